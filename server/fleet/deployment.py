"""The DeploymentCard: what one engine tells a fleet orchestrator about itself (docs/api.md
"Fleet"; ``GET /v1/deployment`` serves it: ``server.api.deployment``).

Everything in it is read from what the engine already keeps — the served models' cards, the
scheduler's cost model (its snapshot), admission (the reserved compute share against the
effective capacity, tightened while deadlines are missed), the chunk-KV slab pools, the
scheduler queue, the session and job hosts — so a router can place a session on the engine
with the most headroom without a model of its own. One share is what one more session of a
model's default profile would reserve (``session_share``): a router compares it with
``load.headroom``; the engine's admission still decides (a ``place`` may be refused).
"""

from __future__ import annotations

import socket
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from server.fleet.context import FleetContext
    from sessions.served_models import ServedModel

__all__ = ["CARD_VERSION", "deployment_card", "engine_id_for"]

CARD_VERSION = 1


def engine_id_for(host: str, port: int) -> str:
    """The default engine id: the node's name and the engine's port (one engine per GPU)."""
    return f"{socket.gethostname()}:{port}"


def deployment_card(ctx: FleetContext) -> dict[str, object]:
    """The engine's DeploymentCard as JSON-able data (see the module docstring)."""
    config = ctx.config
    snapshot_dir = config.recording.snapshot_dir
    engine = ctx.engine
    admission = engine.admission
    assert admission is not None  # a serving engine admits (server.lifespan builds it so)
    ctx.host.refresh_steering()  # the load as admission would price it now
    usage = admission.usage()
    capacity = usage.effective_compute_capacity
    slabs_free, slabs_capacity = ctx.host.slab_counts()
    jobs = ctx.jobs.counts()
    sessions = ctx.host.sessions()
    return {
        "version": CARD_VERSION,
        "engine_id": ctx.engine_id,
        "url": ctx.public_url,
        "health": "draining" if ctx.draining else "ok",
        "device": ctx.device,
        "models": [_model_entry(ctx, served) for served in ctx.host.models.values()],
        "slo_classes": [
            {
                "name": "realtime",
                "playout_buffer_s": config.engine.playout_buffer_s,
                "max_lead_s": config.engine.max_lead_s,
            },
            {"name": "batch", "runs_in": "slack"},
        ],
        "cost_model": engine.cost.snapshot(),
        "load": {
            "compute_gpu_s_per_s": usage.compute_gpu_s_per_s,
            "steering_gpu_s_per_s": usage.steering_gpu_s_per_s,
            "compute_capacity": capacity,
            "headroom": max(0.0, capacity - usage.compute_gpu_s_per_s),
            "tightened": usage.tightened,
            "deadline_miss_ratio": admission.miss_ratio(),
            "kv_slabs_free": slabs_free,
            "kv_slabs_capacity": slabs_capacity,
            "queue_depth": engine.scheduler.depth(),
            "sessions": len(sessions),
            "jobs_queued": jobs.get("queued", 0),
            "jobs_running": jobs.get("running", 0),
        },
        "sessions": sorted(s.id for s in sessions if not s.terminal),
        "snapshot_dir": None if snapshot_dir is None else str(snapshot_dir),
    }


def _model_entry(ctx: FleetContext, served: ServedModel) -> dict[str, object]:
    card = served.card
    streams = "session.realtime" in card.capabilities
    return {
        "id": card.model_id,
        "family": card.family,
        "capabilities": sorted(card.capabilities),
        "default_profile": card.default_profile.as_dict(),
        "loops": sorted(card.loops),
        "weights": card.weights.value,
        "default": card.model_id == ctx.model_id,
        # GPU-s per media second one more session of the default profile reserves
        "session_share": ctx.host.compute_share(served) if streams else None,
    }
