"""WHEP routes through the real app (token auth, a TURN secret): headers, credentials, auth,
refusals and DELETE. Media over the answer is played in tests/e2e (aiortc and Chromium)."""

from __future__ import annotations

import asyncio
import base64
import hashlib
import hmac
import json
import time
from collections.abc import Iterator
from pathlib import Path

import aioice.ice
import pytest
from aiortc import RTCConfiguration, RTCPeerConnection
from fastapi.testclient import TestClient

from tests.server.conftest import make_client

ADMIN_KEY = "drt_admin_" + "w" * 40
TURN_SECRET = "whep-test-secret"
TURN_TTL_S = 600
TURN_URL = "turn:127.0.0.1:3478?transport=udp"
STUN_URL = "stun:127.0.0.1:3479"
AUTH = {"Authorization": f"Bearer {ADMIN_KEY}"}
SDP = {"Content-Type": "application/sdp"}


@pytest.fixture(scope="module")
def client(tmp_path_factory: pytest.TempPathFactory) -> Iterator[TestClient]:
    with make_client(
        Path(tmp_path_factory.mktemp("whep")),
        max_sessions=2,
        auth="token",
        admin_key=ADMIN_KEY,
        ice_hosts=("127.0.0.1",),
        client_ice_servers=(TURN_URL, STUN_URL),
        turn_secret=TURN_SECRET,
        turn_ttl_s=TURN_TTL_S,
    ) as test_client:
        yield test_client


def player_offer(*, data_channel: bool = True) -> str:
    """A WHEP player's offer (aiortc, loopback host candidates only)."""

    async def make() -> str:
        pc = RTCPeerConnection(RTCConfiguration(iceServers=[]))
        pc.addTransceiver("video", direction="recvonly")
        if data_channel:
            pc.createDataChannel("control")
        await pc.setLocalDescription(await pc.createOffer())
        sdp = pc.localDescription.sdp
        await pc.close()
        return sdp

    original = aioice.ice.get_host_addresses
    aioice.ice.get_host_addresses = lambda use_ipv4, use_ipv6: ["127.0.0.1"]
    try:
        return asyncio.run(make())
    finally:
        aioice.ice.get_host_addresses = original


def link_params(link: str) -> dict[str, str]:
    return {k.strip(): json.loads(v) for k, v in (p.split("=", 1) for p in link.split(";")[2:])}


def test_a_new_session_is_a_201_resource_with_minted_turn_credentials(client) -> None:
    before = time.time()
    answer = client.post(
        "/whep/tiny-world",
        params={"prompt": "a lighthouse in fog", "seed": "7", "fps": "6"},
        content=player_offer(),
        headers={**AUTH, **SDP},
    )
    after = time.time()
    assert answer.status_code == 201, answer.text
    assert answer.headers["content-type"] == "application/sdp"
    assert answer.text.startswith("v=0") and "a=sendonly" in answer.text
    assert answer.headers["access-control-allow-origin"] == "*"
    location = answer.headers["location"]
    assert location.startswith("/whep/resource/") and len(location) > len("/whep/resource/") + 16
    etag = answer.headers["etag"]
    assert etag.startswith('"') and etag.endswith('"') and len(etag) > 2
    session_id = answer.headers["dreamrt-session-id"]

    turn, stun = answer.headers.get_list("link")
    assert stun == f'<{STUN_URL}>; rel="ice-server"'
    assert turn.startswith(f'<{TURN_URL}>; rel="ice-server"; ')
    params = link_params(turn)
    assert params["credential-type"] == "password"
    expiry, user = params["username"].split(":", 1)
    assert user == session_id
    assert int(before + TURN_TTL_S) <= int(expiry) <= int(after + TURN_TTL_S)
    digest = hmac.new(TURN_SECRET.encode(), params["username"].encode(), hashlib.sha1).digest()
    assert params["credential"] == base64.b64encode(digest).decode()  # what coturn checks

    view = client.get(f"/v1/sessions/{session_id}", headers=AUTH).json()
    assert (view["prompt"], view["model"]) == ("a lighthouse in fog", "tiny-world")
    assert view["profile"]["fps"] == 6
    assert client.app.state.ctx.host.session(session_id).config.seed == 7

    patched = client.patch(
        location,
        content="a=end-of-candidates\r\n",
        headers={**AUTH, "Content-Type": "application/trickle-ice-sdpfrag", "If-Match": etag},
    )
    assert patched.status_code == 405 and patched.headers["allow"] == "DELETE, OPTIONS"
    assert client.delete(location).status_code == 401
    assert client.delete(location, headers=AUTH).status_code == 200
    # once DELETE has answered, the session WHEP made has ended
    assert client.get(f"/v1/sessions/{session_id}", headers=AUTH).json()["state"] == "closed"
    assert client.delete(location, headers=AUTH).status_code == 404


def test_a_viewer_of_an_existing_session_leaves_the_session_running(client) -> None:
    created = client.post("/v1/sessions", json={"prompt": "a field of wheat"}, headers=AUTH)
    session_id, token = created.json()["id"], created.json()["token"]
    own = {"Authorization": f"Bearer {token}"}
    answer = client.post(
        f"/v1/sessions/{session_id}/whep", content=player_offer(), headers={**own, **SDP}
    )
    assert answer.status_code == 201, answer.text
    assert answer.headers["dreamrt-session-id"] == session_id
    # another session's token cannot end this viewer
    other = client.post("/v1/sessions", json={"prompt": "x"}, headers=AUTH).json()
    stranger = {"Authorization": f"Bearer {other['token']}"}
    assert client.delete(answer.headers["location"], headers=stranger).status_code == 403
    assert client.delete(answer.headers["location"], headers=own).status_code == 200
    state = client.get(f"/v1/sessions/{session_id}", headers=own).json()["state"]
    assert state not in ("closing", "closed"), state
    for sid in (session_id, other["id"]):
        assert client.delete(f"/v1/sessions/{sid}", headers=AUTH).status_code == 204


def test_refusals_name_the_problem_and_leave_no_session(client) -> None:
    offer = player_offer(data_channel=False)
    missing = client.post("/whep/tiny-world", content=offer, headers=SDP)
    assert missing.status_code == 401 and missing.headers["access-control-allow-origin"] == "*"
    session_token = client.post("/v1/sessions", json={"prompt": "x"}, headers=AUTH).json()
    scoped = {"Authorization": f"Bearer {session_token['token']}"}
    assert (
        client.post("/whep/tiny-world", content=offer, headers={**scoped, **SDP}).status_code == 403
    )
    assert client.delete(f"/v1/sessions/{session_token['id']}", headers=AUTH).status_code == 204
    wrong_type = client.post(
        "/whep/tiny-world", content=offer, headers={**AUTH, "Content-Type": "text/plain"}
    )
    assert wrong_type.status_code == 415 and "application/sdp" in wrong_type.json()["detail"]
    unknown = client.post("/whep/no-such-card", content=offer, headers={**AUTH, **SDP})
    assert unknown.status_code == 404 and "no-such-card" in unknown.json()["detail"]
    bad_seed = client.post(
        "/whep/tiny-world", params={"seed": "x"}, content=offer, headers={**AUTH, **SDP}
    )
    assert bad_seed.status_code == 422 and bad_seed.json()["detail"][0]["loc"] == ["query", "seed"]
    no_video = client.post("/whep/tiny-world", content="v=0\r\n", headers={**AUTH, **SDP})
    assert no_video.status_code == 400 and no_video.json()["code"] == "bad_offer"
    big = client.post("/whep/tiny-world", content="v=0\r\n" + "a" * 70_000, headers={**AUTH, **SDP})
    assert big.status_code == 413
    assert client.delete("/whep/resource/nope", headers=AUTH).status_code == 404
    host = client.app.state.ctx.host
    assert [s for s in host.sessions() if not s.terminal] == []


def test_preflights_allow_a_player_on_another_origin(client) -> None:
    for path, method in (("/whep/tiny-world", "POST"), ("/whep/resource/x", "DELETE")):
        preflight = client.options(
            path, headers={"Origin": "http://elsewhere", "Access-Control-Request-Method": method}
        )
        assert preflight.status_code == 204
        assert method in preflight.headers["access-control-allow-methods"]
        assert "authorization" in preflight.headers["access-control-allow-headers"].lower()
        assert "location" in preflight.headers["access-control-expose-headers"].lower()
