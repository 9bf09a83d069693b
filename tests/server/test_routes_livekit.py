"""``POST /v1/sessions`` with a ``livekit`` block, through the real app and the real SDK."""

import os
import sys
import time
from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from tests.server.conftest import make_client
from tests.server.test_livekit_room import closed_port

KEY, SECRET = "devkey", "a-secret-long-enough-for-hs256-signing"


@pytest.fixture
def lk_client(tmp_path: Path):
    with make_client(tmp_path, max_sessions=2, livekit_key=KEY, livekit_secret=SECRET) as c:
        yield c


def wait_state(client: TestClient, sid: str, state: str, timeout_s: float = 15.0) -> dict:
    deadline = time.monotonic() + timeout_s
    while True:
        view = client.get(f"/v1/sessions/{sid}")
        assert view.status_code == 200, view.text
        if view.json()["state"] == state or time.monotonic() > deadline:
            return view.json()
        time.sleep(0.05)


def test_a_refused_join_fails_the_session_cleanly_and_returns_its_capacity(lk_client) -> None:
    host = lk_client.app.state.ctx.host
    url = f"ws://127.0.0.1:{closed_port()}"
    created = lk_client.post(
        "/v1/sessions", json={"prompt": "a forest", "livekit": {"url": url, "room": "lobby"}}
    )
    assert created.status_code == 201, created.text
    body = created.json()
    view = wait_state(lk_client, body["id"], "failed")
    assert view["state"] == "failed" and "livekit_connect" in view["error"]
    assert "lobby" in view["error"] and "refused" in view["error"].lower()
    deadline = time.monotonic() + 5
    while host.slab_counts()[0] != host.slab_counts()[1] and time.monotonic() < deadline:
        time.sleep(0.02)
    free, capacity = host.slab_counts()
    assert capacity > 0 and free == capacity  # slab (and reservation) returned
    with lk_client.stream("GET", f"/v1/sessions/{body['id']}/events") as events:
        text = "".join(events.iter_text())
    assert "event: error" in text and "livekit_connect" in text
    assert "event: livekit.state" in text
    # the pool is full again: two more sessions are admitted
    for _ in range(2):
        assert lk_client.post("/v1/sessions", json={"prompt": "x"}).status_code == 201


def test_without_credentials_or_token_the_livekit_block_is_422(client: TestClient) -> None:
    os.environ.pop("LIVEKIT_API_KEY", None)
    response = client.post(
        "/v1/sessions", json={"prompt": "a", "livekit": {"url": "ws://x", "room": "r"}}
    )
    assert response.status_code == 422 and "livekit.token" in response.text


def test_without_the_sdk_the_livekit_block_is_501_naming_the_extra(
    client: TestClient, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setitem(sys.modules, "livekit.api", None)
    response = client.post(
        "/v1/sessions",
        json={"prompt": "a", "livekit": {"url": "ws://x", "room": "r", "token": "t"}},
    )
    assert response.status_code == 501 and response.json()["code"] == "livekit_unavailable"
    assert "dreamrt[livekit]" in response.json()["detail"]
    assert client.post("/v1/sessions", json={"prompt": "a"}).status_code == 201


def test_the_server_imports_without_the_livekit_packages() -> None:
    import subprocess

    code = (
        "import sys; sys.modules['livekit'] = None; sys.modules['livekit.rtc'] = None; "
        "sys.modules['livekit.api'] = None; import server.app, server.cli, server.livekit.room"
    )
    root = Path(__file__).resolve().parents[2]
    done = subprocess.run(
        [sys.executable, "-c", code], cwd=root, capture_output=True, text=True, check=False
    )
    assert done.returncode == 0, done.stderr
