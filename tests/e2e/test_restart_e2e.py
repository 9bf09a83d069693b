"""Graceful shutdown and resume on a real ``dreamrt serve`` subprocess (tiny-world, token auth,
deterministic mode): a session streams to an aiortc viewer and a job runs; SIGTERM; the server
answers 503 while it drains, the viewer reads ``session.state`` closing with reason
``shutdown``, the process exits 0 within its shutdown timeout, leaving a snapshot of the
session and of the job. A new process on the same data directory resumes both: the job goes on
from its snapshot to its artifact; the viewer's client comes back with the old id and token,
and the session streams on from the chunk after the last one generated, with the PTS going on
and bit-identical frames to a same-seed session that never stopped (so its chunk-KV and prompt
memory were restored exactly). The kill -9 case is in ``test_recording_e2e.py`` (durability of
acknowledged rows).
"""

from __future__ import annotations

import asyncio
import signal
import time
from pathlib import Path

import httpx
import pytest

from clients.python.api import DreamrtClient
from clients.python.viewer import Viewer
from infra.browser_harness import ServerProcess
from tests.e2e.test_recording_e2e import read_sse

pytestmark = pytest.mark.slow

ADMIN = "k" * 40
SEED = 7
PROMPT = "a red ball on grass"


def serve(data: Path, log: Path) -> ServerProcess:
    return ServerProcess(
        data,
        log,
        extra_args=(
            *("--auth", "token", "--admin-key", ADMIN, "--deterministic"),
            *("--max-sessions", "3", "--snapshot-every", "4", "--shutdown-timeout", "10"),
        ),
    ).start()


def chunks(viewer: Viewer) -> dict[int, dict]:
    return {e["chunk"]: e for e in viewer.events if e["type"] == "media.chunk"}


async def test_sigterm_drains_and_the_session_and_job_resume(tmp_path: Path) -> None:
    data = tmp_path / "data"
    server = serve(data, tmp_path / "server1.log")
    try:
        async with DreamrtClient(server.url, token=ADMIN) as api:
            viewer = Viewer(api)
            await viewer.connect(PROMPT, seed=SEED)
            sid = viewer.session_id
            token = api._session_tokens[sid]  # noqa: SLF001 - the client's own session token
            before: list[tuple[int, str]] = []
            sse = asyncio.create_task(read_sse(server.url, sid, before, token=ADMIN))
            job = await api.submit_job("t2v", "a slow pan", num_frames=120, seed=3)
            await viewer.wait_event(lambda e: e["type"] == "media.chunk" and e["chunk"] >= 2, 60)
            deadline = time.monotonic() + 60
            while (await api.job(job))["progress"] < 0.1:
                assert time.monotonic() < deadline, await api.job(job)
                await asyncio.sleep(0.05)
            progress_before = (await api.job(job))["progress"]
            assert progress_before < 1.0, "the job must still run at SIGTERM (make it longer)"
            server.signal(signal.SIGTERM)
            refused = await api._http.post(  # noqa: SLF001 - a raw answer, status and headers
                "/v1/sessions",
                json={"prompt": "late"},
                headers=api._headers(),  # noqa: SLF001
            )
            code = await asyncio.to_thread(server.wait, 30.0)
            closing = await viewer.wait_event(
                lambda e: e["type"] == "session.state" and e["state"] == "closing", 5
            )
            await viewer.wait_event(  # after every chunk generated before it (published first)
                lambda e: e["type"] == "session.state" and e["state"] == "closed", 5
            )
            seen = chunks(viewer)
            last_event_id = viewer.events[-1]["event_id"]
            await asyncio.wait_for(sse, 10)  # the stream ends with the session (closed)
            await viewer.close(delete=False)
    finally:
        server.stop()
    log = (tmp_path / "server1.log").read_text(errors="replace")
    # exit 0: the drain ended by itself (the server's own watchdog exits 1 past its timeout)
    assert code == 0 and "shutdown took over" not in log, (code, log[-3000:])
    assert refused.status_code == 503 and refused.json()["code"] == "shutting_down"
    assert int(refused.headers["retry-after"]) >= 1
    assert closing["reason"] == "shutdown"
    assert "Traceback" not in log, log[-6000:]
    assert list((data / "snapshots" / job).glob("*.snap")), "the running job was snapshotted"
    assert (data / "resume" / f"{sid}.json").is_file()
    last = max(seen)

    server = serve(data, tmp_path / "server2.log")
    try:
        async with DreamrtClient(server.url, token=ADMIN) as api:
            api._session_tokens[sid] = token  # noqa: SLF001 - the old token, from the client
            resumed = Viewer(api)
            await resumed.connect(session_id=sid)  # POST /v1/sessions/{sid}/offer resumes it
            after: list[tuple[int, str]] = []
            last_seen = before[-1][0]
            sse = asyncio.create_task(
                read_sse(server.url, sid, after, after=last_seen, token=ADMIN)
            )
            baseline = Viewer(api)  # same seed and prompt, never stopped
            await baseline.connect(PROMPT, seed=SEED)
            first = await resumed.wait_event(lambda e: e["type"] == "media.chunk", 60)
            await resumed.wait_event(
                lambda e: e["type"] == "media.chunk" and e["chunk"] >= first["chunk"] + 2, 60
            )
            target = max(chunks(resumed))
            await baseline.wait_event(
                lambda e: e["type"] == "media.chunk" and e["chunk"] >= target, 90
            )
            status = await api.session(sid)
            deadline = time.monotonic() + 120
            while not any(kind == "media.chunk" for _, kind in after):
                assert time.monotonic() < deadline, after
                await asyncio.sleep(0.05)
            sse.cancel()
            while (job_now := await api.job(job))["state"] not in ("succeeded", "failed"):
                assert time.monotonic() < deadline, job_now
                await asyncio.sleep(0.2)
            async with httpx.AsyncClient(base_url=server.url) as raw:
                gone = await raw.post(
                    "/v1/sessions/ses_nothere/offer",
                    json={"sdp": "v=0", "type": "offer"},
                    headers={"Authorization": f"Bearer {ADMIN}"},
                )
            await resumed.close(delete=False)
            await api.delete_session(sid)
            await baseline.close()
    finally:
        server.stop(timeout_s=20.0)
    log2 = (tmp_path / "server2.log").read_text(errors="replace")
    assert "Traceback" not in log2, log2[-6000:]
    assert status["id"] == sid and status["state"] == "live"
    assert resumed.events[0]["event_id"] > last_event_id  # the event stream goes on
    # SSE with Last-Event-ID across the restart: the next id after the last one seen (the
    # stream's "closed"), then one apart: no event missed, none twice
    assert before[-1] == (last_seen, "session.state")
    ids = [event_id for event_id, _ in after]
    assert ids == list(range(last_seen + 1, last_seen + 1 + len(ids))), (last_seen, ids)
    # the stream goes on after the last chunk generated before the shutdown
    assert first["chunk"] == last + 1, (last, first)
    assert first["pts_start"] > seen[last]["pts_start"]
    assert first["segment"] == seen[last]["segment"]
    base = chunks(baseline)
    compared = [c for c in chunks(resumed) if c <= target]
    assert len(compared) >= 3
    for chunk in compared:
        assert chunks(resumed)[chunk]["digest"] == base[chunk]["digest"], f"chunk {chunk} differs"
    for chunk, event in seen.items():
        assert event["digest"] == base[chunk]["digest"], f"chunk {chunk} differs"
    assert job_now["state"] == "succeeded", job_now
    assert f"job {job} restored from its snapshot" in log2
    assert gone.status_code == 404
