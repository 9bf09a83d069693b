"""WHEP playback against a real ``dreamrt serve`` subprocess on 127.0.0.1 (token auth, TURN
secret): a real aiortc player, and Debian's Chromium running a small fetch-based WHEP client
written here. No TURN or STUN server runs: the advertised ones are only checked as headers
(both peers connect on loopback host candidates).

GStreamer's ``whepsrc`` (gst-plugins-rs) would be a WHEP client nobody here wrote, but Debian
12 does not package gst-plugins-rs (``apt-cache policy gstreamer1.0-plugins-rs``: no such
package), so there is no such test.
"""

from __future__ import annotations

import asyncio
import base64
import hashlib
import hmac
import json
import time
from collections.abc import AsyncIterator, Iterator
from typing import Any

import httpx
import pytest
from aiortc import RTCConfiguration, RTCPeerConnection, RTCSessionDescription
from playwright.sync_api import sync_playwright

from infra.browser_harness import (
    ChromiumMissingError,
    ServerProcess,
    launch_chromium,
    require_chromium,
)

pytestmark = pytest.mark.slow

ADMIN_KEY = "drt_admin_" + "w" * 40
TURN_SECRET = "whep-test-secret"
TURN_TTL_S = 600
TURN_URL = "turn:127.0.0.1:3478?transport=udp"
STUN_URL = "stun:127.0.0.1:3479"
AUTH = {"Authorization": f"Bearer {ADMIN_KEY}"}


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    root = tmp_path_factory.mktemp("whep")
    srv = ServerProcess(
        root / "data",
        root / "server.log",
        extra_args=(
            "--auth",
            "token",
            "--admin-key",
            ADMIN_KEY,
            "--client-ice-server",
            TURN_URL,
            "--client-ice-server",
            STUN_URL,
            "--turn-secret",
            TURN_SECRET,
            "--turn-ttl",
            str(TURN_TTL_S),
        ),
    ).start()
    yield srv
    srv.stop(timeout_s=20.0)
    log = srv.log_path.read_text(errors="replace")
    assert "dreamrt stopped" in log, log[-3000:]
    assert "Traceback" not in log, log[-6000:]


@pytest.fixture
async def http(server: ServerProcess) -> AsyncIterator[httpx.AsyncClient]:
    async with httpx.AsyncClient(base_url=server.url, timeout=30) as client:
        yield client


async def player_offer(pc: RTCPeerConnection, *, data_channel: bool) -> tuple[str, Any]:
    """A WHEP player's offer: receive-only video, optionally the ``control`` channel."""
    pc.addTransceiver("video", direction="recvonly")
    channel = pc.createDataChannel("control") if data_channel else None
    await pc.setLocalDescription(await pc.createOffer())  # aiortc: candidates gathered
    return pc.localDescription.sdp, channel


def links(response: httpx.Response) -> list[str]:
    return response.headers.get_list("link")


async def test_whep_plays_a_new_session_and_delete_ends_it(
    server: ServerProcess, http: httpx.AsyncClient
) -> None:
    pc = RTCPeerConnection(RTCConfiguration(iceServers=[]))
    pongs: asyncio.Queue[dict] = asyncio.Queue()
    try:
        sdp, channel = await player_offer(pc, data_channel=True)
        before = time.time()
        answer = await http.post(
            "/whep/tiny-world",
            params={"prompt": "a lighthouse in fog", "seed": "7"},
            content=sdp,
            headers={**AUTH, "Content-Type": "application/sdp"},
        )
        after = time.time()
        assert answer.status_code == 201, answer.text
        assert answer.headers["content-type"] == "application/sdp"
        assert answer.headers["access-control-allow-origin"] == "*"
        location = answer.headers["location"]
        assert location.startswith("/whep/resource/")
        etag = answer.headers["etag"]
        assert etag.startswith('"') and etag.endswith('"') and len(etag) > 2
        session_id = answer.headers["dreamrt-session-id"]

        # one Link per advertised ICE server; the TURN one with a minted credential
        turn, stun = links(answer)
        assert stun == f'<{STUN_URL}>; rel="ice-server"'
        assert turn.startswith(f'<{TURN_URL}>; rel="ice-server"; username="')
        params = dict(part.strip().split("=", 1) for part in turn.split(";")[2:] if "=" in part)
        username = json.loads(params["username"])
        credential = json.loads(params["credential"])
        assert json.loads(params["credential-type"]) == "password"
        expiry, user = username.split(":", 1)
        assert user == session_id
        assert int(before + TURN_TTL_S) <= int(expiry) <= int(after + TURN_TTL_S)
        expected = hmac.new(TURN_SECRET.encode(), username.encode(), hashlib.sha1).digest()
        assert credential == base64.b64encode(expected).decode()

        # the query made the session
        state = (await http.get(f"/v1/sessions/{session_id}", headers=AUTH)).json()
        assert state["prompt"] == "a lighthouse in fog" and state["model"] == "tiny-world"

        @channel.on("message")
        def on_message(message: str) -> None:
            event = json.loads(message)
            if event.get("type") == "pong":
                pongs.put_nowait(event)

        video: asyncio.Future = asyncio.get_running_loop().create_future()
        pc.on("track", lambda track: video.done() or video.set_result(track))
        await pc.setRemoteDescription(RTCSessionDescription(answer.text, "answer"))
        track = await asyncio.wait_for(video, 30)
        frames = [await asyncio.wait_for(track.recv(), 30) for _ in range(5)]
        assert frames[0].width == state["profile"]["width"]
        assert [f.pts for f in frames] == sorted(f.pts for f in frames)

        # the data channel of the offer carries the control protocol
        await asyncio.wait_for(_wait_open(channel), 10)
        channel.send(json.dumps({"type": "ping", "t": 41}))
        assert (await asyncio.wait_for(pongs.get(), 10))["t"] == 41

        # no trickle ICE, no ICE restart: 405 naming what is allowed
        patched = await http.patch(
            location,
            content="a=end-of-candidates\r\n",
            headers={
                **AUTH,
                "Content-Type": "application/trickle-ice-sdpfrag",
                "If-Match": etag,
            },
        )
        assert patched.status_code == 405 and patched.headers["allow"] == "DELETE, OPTIONS"

        # a stranger cannot end it
        assert (await http.delete(location)).status_code == 401
        ended = await http.delete(location, headers=AUTH)
        assert ended.status_code == 200
        # once DELETE answered, the session WHEP created has ended and its viewer is gone
        row = (await http.get(f"/v1/sessions/{session_id}", headers=AUTH)).json()
        assert row["state"] == "closed", row
        assert (await http.delete(location, headers=AUTH)).status_code == 404
        peers = _metric((await http.get("/metrics")).text, "dreamrt_webrtc_peers")
        assert peers == 0
    finally:
        await pc.close()


async def test_whep_on_an_existing_session_leaves_it_running(http: httpx.AsyncClient) -> None:
    created = await http.post("/v1/sessions", json={"prompt": "a field of wheat"}, headers=AUTH)
    assert created.status_code == 201, created.text
    session_id, token = created.json()["id"], created.json()["token"]
    session_auth = {"Authorization": f"Bearer {token}"}
    pc = RTCPeerConnection(RTCConfiguration(iceServers=[]))
    try:
        sdp, _ = await player_offer(pc, data_channel=False)
        answer = await http.post(
            f"/v1/sessions/{session_id}/whep",
            content=sdp,
            headers={**session_auth, "Content-Type": "application/sdp"},
        )
        assert answer.status_code == 201, answer.text
        assert answer.headers["dreamrt-session-id"] == session_id
        video: asyncio.Future = asyncio.get_running_loop().create_future()
        pc.on("track", lambda track: video.done() or video.set_result(track))
        await pc.setRemoteDescription(RTCSessionDescription(answer.text, "answer"))
        track = await asyncio.wait_for(video, 30)
        await asyncio.wait_for(track.recv(), 30)
        ended = await http.delete(answer.headers["location"], headers=session_auth)
        assert ended.status_code == 200
        state = (await http.get(f"/v1/sessions/{session_id}", headers=session_auth)).json()
        assert state["state"] == "paused", state  # the viewer left; the session did not end
    finally:
        await pc.close()
        await http.delete(f"/v1/sessions/{session_id}", headers=AUTH)


async def test_a_player_that_leaves_without_delete_ends_its_whep_session(
    http: httpx.AsyncClient,
) -> None:
    pc = RTCPeerConnection(RTCConfiguration(iceServers=[]))
    sdp, _ = await player_offer(pc, data_channel=False)
    answer = await http.post(
        "/whep/tiny-world", content=sdp, headers={**AUTH, "Content-Type": "application/sdp"}
    )
    assert answer.status_code == 201, answer.text
    session_id = answer.headers["dreamrt-session-id"]
    video: asyncio.Future = asyncio.get_running_loop().create_future()
    pc.on("track", lambda track: video.done() or video.set_result(track))
    await pc.setRemoteDescription(RTCSessionDescription(answer.text, "answer"))
    await asyncio.wait_for((await asyncio.wait_for(video, 30)).recv(), 30)
    await pc.close()  # gone, no DELETE: the server sees its peer connection close

    async def closed() -> None:
        while (await http.get(f"/v1/sessions/{session_id}", headers=AUTH)).json()["state"] != (
            "closed"
        ):
            await asyncio.sleep(0.1)

    await asyncio.wait_for(closed(), 20)
    assert (await http.delete(answer.headers["location"], headers=AUTH)).status_code == 404


async def test_whep_refusals_name_the_problem(http: httpx.AsyncClient) -> None:
    sdp_headers = {"Content-Type": "application/sdp"}
    offer = "v=0\r\n"
    missing = await http.post("/whep/tiny-world", content=offer, headers=sdp_headers)
    assert missing.status_code == 401 and missing.headers["access-control-allow-origin"] == "*"
    wrong_type = await http.post(
        "/whep/tiny-world", content=offer, headers={**AUTH, "Content-Type": "text/plain"}
    )
    assert wrong_type.status_code == 415 and "application/sdp" in wrong_type.json()["detail"]
    unknown = await http.post("/whep/no-such-card", content=offer, headers={**AUTH, **sdp_headers})
    assert unknown.status_code == 404 and "no-such-card" in unknown.json()["detail"]
    bad_seed = await http.post(
        "/whep/tiny-world", params={"seed": "x"}, content=offer, headers={**AUTH, **sdp_headers}
    )
    assert bad_seed.status_code == 422 and "seed" in bad_seed.json()["detail"][0]["loc"]
    no_video = await http.post("/whep/tiny-world", content=offer, headers={**AUTH, **sdp_headers})
    assert no_video.status_code == 400 and no_video.json()["code"] == "bad_offer"
    preflight = await http.options(
        "/whep/tiny-world",
        headers={"Origin": "http://elsewhere", "Access-Control-Request-Method": "POST"},
    )
    assert preflight.status_code == 204
    assert "POST" in preflight.headers["access-control-allow-methods"]
    assert "authorization" in preflight.headers["access-control-allow-headers"].lower()
    assert "location" in preflight.headers["access-control-expose-headers"].lower()
    # the refused offers left no session behind
    metrics = (await http.get("/metrics")).text
    assert _metric(metrics, 'dreamrt_sessions{state="live"}') == 0


# ---------------------------------------------------------------- Chromium

WHEP_CLIENT_JS = """async ([endpoint, token]) => {
    const pc = new RTCPeerConnection({iceServers: []});
    pc.addTransceiver('video', {direction: 'recvonly'});
    const channel = pc.createDataChannel('control');
    const pongs = [];
    channel.onmessage = (m) => {
        const e = JSON.parse(m.data);
        if (e.type === 'pong') pongs.push(e.t);
    };
    channel.onopen = () => channel.send(JSON.stringify({type: 'ping', t: 7}));
    await pc.setLocalDescription(await pc.createOffer());
    // the server does not trickle: send the offer once every candidate is in it
    await new Promise((resolve) => {
        if (pc.iceGatheringState === 'complete') return resolve();
        pc.addEventListener('icegatheringstatechange', () => {
            if (pc.iceGatheringState === 'complete') resolve();
        });
    });
    const res = await fetch(endpoint, {
        method: 'POST',
        headers: {'Content-Type': 'application/sdp', 'Authorization': 'Bearer ' + token},
        body: pc.localDescription.sdp,
    });
    if (res.status !== 201) {
        throw new Error('WHEP POST answered ' + res.status + ': ' + await res.text());
    }
    const location = new URL(res.headers.get('Location'), endpoint).href;
    await pc.setRemoteDescription({type: 'answer', sdp: await res.text()});
    window.whep = {
        pc, pongs, location, token,
        session: res.headers.get('Dreamrt-Session-Id'),
        etag: res.headers.get('ETag'),
        stop: async () => {
            const auth = {'Authorization': 'Bearer ' + token};
            return (await fetch(location, {method: 'DELETE', headers: auth})).status;
        },
    };
    return window.whep.session;
}"""

FRAMES_DECODED_JS = """async () => {
    const report = await window.whep.pc.getStats();
    for (const s of report.values()) {
        if (s.type === 'inbound-rtp' && s.kind === 'video') return s.framesDecoded;
    }
    return 0;
}"""


@pytest.mark.browser
def test_chromium_plays_a_whep_url_and_delete_ends_it(
    server: ServerProcess, tmp_path_factory: pytest.TempPathFactory
) -> None:
    try:
        chromium = require_chromium()
    except ChromiumMissingError as exc:
        pytest.fail(str(exc))
    errors: list[str] = []
    with sync_playwright() as playwright:
        context = launch_chromium(
            playwright, tmp_path_factory.mktemp("whep-chromium"), executable_path=chromium
        )
        try:
            page = context.pages[0] if context.pages else context.new_page()
            page.on("pageerror", lambda exc: errors.append(str(exc)))
            # another origin than the endpoint (localhost vs 127.0.0.1): every request is CORS
            page.goto(f"http://localhost:{server.port}/healthz")
            endpoint = f"{server.url}/whep/tiny-world?prompt=a%20red%20kite&seed=3"
            session_id = page.evaluate(WHEP_CLIENT_JS, [endpoint, ADMIN_KEY])
            page.wait_for_function(f"({FRAMES_DECODED_JS})().then((n) => n >= 5)", timeout=30_000)
            page.wait_for_function("window.whep.pongs.includes(7)", timeout=10_000)
            status = page.evaluate("window.whep.stop()")
            # DELETE has answered: the session and its viewer are gone already
            row = httpx.get(f"{server.url}/v1/sessions/{session_id}", headers=AUTH, timeout=10)
            peers = _metric(
                httpx.get(f"{server.url}/metrics", timeout=10).text, "dreamrt_webrtc_peers"
            )
        finally:
            context.close()
    assert errors == [], errors
    assert status == 200
    assert row.json()["state"] == "closed", row.text
    assert peers == 0


def _metric(text: str, name: str) -> float:
    for line in text.splitlines():
        if line.startswith(name + " "):
            return float(line.rsplit(" ", 1)[1])
    return 0.0


async def _wait_open(channel: Any) -> None:
    while channel.readyState != "open":
        await asyncio.sleep(0.02)
