"""One preallocated K/V tensor per (card, geometry); a session's chunk-KV cache is a slab view.

The runtime's ``KVSlabPool`` (pure bookkeeping) says which slab index a session holds; this
module owns the memory those indices name. Every session of one geometry (sink frames S, ring
frames W, T tokens per latent frame) shares two tensors, allocated once when the server starts::

    k, v: [layers, N slabs, (S + W) * T, heads, head_dim]        valid: [N, (S + W) * T] bool

              slab 0           slab 1           ...   slab N-1
    layer 0   [ (S+W)*T x H x D ][ (S+W)*T x H x D ] ... [ ... ]
    layer 1   [ ...            ][ ...            ] ... [ ... ]
    ...
    session on slab i: ChunkKVCache(k=k[:, i:i+1], v=v[:, i:i+1], valid=valid[i])

A slab view keeps the ``[layers, 1, tokens, heads, head_dim]`` shape of a session's own cache and
each of its layers is one contiguous block, so attention reads it as fast as a private buffer.
Nothing is allocated per session or per plan; fork copies one slab into another
(``copy_slab``). A batched forward of several sessions concatenates their views' K/V per layer
(``WanDiT.forward_chunks``).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from models.wan.dit.config import WanDiTConfig
from models.wan.kv.cache import CacheShapeError, ChunkKVCache

__all__ = ["KVSlabBuffer", "SlabGeometry"]


@dataclass(frozen=True, slots=True)
class SlabGeometry:
    """What makes two sessions' slabs alike: sink frames, ring frames, tokens per frame."""

    sink_frames: int
    window_frames: int
    tokens_per_frame: int

    @property
    def key(self) -> str:
        """Stable name of the geometry (the runtime keys its slab pools by it)."""
        return f"s{self.sink_frames}w{self.window_frames}t{self.tokens_per_frame}"

    @property
    def slots(self) -> int:
        """Token slots of one layer of one slab."""
        return (self.sink_frames + self.window_frames) * self.tokens_per_frame


class KVSlabBuffer:
    """``num_slabs`` chunk-KV slabs of one geometry in one pair of tensors (module docstring)."""

    def __init__(
        self,
        config: WanDiTConfig,
        geometry: SlabGeometry,
        *,
        num_slabs: int,
        device: torch.device | str,
        dtype: torch.dtype,
    ) -> None:
        if num_slabs < 1:
            raise CacheShapeError(f"a slab buffer needs num_slabs >= 1, got {num_slabs}")
        self.geometry = geometry
        self.num_slabs = num_slabs
        slots = geometry.slots
        shape = (config.num_layers, num_slabs, slots, config.num_heads, config.head_dim)
        self.k = torch.zeros(shape, device=device, dtype=dtype)
        self.v = torch.zeros(shape, device=device, dtype=dtype)
        self.valid = torch.zeros((num_slabs, slots), device=device, dtype=torch.bool)
        # an e4m3 buffer's descales: [layers, N slabs, heads] fp32 (models/wan/kv/fp8.py)
        self.k_descale: torch.Tensor | None = None
        self.v_descale: torch.Tensor | None = None
        if dtype == torch.float8_e4m3fn:
            scales = (config.num_layers, num_slabs, config.num_heads)
            self.k_descale = torch.zeros(scales, device=device)
            self.v_descale = torch.zeros(scales, device=device)

    @property
    def nbytes(self) -> int:
        scales = sum(d.nbytes for d in (self.k_descale, self.v_descale) if d is not None)
        return self.k.nbytes + self.v.nbytes + self.valid.nbytes + scales

    @property
    def slab_bytes(self) -> int:
        return self.nbytes // self.num_slabs

    def tensors(self) -> dict[str, torch.Tensor]:
        """The K and V buffers (and an e4m3 buffer's descales) by a name unique to the geometry
        (``kv:<key>:k`` / ``:v`` / ``:k_descale`` / ``:v_descale``)."""
        named = {"k": self.k, "v": self.v, "k_descale": self.k_descale, "v_descale": self.v_descale}
        return {f"kv:{self.geometry.key}:{n}": t for n, t in named.items() if t is not None}

    def cache(self, slab_id: int) -> ChunkKVCache:
        """A fresh (reset) cache over slab ``slab_id``: views, no allocation."""
        cache = self.view(slab_id)
        cache.reset()
        return cache

    def view(self, slab_id: int) -> ChunkKVCache:
        """The cache over slab ``slab_id`` as it is (its bookkeeping starts empty: callers that
        resume a stream copy the bookkeeping in with ``ChunkKVCache.copy_from``)."""
        self._check(slab_id)
        g, i = self.geometry, slab_id
        return ChunkKVCache(
            k=self.k[:, i : i + 1],
            v=self.v[:, i : i + 1],
            valid=self.valid[i],
            sink_frames=g.sink_frames,
            window_frames=g.window_frames,
            tokens_per_frame=g.tokens_per_frame,
            k_descale=None if self.k_descale is None else self.k_descale[:, i : i + 1],
            v_descale=None if self.v_descale is None else self.v_descale[:, i : i + 1],
        )

    def owns(self, cache: ChunkKVCache) -> int | None:
        """The slab index ``cache`` is a view of, or ``None`` if it has its own buffers."""
        if cache.k.untyped_storage().data_ptr() != self.k.untyped_storage().data_ptr():
            return None
        per_slab = self.k.stride(1) * self.k.element_size()
        return (cache.k.data_ptr() - self.k.data_ptr()) // per_slab

    def copy_slab(self, src: int, dst: int) -> None:
        """Fork: slab ``dst`` becomes a copy of slab ``src`` (device copy, no sync)."""
        self._check(src)
        self._check(dst)
        self.k[:, dst].copy_(self.k[:, src])
        self.v[:, dst].copy_(self.v[:, src])
        self.valid[dst].copy_(self.valid[src])
        for descale in (self.k_descale, self.v_descale):
            if descale is not None:
                descale[:, dst].copy_(descale[:, src])

    def _check(self, slab_id: int) -> None:
        if not 0 <= slab_id < self.num_slabs:
            raise CacheShapeError(f"slab {slab_id} is not in a buffer of {self.num_slabs} slabs")
