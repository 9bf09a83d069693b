"""Fork of a ``chunk_rollout`` stream: N candidates that share its past exactly.

A fork is taken at a chunk boundary (the runtime's ``LoopHandle.at_boundary(after_chunk=True)``)
from the parent's live state, without serialising: every tensor the state holds is copied on
its device, and the chunk-KV goes into the candidate's own slab of the model's preallocated
buffer (``ChunkKVCache.copy_from`` into the slab view), so a candidate allocates nothing beyond
what admission reserved for it. The candidate's seed replaces the parent's: noise is a pure
function of (seed, segment, chunk, step), so the candidates' next chunks differ while
everything generated before the fork is the parent's, bit for bit.
"""

from __future__ import annotations

from typing import Any

import msgspec
import torch

from models.loops.requests import SessionRequest
from models.wan.kv.slabs import SlabGeometry

__all__ = ["fork_state"]


def fork_state(model: Any, state: Any, request: SessionRequest) -> Any:
    """A continuation of ``state`` (a ``ChunkRolloutState``) as a new stream on ``model``.

    The prompt memory and the inputs latched or waiting are the parent's (a new prompt comes
    as an input). Cross-attention K/V are shared, not copied: no op writes them in place (a new
    prompt replaces the tensors)."""
    kv = state.kv
    geometry = SlabGeometry(kv.sink_frames, kv.window_frames, kv.tokens_per_frame)
    cache = model.kv_cache(geometry, request.kv_slab)  # a view of the candidate's slab
    cache.copy_from(kv)
    return msgspec.structs.replace(
        state,
        seed=request.seed,
        kv=cache,
        decoder=state.decoder.clone(),
        window_latents=state.window_latents.clone(),
        latents=_clone(state.latents),
        chunk_action=_clone(state.chunk_action),
        next_action=_clone(state.next_action),
        chunk_audio=_clone(state.chunk_audio),
        audio_pending=state.audio_pending.clone(),
        acks=list(state.acks),
        next_acks=list(state.next_acks),
        chunk_keys=list(state.chunk_keys),
        next_keys=list(state.next_keys),
        frames=[f.clone() for f in state.frames],
    )


def _clone(tensor: torch.Tensor | None) -> torch.Tensor | None:
    return None if tensor is None else tensor.clone()
