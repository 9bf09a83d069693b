"""Failure isolation on a real server: one bad session, job, peer or stream hurts nobody else.

A real ``dreamrt serve`` subprocess (``wan-tiny-random``, 64x64 at 8 fps, on the CPU) with
``--fault-injection`` (the admin route ``POST /v1/faults`` arms a NaN, an exception or an
out-of-memory error on a loop's next denoising step, ``runtime.faults``) and real aiortc
viewers on loopback. Each test checks that a bystander session goes on streaming after the
fault (its next fresh frames arrive, one frame interval apart on the media timeline: none
skipped; its fps under faults is a benchmark's number, not this suite's), that the faulted
loop failed with its code (``error`` event, ``failed``), and that its chunk-KV
slab is back in the pool. The live fuzz sends 1,000 hypothesis-generated control messages
over a real data channel to a live session and checks every rejected one got its ``error``
event, in order, and that the session still streams.
"""

from __future__ import annotations

import asyncio
import socket
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import httpx
import pytest
from aiortc import RTCConfiguration, RTCPeerConnection, RTCSessionDescription
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st

from clients.python.api import DreamrtClient
from clients.python.viewer import Viewer
from infra.browser_harness import ServerProcess
from tests.e2e.test_sessions_e2e import (
    CHUNK_FRAMES,
    FPS,
    ametrics,
    assert_contiguous,
    await_idle,
    next_fresh_frames,
    start_server,
    stop_server,
)
from tests.server.control_fuzz import control_messages, expected_error

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    srv = start_server(
        tmp_path_factory.mktemp("iso"),
        "iso",
        "--fault-injection",
        "--max-sessions",
        "3",
        "--connect-timeout",
        "3",
        # the live fuzz below sends 1,000 messages at once: every one must reach validation
        "--control-rate",
        "5000",
        "--control-burst",
        "5000",
    )
    yield srv
    stop_server(srv)


@pytest.fixture
async def api(server: ServerProcess) -> AsyncIterator[DreamrtClient]:
    async with DreamrtClient(server.url) as client:
        yield client
    await await_idle(server.url)


async def live_viewer(api: DreamrtClient, prompt: str, seed: int) -> Viewer:
    viewer = Viewer(api)
    await viewer.connect(prompt, seed=seed)
    await viewer.wait_first_frame()
    await viewer.wait_event(lambda e: e["type"] == "session.state" and e["state"] == "live")
    return viewer


async def inject(api: DreamrtClient, target: str, kind: str) -> None:
    await api.request("POST", "/v1/faults", json={"target": target, "kind": kind})


async def failed_with(viewer: Viewer, code: str) -> dict:
    error = await viewer.wait_event(lambda e: e["type"] == "error" and e["code"] == code)
    await viewer.wait_event(lambda e: e["type"] == "session.state" and e["state"] == "failed")
    return error


async def test_nan_in_one_of_two_live_sessions_fails_only_that_one(api: DreamrtClient) -> None:
    bad, good = await live_viewer(api, "a red ball", 1), await live_viewer(api, "a blue cube", 2)
    try:
        slabs_free = (await ametrics(api.base_url))["dreamrt_kv_slabs_free"]
        await inject(api, bad.session_id, "nan")
        error = await failed_with(bad, "nan")
        after = await next_fresh_frames(good, CHUNK_FRAMES)
        status_bad = await api.session(bad.session_id)
        status_good = await api.session(good.session_id)
        slabs_after = (await ametrics(api.base_url))["dreamrt_kv_slabs_free"]
    finally:
        await bad.close()
        await good.close()
    assert "non-finite" in error["message"]
    assert status_bad["state"] == "failed" and status_bad["error"].startswith("nan:")
    assert status_good["state"] == "live"
    assert slabs_after == slabs_free + 1  # the failed session's slab is back in the pool
    assert_contiguous(after, FPS)


async def test_exception_and_oom_fail_only_their_sessions(api: DreamrtClient) -> None:
    good = await live_viewer(api, "a quiet lake", 3)
    oom, boom = await live_viewer(api, "a storm", 4), await live_viewer(api, "a desert", 5)
    try:
        await inject(api, oom.session_id, "oom")
        await inject(api, boom.session_id, "exception")
        oom_error = await failed_with(oom, "oom")
        boom_error = await failed_with(boom, "step_exception")
        after = await next_fresh_frames(good, CHUNK_FRAMES)
        status_good = await api.session(good.session_id)
    finally:
        for viewer in (oom, boom, good):
            await viewer.close()
    assert "out of memory" in oom_error["message"] and "InjectedFault" in boom_error["message"]
    assert status_good["state"] == "live"
    assert_contiguous(after, FPS)


async def test_a_failing_job_does_not_stall_sessions(api: DreamrtClient) -> None:
    good = await live_viewer(api, "a green field", 6)
    try:
        job_id = await api.submit_job("t2v", "a red kite", num_frames=45, seed=9)
        deadline = time.monotonic() + 30
        while (await api.job(job_id))["state"] == "queued":
            assert time.monotonic() < deadline, "the job never started"
            await asyncio.sleep(0.05)
        await inject(api, job_id, "exception")
        during = await next_fresh_frames(good, CHUNK_FRAMES)
        while (job := await api.job(job_id))["state"] == "running":
            assert time.monotonic() < deadline + 30, "the job never ended"
            await asyncio.sleep(0.1)
        status_good = await api.session(good.session_id)
    finally:
        await good.close()
    assert job["state"] == "failed" and "step_exception" in job["error"]
    assert status_good["state"] == "live" and status_good["error"] is None
    assert_contiguous(during, FPS)


async def test_a_peer_that_vanishes_mid_negotiation_is_closed_and_the_session_reusable(
    api: DreamrtClient,
) -> None:
    created = await api.create_session("a harbour", seed=7)
    sid = created["id"]
    for vanish in ("before_ice", "mid_dtls"):
        pc = RTCPeerConnection(RTCConfiguration(iceServers=[]))  # no STUN: nothing outside
        pc.addTransceiver("video", direction="recvonly")
        pc.createDataChannel("control")
        await pc.setLocalDescription(await pc.createOffer())
        answer = await api.offer(sid, pc.localDescription.sdp)
        assert (await api.session(sid))["state"] == "negotiating"
        if vanish == "mid_dtls":  # ICE starts, then the client is gone before DTLS completes
            await pc.setRemoteDescription(RTCSessionDescription(answer["sdp"], answer["type"]))
            # one turn of the loop: the connect task starts; on loopback a whole ICE + DTLS
            # handshake can finish in 50 ms, and a connected peer is not "mid-DTLS"
            await asyncio.sleep(0)
        await pc.close()
        deadline = time.monotonic() + 15
        while (state := (await api.session(sid))["state"]) == "negotiating":
            assert time.monotonic() < deadline, "the server kept a vanished peer"
            await asyncio.sleep(0.2)
        assert state in ("paused", "created"), state
        m = await ametrics(api.base_url)
        assert m["dreamrt_webrtc_peers"] == 0
    viewer = Viewer(api)  # the same session still takes a viewer and streams
    try:
        await viewer.connect(session_id=sid)
        await viewer.wait_first_frame()
    finally:
        await viewer.close()
        await api.delete_session(sid)


async def test_a_client_that_closes_its_event_stream_mid_event(api: DreamrtClient) -> None:
    viewer = await live_viewer(api, "a windmill", 8)
    host, port = api.base_url.removeprefix("http://").split(":")
    try:
        for _ in range(3):  # a raw socket: hang up after part of an event's bytes
            with socket.create_connection((host, int(port)), timeout=10) as sock:
                sock.sendall(
                    f"GET /v1/sessions/{viewer.session_id}/events HTTP/1.1\r\n"
                    f"Host: {host}\r\nAccept: text/event-stream\r\n\r\n".encode()
                )
                data = b""
                while b"event: media.chunk" not in data:
                    data += sock.recv(256)
        async with httpx.AsyncClient(base_url=api.base_url, timeout=10) as http:
            async with http.stream("GET", f"/v1/sessions/{viewer.session_id}/events") as stream:
                async for line in stream.aiter_lines():
                    if line.startswith("data:"):
                        break
        deadline = time.monotonic() + 10
        while (await ametrics(api.base_url))["dreamrt_sse_streams"] > 0:
            assert time.monotonic() < deadline, "an abandoned event stream is still held"
            await asyncio.sleep(0.1)
        frames = len(viewer.frames)
        await asyncio.sleep(1.0)
        status = await api.session(viewer.session_id)
    finally:
        await viewer.close()
    assert status["state"] == "live" and len(viewer.frames) > frames


def generated_messages(n: int) -> list[str]:
    """``n`` hypothesis-generated control messages as text (a data channel's text messages;
    the bytes the strategy also draws are sent as text where they decode)."""
    out: list[str] = []

    @settings(
        max_examples=n // 20,
        deadline=None,
        database=None,
        phases=[Phase.generate],
        suppress_health_check=list(HealthCheck),
    )
    @given(st.lists(control_messages(pause=False), min_size=20, max_size=20))
    def collect(batch: list[str | bytes]) -> None:
        for raw in batch:
            out.append(raw if isinstance(raw, str) else raw.decode("latin-1"))

    collect()
    return out[:n]


async def test_a_thousand_fuzzed_messages_over_a_live_data_channel(api: DreamrtClient) -> None:
    messages = generated_messages(1000)
    assert len(messages) == 1000
    models = {m["id"]: m for m in await api.models()}
    caps = set(models["wan-tiny-random"]["capabilities"])
    expected = [
        code
        for raw in messages
        if (code := expected_error(raw, capabilities=caps, max_prompt_chars=4000)) is not None
    ]
    accepted_prompts = sum(
        1
        for raw in messages
        if expected_error(raw, capabilities=caps, max_prompt_chars=4000) is None
        and '"type": "prompt"' in raw[:20]
    )
    viewer = await live_viewer(api, "a lighthouse", 9)
    try:
        mark = len(viewer.events)
        for i in range(0, len(messages), 50):  # a fast client, not one burst of 1,000
            for raw in messages[i : i + 50]:
                viewer.send_raw(raw)
            await asyncio.sleep(0.02)
        viewer.send({"type": "prompt", "text": "the end of the fuzz"})  # acknowledged last

        def prompts_received() -> int:
            return sum(
                1
                for e in viewer.events[mark:]
                if e["type"] == "input.received" and e["kind"] == "prompt"
            )

        deadline = time.monotonic() + 60
        while prompts_received() < accepted_prompts + 1:
            assert time.monotonic() < deadline, (prompts_received(), accepted_prompts)
            await asyncio.sleep(0.1)
        got = [e["code"] for e in viewer.events[mark:] if e["type"] == "error"]
        frames = len(viewer.fresh_frames())
        # keeps streaming: a new fresh frame arrives (waited for, not timed: a loaded CPU is slow)
        deadline = time.monotonic() + 60
        while len(viewer.fresh_frames()) <= frames and time.monotonic() < deadline:
            await asyncio.sleep(0.1)
        status = await api.session(viewer.session_id)
        still = len(viewer.fresh_frames())
    finally:
        await viewer.close()
    assert len(expected) >= 300, "the fuzz must reject a good share of what it sends"
    assert got == expected  # every rejected message answered by its error event, in order
    assert status["state"] == "live" and still > frames, "the session must keep streaming"


def test_the_server_log_has_no_traceback(server: ServerProcess) -> None:
    log = Path(server.log_path).read_text(errors="replace")
    assert "Traceback" not in log, log[-4000:]
