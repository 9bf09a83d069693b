"""Spatial split of the Wan VAE decode over the ranks of an ``sp`` group, by rows.

Each of the ``sp`` ranks decodes a contiguous band of ``h / sp`` latent rows (rank-major, as
the DiT's token shards are) into a band of ``8h / sp`` pixel rows; rank 0 gathers the bands
into whole frames::

    z [B, 16, c, h, w] -> my band [B, 16, c, h/sp, w] -> decoder, halo per layer
      -> [B, 3, n, 8h/sp, 8w] --gather to rank 0--> [B, 3, n, 8h, 8w]

**Halo per layer, not per band of latents.** Every module of the decoder is per position
except three, which look across rows: the 3x3(x3) convolutions (one row each side), the
upsamplers' 3x3 convolution (one row of the upsampled grid) and the mid-block's attention,
which is global over a frame's positions. So before each 3x3 convolution a rank swaps its edge
rows with its neighbours (``RowBands.halo``: one all-gather of two rows per rank; zeros at the
frame's top and bottom, which is the convolution's own zero padding), and the attention's
queries of my rows attend to every rank's keys and values (``RowBands.gather``: the mid-block
runs at the latent grid, so they are small). The alternative, one exchange of enough latent
rows for the decoder's receptive field, cannot be exact here - the mid-block attention makes
the receptive field the whole frame - and even its convolutional part is about 17 latent rows
each side for the Wan2.1 decoder (1 + 4 at the latent grid, then 6 convs + an upsampler per
level at 2x, 4x, 8x: 5 + 6 + 3.5 + 1.75 + 1), i.e. a band of 30 rows (sp=2 at 480p) would
decode 30 + 34 rows: no faster than one GPU. Per layer the exchange is 36 small collectives
per decode call for Wan2.1 (30 convs + 3 upsamplers + 2 for the attention + the final gather;
28 for the tiny preset; ``exchanges`` counts them, infra/bench/multi_gpu.py reports them and
the decode time) and no redundant compute.

**Causal temporal caches stay per rank**: each causal conv caches the last frames of its own
band (the cache is allocated for the band's grid, ``RowSplitVAE.new_decoder_cache``); the halo
is taken from the cached frames and the new ones together, after the cache is updated, so the
neighbours' history rows arrive with the rest and no rank ever stores another's rows.

**Under ``dreamrt serve --gpus N``** (``split_decode``, called by ``server/spmd_serving.py``)
the instance's codec becomes a ``RowSplitVAE`` and its decode op (``SplitDecodeOp``) runs on
every rank (``spmd = "all"``: it has collectives now). A stream's cache is a ``BandCache``:
rank 0's loops hold it; over the SPMD channel (which pickles the op's arguments) it travels as
its stream's key and frame count, and each follower decodes into its own band's cache of that
stream (``_Streams``: made zeroed on first use, dropped when rank 0's is collected). Not
mirrored: a cache copied or restored outside an op (forks are refused under ``--gpus``; a
resumed session's decoder history would be rank 0's band only).

Numerics: the same convolutions and attention on fewer output rows, with the same inputs; the
gloo test states the tolerance against one process (tests/models/test_vae_split.py).
Hooks: ``row_split`` on ``CausalConv3d``, ``Upsample`` and ``AttentionBlock``
(``models/wan/vae/blocks.py``), set by ``enable``; None = one process, the unchanged path.
"""

from __future__ import annotations

import logging
import weakref
from collections.abc import Iterator
from typing import Any

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

from models.loops.ops import DecodeOp
from models.wan.vae.autoencoder import WanVAE
from models.wan.vae.blocks import AttentionBlock, CausalConv3d, Upsample
from models.wan.vae.cache import DecoderCache

__all__ = ["BandCache", "RowBands", "RowSplitVAE", "SplitDecodeOp", "enable", "split_decode"]

log = logging.getLogger(__name__)


class RowBands:
    """One rank's view of the row split: its band, the halo exchange and the gathers.

    ``group``: the process group of the ``sp`` axis; ``size`` its world size, ``rank`` my
    index in it (band ``rank`` of ``size``, top to bottom). ``exchanges`` counts collectives.
    """

    def __init__(self, group: dist.ProcessGroup | None) -> None:
        self.group = group
        self.size = dist.get_world_size(group)
        self.rank = dist.get_rank(group)
        self.exchanges = 0

    def band(self, z: torch.Tensor) -> torch.Tensor:
        """My rows of dim -2. z: [..., h, w] -> [..., h / size, w]"""
        rows = z.shape[-2]
        if rows % self.size:
            raise ValueError(f"{rows} latent rows do not split over sp={self.size} ranks")
        share = rows // self.size
        return z[..., self.rank * share : (self.rank + 1) * share, :]

    def halo(self, x: torch.Tensor, rows: int) -> torch.Tensor:
        """My band with ``rows`` rows of each neighbour above and below (zeros past the frame's
        edges). x: [..., Hb, W] -> [..., Hb + 2 rows, W]"""
        edges = torch.cat((x[..., :rows, :], x[..., -rows:, :]), dim=-2).contiguous()
        parts = [torch.empty_like(edges) for _ in range(self.size)]
        dist.all_gather(parts, edges, group=self.group)  # [..., 2 rows, W] per rank
        self.exchanges += 1
        zeros = torch.zeros_like(edges[..., :rows, :])
        above = parts[self.rank - 1][..., rows:, :] if self.rank > 0 else zeros
        below = parts[self.rank + 1][..., :rows, :] if self.rank + 1 < self.size else zeros
        return torch.cat((above, x, below), dim=-2)

    def conv(self, conv: nn.Conv2d | nn.Conv3d, x: torch.Tensor) -> torch.Tensor:
        """``conv`` (stride 1, zero padding of half its kernel) over my band of ``x``: the halo
        stands in for the row padding. x: [B, C, (T,) Hb, W] -> [B, C', (T,) Hb, W]"""
        rows = conv.kernel_size[-2] // 2
        padding = (*conv.padding[:-2], 0, conv.padding[-1])
        fn = F.conv3d if isinstance(conv, nn.Conv3d) else F.conv2d
        return fn(self.halo(x, rows), conv.weight, conv.bias, conv.stride, padding)

    def gather(self, x: torch.Tensor, dim: int) -> torch.Tensor:
        """Every rank's ``x`` concatenated along ``dim`` in rank order (on every rank)."""
        parts = [torch.empty_like(x) for _ in range(self.size)]
        dist.all_gather(parts, x.contiguous(), group=self.group)
        self.exchanges += 1
        return torch.cat(parts, dim=dim)

    def gather_to_first(self, x: torch.Tensor, dim: int) -> torch.Tensor:
        """Rank 0: every band concatenated along ``dim``; other ranks: their own ``x``."""
        x = x.contiguous()
        parts = [torch.empty_like(x) for _ in range(self.size)] if self.rank == 0 else None
        # the default group (None) is the world: its rank 0 is global rank 0
        first = 0 if self.group is None else dist.get_global_rank(self.group, 0)
        dist.gather(x, parts, dst=first, group=self.group)
        self.exchanges += 1
        return torch.cat(parts, dim=dim) if parts is not None else x


def enable(vae: WanVAE, group: dist.ProcessGroup | None) -> RowBands:
    """Make ``vae``'s decoder decode a band of rows over ``group`` (module docstring); the
    encoder is untouched. Every rank must hold the same weights."""
    bands = RowBands(group)
    for module in vae.decoder.modules():
        if isinstance(module, CausalConv3d) and module.kernel_size[-2] > 1:
            module.row_split = bands
        elif isinstance(module, Upsample | AttentionBlock):
            module.row_split = bands
    return bands


class RowSplitVAE:
    """The decoding side of a ``WanVAE`` split by rows (a ``models.loops.ops.LatentCodec``).

    ``decode_chunk`` takes the whole chunk's latents on every rank and decodes its band with a
    band-sized ``DecoderCache``; rank 0 returns whole frames [B, 3, n, 8h, 8w], the others
    their band. Every rank must call it alike (collectives inside)."""

    def __init__(self, vae: WanVAE, group: dist.ProcessGroup | None) -> None:
        self.vae = vae
        self.bands = enable(vae, group)
        self.config = vae.config
        self.decoder = vae.decoder

    def parameters(self) -> Iterator[nn.Parameter]:
        return self.vae.parameters()

    def denormalize(self, z: torch.Tensor) -> torch.Tensor:
        return self.vae.denormalize(z)

    def _band_rows(self, latent_height: int) -> int:
        if latent_height % self.bands.size:
            raise ValueError(
                f"{latent_height} latent rows do not split over sp={self.bands.size} ranks"
            )
        return latent_height // self.bands.size

    def new_decoder_cache(
        self, batch_size: int, latent_height: int, latent_width: int
    ) -> BandCache:
        """A zeroed cache for my band of a new ``latent_height x latent_width`` stream."""
        return _STREAMS.open(self, batch_size, (self._band_rows(latent_height), latent_width))

    def band_cache(self, batch_size: int, band_hw: tuple[int, int], stream: int) -> BandCache:
        plain = self.vae.new_decoder_cache(batch_size, *band_hw)
        return BandCache(plain.specs, plain.buffers, plain.grid_hw, stream=stream)

    def decode_flops(
        self, latent_frames: int, latent_height: int, latent_width: int, *, first: bool = False
    ) -> float:
        """One rank's share (its band) of ``WanVAE.decode_flops``, for the cost prior."""
        rows = self._band_rows(latent_height)
        return self.vae.decode_flops(latent_frames, rows, latent_width, first=first)

    def decoder_cache_bytes(
        self, batch_size: int, latent_height: int, latent_width: int, dtype: torch.dtype
    ) -> int:
        rows = self._band_rows(latent_height)
        return self.vae.decoder_cache_bytes(batch_size, rows, latent_width, dtype)

    def decode_chunk(self, z: torch.Tensor, cache: DecoderCache) -> torch.Tensor:
        # z: [B, z_dim, c, h, w] -> rank 0: [B, 3, n, 8h, 8w]; others: [B, 3, n, 8h/sp, 8w]
        frames = self.vae.decode_chunk(self.bands.band(z), cache)
        return self.bands.gather_to_first(frames, dim=3)


class BandCache(DecoderCache, weakref=True):
    """One rank's decoder cache of stream ``stream`` under the row split (module docstring:
    how it crosses the SPMD channel). ``stream`` -1: a copy, bound to no stream."""

    stream: int = -1

    def __reduce__(self) -> tuple:
        dead = _STREAMS.take_dead()
        return (_follow, (self.stream, self.frames_seen, self.grid_hw, self.batch_size, dead))


class _Streams:
    """This process's band caches by stream: rank 0 numbers the streams it opens and notes the
    ones collected; a follower holds its own cache per stream until rank 0 drops it."""

    def __init__(self) -> None:
        self.codec: RowSplitVAE | None = None
        self.held: dict[int, BandCache] = {}
        self.dead: list[int] = []
        self.next = 0

    def open(self, codec: RowSplitVAE, batch: int, band_hw: tuple[int, int]) -> BandCache:
        self.codec, (stream, self.next) = codec, (self.next, self.next + 1)
        cache = codec.band_cache(batch, band_hw, stream)
        weakref.finalize(cache, self._died, stream)
        return cache

    def _died(self, stream: int) -> None:
        self.dead.append(stream)  # the list of now: take_dead swaps it

    def take_dead(self) -> list[int]:
        dead, self.dead = self.dead, []
        return dead

    def follow(self, stream: int, frames_seen: int, band_hw: tuple, batch: int) -> BandCache:
        if self.codec is None:
            raise RuntimeError("a band cache arrived before split_decode ran on this rank")
        cache = self.held.get(stream)
        if cache is None:
            cache = self.held[stream] = self.codec.band_cache(batch, tuple(band_hw), stream)
        elif frames_seen == 0:
            cache.reset()  # rank 0 restarted the stream
        cache.frames_seen = frames_seen
        return cache


_STREAMS = _Streams()


def _follow(stream: int, frames_seen: int, band_hw: tuple, batch: int, dead: list) -> BandCache:
    for key in dead:
        _STREAMS.held.pop(key, None)
    return _STREAMS.follow(stream, frames_seen, band_hw, batch)


class SplitDecodeOp(DecodeOp):
    """The decode op over a ``RowSplitVAE``: every rank runs it (collectives inside), always on
    the main stream (a side stream would reorder the collectives)."""

    spmd = "all"

    def set_overlap(self, enabled: bool, device: torch.device) -> None:
        super().set_overlap(False, device)


def split_decode(instance: Any, group: dist.ProcessGroup | None, latent_height: int) -> bool:
    """Decode ``instance``'s streams split by rows over ``group`` (every rank calls it alike);
    False (nothing changes: rank 0 decodes alone) for a codec that is not a ``WanVAE`` or a
    ``latent_height`` that does not split."""
    size = dist.get_world_size(group)
    if not isinstance(instance.vae, WanVAE) or latent_height % size:
        log.info("VAE decode on rank 0 (%s)", type(instance.vae).__name__)
        return False
    codec = RowSplitVAE(instance.vae, group)
    _STREAMS.codec = codec
    instance.vae = codec
    instance.decode_op = SplitDecodeOp(codec)
    return True
