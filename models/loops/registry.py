"""``LOOPS``: the one table from a card's loop kind to the loop class that serves it.

A card names, per loop id, the kind of loop it runs (``LoopSpec.kind``); a loaded model builds
``LOOPS[spec.kind](model, spec)``. There is no other routing: a chunk-causal card serves jobs
with ``chunk_rollout`` because its card says so (``ModelCard.loop_for("text_to_video")``), and a
bidirectional card serves them with ``diffusion_denoise``. Helper loop kinds (``text_encode``,
``kv_recache``, ``vae_decode``) run inside these two and have no entry.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from types import MappingProxyType
from typing import Any

from models.card import LoopKind, LoopSpec
from models.loops.chunk_rollout.loop import ChunkRollout
from models.loops.diffusion_denoise import DiffusionDenoise
from models.loops.model import LoopModel
from runtime.contract import Loop

__all__ = ["LOOPS", "build_loop"]

LOOPS: Mapping[LoopKind, Callable[[LoopModel, LoopSpec], Loop[Any]]] = MappingProxyType(
    {
        LoopKind.CHUNK_ROLLOUT: ChunkRollout,
        LoopKind.DIFFUSION_DENOISE: DiffusionDenoise,
    }
)


def build_loop(model: LoopModel, spec: LoopSpec) -> Loop[Any]:
    """The loop serving ``spec`` on ``model``; ``KeyError`` names the kinds that have a loop."""
    factory = LOOPS.get(spec.kind)
    if factory is None:
        raise KeyError(
            f"loop {spec.loop_id!r} is a {spec.kind.value} helper loop, run inside "
            f"{sorted(k.value for k in LOOPS)}; it cannot be served on its own"
        )
    return factory(model, spec)
