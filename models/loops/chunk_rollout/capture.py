"""The behaviour facts ``chunk_rollout`` captures for each chunk it generates.

Set on the chunk's final media emission (``MediaMeta.capture``) when the loop describes the
decode, i.e. from the very state the chunk was generated from: records are captured at
generation time, never reconstructed. Everything here is host data already in the state (no
device read): the digests were computed on host copies when the conditioning was latched.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from models.loops.sampling import SigmaStep, noise_seed

__all__ = ["RNG_RULE", "chunk_capture"]

RNG_RULE = (
    "noise_seed(seed, segment, chunk, step) = blake2b((seed, segment, chunk, step)), "
    "step -1: the initial noise"
)


def chunk_capture(state: Any, steps: Sequence[SigmaStep], precision: str) -> dict[str, object]:
    """The facts of the chunk ``state`` is about to decode (a ``ChunkRolloutState``)."""
    seeds = [noise_seed(state.seed, state.segment, state.chunk, i) for i in range(-1, len(steps))]
    kv = state.kv
    return {
        "step": state.step,  # plans completed before this decode (the replay key precedes it)
        "seed": state.seed,
        "rng": RNG_RULE,
        "noise_seeds": seeds,
        "timesteps": [step.timestep for step in steps],
        "sigmas": [step.sigma for step in steps] + [0.0],
        "prompt": state.active_prompt or state.prompt,
        "prompt_digest": state.prompt_digest,
        "action_digest": state.chunk_action_digest,
        "audio_digest": state.chunk_audio_digest,
        "segment": state.segment,
        "chunk": state.chunk,
        "latent_frame_start": state.frame_start,
        "kv_window": {
            "sink_frames": kv.sink_frames,
            "window_frames": kv.window_frames,
            "frames_cached": kv.frames_written,
        },
        "precision": precision,
        "weights_version": state.weights_version,  # of the weights that made this chunk
    }
