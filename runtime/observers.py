"""Observers: read-only hooks around each executed batch (docs/architecture.md §3, "Failure
isolation").

The engine calls ``before_batch`` right before the op and ``after_batch`` right after it
returned (only when it returned; an op that raised is handled by failure isolation). Both run
on the executor thread. An engine without observers runs no hook code at all.

``after_batch`` may return an ``Observation``: per-plan ``faults`` fail those plans' loops
(the engine re-runs a faulted batch of several plans one by one first, like an exception),
``device_s`` is reported in ``StepResult.device_s``. Observers never change outputs.

A ``BatchListener`` is the engine-side counterpart: it hears each batch once, as the engine
accounted it (``BatchReport``: plans that succeeded and their step times, failures, deadlines
met and missed), on the event loop after the results went back to the loops. Metrics
(``server.ops.metrics``) count from it, so totals never depend on a bounded sample window.

- ``Profiler``: wall time per batch and, on CUDA, ``torch.cuda.Event`` time; feeds the cost
  model with the wall time (the executor's occupancy is what the scheduler budgets) and, for a
  batch whose outputs are ``TimedPendingOutput`` (a decode on a second CUDA stream), the
  device time of that asynchronous work once it is done (``CostModel.observe_async``):
  admission budgets all the GPU time a session costs, not only the part that held the
  executor. Keeps per-kind latency samples for median/p95 reporting (wall and asynchronous).
- ``NaNWatch``: scans each plan's output (tensors nested in lists, tuples, dicts, dataclasses,
  msgspec structs) for NaN/Inf in floating tensors; a hit is fault ``"nan"`` for that plan.
"""

from __future__ import annotations

import dataclasses
import math
import statistics
import threading
from collections import deque
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import msgspec

from runtime.cost import CostModel
from runtime.plans import TimedPendingOutput

__all__ = [
    "BatchInfo",
    "BatchListener",
    "BatchReport",
    "LatencySummary",
    "NaNWatch",
    "Observation",
    "Observer",
    "PlanFault",
    "Profiler",
]


@dataclass(frozen=True, slots=True)
class BatchInfo:
    """What observers know about a batch. ``solo_retry``: a one-plan re-run after the batch
    it belonged to failed. ``flops`` is summed over the plans."""

    batch_id: int
    kind: str
    shape_sig: str
    instance_id: str
    op_name: str
    plan_ids: tuple[int, ...]
    loop_ids: tuple[str, ...]
    flops: float = 0.0
    deterministic: bool = False
    solo_retry: bool = False

    @property
    def batch_size(self) -> int:
        return len(self.plan_ids)


@dataclass(frozen=True, slots=True)
class PlanFault:
    """Plan at position ``index`` of the batch failed with ``code`` (e.g. ``"nan"``)."""

    index: int
    code: str
    message: str


@dataclass(frozen=True, slots=True)
class Observation:
    faults: tuple[PlanFault, ...] = ()
    device_s: float | None = None


class Observer(Protocol):
    def before_batch(self, info: BatchInfo) -> None: ...

    def after_batch(
        self, info: BatchInfo, outputs: Sequence[object], wall_s: float
    ) -> Observation | None: ...


@dataclass(frozen=True, slots=True)
class BatchReport:
    """One executed batch as the engine accounted it. ``step_wall_s``: for each plan that
    succeeded, the wall time of the run that produced its output (seconds); ``failed``: plans
    that failed; deadlines of realtime plans that succeeded, ``met`` or ``missed``."""

    batch_id: int
    kind: str
    wall_s: float  # the whole job, solo re-runs included
    step_wall_s: tuple[float, ...]
    failed: int = 0
    deadlines_met: int = 0
    deadlines_missed: int = 0


class BatchListener(Protocol):
    """Hears every finished batch once, on the event loop; must not block. A listener that
    raises is logged and ignored."""

    def batch_done(self, report: BatchReport) -> None: ...


@dataclass(frozen=True, slots=True)
class LatencySummary:
    count: int
    median_s: float
    p95_s: float


def summarize(samples: Sequence[float]) -> LatencySummary:
    """Median and nearest-rank p95 of ``samples`` (NaN for an empty list)."""
    if not samples:
        return LatencySummary(0, math.nan, math.nan)
    ordered = sorted(samples)
    rank = max(0, math.ceil(0.95 * len(ordered)) - 1)
    return LatencySummary(len(ordered), statistics.median(ordered), ordered[rank])


class Profiler:
    """Times every batch; calibrates ``cost`` (if given) per (kind, shape_sig).

    ``use_cuda_events``: ``None`` = when CUDA is available. Event timing synchronises on the
    end event, so it adds one sync per batch; turn it off for pure throughput runs.
    """

    def __init__(
        self,
        cost: CostModel | None = None,
        *,
        max_samples_per_kind: int = 1024,
        use_cuda_events: bool | None = None,
    ) -> None:
        self.cost = cost
        self.max_samples_per_kind = max_samples_per_kind
        self._wall: dict[str, deque[float]] = {}
        self._device: dict[str, deque[float]] = {}
        self._lock = threading.Lock()
        self._use_cuda = use_cuda_events
        self._start_event: Any = None
        self._async: dict[str, deque[float]] = {}
        # batches whose asynchronous outputs are not done yet
        self._deferred: deque[tuple[BatchInfo, tuple[TimedPendingOutput, ...]]] = deque()

    def before_batch(self, info: BatchInfo) -> None:
        if self._cuda_enabled():
            import torch

            self._start_event = torch.cuda.Event(enable_timing=True)
            self._start_event.record()

    def after_batch(self, info: BatchInfo, outputs: Sequence[object], wall_s: float) -> Observation:
        device_s = None
        if self._start_event is not None:
            import torch

            end = torch.cuda.Event(enable_timing=True)
            end.record()
            end.synchronize()
            device_s = self._start_event.elapsed_time(end) / 1000.0
            self._start_event = None
        with self._lock:
            self._samples(self._wall, info.kind).append(wall_s)
            if device_s is not None:
                self._samples(self._device, info.kind).append(device_s)
        if self.cost is not None:
            self.cost.observe(info.kind, info.shape_sig, wall_s, batch_size=info.batch_size)
        timed = tuple(o for o in outputs if isinstance(o, TimedPendingOutput))
        if timed:
            self._deferred.append((info, timed))
        self.collect()
        return Observation(device_s=device_s)

    def collect(self) -> int:
        """Accounts the deferred batches whose asynchronous work is done, oldest first (the
        executor thread calls it after every batch; call it once more at the end of a run).
        -> how many are still pending."""
        while self._deferred:
            info, timed = self._deferred[0]
            if not all(o.ready() for o in timed):
                break
            self._deferred.popleft()
            times = [o.device_s() for o in timed]
            known = [t for t in times if t is not None]
            if not known:
                continue
            async_s = sum(known) * len(times) / len(known)  # per batch, as wall time is
            with self._lock:
                self._samples(self._async, info.kind).append(async_s)
            if self.cost is not None:
                self.cost.observe_async(
                    info.kind, info.shape_sig, async_s, batch_size=info.batch_size
                )
        return len(self._deferred)

    def async_summary(self) -> dict[str, LatencySummary]:
        """Per kind: the asynchronous device seconds of its timed outputs (second stream)."""
        with self._lock:
            snapshot = {kind: list(samples) for kind, samples in self._async.items()}
        return {kind: summarize(samples) for kind, samples in sorted(snapshot.items())}

    def wall_samples(self, kind: str) -> list[float]:
        with self._lock:
            return list(self._wall.get(kind, ()))

    def device_samples(self, kind: str) -> list[float]:
        """CUDA-event times of ``kind``'s batches (empty without CUDA event timing)."""
        with self._lock:
            return list(self._device.get(kind, ()))

    def summary(self) -> dict[str, LatencySummary]:
        """Per kind: count, median and p95 of batch wall time in seconds."""
        with self._lock:
            snapshot = {kind: list(samples) for kind, samples in self._wall.items()}
        return {kind: summarize(samples) for kind, samples in sorted(snapshot.items())}

    def device_summary(self) -> dict[str, LatencySummary]:
        with self._lock:
            snapshot = {kind: list(samples) for kind, samples in self._device.items()}
        return {kind: summarize(samples) for kind, samples in sorted(snapshot.items())}

    def _samples(self, table: dict[str, deque[float]], kind: str) -> deque[float]:
        samples = table.get(kind)
        if samples is None:
            samples = table[kind] = deque(maxlen=self.max_samples_per_kind)
        return samples

    def _cuda_enabled(self) -> bool:
        if self._use_cuda is None:
            try:
                import torch

                self._use_cuda = torch.cuda.is_available()
            except ImportError:
                self._use_cuda = False
        return self._use_cuda


class NaNWatch:
    """Fails a plan whose output holds a non-finite value in a floating tensor.

    ``hits`` counts faulted plans (read from any thread; int updates are atomic in CPython).
    Checking syncs the device once per floating tensor; that is the price of catching a NaN
    at the step that produced it.
    """

    def __init__(self) -> None:
        self.hits = 0

    def before_batch(self, info: BatchInfo) -> None:
        return None

    def after_batch(
        self, info: BatchInfo, outputs: Sequence[object], wall_s: float
    ) -> Observation | None:
        faults = []
        for index, output in enumerate(outputs):
            for path, bad, total in _non_finite(output, f"output[{index}]"):
                faults.append(
                    PlanFault(
                        index,
                        "nan",
                        f"{info.op_name} ({info.kind}) produced {bad} non-finite of {total} "
                        f"values in {path}",
                    )
                )
                break
        if not faults:
            return None
        self.hits += len(faults)
        return Observation(faults=tuple(faults))


def _non_finite(value: object, path: str) -> Iterator[tuple[str, int, int]]:
    """(path, non-finite count, numel) for every floating tensor with NaN/Inf inside ``value``."""
    import torch

    if isinstance(value, torch.Tensor):
        if (value.is_floating_point() or value.is_complex()) and value.numel():
            finite = torch.isfinite(value)
            if not bool(finite.all()):
                yield path, int((~finite).sum()), value.numel()
    elif isinstance(value, Mapping):
        for key, item in value.items():
            yield from _non_finite(item, f"{path}[{key!r}]")
    elif isinstance(value, (list, tuple)):
        for i, item in enumerate(value):
            yield from _non_finite(item, f"{path}[{i}]")
    elif isinstance(value, msgspec.Struct):
        for name in value.__struct_fields__:
            yield from _non_finite(getattr(value, name), f"{path}.{name}")
    elif dataclasses.is_dataclass(value) and not isinstance(value, type):
        for f in dataclasses.fields(value):
            yield from _non_finite(getattr(value, f.name), f"{path}.{f.name}")
