"""Admission for ``infra.bench.multisession``, built as the server builds it.

``session_request`` is ``sessions.host``'s request for a session (compute share = the cost
model's *prior* of ``chunk_flops`` over the chunk's media seconds, a slab of the profile's pool,
peak bytes) and ``admission_controller`` is ``server.app``'s configuration; ``admission_limit``
admits probe sessions until the first ``Reject``. ``measured_share`` is the share the
calibrated costs give instead (what admission would see if it used them).
"""

from __future__ import annotations

from typing import Any

from models.card import Profile
from models.instance import WanInstance
from runtime.admission import AdmissionConfig, AdmissionController, AdmissionRequest, Reject
from runtime.cost import CostModel
from runtime.pools import KVSlabPool
from sessions.session_pricing import chunk_gpu_seconds

__all__ = ["admission_controller", "admission_limit", "measured_share", "session_request"]


def slab_pool_key(instance: WanInstance, profile: Profile) -> str:
    return f"{instance.card.model_id}:{instance.slab_geometry(profile).key}"


def session_request(
    instance: WanInstance,
    cost: CostModel,
    owner: str,
    profile: Profile,
    *,
    share: float | None = None,
) -> AdmissionRequest:
    """``share``: the compute share to ask for (default: the analytic prior, as
    ``sessions.host`` does before its cost model is calibrated)."""
    if share is None:
        share = cost.prior(instance.chunk_flops(profile), 0.0) / instance.chunk_seconds(profile)
    return AdmissionRequest(
        owner=owner,
        compute_gpu_s_per_s=share,
        kv_pool=slab_pool_key(instance, profile),
        peak_bytes=instance.peak_bytes(profile),
    )


def admission_controller(
    instance: WanInstance, profile: Profile, slabs: int, *, max_batch: int
) -> AdmissionController:
    """The server's controller, with a pool of ``slabs`` slabs of ``profile``'s geometry."""
    default = instance.card.default_profile
    ctl = AdmissionController(
        AdmissionConfig(
            peak_capacity_bytes=instance.peak_bytes(default) * max_batch * 4,
            peak_concurrency=max_batch,
        )
    )
    ctl.add_pool(
        slab_pool_key(instance, profile), KVSlabPool(slabs, instance.kv_slab_bytes(profile))
    )
    return ctl


def admission_limit(
    instance: WanInstance,
    cost: CostModel,
    profile: Profile,
    *,
    slabs: int,
    max_batch: int,
    share: float | None = None,
) -> dict[str, Any]:
    """How many sessions of ``profile`` one controller admits (pool of ``slabs``), and why
    it refuses the next."""
    ctl = admission_controller(instance, profile, slabs, max_batch=max_batch)
    limit = 0
    while True:
        answer = ctl.admit(session_request(instance, cost, f"probe-{limit}", profile, share=share))
        if isinstance(answer, Reject):
            break
        limit += 1
    prior = session_request(instance, cost, "probe", profile).compute_gpu_s_per_s
    return {
        "limit": limit,
        "share_prior": prior,
        "share": share or prior,
        "reject_reason": answer.reason,
        "retry_after_s": answer.retry_after_s,
        "capacity": ctl.config.compute_capacity,
    }


def measured_share(instance: WanInstance, cost: CostModel, profile: Profile) -> float | None:
    """GPU-s per media second of a steady chunk from the calibrated costs, the asynchronous
    part of the decode (second CUDA stream) included (None: unmeasured) - what
    ``sessions.host`` admits from once the cost model is calibrated."""
    plans = instance.steady_chunk_plans(profile)
    if any(cost.samples(kind, sig) == 0 for kind, sig, _ in plans):
        return None
    return chunk_gpu_seconds(cost, instance, profile) / instance.chunk_seconds(profile)
