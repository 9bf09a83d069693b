"""What a session costs admission: the GPU-seconds of one steady chunk of a profile
(``chunk_gpu_seconds``: measured, or the cost model's prior) and, where the model batches
sessions' steps, how sessions of one shape are priced together (``batch_pricing``).

``sessions.host.SessionHost`` builds each session's ``runtime.admission.AdmissionRequest`` from
these (docs/architecture.md §3, "Admission prices what runs"); ``ADMISSION_COSTS`` are the
choices of its ``admission_cost`` (``dreamrt serve --admission-cost``).
"""

from __future__ import annotations

from collections.abc import Sequence

from models.card import Profile
from runtime.admission import BatchPricing
from runtime.cost import CostModel
from sessions.served_models import ServedModel

__all__ = [
    "ADMISSION_COSTS",
    "batch_measured",
    "batch_pricing",
    "chunk_gpu_seconds",
    "steady_chunk_measured",
]

ADMISSION_COSTS = ("auto", "measured", "prior")


def chunk_gpu_seconds(
    cost: CostModel,
    served: ServedModel,
    profile: Profile,
    *,
    measured: bool = True,
    decoder: str | None = None,
) -> float:
    """GPU-seconds of one steady chunk of a session of ``profile``: from the cost model's
    calibration when ``measured`` and every plan of the chunk has been measured on this device
    (a session of the profile ran a steady chunk), asynchronous device time included; the
    analytic prior of the chunk's FLOPs otherwise (the warm-up's compiling runs calibrate
    nothing). On an H200 the prior priced a 480x272@16 session at a third of what it costs.
    ``decoder``: the session's (None: the model's default)."""
    plans = _steady_plans(served, profile, decoder) if measured else ()
    if _calibrated(cost, plans):
        return sum(n * cost.gpu_seconds(kind, sig) for kind, sig, n in plans)
    flops = served.chunk_flops(profile) if decoder is None else served.chunk_flops(profile, decoder)
    return cost.prior(flops, 0.0)


def steady_chunk_measured(
    cost: CostModel, served: ServedModel, profile: Profile, decoder: str | None = None
) -> bool:
    """Every plan of a steady chunk of ``profile`` (with ``decoder``; None: the default one)
    has a measurement in ``cost``: ``chunk_gpu_seconds`` prices it by measurement."""
    return _calibrated(cost, _steady_plans(served, profile, decoder))


def batch_measured(cost: CostModel, served: ServedModel, profile: Profile, batch: int) -> bool:
    """Every plan of a steady chunk of ``profile`` that the model batches across sessions
    (``batched_plan_kinds``) has a measurement of a batch of ``batch`` in ``cost``: with the
    solo chunk's, ``batch_pricing`` prices sessions together by measurement."""
    kinds = frozenset(getattr(served, "batched_plan_kinds", lambda: ())())
    batched = [(k, sig) for k, sig, _ in _steady_plans(served, profile, None) if k in kinds]
    return bool(batched) and all(
        cost.samples(kind, sig, batch) >= cost.min_samples for kind, sig in batched
    )


def _steady_plans(
    served: ServedModel, profile: Profile, decoder: str | None
) -> tuple[tuple[str, str, int], ...]:
    if decoder is None:
        return served.steady_chunk_plans(profile)
    return served.steady_chunk_plans(profile, decoder)


def batch_pricing(
    cost: CostModel,
    served: ServedModel,
    profile: Profile,
    *,
    max_batch: int,
    decoder: str | None = None,
) -> BatchPricing | None:
    """How sessions of ``profile`` are priced together (``runtime.admission.BatchPricing``):
    GPU-s per media second of the plans of a steady chunk the model batches across sessions
    (``batched_plan_kinds``: its denoising steps), for 1 .. ``max_batch`` sessions as one batch
    (``CostModel.gpu_seconds(batch_size=k)``: measured per batch size, fitted between).
    None where nothing batches, the engine runs one plan at a time, or the chunk's plans are
    not all measured (the prior knows no batches)."""
    kinds = frozenset(getattr(served, "batched_plan_kinds", lambda: ())())
    plans = _steady_plans(served, profile, decoder)
    batched = [(kind, sig, n) for kind, sig, n in plans if kind in kinds]
    chunk_s = served.chunk_seconds(profile)
    if max_batch < 2 or not batched or chunk_s <= 0 or not _calibrated(cost, plans):
        return None
    shares = tuple(
        sum(n * cost.gpu_seconds(kind, sig, batch_size=k) for kind, sig, n in batched) / chunk_s
        for k in range(1, max_batch + 1)
    )
    key = f"{served.card.model_id}:" + ",".join(f"{kind}/{sig}" for kind, sig, _ in batched)
    return BatchPricing(key, shares)


def _calibrated(cost: CostModel, plans: Sequence[tuple[str, str, int]]) -> bool:
    return bool(plans) and all(
        cost.samples(kind, sig) >= cost.min_samples for kind, sig, _ in plans
    )
