"""A fleet on NVIDIA Dynamo's distributed runtime, as real processes on loopback.

Two engines (``dreamrt serve --fleet`` on the embedded tiny-world card, two chunk-KV slabs each,
a replay snapshot after every chunk on a shared ``--snapshot-dir``) and ``dreamrt router``
find each other through Dynamo's file discovery (``DYN_FILE_KV``), with its TCP request plane
bound to 127.0.0.1. One test, in stages, since each stage starts from the state the one
before left:

1. sessions created through the router spread by load (the second goes to the other engine)
   and the router never places beyond capacity (the fifth is a 503 with Retry-After, and no
   engine holds more sessions than its slabs);
2. kill -9 of one engine: once its discovery lease expires its sessions are re-placed on the
   other engine with their ids and tokens, and a client that asks the router where its session
   is reconnects there: the stream goes on from the snapshot's chunk (generation PTS and
   chunk numbers continue, the chunk regenerated equals the one the dead engine made);
3. the router restarted finds the engines and the resumed sessions again; a drained engine
   takes no new session (503) and stays in the fleet while its sessions last; a viewer that
   creates its session through the router watches it on the engine it was placed on.
"""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

# The fleet extra is part of the test extra: without it this module fails to import (no skip).
import dynamo.runtime  # noqa: E402,F401
import httpx
import pytest

from clients.python.api import DreamrtClient
from clients.python.viewer import Viewer
from infra.browser_harness import REPO_ROOT, ServerProcess, free_port
from runtime.contract import frame_of_pts, pts_of_frame

pytestmark = pytest.mark.slow

NAMESPACE = "fleet-e2e"


class RouterProcess:
    """``python -m server router`` as a subprocess on 127.0.0.1."""

    def __init__(self, log_path: Path, env: dict[str, str]) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log_path = log_path
        self._env = env
        self._proc: subprocess.Popen[bytes] | None = None

    def start(self, engines: int, timeout_s: float = 60.0) -> RouterProcess:
        command = [sys.executable, "-m", "server", "router", "--fleet", NAMESPACE]
        command += ["--port", str(self.port), "--poll", "0.5"]
        with self.log_path.open("ab") as log:
            self._proc = subprocess.Popen(
                command, cwd=REPO_ROOT, stdout=log, stderr=subprocess.STDOUT, env=self._env
            )
        wait_for(lambda: self.engines() == engines, timeout_s, f"router sees {engines} engines")
        return self

    def engines(self) -> int | None:
        if self._proc is not None and self._proc.poll() is not None:
            raise AssertionError(f"router exited:\n{self.log_path.read_text()[-3000:]}")
        try:
            return httpx.get(f"{self.url}/healthz", timeout=2.0).json()["engines"]
        except httpx.HTTPError:
            return None

    def stop(self) -> None:
        proc, self._proc = self._proc, None
        if proc is not None and proc.poll() is None:
            proc.send_signal(signal.SIGINT)
            try:
                proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


def wait_for(predicate: Any, timeout_s: float, what: str) -> Any:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.2)
    raise AssertionError(f"timed out after {timeout_s} s waiting until {what}")


@pytest.fixture
def fleet(tmp_path: Path) -> Iterator[dict[str, Any]]:
    env = {
        **os.environ,
        "PYTHONUNBUFFERED": "1",
        "DYN_FILE_KV": str(tmp_path / "discovery"),
        "DYN_TCP_RPC_HOST": "127.0.0.1",
    }
    shared = tmp_path / "shared"
    engines = [
        ServerProcess(
            tmp_path / name / "data",
            tmp_path / name / "server.log",
            env=env,
            extra_args=(
                "--fleet", NAMESPACE, "--engine-id", name, "--snapshot-dir", str(shared),
                "--max-sessions", "2", "--snapshot-every", "1", "--deterministic",
                "--unwatched-timeout", "0",
            ),
        )
        for name in ("engine-a", "engine-b")
    ]  # fmt: skip
    for engine in engines:
        engine.start(timeout_s=120.0)
    router = RouterProcess(tmp_path / "router.log", env)
    try:
        yield {"engines": engines, "router": router.start(engines=2), "shared": shared}
    finally:
        router.stop()
        for engine in engines:
            engine.stop(timeout_s=20.0)
    for log in [router.log_path] + [e.log_path for e in engines]:
        assert "Traceback" not in log.read_text(errors="replace"), log.read_text()[-4000:]


def cards(router_url: str) -> dict[str, dict[str, Any]]:
    fleet = httpx.get(f"{router_url}/v1/fleet", timeout=5.0).json()
    return {e["card"]["engine_id"]: e["card"] for e in fleet["engines"]}


def chunks_of(viewer: Viewer) -> dict[int, dict[str, Any]]:
    return {e["chunk"]: e for e in viewer.events if e["type"] == "media.chunk"}


async def test_two_engines_and_a_router_place_fail_over_and_restart(fleet: dict[str, Any]) -> None:
    router = fleet["router"]
    by_url = {e.url: e for e in fleet["engines"]}
    async with DreamrtClient(router.url) as front, httpx.AsyncClient(base_url=router.url) as http:
        # 1. spread by load, never beyond capacity
        placed = [await front.create_session("a red fox", start="now") for _ in range(4)]
        engines = [p["engine_id"] for p in placed]
        assert engines[0] != engines[1], engines  # the second goes where the headroom is
        assert sorted(engines) == ["engine-a"] * 2 + ["engine-b"] * 2, engines
        refused = await http.post("/v1/sessions", json={"prompt": "one too many"})
        assert refused.status_code == 503 and int(refused.headers["retry-after"]) >= 1
        loads = {name: card["load"] for name, card in cards(router.url).items()}
        assert all(load["sessions"] == 2 and load["kv_slabs_free"] == 0 for load in loads.values())
        # an OpenAI-API video (multipart, as the official client sends it) is placed like a job
        fields = {"prompt": (None, "a kite"), "seconds": (None, "1")}
        video = await http.post("/v1/videos", files=fields)
        assert video.status_code == 200 and video.json()["object"] == "video", video.text
        assert video.json()["url"] in by_url and video.json()["seconds"] == "1"

        # 2. make room on one engine, watch a session on the other, kill that one
        victim_id = placed[0]["engine_id"]
        survivor = next(p for p in placed if p["engine_id"] != victim_id)["url"]
        for p in placed:
            if p["engine_id"] != victim_id:
                async with DreamrtClient(p["url"], token=p["token"]) as engine:
                    await engine.delete_session(p["id"])
        watched = placed[0]
        lost = {p["id"] for p in placed if p["engine_id"] == victim_id}
        async with DreamrtClient(watched["url"], token=watched["token"]) as engine:
            before = Viewer(engine)
            await before.connect(session_id=watched["id"])
            await before.wait_event(lambda e: e["type"] == "media.chunk" and e["chunk"] >= 3, 60)
            snaps = fleet["shared"] / "snapshots" / watched["id"]
            wait_for(lambda: len(list(snaps.glob("*.snap"))) >= 4, 20, "snapshots are written")
            # ServerProcess has no kill(): its process, killed without a chance to clean up
            os.kill(by_url[watched["url"]]._proc.pid, signal.SIGKILL)
            killed_s = time.monotonic()
            await before.close(delete=False)
        made_before = chunks_of(before)

        async def located(session_id: str) -> dict[str, Any] | None:
            answer = await http.get(f"/v1/sessions/{session_id}")
            return answer.json() if answer.status_code == 200 else None

        deadline = time.monotonic() + 40
        while True:
            places = [await located(s) for s in lost]
            if all(w is not None and w["url"] == survivor for w in places):
                break
            assert time.monotonic() < deadline, cards(router.url)
            await asyncio.sleep(0.25)
        failover_s = time.monotonic() - killed_s
        where = await located(watched["id"])
        assert where["url"] == survivor and where["engine_id"] != victim_id
        card = cards(router.url)[where["engine_id"]]
        assert lost <= set(card["sessions"]) and card["load"]["kv_slabs_free"] == 0

        # the client reconnects where the router says, with the token it had
        async with DreamrtClient(where["url"], token=watched["token"]) as engine:
            after = Viewer(engine)
            await after.connect(session_id=watched["id"])
            await after.wait_first_frame(30)
            first = await after.wait_event(lambda e: e["type"] == "media.chunk", 30)
            await after.wait_event(
                lambda e: e["type"] == "media.chunk" and e["chunk"] > first["chunk"], 30
            )
            await after.close(delete=False)
        resumed_from = first["chunk"]
        assert 1 <= resumed_from <= max(made_before) + 1, (resumed_from, sorted(made_before))
        assert first["pts_start"] > 0  # the PTS clock goes on, it does not restart at 0
        if resumed_from in made_before:  # regenerated from the snapshot: the same chunk
            assert first["pts_start"] == made_before[resumed_from]["pts_start"]
            assert first["digest"] == made_before[resumed_from]["digest"]
        else:
            previous = made_before[resumed_from - 1]  # the frame after its last one
            next_frame = frame_of_pts(previous["pts_start"], previous["fps"]) + previous["frames"]
            assert first["pts_start"] == pts_of_frame(next_frame, previous["fps"])

    # 3. the router restarted rebuilds its view from discovery
    router.stop()
    router.start(engines=1)
    again = httpx.get(f"{router.url}/v1/sessions/{watched['id']}", timeout=5.0).json()
    assert again["url"] == survivor

    # a viewer that creates its session through the router watches it on the placed engine
    other = next(p for p in placed if p["id"] in lost and p["id"] != watched["id"])
    async with DreamrtClient(survivor, token=other["token"]) as engine:
        await engine.delete_session(other["id"])  # the resumed one keeps its token there
    async with DreamrtClient(router.url) as front:
        through = Viewer(front)
        await through.connect("a blue bird")
        assert through.api.base_url == survivor and through.api is not front
        await through.wait_first_frame(30)
        await through.close()  # deletes it on its engine

    # a drained engine takes nothing new, and stays in the fleet while its sessions last
    assert httpx.post(f"{survivor}/v1/deployment/drain", timeout=5.0).status_code == 202
    wait_for(
        lambda: [c["health"] for c in cards(router.url).values()] == ["draining"], 10, "draining"
    )
    refused = httpx.post(f"{router.url}/v1/sessions", json={"prompt": "x"}, timeout=10.0)
    assert refused.status_code == 503 and router.engines() == 1
    print(
        f"failover: sessions re-placed {failover_s:.1f} s after kill -9; the watched one "
        f"resumed at chunk {resumed_from} (chunks 0..{max(made_before)} seen before)"
    )
