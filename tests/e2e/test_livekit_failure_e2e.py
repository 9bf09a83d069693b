"""A LiveKit join that cannot connect, through a real ``dreamrt serve`` subprocess and the real
SDK (no LiveKit server is needed: the room URL is a closed loopback port).

The 201 stays valid, the session ends ``failed`` with an ``error`` event naming the cause, its
KV slab comes back (the pool is full again, by ``/metrics``), and the server stays healthy.
"""

import time
from pathlib import Path

import httpx
import pytest

from infra.browser_harness import ServerProcess
from tests.e2e.test_sessions_e2e import wait_idle
from tests.server.test_livekit_room import closed_port

pytestmark = pytest.mark.slow


def test_a_refused_join_fails_the_session_and_returns_its_slab(tmp_path: Path) -> None:
    args = ("--livekit-key", "devkey", "--livekit-secret", "a-secret-long-enough-for-hs256")
    with ServerProcess(tmp_path / "data", tmp_path / "server.log", extra_args=args) as srv:
        url = f"ws://127.0.0.1:{closed_port()}"
        created = httpx.post(
            f"{srv.url}/v1/sessions",
            json={"prompt": "a forest", "livekit": {"url": url, "room": "lobby"}},
            timeout=10,
        )
        assert created.status_code == 201, created.text
        sid = created.json()["id"]
        deadline = time.monotonic() + 20
        while True:
            view = httpx.get(f"{srv.url}/v1/sessions/{sid}", timeout=10).json()
            if view["state"] == "failed" or time.monotonic() > deadline:
                break
            time.sleep(0.1)
        assert view["state"] == "failed", view
        assert "livekit_connect" in view["error"] and "lobby" in view["error"]
        events = httpx.get(f"{srv.url}/v1/sessions/{sid}/events", timeout=10).text
        assert "event: error" in events and "livekit_connect" in events
        m = wait_idle(srv.url)
        assert m["dreamrt_kv_slabs_free"] == m["dreamrt_kv_slabs_capacity"] > 0
        assert httpx.get(f"{srv.url}/healthz", timeout=10).status_code == 200
    assert "Traceback" not in Path(srv.log_path).read_text(errors="replace")
