"""One PTS clock end to end, at frame rates that do not divide 90 kHz (7 fps: 12857.14 ticks a
frame) and that do (24 fps): the loop (chunk_rollout on the tiny Wan card through the real
engine), the session's media queue and records, the playout anchor and the paced video track
all give frame ``i`` the PTS ``pts_of_frame(i, fps)``; none of them adds a per-frame step."""

from __future__ import annotations

import asyncio

import pytest

from models import registry
from models.instance import load_instance
from models.loops.requests import SessionRequest
from runtime.contract import PTS_HZ, Emission, Priority, frame_of_pts, pts_of_frame
from runtime.cost import CostModel, DeviceConstants
from runtime.engine import Engine
from server.media.track import SessionVideoTrack
from sessions.session import Session, SessionConfig
from sessions.store import Store
from tests.server.test_media_track import FakeClock, pull
from tests.sessions.fakes import FakeHandle


@pytest.fixture(scope="module")
def instance():
    return load_instance(registry.get("wan-tiny-random"), device="cpu")


def test_frame_of_pts_inverts_pts_of_frame() -> None:
    for fps in (1, 7, 8, 12, 16, 24, 25, 30, 60):
        assert all(frame_of_pts(pts_of_frame(i, fps), fps) == i for i in range(5_000))


@pytest.mark.parametrize("fps", [7, 24])
async def test_loop_session_playout_and_track_share_one_pts_clock(
    instance, fps: int, tmp_path
) -> None:
    store = Store(tmp_path / "db.sqlite3")
    config = SessionConfig(
        session_id="s",
        model_id=instance.card.model_id,
        prompt="a kite",
        seed=1,
        fps=fps,
        width=64,
        height=64,
        priority_class="realtime",
        capabilities=frozenset({"prompt.switch"}),
        record_template={
            "weights_version": "random",
            "loop_id": "chunk_rollout",
            "sampler": "test",
            "steps": 4,
            "timesteps": [],
            "precision": "fp32",
        },
    )
    columns = ("session_id", "model_id", "prompt", "seed", "fps", "width", "height")
    store.add_session(
        **{c: getattr(config, c) for c in columns}, priority_class="realtime", state="created"
    )
    clock = FakeClock(50.0)
    session = Session(config, media_capacity_frames=128, store=store, clock=clock)
    handle = FakeHandle()  # the session stays open when the bounded loop below ends
    session.attach(handle)
    metas = []

    def on_emit(emission: Emission) -> None:
        if emission.spec.stream == "media":
            metas.append(emission.spec.meta)
        session.on_emission(emission)

    engine = Engine(cost=CostModel(DeviceConstants.cpu()))
    await engine.start()
    try:
        request = SessionRequest(
            prompt="a kite", seed=1, width=64, height=64, fps=fps, max_chunks=3
        )
        loop = engine.spawn(
            instance.loop("chunk_rollout"),
            request,
            instance,
            loop_id="s",
            priority=Priority.BATCH,
            on_emit=on_emit,
        )
        await asyncio.wait_for(loop.result(), 120)
    finally:
        await engine.close()
    await session.settle()
    # the loop: every part's PTS is its first frame's index through pts_of_frame
    assert [m.pts_90k for m in metas] == [pts_of_frame(m.frame_start, m.fps) for m in metas]
    total = metas[-1].frame_start + metas[-1].num_frames
    expected = [pts_of_frame(i, fps) for i in range(total)]
    # the session's media queue, then the track on the wire (paced on the fake clock)
    session.begin_negotiation()
    track = SessionVideoTrack(session, clock=clock, sleep=clock.sleep)
    got = await pull(track, clock, total)
    assert [pts for pts, _, _ in got] == expected
    # sent at anchor + pts (to the tick)
    assert all(abs(t - (50.0 + pts / PTS_HZ)) < 1 / PTS_HZ for (pts, _, t) in got)
    assert session.stalls == 0 and session.playout_anchor_s == 50.0
    # playout: a resume with nothing queued anchors at the frame after the last one generated
    session.pause()
    clock.now_s = 90.0
    session.resume()
    assert session.playout_anchor_s == 90.0 - pts_of_frame(total, fps) / PTS_HZ
    assert handle.calls[-2] == ("t0", round(90.0 - pts_of_frame(total, fps) / PTS_HZ, 6))
    # the records: each chunk's PTS range is that of its first and last frame
    await session.close()
    await store.run(lambda: None)
    chunks: dict[int, list[int]] = {}
    for m in metas:  # a chunk may come in parts
        chunks.setdefault(m.chunk, []).extend(range(m.frame_start, m.frame_start + m.num_frames))
    records = [(r["pts_start"], r["pts_end"], r["num_frames"]) for r in store.records("s")]
    assert records == [
        (pts_of_frame(f[0], fps), pts_of_frame(f[-1], fps), len(f)) for f in chunks.values()
    ]
    store.close()
