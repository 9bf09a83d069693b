"""Causal feature caches of the Wan VAE: one static history buffer per causal time conv.

Every temporal causal conv of a coder (a "slot") needs the last frames of its own input from the
previous chunk, so that chunk k's conv sees them where a one-shot pass over the whole clip would.
A cache holds one buffer per slot, allocated once with static shapes and rewritten in place::

    slot s   buffer [B, C_s, T_s, H_s, W_s]    T_s = 2 (3-tap causal conv), 1 (stride-2 time conv)

             ┌──────────┬──────────┐
    frames   │ t - 2    │ t - 1    │   oldest first; zeros before the stream's first frame
             └──────────┴──────────┘
    after a chunk x:  buffer <- last T_s frames of cat(buffer, x)     (copy_, same storage)

``frames_seen`` counts the input frames the coder has consumed; the coders branch on
``frames_seen == 0`` (a Python int, so no host sync), because Wan treats the stream's first frame
specially at the temporal up/down-samplers.

The cache is per stream (per session): it is the decoder's only per-request state, it never lives
on the module, and two streams decoded with two caches do not interact.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Self

import torch

__all__ = ["CacheMismatchError", "CausalCache", "DecoderCache", "EncoderCache", "SlotSpec"]


class CacheMismatchError(ValueError):
    """A cache used with a coder or input it was not allocated for."""


@dataclass(frozen=True, slots=True)
class SlotSpec:
    """One slot: ``channels`` x ``frames`` of history at spatial ``level`` of its coder.

    The coder maps a level to a grid size (decoder: latent grid x 2**level; encoder: the pixel
    grid halved ``level`` times).
    """

    channels: int
    frames: int
    level: int


class CausalCache:
    """Per-stream history buffers for every causal slot of one coder (see module docstring).

    ``buffers[s]`` has shape ``[batch_size, spec.channels, spec.frames, *level_hw[spec.level]]``.
    ``grid_hw`` is the input grid the cache was allocated for (decoder: latent ``(h, w)``).
    Not thread-safe; one stream uses it at a time.
    """

    __slots__ = ("batch_size", "buffers", "frames_seen", "grid_hw", "specs")

    def __init__(
        self,
        specs: Sequence[SlotSpec],
        buffers: Sequence[torch.Tensor],
        grid_hw: tuple[int, int],
        frames_seen: int = 0,
    ) -> None:
        if len(specs) != len(buffers):
            raise CacheMismatchError(f"{len(specs)} slot specs but {len(buffers)} buffers")
        self.specs: tuple[SlotSpec, ...] = tuple(specs)
        self.buffers: tuple[torch.Tensor, ...] = tuple(buffers)
        self.grid_hw = (int(grid_hw[0]), int(grid_hw[1]))
        self.batch_size = int(buffers[0].shape[0]) if buffers else 0
        self.frames_seen = int(frames_seen)

    # ---------------------------------------------------------------------------------------
    # allocation and size

    @staticmethod
    def buffer_shapes(
        specs: Sequence[SlotSpec], level_hw: Sequence[tuple[int, int]], batch_size: int
    ) -> list[tuple[int, ...]]:
        """The static shape of every slot buffer."""
        return [(batch_size, s.channels, s.frames, *level_hw[s.level]) for s in specs]

    @classmethod
    def bytes_for(
        cls,
        specs: Sequence[SlotSpec],
        level_hw: Sequence[tuple[int, int]],
        batch_size: int,
        dtype: torch.dtype,
    ) -> int:
        """Bytes a cache of this layout takes, without allocating it (for admission)."""
        itemsize = torch.empty((), dtype=dtype).element_size()
        total = 0
        for shape in cls.buffer_shapes(specs, level_hw, batch_size):
            numel = 1
            for dim in shape:
                numel *= dim
            total += numel * itemsize
        return total

    @classmethod
    def allocate(
        cls,
        specs: Sequence[SlotSpec],
        level_hw: Sequence[tuple[int, int]],
        batch_size: int,
        *,
        device: torch.device | str,
        dtype: torch.dtype,
    ) -> Self:
        """Zero-filled buffers (the history before a stream's first frame is zeros)."""
        shapes = cls.buffer_shapes(specs, level_hw, batch_size)
        buffers = [torch.zeros(shape, device=device, dtype=dtype) for shape in shapes]
        return cls(specs, buffers, level_hw[0])

    @property
    def nbytes(self) -> int:
        return sum(b.numel() * b.element_size() for b in self.buffers)

    # ---------------------------------------------------------------------------------------
    # lifecycle

    def reset(self) -> None:
        """Back to the start of a stream, in place (same storage)."""
        for buffer in self.buffers:
            buffer.zero_()
        self.frames_seen = 0

    def clone(self) -> Self:
        """An independent copy (fork a stream)."""
        return type(self)(
            self.specs, [b.clone() for b in self.buffers], self.grid_hw, self.frames_seen
        )

    def copy_(self, other: CausalCache) -> None:
        """Overwrite this cache's contents with ``other``'s, in place (fork into a pooled cache)."""
        self.check_compatible(other.specs, other.grid_hw, other.batch_size)
        for mine, theirs in zip(self.buffers, other.buffers, strict=True):
            mine.copy_(theirs)
        self.frames_seen = other.frames_seen

    def check_compatible(
        self, specs: Sequence[SlotSpec], grid_hw: tuple[int, int], batch_size: int
    ) -> None:
        """Raise ``CacheMismatchError`` unless this cache fits that coder layout and input."""
        if tuple(specs) != self.specs:
            raise CacheMismatchError(
                f"cache has {len(self.specs)} slots laid out for another coder "
                f"(expected {len(specs)} slots)"
            )
        if tuple(grid_hw) != self.grid_hw or batch_size != self.batch_size:
            raise CacheMismatchError(
                f"cache allocated for batch {self.batch_size} at grid {self.grid_hw}, "
                f"used with batch {batch_size} at grid {tuple(grid_hw)}"
            )

    # ---------------------------------------------------------------------------------------
    # snapshot support: LoopState fields may be dict[str, torch.Tensor]

    def as_tensors(self) -> dict[str, torch.Tensor]:
        """``{"slot_000": buffer, ..., "frames_seen": int64 scalar}``; views, not copies."""
        out = {f"slot_{i:03d}": b for i, b in enumerate(self.buffers)}
        out["frames_seen"] = torch.tensor(self.frames_seen, dtype=torch.int64)
        return out

    @classmethod
    def from_tensors(cls, tensors: Mapping[str, torch.Tensor], specs: Sequence[SlotSpec]) -> Self:
        """Inverse of ``as_tensors`` for the coder whose ``slot_specs`` are ``specs``."""
        buffers = [tensors[f"slot_{i:03d}"] for i in range(len(specs))]
        for spec, buffer in zip(specs, buffers, strict=True):
            if buffer.shape[1:3] != (spec.channels, spec.frames):
                raise CacheMismatchError(f"buffer {tuple(buffer.shape)} does not match slot {spec}")
        level0 = [b for b, s in zip(buffers, specs, strict=True) if s.level == 0]
        grid_hw = tuple(level0[0].shape[-2:]) if level0 else (0, 0)
        return cls(specs, buffers, grid_hw, int(tensors["frames_seen"]))


class DecoderCache(CausalCache):
    """The decoder's per-session feature cache; made by ``WanVAE.new_decoder_cache``."""

    __slots__ = ()


class EncoderCache(CausalCache):
    """The encoder's feature cache for one ``WanVAE.encode`` call."""

    __slots__ = ()
