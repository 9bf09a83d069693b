"""Cost model: predicted GPU-seconds per WorkPlan, the runtime's one currency
(docs/architecture.md §3).

Two layers:

1. **Analytic prior** from the declared work (a plan declares its ``flops``; ``bytes_moved`` is
   for callers that know it) and the device's constants::

       prior_s = overhead_s + flops / sustained_flops + bytes_moved / bandwidth_bytes_per_s

2. **Online calibration** per ``(kind, shape_sig, k)`` from measured times: the seconds one
   *batch of k plans* of that shape took, as an exponentially weighted moving average (EWMA,
   weight ``alpha`` on the newest sample). A batch is not k times one plan - two sessions'
   denoising steps batched into one DiT forward cost 1.5x one step, not 2x - so each batch size
   is its own key. Once a key has ``min_samples`` observations its EWMA replaces the prior.
   For a batch size never measured, the measured sizes of that ``(kind, shape_sig)`` give the
   estimate (``predict_batch``): with two or more sizes a least-squares line ``a + b*k``
   (clamped: never below a smaller measured batch, never above k plans alone), with one size
   ``k0`` that batch scaled per plan (``k * c(k0) / k0``: no evidence of a batching gain), with
   none ``k`` priors. EWMA was chosen over a running median because it is O(1) per update and
   follows drift (clock changes, thermal throttling) within ~1/alpha samples; the Profiler
   keeps raw samples for median/p95 reporting.

``predict`` is the cost of one plan run alone (``predict_batch(..., 1)``): what the scheduler
budgets per ticket. Admission prices a batch of sessions' steps with ``predict_batch``.

**Persistence**: ``snapshot()`` is the calibration as plain data and ``load(snapshot)`` puts it
back (a restarted server predicts from measured costs from its first plan). A snapshot taken on
another device is refused: its seconds describe other hardware. An entry without ``batch``
(written before batches were keyed) is a batch of one.

Thread safety: ``observe`` runs on the engine's executor thread while ``predict`` runs on the
event loop, so both take one lock (uncontended cost ~100 ns). Pure: imports neither torch nor
asyncio.
"""

from __future__ import annotations

import math
import threading
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

__all__ = ["CostModel", "CostModelError", "DeviceConstants"]


ASYNC_SUFFIX = "+async"
"""Kind suffix of the calibration entries of asynchronous device time (``observe_async``)."""


class CostModelError(ValueError):
    """A cost-model input is out of range (negative work, non-finite time, bad constants)."""


@dataclass(frozen=True, slots=True)
class DeviceConstants:
    """What the analytic prior needs to know about a device.

    ``sustained_flops`` is achievable (not peak) FLOP/s for the dominant dtype,
    ``bandwidth_bytes_per_s`` achievable memory bandwidth, ``overhead_s`` the fixed per-plan
    cost (launches, Python, synchronisation).
    """

    name: str
    sustained_flops: float
    bandwidth_bytes_per_s: float
    overhead_s: float = 50e-6

    def __post_init__(self) -> None:
        if not (self.sustained_flops > 0 and self.bandwidth_bytes_per_s > 0):
            raise CostModelError(
                f"device {self.name!r}: sustained_flops={self.sustained_flops} and "
                f"bandwidth_bytes_per_s={self.bandwidth_bytes_per_s} must be > 0"
            )
        if self.overhead_s < 0:
            raise CostModelError(f"device {self.name!r}: overhead_s={self.overhead_s} must be >= 0")

    @classmethod
    def h200(cls) -> DeviceConstants:
        # ~60% of the 989 TFLOP/s dense bf16 peak and ~80% of 4.8 TB/s HBM3e.
        return cls(
            name="h200", sustained_flops=600e12, bandwidth_bytes_per_s=3.8e12, overhead_s=30e-6
        )

    @classmethod
    def cpu(cls) -> DeviceConstants:
        # A small laptop/CI CPU running fp32: tens of GFLOP/s, ~10 GB/s effective.
        return cls(name="cpu", sustained_flops=50e9, bandwidth_bytes_per_s=10e9, overhead_s=100e-6)


def _kind_name(kind: object) -> str:
    """``PlanKind.CHUNK_STEP`` and ``"chunk_step"`` name the same key."""
    return str(getattr(kind, "value", kind))


@dataclass(slots=True)
class _Calibration:
    ewma_s: float  # seconds of one batch of the key's size
    samples: int


# (kind, shape_sig) -> batch size -> calibration
_Sizes = dict[int, _Calibration]


class CostModel:
    """Predicts the GPU-seconds a plan (or a batch of plans) will take; learns from measured
    times.

    ``predict`` never fails for a valid input: unseen keys fall back to the analytic prior.
    ``observe`` rejects nonsense (negative or non-finite times, batch_size < 1) with
    ``CostModelError`` because it means a broken profiler, not a slow device.
    """

    def __init__(
        self,
        device: DeviceConstants | None = None,
        *,
        alpha: float = 0.2,
        min_samples: int = 1,
    ) -> None:
        if not 0.0 < alpha <= 1.0:
            raise CostModelError(f"alpha={alpha} must be in (0, 1]")
        if min_samples < 1:
            raise CostModelError(f"min_samples={min_samples} must be >= 1")
        self.device = device or DeviceConstants.cpu()
        self.alpha = alpha
        self.min_samples = min_samples
        self._calibration: dict[tuple[str, str], _Sizes] = {}
        self._lock = threading.Lock()

    def prior(self, flops: float, bytes_moved: float) -> float:
        """Analytic estimate in seconds for one plan (no calibration)."""
        if flops < 0 or bytes_moved < 0:
            raise CostModelError(f"flops={flops} and bytes_moved={bytes_moved} must be >= 0")
        dev = self.device
        return (
            dev.overhead_s + flops / dev.sustained_flops + bytes_moved / dev.bandwidth_bytes_per_s
        )

    def predict(
        self, kind: str, shape_sig: str, flops: float = 0.0, bytes_moved: float = 0.0
    ) -> float:
        """Predicted seconds for one plan of ``(kind, shape_sig)`` run alone; ``kind`` is a
        PlanKind value."""
        return self.predict_batch(kind, shape_sig, 1, flops, bytes_moved)

    def predict_batch(
        self,
        kind: str,
        shape_sig: str,
        batch_size: int,
        flops: float = 0.0,
        bytes_moved: float = 0.0,
    ) -> float:
        """Predicted seconds of ONE batch of ``batch_size`` plans of ``(kind, shape_sig)`` run
        as one call (``flops``/``bytes_moved``: one plan's, for the prior); the module
        docstring says how an unmeasured size is estimated."""
        if batch_size < 1:
            raise CostModelError(f"batch_size={batch_size} must be >= 1")
        with self._lock:
            sizes = self._calibration.get((_kind_name(kind), shape_sig))
            seconds = self._estimate(sizes, batch_size)
        if seconds is not None:
            return seconds
        return batch_size * self.prior(flops, bytes_moved)

    def observe(
        self,
        kind: str,
        shape_sig: str,
        measured_s: float,
        *,
        batch_size: int = 1,
    ) -> None:
        """Fold one measured batch time (seconds for ``batch_size`` plans run as one call) into
        the calibration of ``(kind, shape_sig, batch_size)``."""
        if not (math.isfinite(measured_s) and measured_s >= 0):
            raise CostModelError(f"measured_s={measured_s} must be finite and >= 0")
        if batch_size < 1:
            raise CostModelError(f"batch_size={batch_size} must be >= 1")
        key = (_kind_name(kind), shape_sig)
        with self._lock:
            sizes = self._calibration.setdefault(key, {})
            cal = sizes.get(batch_size)
            if cal is None:
                sizes[batch_size] = _Calibration(ewma_s=measured_s, samples=1)
            else:
                cal.ewma_s += self.alpha * (measured_s - cal.ewma_s)
                cal.samples += 1

    def observe_async(
        self, kind: str, shape_sig: str, measured_s: float, *, batch_size: int = 1
    ) -> None:
        """Fold in device time a plan's asynchronous work took after the plan returned (a
        decode on a second CUDA stream). It is kept apart from ``predict`` (the executor's
        occupancy, which the scheduler budgets) under the kind ``<kind>+async``."""
        self.observe(
            f"{_kind_name(kind)}{ASYNC_SUFFIX}", shape_sig, measured_s, batch_size=batch_size
        )

    def predict_async(self, kind: str, shape_sig: str, batch_size: int = 1) -> float:
        """Calibrated asynchronous seconds of a batch of ``batch_size`` plans of ``(kind,
        shape_sig)``; 0.0 unseen."""
        key = (f"{_kind_name(kind)}{ASYNC_SUFFIX}", shape_sig)
        with self._lock:
            seconds = self._estimate(self._calibration.get(key), batch_size)
        return 0.0 if seconds is None else seconds

    def gpu_seconds(
        self,
        kind: str,
        shape_sig: str,
        flops: float = 0.0,
        bytes_moved: float = 0.0,
        *,
        batch_size: int = 1,
    ) -> float:
        """All the device time a batch of ``batch_size`` plans (default one) costs:
        ``predict_batch`` plus its asynchronous part. This is what a session's compute share is
        made of (admission)."""
        return self.predict_batch(
            kind, shape_sig, batch_size, flops, bytes_moved
        ) + self.predict_async(kind, shape_sig, batch_size)

    def samples(self, kind: str, shape_sig: str, batch_size: int | None = None) -> int:
        """How many measurements calibrate ``(kind, shape_sig)``: of batches of ``batch_size``
        plans, or (None) of every size."""
        with self._lock:
            sizes = self._calibration.get((_kind_name(kind), shape_sig), {})
            if batch_size is None:
                return sum(cal.samples for cal in sizes.values())
            cal = sizes.get(batch_size)
            return 0 if cal is None else cal.samples

    def _estimate(self, sizes: _Sizes | None, k: int) -> float | None:
        """Seconds of a batch of ``k`` from the calibrated sizes of one key; None: none is
        calibrated. Call with the lock held."""
        if not sizes:
            return None
        known = {n: c.ewma_s for n, c in sizes.items() if c.samples >= self.min_samples}
        if not known:
            return None
        if k in known:
            return known[k]
        if len(known) == 1:
            ((k0, c0),) = known.items()
            return k * c0 / k0
        # least squares c = a + b k over the measured sizes, clamped
        n = len(known)
        mean_k = sum(known) / n
        mean_c = sum(known.values()) / n
        var = sum((x - mean_k) ** 2 for x in known)
        slope = sum((x - mean_k) * (c - mean_c) for x, c in known.items()) / var
        fitted = mean_c + slope * (k - mean_k)
        k_min = min(known)
        per_plan = known[k_min] / k_min  # of the smallest size measured
        if k < k_min:  # between its per-plan share and the whole smaller batch
            low, high = k * per_plan, known[k_min]
        else:  # never below a smaller measured batch, never dearer than k plans alone
            low = max(c for x, c in known.items() if x < k)
            high = max(k * per_plan, low)
        return min(max(fitted, low), high)

    def snapshot(self) -> dict[str, object]:
        """Plain data (msgspec/JSON-encodable) to publish to a fleet router.

        ``{"device": {...}, "method": "ewma", "alpha": a, "entries": [{"kind", "shape_sig",
        "batch", "gpu_s", "samples"}, ...]}`` with entries sorted by (kind, shape_sig, batch);
        ``gpu_s`` is the seconds of one batch of ``batch`` plans.
        """
        dev = self.device
        with self._lock:
            entries = [
                {
                    "kind": kind,
                    "shape_sig": sig,
                    "batch": k,
                    "gpu_s": cal.ewma_s,
                    "samples": cal.samples,
                }
                for (kind, sig), sizes in sorted(self._calibration.items())
                for k, cal in sorted(sizes.items())
            ]
        return {
            "device": {
                "name": dev.name,
                "sustained_flops": dev.sustained_flops,
                "bandwidth_bytes_per_s": dev.bandwidth_bytes_per_s,
                "overhead_s": dev.overhead_s,
            },
            "method": "ewma",
            "alpha": self.alpha,
            "min_samples": self.min_samples,
            "entries": entries,
        }

    def load(self, snapshot: Mapping[str, Any]) -> int:
        """Restore the calibration of a ``snapshot()`` (entries replace those of equal keys);
        -> entries loaded. ``CostModelError`` for another device's snapshot or a malformed one
        (then nothing is loaded)."""
        device = snapshot.get("device")
        name = device.get("name") if isinstance(device, Mapping) else None
        if name != self.device.name:
            raise CostModelError(
                f"cost snapshot of device {name!r} cannot calibrate device {self.device.name!r}"
            )
        entries = snapshot.get("entries")
        if not isinstance(entries, list):
            raise CostModelError("cost snapshot has no list of entries")
        loaded: dict[tuple[str, str, int], _Calibration] = {}
        for entry in entries:
            try:
                key = (str(entry["kind"]), str(entry["shape_sig"]), int(entry.get("batch", 1)))
                gpu_s, samples = float(entry["gpu_s"]), int(entry["samples"])
            except (KeyError, TypeError, ValueError, AttributeError) as exc:
                raise CostModelError(f"malformed cost snapshot entry {entry!r}: {exc}") from None
            if not (math.isfinite(gpu_s) and gpu_s >= 0 and samples >= 1 and key[2] >= 1):
                raise CostModelError(
                    f"cost snapshot entry {entry!r}: gpu_s must be finite and >= 0, "
                    "samples and batch >= 1"
                )
            loaded[key] = _Calibration(ewma_s=gpu_s, samples=samples)
        with self._lock:
            for (kind, sig, k), cal in loaded.items():
                self._calibration.setdefault((kind, sig), {})[k] = cal
        return len(loaded)
