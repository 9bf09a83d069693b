"""The event-loop watchdog: a loop that stands still is logged with every thread's stack, and
its length is reported once the loop runs again."""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from typing import Any

import pytest

from server.ops.loop_watchdog import LoopWatchdog, thread_stacks


class FakeClock:
    """The watchdog's time: moves only when a test moves it (the loop and the watchdog thread
    still run on real time, so a test waits for what it expects, never for a duration)."""

    def __init__(self) -> None:
        self.now_s = 100.0

    def __call__(self) -> float:
        return self.now_s


def _hold_the_loop(clock: FakeClock, seconds: float, until: Any = None) -> None:
    """A blocking call on the loop (what a compile holding the GIL looks like): ``seconds``
    pass on the watchdog's clock, and the loop stays held until ``until()`` (if given)."""
    clock.now_s += seconds
    deadline = time.monotonic() + 30.0  # only bounds a watchdog that never looks
    while until is not None and not until():
        assert time.monotonic() < deadline, "the watchdog thread never saw the stall"
        time.sleep(0.01)


def test_a_stall_is_logged_with_the_stacks_and_its_length_reported(caplog) -> None:
    stalls: list[float] = []
    clock = FakeClock()

    async def main() -> LoopWatchdog:
        dog = LoopWatchdog(threshold_s=0.2, interval_s=0.02, on_stall=stalls.append, clock=clock)
        dog.start()
        await asyncio.sleep(0.1)  # beats run: no stall yet
        assert stalls == []
        warned = lambda: any("what the threads are doing" in r.message for r in caplog.records)  # noqa: E731
        _hold_the_loop(clock, 0.5, until=warned)
        await asyncio.sleep(0.1)  # the next beat sees the gap
        dog.close()
        return dog

    with caplog.at_level(logging.WARNING, logger="server.ops.loop_watchdog"):
        dog = asyncio.run(main())
    assert stalls == [0.5]  # the whole hold, on the watchdog's clock
    assert dog.stalls == 1 and dog.longest_s == 0.5
    stacked = [r.getMessage() for r in caplog.records if "what the threads are doing" in r.message]
    assert len(stacked) == 1  # one warning per stall, not one per check
    assert "_hold_the_loop" in stacked[0]  # the frame that held the loop is named


def test_a_busy_but_responsive_loop_reports_nothing(caplog) -> None:
    stalls: list[float] = []
    clock = FakeClock()

    async def main() -> None:
        dog = LoopWatchdog(threshold_s=0.3, interval_s=0.02, on_stall=stalls.append, clock=clock)
        dog.start()
        for _ in range(20):
            _hold_the_loop(clock, 0.02)  # short blocking pieces, the loop runs between them
            await asyncio.sleep(0.03)  # past the beat's interval: it beats between the pieces
        dog.close()

    with caplog.at_level(logging.WARNING, logger="server.ops.loop_watchdog"):
        asyncio.run(main())
    assert stalls == [] and not caplog.records


def test_thread_stacks_name_other_threads() -> None:
    release = threading.Event()
    worker = threading.Thread(target=release.wait, name="executor-under-test", daemon=True)
    worker.start()
    try:
        text = thread_stacks()
    finally:
        release.set()
        worker.join()
    assert "--- executor-under-test" in text and "--- MainThread" in text


def test_the_threshold_must_exceed_the_beat() -> None:
    with pytest.raises(ValueError):
        LoopWatchdog(threshold_s=0.05, interval_s=0.1)


def test_a_reported_stall_lands_in_the_metrics() -> None:
    from server.ops.metrics import MetricsSnapshot, ServerMetrics

    metrics = ServerMetrics(lambda: MetricsSnapshot())
    metrics.loop_stalled(0.7)
    metrics.loop_stalled(3.0)
    text = metrics.render().decode()
    assert "dreamrt_event_loop_stall_seconds_count 2.0" in text
    assert 'dreamrt_event_loop_stall_seconds_bucket{le="1.0"} 1.0' in text
