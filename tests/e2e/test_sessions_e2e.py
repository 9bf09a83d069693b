"""End-to-end: a real ``dreamrt serve`` subprocess on 127.0.0.1, real aiortc viewers, no fakes.

The server runs the ``wan-tiny-random`` card on the CPU (64x64 at 8 fps, 9 frames in chunk 0
and 12 per chunk after). ICE uses host candidates on 127.0.0.1 only (the server gets
``--ice-host 127.0.0.1``; this process patches aioice) and no STUN server.

"Frames identical / different" claims compare the ``media.chunk`` digests (sha256 of the
generated uint8 frames): frames received over VP8 are lossy and the encoder's state depends on
timing, so the codec output cannot carry a bit-exactness claim; the tests also check that the
client really receives and decodes frames past the point of change. Runs that are compared
use the same seed on a server in deterministic mode (no cross-session batching effects).

Every test closes its viewers and sessions; ``idle_after`` then checks through ``/metrics``
that no loop, plan or server task is left and every KV slab is back in the pool. Each server
is stopped at the end of its module and must shut down cleanly.
"""

from __future__ import annotations

import asyncio
import fractions
import io
import itertools
import json
import re
import subprocess
import sys
import time
import wave
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import av
import httpx
import numpy as np
import pytest
from aiortc import RTCConfiguration, RTCPeerConnection, RTCSessionDescription
from aiortc.mediastreams import MediaStreamTrack

from clients.python.api import ApiCallError, DreamrtClient
from clients.python.viewer import ReceivedFrame, Viewer
from infra.browser_harness import ServerProcess

pytestmark = pytest.mark.slow

FPS = 8
FIRST_CHUNK_FRAMES = 9
CHUNK_FRAMES = 12


def parse_metrics(text: str) -> dict[str, float]:
    out = {}
    for line in text.splitlines():
        if line and not line.startswith("#"):
            name, value = line.rsplit(" ", 1)
            out[name] = float(value)
    return out


def metrics(url: str) -> dict[str, float]:
    return parse_metrics(httpx.get(f"{url}/metrics", timeout=10).text)


async def ametrics(url: str) -> dict[str, float]:
    async with httpx.AsyncClient(timeout=10) as http:
        return parse_metrics((await http.get(f"{url}/metrics")).text)


def _idle_state(m: dict[str, float]) -> tuple[float, ...]:
    live = sum(v for k, v in m.items() if k.startswith("dreamrt_sessions{"))
    free = m["dreamrt_kv_slabs_capacity"] - m["dreamrt_kv_slabs_free"]
    return (
        m["dreamrt_engine_running_loops"],
        m["dreamrt_scheduler_queue_depth"],
        m["dreamrt_server_tasks"],
        live,
        free,
    )


def wait_idle(url: str, timeout_s: float = 15.0) -> dict[str, float]:
    """Polls /metrics until nothing of any session is left; returns the last reading."""
    deadline = time.monotonic() + timeout_s
    while any(busy := _idle_state(m := metrics(url))):
        if time.monotonic() > deadline:
            raise AssertionError(
                f"not idle after {timeout_s} s: "
                f"(loops, queue, tasks, sessions, slabs used) = {busy}"
            )
        time.sleep(0.1)
    return m


async def await_idle(url: str, timeout_s: float = 15.0) -> dict[str, float]:
    """``wait_idle`` without blocking the test's event loop."""
    deadline = time.monotonic() + timeout_s
    while any(busy := _idle_state(m := await ametrics(url))):
        if time.monotonic() > deadline:
            raise AssertionError(
                f"not idle after {timeout_s} s: "
                f"(loops, queue, tasks, sessions, slabs used) = {busy}"
            )
        await asyncio.sleep(0.1)
    return m


def start_server(tmp: Path, name: str, *extra: str) -> ServerProcess:
    # pinned: the geometry asserted here is wan-tiny-random's, not the default card's
    return ServerProcess(
        tmp / name / "data",
        tmp / name / "server.log",
        extra_args=("--model", "wan-tiny-random", *extra),
    ).start()


def stop_server(server: ServerProcess) -> None:
    server.stop(timeout_s=20.0)
    log = server.log_path.read_text(errors="replace")
    assert "dreamrt stopped" in log, log[-3000:]
    assert "Traceback" not in log, log[-6000:]


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    srv = start_server(
        tmp_path_factory.mktemp("e2e"), "main", "--deterministic", "--max-sessions", "4"
    )
    yield srv
    stop_server(srv)


@pytest.fixture
async def api(server: ServerProcess) -> AsyncIterator[DreamrtClient]:
    async with DreamrtClient(server.url) as client:
        yield client
    wait_idle(server.url)


def chunk_digests(viewer: Viewer) -> dict[int, str]:
    return {e["chunk"]: e["digest"] for e in viewer.events if e["type"] == "media.chunk"}


def index_of(viewer: Viewer, predicate: Any) -> int:
    return next(i for i, e in enumerate(viewer.events) if predicate(e))


async def wait_chunk(viewer: Viewer, chunk: int, timeout_s: float = 60.0) -> None:
    await viewer.wait_event(lambda e: e["type"] == "media.chunk" and e["chunk"] >= chunk, timeout_s)


async def next_fresh_frames(
    viewer: Viewer, count: int, timeout_s: float = 60.0
) -> list[ReceivedFrame]:
    """The next ``count`` fresh frames ``viewer`` receives from now on. The stream going on is
    the claim, whatever the pace of a loaded machine: ``timeout_s`` only bounds a stuck one."""
    start = len(viewer.fresh_frames())
    deadline = time.monotonic() + timeout_s
    while len(fresh := viewer.fresh_frames()) < start + count:
        if time.monotonic() > deadline:
            raise TimeoutError(f"{len(fresh) - start} of {count} fresh frames in {timeout_s} s")
        await asyncio.sleep(0.05)
    return fresh[start : start + count]


def assert_contiguous(frames: list[ReceivedFrame], fps: int) -> None:
    """Each fresh frame is the next one of the media timeline: PTS one frame interval apart,
    none skipped and none repeated (stall repeats are not fresh frames)."""
    steps = {b.pts - a.pts for a, b in itertools.pairwise(frames)}
    assert steps == {90_000 // fps}, f"PTS steps between fresh frames: {sorted(steps)}"


# ---------------------------------------------------------------------------------------------
# streaming


async def test_session_streams_fresh_frames_with_strictly_increasing_pts(
    api: DreamrtClient,
) -> None:
    # The frame rate is a benchmark's number (infra/bench): here, the frames of three chunks
    # arrive, decode, and step one frame interval apart on the media timeline.
    viewer = Viewer(api, keep_rgb=True)
    try:
        await viewer.connect("a lighthouse in a storm", seed=11)
        assert viewer.profile == {"fps": FPS, "width": 64, "height": 64}
        await viewer.wait_first_frame()
        await viewer.wait_event(lambda e: e["type"] == "session.state" and e["state"] == "live")
        await next_fresh_frames(viewer, FIRST_CHUNK_FRAMES + 2 * CHUNK_FRAMES)
        status = await api.session(viewer.session_id)
    finally:
        await viewer.close()
    pts = [f.pts for f in viewer.frames]
    assert all(b > a for a, b in itertools.pairwise(pts)), "PTS must be strictly increasing"
    fresh = viewer.fresh_frames()
    assert fresh[0].pts == 0 and {b.pts - a.pts for a, b in itertools.pairwise(fresh)} == {
        90_000 // FPS
    }
    assert all(f.rgb is not None and f.rgb.shape == (64, 64, 3) for f in viewer.frames)
    assert len({f.rgb.tobytes() for f in fresh[:20]}) > 10, (
        "decoded frames should be distinct pictures"
    )
    assert status["state"] == "live" and status["fps_measured"] > 0
    assert status["frames_sent"] >= len(viewer.frames)


# ---------------------------------------------------------------------------------------------
# live inputs: two-phase acknowledgement, and frames before/after vs a same-seed run


async def run_against_baseline(
    api: DreamrtClient, seed: int, make_input: Any, kind: str, applied_type: str
) -> tuple[Viewer, Viewer, dict[str, Any]]:
    """Two same-seed sessions; ``make_input(viewer)`` is applied to the second after chunk 0.
    Returns both viewers (closed) and the ``*.applied`` event."""
    baseline, variant = Viewer(api), Viewer(api, keep_rgb=True)
    try:
        await asyncio.gather(
            baseline.connect("a river in a canyon", seed=seed),
            variant.connect("a river in a canyon", seed=seed),
        )
        await wait_chunk(variant, 0)
        mark = len(variant.events)
        seq = await make_input(variant)
        received = await variant.wait_event(
            lambda e: e["type"] == "input.received" and e["kind"] == kind, start=mark
        )
        if seq is not None:
            assert received["seq"] == seq
        applied = await variant.wait_event(
            lambda e: e["type"] == applied_type and e["seq"] == received["seq"], start=mark
        )
        assert index_of(variant, lambda e: e is received) < index_of(
            variant, lambda e: e is applied
        )
        await asyncio.gather(
            wait_chunk(variant, applied["chunk"] + 1), wait_chunk(baseline, applied["chunk"] + 1)
        )
        deadline = time.monotonic() + 20
        while (
            max(f.pts for f in variant.frames) < applied["pts"] + 90_000 // FPS
            and time.monotonic() < deadline
        ):
            await asyncio.sleep(0.1)
    finally:
        await asyncio.gather(baseline.close(), variant.close())
    return baseline, variant, applied


def assert_changed_from(baseline: Viewer, variant: Viewer, applied: dict[str, Any]) -> None:
    k = applied["chunk"]
    a, b = chunk_digests(baseline), chunk_digests(variant)
    assert k >= 1, (
        f"the input cannot apply before chunk 1 (it was sent after chunk 0), got {applied}"
    )
    assert all(a[c] == b[c] for c in range(k)), f"chunks before {k} must be identical: {a} vs {b}"
    assert a[k] != b[k] and a[k + 1] != b[k + 1], f"chunks from {k} on must differ: {a} vs {b}"
    media = next(e for e in variant.events if e["type"] == "media.chunk" and e["chunk"] == k)
    assert applied["pts"] == media["pts_start"]
    after = [f for f in variant.frames if f.pts >= applied["pts"]]
    assert after and all(f.rgb.shape == (64, 64, 3) for f in after), (
        "client must decode frames past the change"
    )


async def test_prompt_over_the_data_channel_is_acked_twice_and_changes_frames_from_its_chunk(
    api: DreamrtClient,
) -> None:
    async def send_prompt(viewer: Viewer) -> None:
        viewer.send({"type": "prompt", "text": "a city at night"})

    baseline, variant, applied = await run_against_baseline(
        api, 21, send_prompt, "prompt", "prompt.applied"
    )
    assert applied["mode"] == "switch" and applied["text"] == "a city at night"
    assert_changed_from(baseline, variant, applied)


async def test_action_over_the_data_channel_is_acked_twice_and_changes_frames_from_its_chunk(
    api: DreamrtClient,
) -> None:
    async def send_action(viewer: Viewer) -> None:
        viewer.send({"type": "action", "keys": ["w", "a"], "mouse": [30, -10]})

    baseline, variant, applied = await run_against_baseline(
        api, 22, send_action, "action", "action.applied"
    )
    assert_changed_from(baseline, variant, applied)


def wav_48k_stereo(seconds: float) -> bytes:
    t = np.arange(int(48_000 * seconds)) / 48_000
    tone = (0.6 * np.sin(2 * np.pi * 330 * t) * 32767).astype("<i2")
    buf = io.BytesIO()
    with wave.open(buf, "wb") as w:
        w.setnchannels(2)
        w.setsampwidth(2)
        w.setframerate(48_000)
        w.writeframes(np.repeat(tone[:, None], 2, axis=1).tobytes())
    return buf.getvalue()


async def test_audio_through_rest_reaches_the_loop_and_changes_frames(api: DreamrtClient) -> None:
    async def post_audio(viewer: Viewer) -> int:
        answer = await api.audio(viewer.session_id, wav_48k_stereo(1.5), "audio/wav")
        assert answer["seconds"] == pytest.approx(1.5, abs=1e-3)
        return answer["seq"]

    baseline, variant, applied = await run_against_baseline(
        api, 23, post_audio, "audio", "audio.applied"
    )
    assert_changed_from(baseline, variant, applied)


async def test_sse_follows_the_same_ordered_stream_as_the_data_channel(
    api: DreamrtClient, server: ServerProcess
) -> None:
    viewer = Viewer(api)
    sse_events: list[tuple[int, str]] = []

    async def follow_sse(session_id: str) -> None:
        async with (
            httpx.AsyncClient(base_url=server.url, timeout=None) as http,
            http.stream("GET", f"/v1/sessions/{session_id}/events") as response,
        ):
            assert response.headers["content-type"].startswith("text/event-stream")
            event_id = None
            async for line in response.aiter_lines():
                if line.startswith("id: "):
                    event_id = int(line[4:])
                elif line.startswith("event: "):
                    sse_events.append((event_id, line[7:]))

    try:
        await viewer.connect("a glacier", seed=8)
        reader = asyncio.create_task(follow_sse(viewer.session_id))
        await viewer.wait_first_frame()
        viewer.send({"type": "prompt", "text": "a glacier at night"})
        await viewer.wait_event(lambda e: e["type"] == "prompt.applied")
        await api.delete_session(viewer.session_id)
        await asyncio.wait_for(reader, 10)  # the stream ends when the session ends
    finally:
        await viewer.close(delete=False)
    over_channel = [(e["event_id"], e["type"]) for e in viewer.events]
    assert [i for i, _ in sse_events] == list(range(1, len(sse_events) + 1))
    assert sse_events[-1] == (sse_events[-1][0], "session.state")
    # the data channel subscribed when the offer arrived: it carries the same events from there on
    assert over_channel == sse_events[len(sse_events) - len(over_channel) :]
    types = [t for _, t in sse_events]
    assert types.index("input.received") < types.index("prompt.applied") and "media.chunk" in types


class ToneTrack(MediaStreamTrack):
    """A 48 kHz stereo 440 Hz tone in 20 ms frames, paced in real time (a stand-in microphone)."""

    kind = "audio"

    def __init__(self) -> None:
        super().__init__()
        self._sent = 0
        self._start: float | None = None

    async def recv(self) -> av.AudioFrame:
        samples = 960
        if self._start is None:
            self._start = time.monotonic()
        await asyncio.sleep(max(0.0, self._start + self._sent / 48_000 - time.monotonic()))
        t = (self._sent + np.arange(samples)) / 48_000
        tone = (0.5 * np.sin(2 * np.pi * 440 * t) * 32767).astype("<i2")
        frame = av.AudioFrame.from_ndarray(
            np.repeat(tone, 2)[None, :], format="s16", layout="stereo"
        )
        frame.sample_rate, frame.pts, frame.time_base = (
            48_000,
            self._sent,
            fractions.Fraction(1, 48_000),
        )
        self._sent += samples
        return frame


async def test_audio_sent_on_the_peer_connection_reaches_the_loop(api: DreamrtClient) -> None:
    microphone = ToneTrack()
    viewer = Viewer(api, audio_track=microphone)
    try:
        await viewer.connect("a drum circle", seed=31)
        received = await viewer.wait_event(
            lambda e: e["type"] == "input.received" and e["kind"] == "audio"
        )
        applied = await viewer.wait_event(
            lambda e: e["type"] == "audio.applied" and e["seq"] == received["seq"]
        )
        status = await api.session(viewer.session_id)
    finally:
        microphone.stop()
        await viewer.close()
    assert applied["chunk"] >= 1 and status["audio_seconds_in"] >= 0.5


# ---------------------------------------------------------------------------------------------
# errors


async def test_malformed_offer_is_400_and_malformed_control_messages_are_error_events(
    api: DreamrtClient, server: ServerProcess
) -> None:
    created = await api.create_session("a meadow", seed=5)
    session_id = created["id"]
    with pytest.raises(ApiCallError) as bad_sdp:
        await api.offer(session_id, "v=0\r\nthis is not an SDP offer\r\nm=video")
    assert bad_sdp.value.status == 400 and bad_sdp.value.code == "bad_offer"
    auth = {"Authorization": f"Bearer {created['token']}"}
    async with httpx.AsyncClient(base_url=server.url) as http:
        no_video = await http.post(
            f"/v1/sessions/{session_id}/offer",
            json={"sdp": "v=0\r\n", "type": "offer"},
            headers=auth,
        )
        wrong_type = await http.post(
            f"/v1/sessions/{session_id}/offer", json={"sdp": "v=0", "type": "answer"}, headers=auth
        )
    assert no_video.status_code == 400 and "video" in no_video.json()["detail"]
    assert wrong_type.status_code == 422 and wrong_type.json()["detail"][0]["loc"] == [
        "body",
        "type",
    ]
    assert (await api.session(session_id))[
        "state"
    ] == "created"  # the failed offers changed nothing

    viewer = Viewer(api)
    try:
        await viewer.connect(session_id=session_id)
        await viewer.wait_first_frame()
        mark = len(viewer.events)
        viewer.send_raw("not json at all")
        viewer.send({"type": "prompt", "text": 42})
        viewer.send({"type": "teleport", "to": "mars"})
        viewer.send({"type": "action", "keys": ["w", "no-such-key"]})
        viewer.send_raw('{"type": "prompt", "text": "' + "x" * 17_000 + '"}')
        deadline = time.monotonic() + 10
        while len(errors := [e for e in viewer.events[mark:] if e["type"] == "error"]) < 5:
            assert time.monotonic() < deadline, f"expected 5 error events, got {errors}"
            await asyncio.sleep(0.05)
        codes = [e["code"] for e in errors]
        assert codes == [
            "invalid_json",
            "invalid_message",
            "invalid_message",
            "rejected",
            "message_too_large",
        ]
        assert "$.text" in errors[1]["message"] and "no-such-key" in errors[3]["message"]
        frames_before = len(viewer.frames)
        viewer.send({"type": "prompt", "text": "a meadow in the rain"})
        ok = await viewer.wait_event(lambda e: e["type"] == "input.received", start=mark)
        viewer.send({"type": "ping", "t": 123.5})
        pong = await viewer.wait_event(lambda e: e["type"] == "pong", start=mark)
        viewer.send({"type": "feedback", "rating": 1, "note": "pretty"})
        recorded = await viewer.wait_event(lambda e: e["type"] == "feedback.recorded", start=mark)
        flood = len(viewer.events)
        for i in range(100):  # beyond the 30/s rate with a burst of 60
            viewer.send({"type": "ping", "t": i})
        limited = await viewer.wait_event(
            lambda e: e["type"] == "error" and e["code"] == "rate_limited", start=flood
        )
        await asyncio.sleep(1.0)
        status = await api.session(session_id)
    finally:
        await viewer.close(delete=False)
        await api.delete_session(session_id)
    assert ok["kind"] == "prompt" and pong["t"] == 123.5
    assert recorded["rating"] == 1 and recorded["feedback_id"] >= 1
    assert "per second" in limited["message"]
    assert status["state"] == "live" and len(viewer.frames) > frames_before, (
        "the session must keep streaming"
    )


# ---------------------------------------------------------------------------------------------
# lifecycle


async def test_delete_during_a_step_returns_the_kv_slab_and_leaves_no_task(
    api: DreamrtClient, server: ServerProcess
) -> None:
    viewer = Viewer(api)
    await viewer.connect("a volcano", seed=3)
    try:
        await viewer.wait_first_frame()
        during = await ametrics(server.url)
        assert during["dreamrt_kv_slabs_free"] == during["dreamrt_kv_slabs_capacity"] - 1
        deadline = time.monotonic() + 20
        while (await ametrics(server.url))[
            "dreamrt_engine_executing"
        ] != 1:  # a plan of this session is running
            assert time.monotonic() < deadline, "the session never executed a plan"
            await asyncio.sleep(0.005)
        await api.delete_session(viewer.session_id)
        await api.delete_session(viewer.session_id)  # idempotent
        after = await await_idle(server.url, timeout_s=10)
        status = await api.session(viewer.session_id)
    finally:
        await viewer.close(delete=False)
    assert after["dreamrt_kv_slabs_free"] == after["dreamrt_kv_slabs_capacity"]
    assert status["state"] == "closed"
    states = [e["state"] for e in viewer.events if e["type"] == "session.state"]
    assert states[-2:] == ["closing", "closed"]


async def test_a_viewer_that_leaves_pauses_the_session_and_a_new_offer_resumes_it(
    api: DreamrtClient,
) -> None:
    first = Viewer(api)
    await first.connect("a harbour", seed=12)
    session_id = first.session_id
    try:
        await wait_chunk(first, 1)
        await first.close(delete=False)
        await asyncio.sleep(0.3)
        paused = await api.session(session_id)
        second = Viewer(api)
        try:
            await second.connect(session_id=session_id)
            await second.wait_first_frame()
            chunks_before = paused["chunks"]
            await wait_chunk(second, chunks_before + 1)
            resumed = await api.session(session_id)
        finally:
            await second.close(delete=False)
    finally:
        await api.delete_session(session_id)
    assert paused["state"] == "paused"
    assert resumed["state"] == "live" and resumed["chunks"] > chunks_before
    states = [e["state"] for e in second.events if e["type"] == "session.state"]
    assert states[:2] == ["negotiating", "live"]
    digests = chunk_digests(first) | chunk_digests(second)
    assert sorted(digests) == list(range(len(digests))), "generation continued where it paused"


async def test_two_sessions_keep_streaming_while_a_t2v_job_completes(
    api: DreamrtClient, tmp_path: Path
) -> None:
    # Their fps beside a job is the multisession benchmark's number; here, both streams go on
    # without a skipped frame while the job runs, and the job's artifact decodes.
    viewers = [Viewer(api), Viewer(api)]
    try:
        await asyncio.gather(*(v.connect(f"scene {i}", seed=40 + i) for i, v in enumerate(viewers)))
        await asyncio.gather(*(v.wait_first_frame() for v in viewers))
        job_id = await api.submit_job("t2v", "a red kite over a beach", num_frames=21, seed=9)
        deadline = time.monotonic() + 60
        while (job := await api.job(job_id))["state"] == "queued":
            assert time.monotonic() < deadline, f"job did not start: {job}"
            await asyncio.sleep(0.05)
        during = await asyncio.gather(*(next_fresh_frames(v, CHUNK_FRAMES) for v in viewers))
        while (job := await api.job(job_id))["state"] not in ("succeeded", "failed"):
            assert time.monotonic() < deadline, f"job did not finish: {job}"
            await asyncio.sleep(0.2)
        after = await asyncio.gather(*(next_fresh_frames(v, CHUNK_FRAMES) for v in viewers))
        states = [(await api.session(v.session_id))["state"] for v in viewers]
        media_type, size = await api.download_artifact(job_id, tmp_path / "job.mp4")
    finally:
        await asyncio.gather(*(v.close() for v in viewers))
    assert job["state"] == "succeeded", job
    assert states == ["live", "live"]
    for frames in (*during, *after):
        assert_contiguous(frames, FPS)
    assert media_type == "video/mp4" and size > 0
    with av.open(str(tmp_path / "job.mp4")) as container:
        assert sum(1 for _ in container.decode(video=0)) == 21


@pytest.fixture(scope="module")
def small_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    srv = start_server(tmp_path_factory.mktemp("e2e-small"), "small", "--max-sessions", "1")
    yield srv
    stop_server(srv)


async def test_admission_beyond_capacity_is_503_with_retry_after(
    small_server: ServerProcess,
) -> None:
    url = small_server.url
    async with httpx.AsyncClient(base_url=url) as http:
        first = await http.post("/v1/sessions", json={"prompt": "one"})
        assert first.status_code == 201
        refused = await http.post("/v1/sessions", json={"prompt": "two"})
        assert refused.status_code == 503
        assert int(refused.headers["Retry-After"]) >= 1
        assert refused.json()["code"] == "capacity" and refused.json()["reason"] == "kv_slabs"
        assert (await http.delete(f"/v1/sessions/{first.json()['id']}")).status_code == 204
        again = await http.post("/v1/sessions", json={"prompt": "three"})
        assert again.status_code == 201
        assert (await http.delete(f"/v1/sessions/{again.json()['id']}")).status_code == 204
    m = await await_idle(url)
    assert m['dreamrt_admission_rejections_total{reason="kv_slabs"}'] == 1


def test_dreamrt_watch_and_job_commands_work_against_the_server(
    small_server: ServerProcess, tmp_path: Path
) -> None:
    out = tmp_path / "a.mp4"
    watch = subprocess.run(
        [
            sys.executable,
            "-m",
            "server",
            "watch",
            small_server.url,
            "--seconds",
            "3",
            "--out",
            str(out),
            "--action",
            "w",
            "--ice-host",
            "127.0.0.1",
        ],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert watch.returncode == 0, watch.stderr[-3000:]
    summary = re.search(
        r"received (\d+) fresh frames in 3 s \(([\d.]+) fps, target 8\), (\d+) stalls", watch.stdout
    )
    assert summary is not None, watch.stdout
    fresh = int(summary.group(1))
    assert fresh > 0, watch.stdout  # the rate it prints is the user's number, not this test's
    with av.open(str(out)) as container:  # every received frame, decodable
        assert sum(1 for _ in container.decode(video=0)) >= fresh
    png = tmp_path / "cat.png"
    job = subprocess.run(
        [
            sys.executable,
            "-m",
            "server",
            "job",
            small_server.url,
            "--task",
            "t2i",
            "--prompt",
            "a cat",
            "--out",
            str(png),
        ],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert job.returncode == 0, job.stderr[-3000:]
    assert "succeeded" in job.stdout and png.stat().st_size > 0
    wait_idle(small_server.url)


async def _whep_player(
    url: str, *, data_channel: bool
) -> tuple[RTCPeerConnection, Any, httpx.Response, Any]:
    """A WHEP player on aiortc: POSTs a receive-only offer to ``url``, applies the answer;
    returns the peer, its data channel, the 201 and the video track."""
    pc = RTCPeerConnection(RTCConfiguration(iceServers=[]))
    pc.addTransceiver("video", direction="recvonly")
    channel = pc.createDataChannel("control") if data_channel else None
    await pc.setLocalDescription(await pc.createOffer())  # aiortc: candidates gathered
    async with httpx.AsyncClient(timeout=30) as http:
        answer = await http.post(
            url, content=pc.localDescription.sdp, headers={"Content-Type": "application/sdp"}
        )
    assert answer.status_code == 201, answer.text
    video: asyncio.Future = asyncio.get_running_loop().create_future()
    pc.on("track", lambda track: video.done() or video.set_result(track))
    await pc.setRemoteDescription(RTCSessionDescription(answer.text, "answer"))
    return pc, channel, answer, await asyncio.wait_for(video, 30)


async def test_a_whep_player_plays_steers_and_delete_ends_its_session(
    server: ServerProcess, api: DreamrtClient
) -> None:
    pc, channel, answer, track = await _whep_player(
        f"{server.url}/whep/wan-tiny-random?prompt=a%20lighthouse&seed=5", data_channel=True
    )
    try:
        session_id = answer.headers["dreamrt-session-id"]
        frames = [await asyncio.wait_for(track.recv(), 30) for _ in range(FIRST_CHUNK_FRAMES)]
        assert [f.pts for f in frames] == sorted({f.pts for f in frames})
        view = await api.session(session_id)
        assert (view["prompt"], view["state"]) == ("a lighthouse", "live")
        # the offer's data channel carries the control protocol
        pongs: asyncio.Queue = asyncio.Queue()
        channel.on(
            "message", lambda m: (e := json.loads(m))["type"] == "pong" and pongs.put_nowait(e)
        )
        while channel.readyState != "open":
            await asyncio.sleep(0.02)
        channel.send(json.dumps({"type": "ping", "t": 41}))
        assert (await asyncio.wait_for(pongs.get(), 10))["t"] == 41
        async with httpx.AsyncClient(base_url=server.url, timeout=30) as http:
            assert (await http.delete(answer.headers["location"])).status_code == 200
            # DELETE has answered: the session WHEP made and its viewer are gone already
            assert (await api.session(session_id))["state"] == "closed"
            assert parse_metrics((await http.get("/metrics")).text)["dreamrt_webrtc_peers"] == 0
    finally:
        await pc.close()


async def test_a_whep_player_gone_without_delete_ends_its_session(
    server: ServerProcess, api: DreamrtClient
) -> None:
    pc, _, answer, track = await _whep_player(
        f"{server.url}/whep/wan-tiny-random", data_channel=False
    )
    await asyncio.wait_for(track.recv(), 30)
    await pc.close()  # no DELETE: the server sees the peer connection close
    session_id = answer.headers["dreamrt-session-id"]

    async def closed() -> None:
        while (await api.session(session_id))["state"] != "closed":
            await asyncio.sleep(0.1)

    await asyncio.wait_for(closed(), 20)
