"""The engine's counters since start (``EngineCounters``) and their snapshot (``EngineStats``).

``EngineCounters`` is the engine's own ``BatchListener``: it counts from the same
``BatchReport`` every other listener (metrics) hears, so ``Engine.stats()`` and the exported
totals agree. Totals are unbounded integers; only the per-kind latency samples are a bounded
window (the most recent ``samples_per_kind`` batch times, for quick medians).
"""

from __future__ import annotations

from collections import Counter, deque
from collections.abc import Mapping
from dataclasses import dataclass

from runtime.observers import BatchReport

__all__ = ["EngineCounters", "EngineStats"]


@dataclass(frozen=True, slots=True)
class EngineStats:
    """Counters since start. ``latency_samples_s``: per plan kind, recent batch wall times."""

    queue_depth: int
    running_loops: int
    paused_loops: int
    executing: bool
    plans_executed: int
    batches_executed: int
    deadline_misses: int
    deadlines_met: int
    loops_succeeded: int
    loops_failed: int
    loops_cancelled: int
    latency_samples_s: Mapping[str, tuple[float, ...]]


class EngineCounters:
    """Batches, plans, deadlines and loop outcomes since start (event loop only)."""

    def __init__(self, samples_per_kind: int = 512) -> None:
        self._counts: Counter[str] = Counter()
        self._latency: dict[str, deque[float]] = {}
        self._samples_per_kind = samples_per_kind

    def batch_done(self, report: BatchReport) -> None:
        counts = self._counts
        counts["batches"] += 1
        counts["plans"] += len(report.step_wall_s)
        counts["missed"] += report.deadlines_missed
        counts["met"] += report.deadlines_met
        samples = self._latency.get(report.kind)
        if samples is None:
            samples = self._latency[report.kind] = deque(maxlen=self._samples_per_kind)
        samples.append(report.wall_s)

    def loop_ended(self, status: str) -> None:
        """A loop ended as ``status`` (``"succeeded"``, ``"failed"``, ``"cancelled"``)."""
        self._counts[status] += 1

    def snapshot(
        self, *, queue_depth: int, running_loops: int, paused_loops: int, executing: bool
    ) -> EngineStats:
        counts = self._counts
        return EngineStats(
            queue_depth=queue_depth,
            running_loops=running_loops,
            paused_loops=paused_loops,
            executing=executing,
            plans_executed=counts["plans"],
            batches_executed=counts["batches"],
            deadline_misses=counts["missed"],
            deadlines_met=counts["met"],
            loops_succeeded=counts["succeeded"],
            loops_failed=counts["failed"],
            loops_cancelled=counts["cancelled"],
            latency_samples_s={kind: tuple(s) for kind, s in sorted(self._latency.items())},
        )
