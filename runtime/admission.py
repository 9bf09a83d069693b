"""Admission = reservation (docs/architecture.md §3).

A session or job is admitted only if everything it will need fits *together with everything
already admitted*; nothing is discovered at step 37. Three resources are reserved:

- ``compute``: GPU-seconds per second of media, i.e. the predicted cost of one chunk divided
  by the chunk's media duration (frames / fps). The sum over reservations must stay within
  the effective compute capacity (``AdmissionConfig.compute_capacity``, default
  ``SLO_COMPUTE_CAPACITY`` of one device). Reservations that share a ``BatchPricing`` key
  (sessions whose denoising steps the engine runs as one batched call) are priced together:
  the batched part of ``n`` of them costs ``shares[n - 1]`` (their steps as one batch of
  ``n``), not ``n`` times one, and each adds its own rest (decode, KV update) - so batching
  admits more sessions. Each reservation also carries what steering throws away
  (``steering_gpu_s_per_s``: the frames its prompt switches flushed, regenerated), an estimate
  its owner updates while it runs (``reprice``); it counts against the capacity shared with
  others, never in the check of a request alone nor on an idle device.
- ``kv_slabs``: a chunk-KV slab from the slab pool of the session's geometry
  (``AdmissionRequest.kv_pool``), held for the session's life. The pools are the one KV gate:
  the model preallocated exactly their slabs, so a slab handed out here is memory that exists;
  ``Admit.slab`` names it and ``release`` returns it to its pool.
- ``peak_bytes``: peak activation bytes of its largest plan. The engine runs one batch of up
  to ``max_batch`` plans at a time, so what can be live together is the sum of the
  ``peak_concurrency`` largest reserved peaks (set it to the engine's ``max_batch``).

``admit`` answers ``Admit(reservation_id)`` or ``Reject(reason, retry_after_s, ...)``;
``reason`` names the first short resource in the order compute, kv_slabs, peak_bytes and
``short`` lists all of them. **retry_after_s** is derived from reservations that declared an
``expected_duration_s`` (jobs know their predicted total cost): releasing them in order of
expected end, it is the time until the first release after which the request would fit
(never less than ``min_retry_after_s``). If no known release is enough, it is
``default_retry_after_s``. A request that exceeds a nominal capacity on its own can never fit:
``permanent=True`` (the API should offer a smaller profile instead of asking to retry).

Deadline misses tighten admission: the engine reports every realtime plan's outcome through
``record_deadline``; while, over the last ``miss_window`` outcomes of the last
``miss_horizon_s`` seconds (at least ``min_outcomes`` of them), the miss ratio exceeds
``miss_ratio_threshold``, new admissions see the compute capacity multiplied by
``tighten_factor``. The horizon is what lets admission relax again when the misses stopped
because the sessions that missed ended (a job beside the last session, say): with no realtime
plan running, no new outcome would ever push the old misses out of the window. Existing
reservations are never revoked.

Pure: imports neither torch nor asyncio. Not thread-safe; call from the event loop.
"""

from __future__ import annotations

import math
import time
from collections import deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass, replace

from runtime.pools import KVSlabPool, Slab

__all__ = [
    "RESOURCES",
    "SLO_COMPUTE_CAPACITY",
    "Admission",
    "AdmissionConfig",
    "AdmissionController",
    "AdmissionError",
    "AdmissionRequest",
    "AdmissionUsage",
    "Admit",
    "BatchPricing",
    "Reject",
    "compute_load",
]

RESOURCES = ("compute", "kv_slabs", "peak_bytes")

SLO_COMPUTE_CAPACITY = 0.9
"""GPU-seconds per second of one device that admission lets reservations sum to: the highest
measured load at which the realtime SLO (delivered fps, stalls per minute, p95 frame interval
at the viewer; docs/architecture.md §3) still holds. The 10 % below one device is headroom for
jitter, re-caches and jobs; a measurement on the serving GPU replaces it (``dreamrt serve
--compute-capacity``)."""


class AdmissionError(ValueError):
    """A malformed request or configuration (negative sizes, non-finite rates)."""


@dataclass(frozen=True, slots=True)
class BatchPricing:
    """How the batched part of a reservation is priced together with the others of the same
    ``key`` (sessions of one model and shape whose denoising steps the engine batches):
    ``shares[k - 1]`` is the GPU-seconds per media second of those plans of ``k`` such
    sessions run as batches of ``k``, for ``k`` = 1 up to the largest batch (``len(shares)``,
    the engine's ``max_batch``); more members than that form further batches. ``shares[0]`` is
    the part of the request's own ``compute_gpu_s_per_s`` that batches; the rest of it (plans
    that run one by one) is added per member."""

    key: str
    shares: tuple[float, ...]

    def validate(self, owner: str, alone: float) -> None:
        if not self.shares or not all(math.isfinite(x) and x >= 0 for x in self.shares):
            raise AdmissionError(
                f"{owner}: batch pricing {self.key!r} needs finite shares >= 0, got {self.shares}"
            )
        if self.shares[0] > alone * (1 + 1e-9) + 1e-12:
            raise AdmissionError(
                f"{owner}: batch pricing {self.key!r}: shares[0]={self.shares[0]} exceeds the "
                f"request's compute_gpu_s_per_s={alone}"
            )

    def total(self, members: int) -> float:
        """GPU-s/s of ``members`` reservations of this group."""
        full, rest = divmod(members, len(self.shares))
        return full * self.shares[-1] + (self.shares[rest - 1] if rest else 0.0)


@dataclass(frozen=True, slots=True)
class AdmissionRequest:
    """What one session or job asks to reserve.

    ``compute_gpu_s_per_s``: GPU-seconds needed per second of media (0 for batch work that
    only runs in slack). ``kv_pool``: the key of the slab pool it needs one slab of (None: no
    chunk-KV, e.g. a job). ``expected_duration_s``: how long it will hold the reservation if
    known, used only to compute ``retry_after_s`` for others. ``batching``: priced with the
    other reservations of its group (``BatchPricing``); None: alone. ``steering_gpu_s_per_s``:
    GPU-s/s of generated media that steering throws away (a flushed backlog, regenerated), on
    top of ``compute_gpu_s_per_s`` and outside any batch pricing.
    """

    owner: str
    compute_gpu_s_per_s: float = 0.0
    kv_pool: str | None = None
    peak_bytes: int = 0
    expected_duration_s: float | None = None
    batching: BatchPricing | None = None
    steering_gpu_s_per_s: float = 0.0

    @classmethod
    def for_stream(
        cls,
        owner: str,
        *,
        chunk_cost_gpu_s: float,
        frames_per_chunk: int,
        fps: float,
        kv_pool: str | None = None,
        peak_bytes: int = 0,
        expected_duration_s: float | None = None,
    ) -> AdmissionRequest:
        """A streaming session: share = cost of one chunk / media duration of one chunk."""
        if frames_per_chunk <= 0 or not fps > 0:
            raise AdmissionError(
                f"{owner}: frames_per_chunk={frames_per_chunk} and fps={fps} must be > 0"
            )
        chunk_duration_s = frames_per_chunk / fps
        return cls(
            owner=owner,
            compute_gpu_s_per_s=chunk_cost_gpu_s / chunk_duration_s,
            kv_pool=kv_pool,
            peak_bytes=peak_bytes,
            expected_duration_s=expected_duration_s,
        )

    def validate(self) -> None:
        if not (math.isfinite(self.compute_gpu_s_per_s) and self.compute_gpu_s_per_s >= 0):
            raise AdmissionError(
                f"{self.owner}: compute_gpu_s_per_s={self.compute_gpu_s_per_s} must be finite, >= 0"
            )
        if not (math.isfinite(self.steering_gpu_s_per_s) and self.steering_gpu_s_per_s >= 0):
            raise AdmissionError(
                f"{self.owner}: steering_gpu_s_per_s={self.steering_gpu_s_per_s} must be "
                "finite, >= 0"
            )
        if self.peak_bytes < 0:
            raise AdmissionError(f"{self.owner}: peak_bytes={self.peak_bytes} must be >= 0")
        if self.expected_duration_s is not None and not self.expected_duration_s >= 0:
            raise AdmissionError(
                f"{self.owner}: expected_duration_s={self.expected_duration_s} must be >= 0"
            )
        if self.batching is not None:
            self.batching.validate(self.owner, self.compute_gpu_s_per_s)


@dataclass(frozen=True, slots=True)
class Admit:
    """Admitted: ``slab`` is the chunk-KV slab reserved for it (None if it asked for none)."""

    reservation_id: str
    slab: Slab | None = None


@dataclass(frozen=True, slots=True)
class Reject:
    """``reason``: the first short resource (``"compute"``, ``"kv_slabs"``, ``"peak_bytes"``)."""

    reason: str
    retry_after_s: float
    short: tuple[str, ...] = ()
    detail: str = ""
    permanent: bool = False


Admission = Admit | Reject


@dataclass(frozen=True, slots=True)
class AdmissionConfig:
    """Capacities and policy knobs; bytes are per device. Chunk-KV capacity is the slab pools'
    (``AdmissionController.add_pool``)."""

    peak_capacity_bytes: int
    compute_capacity: float = SLO_COMPUTE_CAPACITY  # GPU-s per s of one device
    peak_concurrency: int = 1
    default_retry_after_s: float = 5.0
    min_retry_after_s: float = 1.0
    miss_window: int = 50
    miss_horizon_s: float = 30.0  # outcomes older than this no longer count
    min_outcomes: int = 10
    miss_ratio_threshold: float = 0.05
    tighten_factor: float = 0.8

    def __post_init__(self) -> None:
        if self.peak_capacity_bytes < 0:
            raise AdmissionError(f"peak_capacity_bytes={self.peak_capacity_bytes} must be >= 0")
        if not self.compute_capacity > 0:
            raise AdmissionError(f"compute_capacity={self.compute_capacity} must be > 0")
        if self.peak_concurrency < 1 or self.miss_window < 1 or self.min_outcomes < 1:
            raise AdmissionError(
                f"peak_concurrency={self.peak_concurrency}, miss_window={self.miss_window}, "
                f"min_outcomes={self.min_outcomes} must be >= 1"
            )
        if not self.miss_horizon_s > 0:
            raise AdmissionError(f"miss_horizon_s={self.miss_horizon_s} must be > 0")
        if not 0 < self.tighten_factor <= 1:
            raise AdmissionError(f"tighten_factor={self.tighten_factor} must be in (0, 1]")


@dataclass(frozen=True, slots=True)
class AdmissionUsage:
    """Totals currently reserved, and the compute capacity new admissions see."""

    reservations: int
    compute_gpu_s_per_s: float
    kv_slabs: int
    peak_bytes: int
    effective_compute_capacity: float
    tightened: bool
    steering_gpu_s_per_s: float = 0.0  # the part of compute_gpu_s_per_s steering throws away


@dataclass(frozen=True, slots=True)
class _Reservation:
    reservation_id: str
    request: AdmissionRequest
    expected_end_s: float | None
    slab: Slab | None = None


class AdmissionController:
    """Reserves compute share, chunk-KV slabs and peak bytes; see the module docstring."""

    def __init__(
        self, config: AdmissionConfig, *, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.config = config
        self._clock = clock
        self._pools: dict[str, KVSlabPool] = {}
        self._reservations: dict[str, _Reservation] = {}
        # (time of the outcome, missed) of the last miss_window realtime plans
        self._outcomes: deque[tuple[float, bool]] = deque(maxlen=config.miss_window)
        self._next_id = 0

    # -- slab pools -------------------------------------------------------------------------

    def add_pool(self, key: str, pool: KVSlabPool) -> KVSlabPool:
        """Register the slab pool of one (model, geometry); a key is registered once."""
        if key in self._pools:
            raise AdmissionError(f"slab pool {key!r} is already registered")
        self._pools[key] = pool
        return pool

    def pool(self, key: str) -> KVSlabPool | None:
        return self._pools.get(key)

    def pools(self) -> dict[str, KVSlabPool]:
        return dict(self._pools)

    # -- reservations -----------------------------------------------------------------------

    def admit(self, request: AdmissionRequest) -> Admission:
        request.validate()
        if request.kv_pool is not None and request.kv_pool not in self._pools:
            raise AdmissionError(
                f"{request.owner}: no slab pool {request.kv_pool!r} "
                f"(registered: {sorted(self._pools)})"
            )
        cfg = self.config
        # steering's share is an estimate of what the viewer will do: a session that fits alone
        # is never refused because of it, for good or on an idle device
        bare = replace(request, steering_gpu_s_per_s=0.0)
        alone = self._short(bare, (), cfg.compute_capacity)
        if alone:
            return Reject(
                reason=alone[0],
                retry_after_s=cfg.default_retry_after_s,
                short=tuple(alone),
                detail=f"{request.owner} alone exceeds the nominal {', '.join(alone)} capacity",
                permanent=True,
            )
        active = list(self._reservations.values())
        request = request if active else bare
        short = self._short(request, active, self.effective_compute_capacity())
        if short:
            return Reject(
                reason=short[0],
                retry_after_s=self._retry_after_s(request, active),
                short=tuple(short),
                detail=self._describe(request, short),
            )
        slab = None
        if request.kv_pool is not None:
            slab = self._pools[request.kv_pool].allocate(request.owner)
            if slab is None:  # _short saw a free slab: only a slab taken outside could do this
                raise AdmissionError(f"slab pool {request.kv_pool!r} is out of sync")
        now_s = self._clock()
        reservation_id = f"res-{self._next_id}"
        self._next_id += 1
        end_s = None if request.expected_duration_s is None else now_s + request.expected_duration_s
        self._reservations[reservation_id] = _Reservation(reservation_id, request, end_s, slab)
        return Admit(reservation_id, slab)

    def release(self, reservation_id: str) -> bool:
        """Free a reservation and return its slab. Idempotent: ``False`` if it was not held."""
        reservation = self._reservations.pop(reservation_id, None)
        if reservation is None:
            return False
        if reservation.slab is not None and reservation.request.kv_pool is not None:
            self._pools[reservation.request.kv_pool].free(reservation.slab)
        return True

    def holds(self, reservation_id: str) -> bool:
        return reservation_id in self._reservations

    def reprice(self, reservation_id: str, *, steering_gpu_s_per_s: float) -> bool:
        """Set what a held reservation's steering throws away (``AdmissionRequest.
        steering_gpu_s_per_s``), as measured while it runs; later admissions see it. Nothing
        is revoked. ``False`` if it is not held."""
        reservation = self._reservations.get(reservation_id)
        if reservation is None:
            return False
        request = replace(reservation.request, steering_gpu_s_per_s=steering_gpu_s_per_s)
        request.validate()
        self._reservations[reservation_id] = replace(reservation, request=request)
        return True

    def usage(self) -> AdmissionUsage:
        active = self._reservations.values()
        return AdmissionUsage(
            reservations=len(self._reservations),
            compute_gpu_s_per_s=compute_load(r.request for r in active),
            kv_slabs=sum(1 for r in active if r.slab is not None),
            peak_bytes=self._live_peak_bytes(r.request.peak_bytes for r in active),
            effective_compute_capacity=self.effective_compute_capacity(),
            tightened=self.tightened(),
            steering_gpu_s_per_s=sum(r.request.steering_gpu_s_per_s for r in active),
        )

    # -- deadline feedback ------------------------------------------------------------------

    def record_deadline(self, *, missed: bool) -> None:
        """One realtime plan finished; ``missed`` if after its deadline."""
        self._outcomes.append((self._clock(), missed))

    def _recent_outcomes(self) -> list[bool]:
        since = self._clock() - self.config.miss_horizon_s
        return [missed for at, missed in self._outcomes if at >= since]

    def miss_ratio(self) -> float:
        """Missed over all realtime outcomes of the window and the horizon (0 with none)."""
        recent = self._recent_outcomes()
        return sum(recent) / len(recent) if recent else 0.0

    def tightened(self) -> bool:
        cfg = self.config
        recent = self._recent_outcomes()
        return (
            len(recent) >= cfg.min_outcomes and sum(recent) / len(recent) > cfg.miss_ratio_threshold
        )

    def effective_compute_capacity(self) -> float:
        cap = self.config.compute_capacity
        return cap * self.config.tighten_factor if self.tightened() else cap

    # -- internals --------------------------------------------------------------------------

    def _live_peak_bytes(self, peaks: Iterable[int]) -> int:
        return sum(sorted(peaks, reverse=True)[: self.config.peak_concurrency])

    def _short(
        self, request: AdmissionRequest, active: Iterable[_Reservation], compute_capacity: float
    ) -> list[str]:
        active = list(active)
        cfg = self.config
        compute = compute_load([*(r.request for r in active), request])
        peak = self._live_peak_bytes([r.request.peak_bytes for r in active] + [request.peak_bytes])
        short = []
        # A tiny epsilon keeps e.g. 3 x 0.3 == 0.9 admissible despite float rounding.
        if compute > compute_capacity + 1e-12:
            short.append("compute")
        if request.kv_pool is not None and self._slabs_needed(request.kv_pool, active) > (
            self._pools[request.kv_pool].capacity
        ):
            short.append("kv_slabs")
        if peak > cfg.peak_capacity_bytes:
            short.append("peak_bytes")
        return short

    def _slabs_needed(self, key: str, active: list[_Reservation]) -> int:
        """Slabs of pool ``key`` in use if only ``active`` held theirs, plus the one asked for
        (slabs taken from the pool outside admission, e.g. by a fork, count as held)."""
        pool = self._pools[key]
        reserved = [
            r
            for r in self._reservations.values()
            if r.slab is not None and r.request.kv_pool == key
        ]
        outside = pool.used_count - len(reserved)
        held = sum(1 for r in active if r.slab is not None and r.request.kv_pool == key)
        return outside + held + 1

    def _retry_after_s(self, request: AdmissionRequest, active: list[_Reservation]) -> float:
        cfg = self.config
        now_s = self._clock()
        capacity = self.effective_compute_capacity()
        ending = sorted((r for r in active if r.expected_end_s is not None), key=_end_s)
        remaining = {r.reservation_id: r for r in active}
        for reservation in ending:
            del remaining[reservation.reservation_id]
            if not self._short(request, remaining.values(), capacity):
                wait_s = (reservation.expected_end_s or now_s) - now_s
                return max(wait_s, cfg.min_retry_after_s)
        return cfg.default_retry_after_s

    def marginal_compute(self, request: AdmissionRequest) -> float:
        """GPU-s/s the reserved load would grow by with ``request`` admitted now (less than its
        share alone when it joins a batch group)."""
        held = [r.request for r in self._reservations.values()]
        return compute_load([*held, request]) - compute_load(held)

    def _describe(self, request: AdmissionRequest, short: list[str]) -> str:
        usage = self.usage()
        pool = self._pools.get(request.kv_pool) if request.kv_pool is not None else None
        have = {
            "compute": f"{usage.compute_gpu_s_per_s:.3f}+{self.marginal_compute(request):.3f} "
            f"GPU-s/s > {usage.effective_compute_capacity:.3f}",
            "kv_slabs": f"all {pool.capacity if pool else 0} chunk-KV slabs of "
            f"{request.kv_pool} are in use",
            "peak_bytes": f"{request.peak_bytes} B with live peaks {usage.peak_bytes} B "
            f"> {self.config.peak_capacity_bytes}",
        }
        return f"{request.owner}: " + "; ".join(have[name] for name in short)


def compute_load(requests: Iterable[AdmissionRequest]) -> float:
    """GPU-s/s of ``requests`` together: each alone, except the batched part of the members of
    one batch group, priced as the group (with the pricing of its member listed last: the
    newest calibration); plus what each one's steering throws away."""
    total = 0.0
    groups: dict[str, tuple[BatchPricing, int]] = {}
    for request in requests:
        total += request.steering_gpu_s_per_s
        pricing = request.batching
        if pricing is None:
            total += request.compute_gpu_s_per_s
        else:
            total += max(0.0, request.compute_gpu_s_per_s - pricing.shares[0])  # its own part
            members = groups.get(pricing.key, (pricing, 0))[1]
            groups[pricing.key] = (pricing, members + 1)
    return total + sum(pricing.total(members) for pricing, members in groups.values())


def _end_s(reservation: _Reservation) -> float:
    return reservation.expected_end_s if reservation.expected_end_s is not None else math.inf
