"""The event-loop watchdog: a loop that stands still is logged with every thread's stack, and
its length is reported once the loop runs again."""

from __future__ import annotations

import asyncio
import logging
import threading
import time

import pytest

from server.loop_watchdog import LoopWatchdog, thread_stacks


def _hold_the_loop(seconds: float) -> None:
    time.sleep(seconds)  # a blocking call on the loop: what a compile holding the GIL looks like


def test_a_stall_is_logged_with_the_stacks_and_its_length_reported(caplog) -> None:
    stalls: list[float] = []

    async def main() -> LoopWatchdog:
        dog = LoopWatchdog(threshold_s=0.2, interval_s=0.02, on_stall=stalls.append)
        dog.start()
        await asyncio.sleep(0.1)  # beats run: no stall yet
        assert stalls == []
        _hold_the_loop(0.5)
        await asyncio.sleep(0.1)  # the next beat sees the gap
        dog.close()
        return dog

    with caplog.at_level(logging.WARNING, logger="server.loop_watchdog"):
        dog = asyncio.run(main())
    assert len(stalls) == 1 and 0.45 <= stalls[0] < 2.0
    assert dog.stalls == 1 and dog.longest_s == stalls[0]
    stacked = [r.getMessage() for r in caplog.records if "what the threads are doing" in r.message]
    assert len(stacked) == 1  # one warning per stall, not one per check
    assert "_hold_the_loop" in stacked[0]  # the frame that held the loop is named


def test_a_busy_but_responsive_loop_reports_nothing(caplog) -> None:
    stalls: list[float] = []

    async def main() -> None:
        dog = LoopWatchdog(threshold_s=0.3, interval_s=0.02, on_stall=stalls.append)
        dog.start()
        for _ in range(20):
            _hold_the_loop(0.02)  # short blocking pieces, the loop runs between them
            await asyncio.sleep(0)
        dog.close()

    with caplog.at_level(logging.WARNING, logger="server.loop_watchdog"):
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
    from server.metrics import MetricsSnapshot, ServerMetrics

    metrics = ServerMetrics(lambda: MetricsSnapshot())
    metrics.loop_stalled(0.7)
    metrics.loop_stalled(3.0)
    text = metrics.render().decode()
    assert "dreamrt_event_loop_stall_seconds_count 2.0" in text
    assert 'dreamrt_event_loop_stall_seconds_bucket{le="1.0"} 1.0' in text
