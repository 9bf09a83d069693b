"""Chunk-KV cache of one session: fixed-size per-layer K/V buffers with sink frames and a ring.

Slot layout of one layer's K (V is identical), ``T`` tokens per latent frame, ``S`` sink
frames, ``W`` window frames; every slot holds one whole latent frame::

    token index:  0      T            S*T                                   (S+W)*T
                  +------+-----+--------+---------+---------+-----+---------+
       slots:     | s 0  | ... | s S-1  | ring 0  | ring 1  | ... | ring W-1|
                  +------+-----+--------+---------+---------+-----+---------+
                  first S frames ever      frame n >= S goes to ring (n - S) mod W,
                  written; never evicted   overwriting the oldest window frame

``n`` counts frames in *write order* (``frames_written``); positions for RoPE are baked into K
when it is computed, so the slot order does not matter to attention and a re-cache may write
frames again after ``reset()``. ``valid`` ([(S+W)*T] bool) marks filled token slots; attention
marks filled token slots. Frames fill slots in order (sinks, then the ring), so until the ring
wraps the filled slots are a prefix: attention reads only that prefix, unmasked
(``attention_keys``), which lets SDPA use its flash / cuDNN kernels from a stream's first chunk
on. ``attention_mask`` covers any other layout (a cache restored with holes)

A cache is plain data and a member of its loop's state: ops read and write it in place and a
snapshot serializes it directly (a ``msgspec.Struct``; ``slot_positions`` uses -1 for an empty
slot). Its buffers are either a session's slab of a ``KVSlabBuffer`` (views: no per-session
allocation, see ``models/wan/kv/slabs.py``) or, for a job or a test, its own (``allocate``).
Size a geometry beforehand with ``bytes_for`` (admission); ``copy_from`` forks one cache into
another. Writes go through ``plan_write`` -> ``write`` (per layer) -> ``commit``; the plan is
host-side integer arithmetic, the writes are slice copies, so nothing syncs with the device.

**FP8.** A cache allocated with ``dtype=torch.float8_e4m3fn`` stores e4m3 K/V plus one float32
descale per (layer, sample, head) (``k_descale``, ``v_descale``; 0 until the first write sets
it): writes quantise, and ``layer_past`` hands attention an ``Fp8Past`` it reads as stored
(``models/wan/kv/fp8.py``). Half the bytes of a bf16 slab, so twice the sessions per slab GiB.
"""

from __future__ import annotations

from dataclasses import dataclass

import msgspec
import torch

from models.wan.dit.config import WanDiTConfig
from models.wan.kv.fp8 import Fp8Past, calibrated, quantize_with

__all__ = ["EMPTY", "CacheShapeError", "ChunkKVCache", "WriteRun"]

EMPTY = -1  # slot_positions entry of a slot that holds no frame


class CacheShapeError(ValueError):
    """A cache geometry or a write that does not fit it (names the offending values)."""


@dataclass(frozen=True, slots=True)
class WriteRun:
    """Copy ``frames`` consecutive frames from chunk frame ``src_frame`` to slot ``dst_slot``."""

    src_frame: int
    dst_slot: int
    frames: int


class ChunkKVCache(msgspec.Struct, kw_only=True):
    """Per-session self-attention K/V of past latent frames (see the module docstring).

    ``k``/``v``: [layers, B, (S + W) * T, heads, head_dim] in the model dtype (zero-filled, so an
    unfilled slot never injects NaN even though it is masked); ``valid``: [(S + W) * T] bool.
    ``slot_positions[i]`` is the absolute latent frame (RoPE position) slot ``i`` holds, -1 while
    empty; ``frames_written`` counts frames since allocation or ``reset`` (write order).
    An e4m3 cache also has ``k_descale``/``v_descale``: [layers, B, heads] float32, 0 = unset.
    """

    k: torch.Tensor
    v: torch.Tensor
    valid: torch.Tensor
    sink_frames: int
    window_frames: int
    tokens_per_frame: int
    slot_positions: list[int] = []
    frames_written: int = 0
    k_descale: torch.Tensor | None = None
    v_descale: torch.Tensor | None = None

    def __post_init__(self) -> None:
        _check_geometry(self.sink_frames, self.window_frames, self.tokens_per_frame)
        expected = self.capacity_frames * self.tokens_per_frame
        k, v, valid = self.k, self.v, self.valid
        if (
            k.shape != v.shape
            or k.ndim != 5
            or k.shape[2] != expected
            or valid.shape != (expected,)
        ):
            raise CacheShapeError(
                f"buffers k={tuple(k.shape)} v={tuple(v.shape)} valid={tuple(valid.shape)} do not "
                f"match S={self.sink_frames} W={self.window_frames} T={self.tokens_per_frame}"
            )
        scales = (self.k_descale, self.v_descale)
        want = tuple(k.shape[:2]) + (k.shape[3],)
        if self.fp8 != all(d is not None for d in scales) or any(
            d is not None and tuple(d.shape) != want for d in scales
        ):
            raise CacheShapeError(
                f"an e4m3 cache needs k_descale and v_descale of shape {want} (and only an e4m3 "
                f"cache has them); got k {k.dtype}, descales "
                f"{[None if d is None else tuple(d.shape) for d in scales]}"
            )
        if not self.slot_positions:
            self.slot_positions = [EMPTY] * self.capacity_frames
        if len(self.slot_positions) != self.capacity_frames or self.frames_written < 0:
            raise CacheShapeError(
                f"{len(self.slot_positions)} slot positions and frames_written="
                f"{self.frames_written} do not fit S={self.sink_frames} W={self.window_frames}"
            )

    # ---------------------------------------------------------------------------------------
    # construction and sizing

    @classmethod
    def allocate(
        cls,
        config: WanDiTConfig,
        *,
        batch: int,
        sink_frames: int,
        window_frames: int,
        tokens_per_frame: int,
        device: torch.device | str,
        dtype: torch.dtype,
    ) -> ChunkKVCache:
        """Own (zero-filled) buffers, outside any slab pool; sizes as ``bytes_for`` reports."""
        _check_geometry(sink_frames, window_frames, tokens_per_frame)
        if batch < 1:
            raise CacheShapeError(f"batch must be >= 1, got {batch}")
        shape = (
            config.num_layers,
            batch,
            (sink_frames + window_frames) * tokens_per_frame,
            config.num_heads,
            config.head_dim,
        )
        fp8 = dtype == torch.float8_e4m3fn
        scale_shape = (config.num_layers, batch, config.num_heads)
        return cls(
            k=torch.zeros(shape, device=device, dtype=dtype),
            v=torch.zeros(shape, device=device, dtype=dtype),
            valid=torch.zeros(shape[2], device=device, dtype=torch.bool),
            sink_frames=sink_frames,
            window_frames=window_frames,
            tokens_per_frame=tokens_per_frame,
            k_descale=torch.zeros(scale_shape, device=device) if fp8 else None,
            v_descale=torch.zeros(scale_shape, device=device) if fp8 else None,
        )

    @staticmethod
    def bytes_for(
        config: WanDiTConfig,
        sink_frames: int,
        window_frames: int,
        tokens_per_frame: int,
        dtype: torch.dtype,
        batch: int = 1,
    ) -> int:
        """Device bytes ``allocate`` will take for this geometry (K + V + validity mask, and an
        e4m3 cache's descales)."""
        slots = (sink_frames + window_frames) * tokens_per_frame
        itemsize = torch.empty((), dtype=dtype).element_size()
        scales = 2 * config.num_layers * batch * config.num_heads * 4
        kv = 2 * config.num_layers * batch * slots * config.dim * itemsize + slots
        return kv + (scales if dtype == torch.float8_e4m3fn else 0)

    @property
    def nbytes(self) -> int:
        scales = sum(d.nbytes for d in (self.k_descale, self.v_descale) if d is not None)
        return self.k.nbytes + self.v.nbytes + self.valid.nbytes + scales

    @property
    def fp8(self) -> bool:
        """K/V stored in e4m3 with per-(layer, sample, head) descales."""
        return self.k.dtype == torch.float8_e4m3fn

    @property
    def capacity_frames(self) -> int:
        return self.sink_frames + self.window_frames

    @property
    def batch(self) -> int:
        return self.k.shape[1]

    @property
    def num_layers(self) -> int:
        return self.k.shape[0]

    def reset(self) -> None:
        """Forget every frame (buffers are zeroed so old K/V cannot leak into a new stream)."""
        self.k.zero_()
        self.v.zero_()
        self.valid.zero_()
        for descale in (self.k_descale, self.v_descale):
            if descale is not None:
                descale.zero_()
        self.slot_positions = [EMPTY] * self.capacity_frames
        self.frames_written = 0

    def clone(self) -> ChunkKVCache:
        """An independent copy with its own buffers."""
        return ChunkKVCache(
            k=self.k.clone(),
            v=self.v.clone(),
            valid=self.valid.clone(),
            sink_frames=self.sink_frames,
            window_frames=self.window_frames,
            tokens_per_frame=self.tokens_per_frame,
            slot_positions=list(self.slot_positions),
            frames_written=self.frames_written,
            k_descale=None if self.k_descale is None else self.k_descale.clone(),
            v_descale=None if self.v_descale is None else self.v_descale.clone(),
        )

    def copy_from(self, other: ChunkKVCache) -> None:
        """Overwrite this cache with ``other``, in place (fork into a slab; a snapshot's cache
        moved into a session's slab). The geometries must match."""
        if (
            other.k.shape != self.k.shape
            or other.k.dtype != self.k.dtype
            or other.sink_frames != self.sink_frames
            or other.window_frames != self.window_frames
        ):
            raise CacheShapeError(
                f"cannot copy a cache of k={tuple(other.k.shape)} {other.k.dtype} "
                f"S={other.sink_frames} W={other.window_frames} into one of "
                f"k={tuple(self.k.shape)} {self.k.dtype} S={self.sink_frames} "
                f"W={self.window_frames}"
            )
        self.k.copy_(other.k)
        self.v.copy_(other.v)
        self.valid.copy_(other.valid)
        for mine, theirs in ((self.k_descale, other.k_descale), (self.v_descale, other.v_descale)):
            if mine is not None and theirs is not None:
                mine.copy_(theirs)
        self.slot_positions = list(other.slot_positions)
        self.frames_written = other.frames_written

    # ---------------------------------------------------------------------------------------
    # reading

    def layer(self, index: int, tokens: int | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """Views of one layer's K and V, all slots or the first ``tokens``:
        2 x [B, tokens or (S + W) * T, heads, head_dim]."""
        if tokens is None:
            return self.k[index], self.v[index]
        return self.k[index, :, :tokens], self.v[index, :, :tokens]

    def layer_past(self, index: int, tokens: int) -> tuple[torch.Tensor, torch.Tensor] | Fp8Past:
        """What attention reads of layer ``index``: the first ``tokens`` K/V as views, wrapped
        with their descales for an e4m3 cache (``Fp8Past``)."""
        k, v = self.layer(index, tokens)
        if self.k_descale is None or self.v_descale is None:
            return k, v
        return Fp8Past(k, v, self.k_descale[index], self.v_descale[index])

    @property
    def prefix_frames(self) -> int | None:
        """How many leading slots hold frames when the filled slots are exactly a prefix (the
        case for every cache written in order); ``None`` if some empty slot precedes a filled
        one. Host-side bookkeeping, no device sync."""
        filled = [p != EMPTY for p in self.slot_positions]
        count = filled.index(False) if False in filled else len(filled)
        return None if any(filled[count:]) else count

    def attention_keys(self, new_tokens: int) -> tuple[int, torch.Tensor | None]:
        """What a chunk of ``new_tokens`` attends to: (cached tokens to read from slot 0, key
        mask or ``None``). A filled prefix is read unmasked; otherwise every slot is read
        under ``attention_mask``."""
        prefix = self.prefix_frames
        if prefix is not None:
            return prefix * self.tokens_per_frame, None
        return self.capacity_frames * self.tokens_per_frame, self.attention_mask(new_tokens)

    @property
    def full(self) -> bool:
        """Every slot holds a frame (host-side bookkeeping, no device sync)."""
        return self.frames_written >= self.capacity_frames

    def attention_mask(self, new_tokens: int) -> torch.Tensor | None:
        """Key mask for a chunk of ``new_tokens`` attending to the cache and to itself.

        -> [1, 1, 1, (S + W) * T + new_tokens] bool, True = attend (cached slots first), or
        ``None`` once the cache is full: a session spends nearly all its life there, and
        attention without a mask may use the flash / cuDNN kernels.
        """
        if self.full:
            return None
        own = torch.ones(new_tokens, dtype=torch.bool, device=self.valid.device)
        return torch.cat((self.valid, own))[None, None, None, :]

    # ---------------------------------------------------------------------------------------
    # writing

    def plan_write(self, num_frames: int) -> tuple[WriteRun, ...]:
        """Where the next ``num_frames`` frames go: sinks first, then the ring (host-side ints).

        Frames of one chunk that would overwrite each other in the ring (``num_frames`` > W)
        keep only the latest W, as a sequence of single-frame writes would.
        """
        if num_frames < 1:
            raise CacheShapeError(f"num_frames must be >= 1, got {num_frames}")
        s, w = self.sink_frames, self.window_frames
        targets: list[tuple[int, int]] = []  # (src_frame, dst_slot)
        ring: list[tuple[int, int]] = []
        for src in range(num_frames):
            n = self.frames_written + src
            if n < s:
                targets.append((src, n))
            else:
                ring.append((src, s + (n - s) % w))
        targets.extend(ring[-w:])
        runs: list[WriteRun] = []
        for src, dst in targets:
            last = runs[-1] if runs else None
            if last and last.src_frame + last.frames == src and last.dst_slot + last.frames == dst:
                runs[-1] = WriteRun(last.src_frame, last.dst_slot, last.frames + 1)
            else:
                runs.append(WriteRun(src, dst, 1))
        return tuple(runs)

    def write(
        self, layer: int, k: torch.Tensor, v: torch.Tensor, runs: tuple[WriteRun, ...]
    ) -> None:
        """Copy one layer's chunk K/V into the planned slots.

        k, v: [B, num_frames * T, heads, head_dim] (post-RoPE keys, the model's dtype); an e4m3
        cache quantises them with its layer's descales, set from this chunk if still unset.
        """
        if self.k_descale is not None and self.v_descale is not None:
            self.k_descale[layer].copy_(calibrated(self.k_descale[layer], k))
            self.v_descale[layer].copy_(calibrated(self.v_descale[layer], v))
            k = quantize_with(k, self.k_descale[layer])
            v = quantize_with(v, self.v_descale[layer])
        t = self.tokens_per_frame
        for run in runs:
            src = slice(run.src_frame * t, (run.src_frame + run.frames) * t)
            dst = slice(run.dst_slot * t, (run.dst_slot + run.frames) * t)
            self.k[layer, :, dst].copy_(k[:, src])
            self.v[layer, :, dst].copy_(v[:, src])

    def commit(self, runs: tuple[WriteRun, ...], num_frames: int, frame_start: int) -> None:
        """Mark the planned slots filled once every layer is written; advance the counter."""
        t = self.tokens_per_frame
        for run in runs:
            self.valid[run.dst_slot * t : (run.dst_slot + run.frames) * t] = True
            for i in range(run.frames):
                self.slot_positions[run.dst_slot + i] = frame_start + run.src_frame + i
        self.frames_written += num_frames


def _check_geometry(sink_frames: int, window_frames: int, tokens_per_frame: int) -> None:
    if sink_frames < 0 or window_frames < 1 or tokens_per_frame < 1:
        raise CacheShapeError(
            f"need sink_frames >= 0, window_frames >= 1, tokens_per_frame >= 1; got "
            f"S={sink_frames} W={window_frames} T={tokens_per_frame}"
        )
