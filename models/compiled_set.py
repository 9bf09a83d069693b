"""The finite set of shapes a compiled instance serves: what the warm-up compiles, and all a
served request may use afterwards without compiling.

A chunk-causal card's step shapes depend only on the pixel size and the chunk size (latent
frames per chunk); fps and the denoising steps change no tensor shape. So the set is one
profile per size: the card's default profile and each of its ``compiled_sizes``, all at the
card's chunk size (``--chunk-frames``, the latency mode, changes it for the whole server). Every
request the server serves maps onto one of these profiles:

- a session at one of the sizes (any fps), and its prompt switches and cuts at any chunk (a
  switch re-caches the cached frames at the current prefix length: the warm-up switches at
  every prefix length the cache passes through);
- a fork candidate: a copy of its parent's state into its own slab, the parent's shapes;
- a job of any ``num_frames`` (t2v) and t2i: every chunk of a job is a full chunk (the last one
  is generated whole and the frames beyond ``num_frames`` are dropped), so a job runs the
  session's chunk shapes at its size;
- a rollout group of any K: on a compiled instance each sample's denoising steps run alone
  (batch 1, the session shapes) instead of batched (``models.loops.rollout_group``);
- with cross-session batching (``WanInstance.batch_sessions``), the denoising steps of 2 ..
  ``max_batch`` sessions of one profile at one prefix length as one forward: the DiT block's
  batch dimension is symbolic above one (``models.wan.dit.block.block_dynamic``), so two graphs
  per profile (no past; a past) serve every batch size, compiled by a warm-up stage of two
  sessions side by side (``server.ops.warm_up``).

A request at another size is served, but eagerly: the sealed instance runs it uncompiled and
logs it once (``models.compile_guard``).
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from models.card import ModelCard, Profile

__all__ = ["CompiledSet", "compiled_set"]


@dataclass(frozen=True, slots=True)
class CompiledSet:
    """The profiles a compiled instance warms up and serves compiled (module docstring)."""

    profiles: tuple[Profile, ...]
    max_batch: int = 1  # sessions' steps of one profile batched: 2 .. this (1: none)

    def covers(self, width: int, height: int, chunk_latent_frames: int, batch: int = 1) -> bool:
        """Whether a stream of this geometry runs only shapes of the set, its steps batched
        with those of ``batch - 1`` other sessions of its profile."""
        return 1 <= batch <= self.max_batch and any(
            (p.width, p.height, p.chunk_latent_frames) == (width, height, chunk_latent_frames)
            for p in self.profiles
        )

    def describe(self) -> list[str]:
        """``WxH/c`` per profile (``WxH/c x1-k`` with batches of up to k), for logs and
        ``dreamrt compile``."""
        batches = f" x1-{self.max_batch}" if self.max_batch > 1 else ""
        return [f"{p.width}x{p.height}/{p.chunk_latent_frames}{batches}" for p in self.profiles]


def compiled_set(card: ModelCard, max_batch: int = 1) -> CompiledSet:
    """The set of ``card`` as served (its default profile first, then ``compiled_sizes`` in
    order, duplicates dropped), with batches of up to ``max_batch`` sessions' steps (the
    engine's ``max_batch`` where the server batches sessions, else 1)."""
    if max_batch < 1:
        raise ValueError(f"max_batch={max_batch} must be >= 1")
    default = card.default_profile
    profiles = [default]
    for width, height in card.compiled_sizes:
        if (width, height) != (default.width, default.height):
            profiles.append(replace(default, width=width, height=height))
    return CompiledSet(tuple(dict.fromkeys(profiles)), max_batch)
