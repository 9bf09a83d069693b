"""The bench's simulated viewer: paced playout, stalls, re-anchoring, slack and input latency
(real time at 50 fps, with margins wide enough for a loaded machine)."""

from __future__ import annotations

import asyncio

import numpy as np

from infra.bench.sim_viewer import SimViewer
from runtime.contract import (
    AppliedMeta,
    Emission,
    EmitSpec,
    InputKind,
    MediaMeta,
    PromptInput,
    Stream,
    pts_of_frame,
)

FPS = 50


def media(chunk: int, frame_start: int, n: int) -> Emission:
    meta = MediaMeta(
        chunk=chunk,
        segment=0,
        frame_start=frame_start,
        pts_90k=pts_of_frame(frame_start, FPS),
        num_frames=n,
        fps=FPS,
    )
    return Emission(EmitSpec(Stream.MEDIA, meta), np.zeros((n, 2, 2, 3), np.uint8))


class Handle:
    def __init__(self) -> None:
        self.inputs: list = []

    def push_input(self, event) -> None:
        self.inputs.append(event)


async def test_playout_counts_a_stall_and_reanchors_after_it() -> None:
    anchors: list[float] = []
    viewer = SimViewer(FPS, on_anchor=anchors.append)
    stop = asyncio.Event()
    task = asyncio.create_task(viewer.run(stop))
    loop = asyncio.get_running_loop()
    start = loop.time()
    viewer.on_emit(media(0, 0, 5))  # 100 ms of frames
    await asyncio.sleep(0.4)  # nothing for 300 ms after they ran out: one stall
    handle = Handle()
    viewer.push(handle, InputKind.PROMPT, PromptInput(text="b"))
    await asyncio.sleep(0.05)
    viewer.on_emit(media(1, 5, 5))
    seq = handle.inputs[0].seq
    viewer.on_emit(
        Emission(
            EmitSpec(
                Stream.APPLIED,
                AppliedMeta(kind=InputKind.PROMPT, seq=seq, chunk=1, pts_90k=pts_of_frame(5, FPS)),
            ),
            None,
        )
    )
    await asyncio.sleep(0.3)
    stop.set()
    await task
    end = loop.time()
    summary = viewer.summary(start, end)
    assert summary["fresh_frames"] == 10
    # the gap, and the end (nothing after chunk 1)
    assert summary["stalls"] == 2 and summary["repeats"] >= 10
    assert len(anchors) == 2  # the first frame, then the first fresh frame after the stall
    assert anchors[1] - anchors[0] > 0.2
    # frames of a chunk leave one slot apart; the stall shows as one long interval
    assert 15 <= summary["interval_ms"]["p50"] <= 40
    assert summary["interval_ms"]["p99"] > 250
    assert summary["slack_ms"]["n"] == 1 and summary["slack_ms"]["min"] < -200  # chunk 1 late
    assert 0.04 <= summary["prompt_to_applied_s"] < 0.2
    assert summary["first_frame_s"] < 0.05 and 0 < summary["fps"] < FPS
