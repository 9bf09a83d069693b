"""The bench's simulated viewer: paced playout, stalls, re-anchoring, slack and input latency,
at 50 fps on virtual time (``tests.virtual_time``): every number is exact."""

from __future__ import annotations

import asyncio

import numpy as np
import pytest

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
from tests.virtual_time import run_virtual

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


def test_playout_counts_a_stall_and_reanchors_after_it() -> None:
    run_virtual(_stall_and_reanchor())


async def _stall_and_reanchor() -> None:
    anchors: list[float] = []
    viewer = SimViewer(FPS, on_anchor=anchors.append, clock=asyncio.get_running_loop().time)
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
    assert (start, end) == (0.0, pytest.approx(0.75))
    assert summary["fresh_frames"] == 10 and summary["fps"] == pytest.approx(10 / 0.75)
    # chunk 0's five frames at 0..80 ms, then repeats every 20 ms until chunk 1 (at 450 ms) is
    # shown at the next slot (460 ms), and repeats again after its last frame (540 ms): 18 + 10
    assert summary["stalls"] == 2 and summary["repeats"] == 28
    # the first frame, then the first fresh frame after the stall: 460 ms - frame 5's 100 ms
    assert anchors == [0.0, pytest.approx(0.36)]
    # frames of a chunk leave one slot apart; the stall shows as one long interval
    assert summary["interval_ms"]["p50"] == pytest.approx(20.0)
    assert summary["interval_ms"]["p99"] == pytest.approx(380.0)
    # chunk 1 arrived 350 ms after its frame 5 was due on the first anchor (100 ms)
    assert summary["slack_ms"] == {
        "min": pytest.approx(-350.0),
        "p5": pytest.approx(-350.0),
        "n": 1,
    }
    assert summary["prompt_to_applied_s"] == pytest.approx(0.05)  # pushed at 400, arrived 450
    assert summary["first_frame_s"] == 0.0
