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
specially at the temporal up/down-samplers. They compare it with 0 and nothing else, so a
compiled coder is called with ``coder_call``'s view of its cache (0 or 1): one graph for the
stream's first chunk, one for every later one, where tracing the count itself would specialise
a graph to each value.

The cache is per stream (per session): it is the decoder's only per-request state, it never lives
on the module, and two streams decoded with two caches do not interact. It is plain data (a
``msgspec.Struct``), so a session's loop state holds it as a member and a snapshot serializes it
directly.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Self

import msgspec
import torch

__all__ = [
    "CacheMismatchError",
    "CausalCache",
    "DecoderCache",
    "EncoderCache",
    "SlotSpec",
    "coder_call",
    "coder_dynamic",
    "decoder_dynamic",
]


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


class CausalCache(msgspec.Struct):
    """Per-stream history buffers for every causal slot of one coder (see module docstring).

    ``buffers[s]`` has shape ``[batch_size, spec.channels, spec.frames, *level_hw[spec.level]]``.
    ``grid_hw`` is the input grid the cache was allocated for (decoder: latent ``(h, w)``).
    Not thread-safe; one stream uses it at a time.
    """

    specs: tuple[SlotSpec, ...]
    buffers: list[torch.Tensor]
    grid_hw: tuple[int, int]
    frames_seen: int = 0

    def __post_init__(self) -> None:
        if len(self.specs) != len(self.buffers):
            raise CacheMismatchError(
                f"{len(self.specs)} slot specs but {len(self.buffers)} buffers"
            )
        self.specs = tuple(self.specs)
        self.grid_hw = (int(self.grid_hw[0]), int(self.grid_hw[1]))

    @property
    def batch_size(self) -> int:
        return int(self.buffers[0].shape[0]) if self.buffers else 0

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
        return cls(tuple(specs), buffers, level_hw[0])

    @classmethod
    def for_coder(
        cls,
        coder: Any,
        batch_size: int,
        grid_hw: tuple[int, int],
        *,
        device: torch.device | str,
        dtype: torch.dtype,
    ) -> Self:
        """A zeroed cache laid out for ``coder`` (its ``slot_specs`` and ``level_hw(h, w)``) on a
        ``grid_hw`` input; ``bytes_for_coder`` is its size without allocating."""
        level_hw = coder.level_hw(*grid_hw)
        return cls.allocate(coder.slot_specs, level_hw, batch_size, device=device, dtype=dtype)

    @classmethod
    def bytes_for_coder(
        cls, coder: Any, batch_size: int, grid_hw: tuple[int, int], dtype: torch.dtype
    ) -> int:
        return cls.bytes_for(coder.slot_specs, coder.level_hw(*grid_hw), batch_size, dtype)

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


class DecoderCache(CausalCache):
    """The decoder's per-session feature cache; made by ``WanVAE.new_decoder_cache``."""


class EncoderCache(CausalCache):
    """The encoder's feature cache for one ``WanVAE.encode`` call."""


def coder_call(args: tuple[object, ...]) -> tuple[object, ...]:
    """A compiled coder's call arguments with each ``CausalCache`` among them replaced by the
    view it compiles against: the same buffers, ``frames_seen`` 0 (the stream's first chunk) or
    1 (any later one; module docstring) and no ``grid_hw`` (``(0, 0)``: the coders read the
    grid from the buffers, their callers check it), so one graph serves every grid size and
    every later chunk. Other arguments as they are."""
    return tuple(
        msgspec.structs.replace(a, frames_seen=min(a.frames_seen, 1), grid_hw=(0, 0))
        if isinstance(a, CausalCache)
        else a
        for a in args
    )


def coder_dynamic(args: tuple[object, ...]) -> list[tuple[torch.Tensor, int]]:
    """The dimensions one compiled coder graph keeps symbolic (``models.precompiled``): the
    grid (the last two dimensions) of the latents and of every cache buffer, so one graph
    serves every size of the compiled set. (The chunk's frame count stays static here: the tiny
    decoder's time upsampling specialises it; ``decoder_dynamic`` is the VAE decoder's rule.)
    ``args``: the coder's call, the module first, the latents second (``coder_call``'s view of
    the cache among them)."""
    marks: list[tuple[torch.Tensor, int]] = []
    latents = args[1]
    if isinstance(latents, torch.Tensor):
        marks += [(latents, latents.ndim - 2), (latents, latents.ndim - 1)]
    for arg in args[2:]:
        buffers = arg.buffers if isinstance(arg, CausalCache) else arg
        if isinstance(buffers, list):
            for buffer in buffers:
                if isinstance(buffer, torch.Tensor):
                    marks += [(buffer, buffer.ndim - 2), (buffer, buffer.ndim - 1)]
    return marks


def decoder_dynamic(args: tuple[object, ...]) -> list[tuple[torch.Tensor, int]]:
    """The Wan VAE decoder's symbolic dimensions: ``coder_dynamic``'s grid and the chunk's
    latent frame count when above one, so the decodes of a stream after its first frame (two
    or three latent frames: a first chunk's rest, a steady chunk) share one graph. A count of
    one stays static: Dynamo specialises a size of 1, and at the stream's first chunk one
    frame takes another branch of the time upsampler; so a stream compiles three graphs in
    all (its first frame, a later chunk's first frame alone, any later piece)."""
    marks = coder_dynamic(args)
    latents = args[1]
    if isinstance(latents, torch.Tensor) and latents.ndim == 5 and latents.shape[2] > 1:
        marks.append((latents, 2))
    return marks
