"""Wan2.1 DiT: bidirectional, block-causal, and chunk-causal over a preallocated KV cache.

One module, three entry points sharing every layer:

- ``forward(x, t, text)``: bidirectional over all frames; equals diffusers'
  ``WanTransformer3DModel(...).sample`` for the same weights (T2V / T2I jobs).
- ``forward_block_causal(x, t, text, chunk_frames)``: one pass where frame chunk i attends to
  chunks <= i: the reference that a chunked rollout must reproduce.
- ``forward_chunk(x_chunk, t, cross, cache, frame_start, ...)``: one chunk attends to itself and
  to the cached frames (sinks + rolling window); ``write_cache=True`` stores its K/V (the
  KV-update pass on the clean chunk). ``cross_kv(text)`` precomputes cross-attention K/V.

Parameter names are the original Wan ones (``blocks.N.self_attn.q``, ``head.head`` ...); note
that in Wan ``norm3`` is the cross-attention norm and ``norm2`` the FFN norm. The block and the
head are ``models/wan/dit/block.py``, the FLOP count ``models/wan/dit/flops.py``. Forward paths
have no host syncs and no data-dependent control flow.

``forward_chunk`` does its host-side bookkeeping (shape checks, where the K/V writes go, which
keys to attend to, the RoPE tables of its position) first and then runs the device work as one
``ChunkCall`` through ``_chunk_body``, or through ``chunk_graphs`` when one is set
(``models/wan/dit/cuda_graphs.py``: CUDA graphs of the steady-state call, same numerics).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol, cast

import torch
from torch import nn

from models.wan.dit.block import WanBlock, WanHead
from models.wan.dit.conditioning import (
    HookEmbedding,
    sinusoidal_embedding,
    text_embedding,
    time_embedding,
    time_projection,
)
from models.wan.dit.config import WanDiTConfig
from models.wan.dit.flops import dit_flops
from models.wan.dit.rope import rope_cos_sin
from models.wan.kv.cache import ChunkKVCache, WriteRun
from models.wan.kv.fp8 import Fp8Past

if TYPE_CHECKING:
    from models.wan.dit.sequence_parallel import SequenceShards

__all__ = [
    "ChunkCall",
    "CrossKV",
    "InputShapeError",
    "WanBlock",
    "WanDiT",
    "dit_flops",
    "param_dtype",
]

# Parameters kept in float32 when the model runs in bf16/fp16 (as diffusers does): the timestep
# path feeds every modulation, and the cross-attention norm's affine is tiny.
_FP32_PARAMS = re.compile(r"^(time_embedding\.|action_embedding\.)|modulation$|\.norm3\.")


def param_dtype(name: str, dtype: torch.dtype) -> torch.dtype:
    """Storage dtype of parameter ``name`` in a model whose compute dtype is ``dtype``."""
    return torch.float32 if _FP32_PARAMS.search(name) else dtype


class InputShapeError(ValueError):
    """An input whose shape does not fit the config or the cache (names both)."""


@dataclass(frozen=True, slots=True)
class CrossKV:
    """Cross-attention K/V of one prompt for every layer; compute once, reuse every step.

    k, v: [layers, B, L, heads, head_dim] in the model dtype.
    """

    k: torch.Tensor
    v: torch.Tensor
    digest: str = ""  # of the prompt's text-encoder embedding (behaviour records)

    @property
    def nbytes(self) -> int:
        return self.k.nbytes + self.v.nbytes


@dataclass(frozen=True, slots=True)
class ChunkCall:
    """The device work of one ``forward_chunk``, its host-side decisions already made.

    x: [B, C, f, H, W]; timestep: [B]; cos, sin: [N, D/2] RoPE tables of the chunk's position;
    ``past_tokens`` leading cache tokens attended to under ``mask`` (None: unmasked); ``runs``
    the K/V writes (empty: none); action: [B, action_dim]; audio: [B, f, audio_dim].
    """

    x: torch.Tensor
    timestep: torch.Tensor
    cross: CrossKV
    cos: torch.Tensor
    sin: torch.Tensor
    cache: ChunkKVCache
    past_tokens: int
    mask: torch.Tensor | None
    runs: tuple[WriteRun, ...]
    action: torch.Tensor | None
    audio: torch.Tensor | None


class ChunkRunner(Protocol):
    """Runs ``body(call)`` or work equal to it, bit for bit (``models/wan/dit/cuda_graphs.py``)."""

    def run(self, body: Callable[[ChunkCall], torch.Tensor], call: ChunkCall) -> torch.Tensor: ...


class WanDiT(nn.Module):
    """The Wan2.1 text-to-video transformer (see the module docstring for the three modes).

    Inputs are latents ``[B, C, F, H, W]`` with F, H, W divisible by the patch size (otherwise
    ``InputShapeError``), timesteps on Wan's 0..1000 scale, text features ``[B, L, text_dim]``.
    Optional hooks: ``action`` ([B, action_dim] per chunk) and ``audio`` ([B, F, audio_dim] per
    latent frame); passing one the config does not declare raises ``InputShapeError``.
    ``chunk_graphs`` (set by ``WanInstance.compile(cuda_graphs=True)``) runs ``forward_chunk``'s
    device work; None runs it directly.
    """

    chunk_graphs: ChunkRunner | None = None
    # Ulysses token shards (models/wan/dit/sequence_parallel.py): None runs every token here
    sequence_parallel: SequenceShards | None = None

    def __init__(self, config: WanDiTConfig) -> None:
        super().__init__()
        self.config = config
        dim = config.dim
        self.patch_embedding = nn.Conv3d(
            config.in_channels, dim, kernel_size=config.patch_size, stride=config.patch_size
        )
        self.text_embedding = text_embedding(config.text_dim, dim)
        self.time_embedding = time_embedding(config.freq_dim, dim)
        self.time_projection = time_projection(dim)
        self.blocks = nn.ModuleList(WanBlock(config) for _ in range(config.num_layers))
        self.head = WanHead(config)
        self.action_embedding = HookEmbedding(config.action_dim, dim) if config.action_dim else None
        self.audio_embedding = HookEmbedding(config.audio_dim, dim) if config.audio_dim else None

    # ---------------------------------------------------------------------------------------
    # public entry points

    def forward(
        self,
        hidden_states: torch.Tensor,
        timestep: torch.Tensor,
        encoder_hidden_states: torch.Tensor,
        *,
        action: torch.Tensor | None = None,
        audio: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """Bidirectional denoiser output (flow/noise prediction) for all frames.

        hidden_states: [B, C, F, H, W]; timestep: [B]; encoder_hidden_states: [B, L, text_dim]
        -> [B, out_channels, F, H, W]
        """
        grid = self._check_latents(hidden_states, timestep)
        tokens = self._embed_tokens(hidden_states, audio, grid)
        e, e0 = self._embed_time(timestep, action, grid[0])
        cross = self.cross_kv(encoder_hidden_states)
        return self._run(tokens, grid, self._rope(grid, (0,), tokens.device), e, e0, cross)

    def forward_block_causal(
        self,
        hidden_states: torch.Tensor,
        timestep: torch.Tensor,
        encoder_hidden_states: torch.Tensor,
        chunk_frames: int,
        *,
        action: torch.Tensor | None = None,
        audio: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """All frames in one pass, latent-frame chunk i attending to chunks 0..i.

        hidden_states: [B, C, F, H, W]; timestep: [B] or [B, F] (per latent frame);
        action: [B, action_dim] or [B, F, action_dim] -> [B, out_channels, F, H, W]
        """
        grid = self._check_latents(hidden_states, timestep)
        if chunk_frames < 1:
            raise InputShapeError(f"chunk_frames must be >= 1, got {chunk_frames}")
        tokens = self._embed_tokens(hidden_states, audio, grid)
        e, e0 = self._embed_time(timestep, action, grid[0])
        cross = self.cross_kv(encoder_hidden_states)
        frames, tokens_per_frame = grid[0], grid[1] * grid[2]
        chunk = torch.arange(frames * tokens_per_frame, device=tokens.device)
        chunk = chunk // tokens_per_frame // chunk_frames  # [N] chunk index of each token
        mask = chunk[None, :] <= chunk[:, None]  # [N, N] True = attend
        rope = self._rope(grid, (0,), tokens.device)
        return self._run(tokens, grid, rope, e, e0, cross, mask=mask)

    def cross_kv(self, encoder_hidden_states: torch.Tensor) -> CrossKV:
        """Per-layer cross-attention K/V of a prompt (cache it per prompt).

        encoder_hidden_states: [B, L, text_dim] -> CrossKV with k, v [layers, B, L, H, D]
        """
        text = encoder_hidden_states
        if text.ndim != 3 or text.shape[-1] != self.config.text_dim:
            raise InputShapeError(
                f"encoder_hidden_states {tuple(encoder_hidden_states.shape)} is not "
                f"[B, L, text_dim={self.config.text_dim}]"
            )
        weight = cast(nn.Linear, self.text_embedding[0]).weight
        context = self.text_embedding(encoder_hidden_states.to(weight.dtype))  # [B, L, dim]
        blocks = cast("Iterable[WanBlock]", self.blocks)  # a ModuleList keeps no element type
        ks, vs = zip(*(block.cross_attn.kv(context) for block in blocks), strict=True)
        return CrossKV(torch.stack(ks), torch.stack(vs))

    def forward_chunk(
        self,
        x: torch.Tensor,
        timestep: torch.Tensor,
        cross: CrossKV,
        cache: ChunkKVCache,
        frame_start: int,
        action: torch.Tensor | None = None,
        audio: torch.Tensor | None = None,
        write_cache: bool = False,
    ) -> torch.Tensor:
        """One chunk, bidirectional within itself and causal to the cached frames.

        ``frame_start`` is the chunk's absolute latent frame index (its RoPE position). With
        ``write_cache`` the chunk's K/V are written after attention (run it on the clean chunk
        at timestep 0 once denoising is done); the chunk never attends to its own cached copy.
        x: [B, C, f, H, W]; timestep: [B]; action: [B, action_dim]; audio: [B, f, audio_dim]
        -> [B, out_channels, f, H, W]
        """
        grid = self._check_latents(x, timestep)
        frames, tokens_per_frame = grid[0], grid[1] * grid[2]
        if tokens_per_frame != cache.tokens_per_frame or x.shape[0] != cache.batch:
            raise InputShapeError(
                f"chunk has batch {x.shape[0]} and {tokens_per_frame} tokens/frame; the cache "
                f"holds batch {cache.batch} and {cache.tokens_per_frame} tokens/frame"
            )
        if cache.num_layers != self.config.num_layers or cross.k.shape[0] != self.config.num_layers:
            raise InputShapeError(
                f"cache has {cache.num_layers} layers and cross K/V {cross.k.shape[0]}; the model "
                f"has {self.config.num_layers}"
            )
        if frame_start < 0:
            raise InputShapeError(f"frame_start must be >= 0, got {frame_start}")
        runs = cache.plan_write(frames) if write_cache else ()
        past_tokens, mask = cache.attention_keys(frames * tokens_per_frame)
        cos, sin = self._rope(grid, (frame_start,), x.device)
        call = ChunkCall(
            x, timestep, cross, cos, sin, cache, past_tokens, mask, runs, action, audio
        )
        graphs = self.chunk_graphs
        out = self._chunk_body(call) if graphs is None else graphs.run(self._chunk_body, call)
        if write_cache:
            cache.commit(runs, frames, frame_start)
        return out

    def _chunk_body(self, call: ChunkCall) -> torch.Tensor:
        """``forward_chunk``'s device work (no host syncs, no host-side state changes: a CUDA
        graph may capture it). -> [B, out_channels, f, H, W]"""
        grid = self._check_latents(call.x, call.timestep)
        tokens = self._embed_tokens(call.x, call.audio, grid)
        e, e0 = self._embed_time(call.timestep, call.action, grid[0])
        return self._run(
            tokens,
            grid,
            (call.cos, call.sin),
            e,
            e0,
            call.cross,
            mask=call.mask,
            caches=(call.cache,),
            past_tokens=call.past_tokens,
            runs=(call.runs,) if call.runs else (),
        )

    def forward_chunks(
        self,
        x: torch.Tensor,
        timestep: torch.Tensor,
        cross: CrossKV,
        caches: Sequence[ChunkKVCache],
        frame_starts: Sequence[int],
        action: torch.Tensor | None = None,
        audio: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """Several sessions' chunks as one batch: sample i attends to ``caches[i]`` (one cache
        per sample, batch 1 each) at RoPE position ``frame_starts[i]``; no cache is written.

        Every cache must present the same keys to attend to (the same filled prefix, read
        unmasked: what streams in steady state have); otherwise ``InputShapeError`` and the
        caller runs the chunks one by one. Within a stated tolerance of one ``forward_chunk``
        per sample (batched GEMMs may accumulate differently).
        x: [B, C, f, H, W]; timestep: [B]; cross: k, v [layers, B, L, H, D]; action: [B, a];
        audio: [B, f, audio_dim] -> [B, out_channels, f, H, W]
        """
        grid = self._check_latents(x, timestep)
        frames, tokens_per_frame = grid[0], grid[1] * grid[2]
        if len(caches) != x.shape[0] or len(frame_starts) != x.shape[0]:
            raise InputShapeError(
                f"batch {x.shape[0]} with {len(caches)} caches and {len(frame_starts)} frame starts"
            )
        keys = {c.attention_keys(frames * tokens_per_frame)[0] for c in caches}
        if (
            len(keys) != 1
            or any(c.prefix_frames is None for c in caches)
            or any(c.tokens_per_frame != tokens_per_frame or c.batch != 1 for c in caches)
        ):
            raise InputShapeError(
                "batched chunks need caches of batch 1 with one filled prefix "
                f"of {tokens_per_frame} tokens/frame; got keys {sorted(keys)}"
            )
        tokens = self._embed_tokens(x, audio, grid)
        e, e0 = self._embed_time(timestep, action, grid[0])
        return self._run(
            tokens,
            grid,
            self._rope(grid, tuple(frame_starts), x.device),
            e,
            e0,
            cross,
            caches=tuple(caches),
            past_tokens=keys.pop(),
        )

    def flops_per_chunk(
        self, tokens_q: int, tokens_kv: int, text_len: int | None = None, batch: int = 1
    ) -> float:
        """Matmul FLOPs of one chunk forward with cached cross K/V (see ``dit_flops``)."""
        return dit_flops(
            self.config,
            tokens_q,
            tokens_kv,
            self.config.text_len if text_len is None else text_len,
            batch=batch,
        )

    def reset_hooks(self) -> None:
        """Put the action/audio hooks back into their exact no-op state."""
        for hook in (self.action_embedding, self.audio_embedding):
            if hook is not None:
                hook.reset_parameters()

    # ---------------------------------------------------------------------------------------
    # shared pieces

    def _check_latents(self, x: torch.Tensor, timestep: torch.Tensor) -> tuple[int, int, int]:
        # x: [B, C, F, H, W] -> token grid (F/pt, H/ph, W/pw)
        cfg = self.config
        if x.ndim != 5 or x.shape[1] != cfg.in_channels:
            raise InputShapeError(
                f"latents {tuple(x.shape)} are not [B, C={cfg.in_channels}, F, H, W]"
            )
        if any(size % p for size, p in zip(x.shape[2:], cfg.patch_size, strict=True)):
            raise InputShapeError(
                f"latent F, H, W {tuple(x.shape[2:])} not divisible by patch {cfg.patch_size}"
            )
        (pt, ph, pw), (f, h, w) = cfg.patch_size, x.shape[2:]
        grid = (f // pt, h // ph, w // pw)
        if timestep.shape not in ((x.shape[0],), (x.shape[0], grid[0])):
            raise InputShapeError(
                f"timestep {tuple(timestep.shape)} is not [B={x.shape[0]}] or "
                f"[B={x.shape[0]}, F={grid[0]}]"
            )
        return grid

    def _embed_tokens(
        self, x: torch.Tensor, audio: torch.Tensor | None, grid: tuple[int, int, int]
    ) -> torch.Tensor:
        # x: [B, C, F, H, W]; audio: [B, F', audio_dim] -> tokens [B, N, dim], frame-major
        weight = self.patch_embedding.weight
        tokens = self.patch_embedding(x.to(weight.dtype)).flatten(2).transpose(1, 2).contiguous()
        if audio is None:
            return tokens
        if self.audio_embedding is None or audio.shape != (
            x.shape[0],
            grid[0],
            self.config.audio_dim,
        ):
            raise InputShapeError(
                f"audio {tuple(audio.shape)} given; expected [B={x.shape[0]}, f={grid[0]}, "
                f"audio_dim={self.config.audio_dim}] and a config with audio_dim > 0"
            )
        per_frame = self.audio_embedding(audio.to(weight.dtype))  # [B, f, dim]
        tokens = tokens.unflatten(1, (grid[0], grid[1] * grid[2])) + per_frame[:, :, None, :]
        return tokens.flatten(1, 2)

    def _embed_time(
        self, timestep: torch.Tensor, action: torch.Tensor | None, frames: int
    ) -> tuple[torch.Tensor, torch.Tensor]:
        # timestep: [B] or [B, F]; action: [B, A] or [B, F, A]
        # -> e [B, 1 | F, dim], e0 [B, 1 | F, 6, dim]
        t = timestep if timestep.ndim == 2 else timestep[:, None]  # [B, 1 | F]
        weight = cast(nn.Linear, self.time_embedding[0]).weight
        feats = sinusoidal_embedding(t.flatten(), self.config.freq_dim).unflatten(0, t.shape)
        e = self.time_embedding(feats.to(weight.dtype))  # [B, 1 | F, dim]
        if action is not None:
            batch, width = t.shape[0], self.config.action_dim
            if self.action_embedding is None or action.shape not in (
                (batch, width),
                (batch, frames, width),
            ):
                raise InputShapeError(
                    f"action {tuple(action.shape)} is not [B={batch}, action_dim={width}] or "
                    f"[B, F={frames}, action_dim] (a config with action_dim > 0 is required)"
                )
            act = action if action.ndim == 3 else action[:, None]  # [B, 1 | F, A]
            e = e + self.action_embedding(act.to(weight.dtype))
        proj = cast(nn.Linear, self.time_projection[1]).weight
        e0 = self.time_projection(e.to(proj.dtype)).unflatten(-1, (6, self.config.dim))
        return e, e0

    def _rope(
        self, grid: tuple[int, int, int], starts: tuple[int, ...], device: torch.device
    ) -> tuple[torch.Tensor, torch.Tensor]:
        # RoPE cos/sin of a token grid at each latent frame start: [N, D/2] for one start,
        # [B, N, D/2] for one per sample (a batch of sessions at their own positions)
        cfg = self.config
        tables = [
            rope_cos_sin(cfg.rope_split(), grid, start, cfg.rope_theta, device) for start in starts
        ]
        if len(tables) == 1:
            return tables[0]
        cos, sin = (torch.stack(t) for t in zip(*tables))
        return cos, sin

    def _run(
        self,
        tokens: torch.Tensor,
        grid: tuple[int, int, int],
        rope: tuple[torch.Tensor, torch.Tensor],
        e: torch.Tensor,
        e0: torch.Tensor,
        cross: CrossKV,
        *,
        mask: torch.Tensor | None = None,
        caches: tuple[ChunkKVCache, ...] = (),
        past_tokens: int = 0,
        runs: tuple[tuple[WriteRun, ...], ...] = (),
    ) -> torch.Tensor:
        # tokens: [B, N, dim]; e: [B, 1 | F, dim]; e0: [B, 1 | F, 6, dim] -> [B, C, F, H, W]
        # rope: cos, sin [N, D/2] (one position for the batch) or [B, N, D/2] (one per sample);
        # caches: one per sample (or one of batch B); past_tokens: leading cache tokens each
        # block attends to (0: none, no concatenation); runs: per cache, its K/V writes
        tokens_per_frame = grid[1] * grid[2]
        if e.shape[1] > 1:  # per-frame conditioning: spread to that frame's tokens
            e = e.repeat_interleave(tokens_per_frame, dim=1)
            e0 = e0.repeat_interleave(tokens_per_frame, dim=1)
        cos, sin = rope
        x = tokens
        shards = self.sequence_parallel
        if shards is not None:  # this rank's tokens only, up to the head's all-gather
            x, e, e0 = shards.scatter(x), shards.scatter(e), shards.scatter(e0)
        for index, block in enumerate(self.blocks):
            past = _gather_past(caches, index, past_tokens)
            x, k, v = block(x, e0, cos, sin, cross.k[index], cross.v[index], past, mask)
            for i, (cache, cache_runs) in enumerate(zip(caches, runs, strict=False)):
                if cache_runs:
                    rows = slice(None) if len(caches) == 1 else slice(i, i + 1)
                    cache.write(index, k[rows], v[rows], cache_runs)
        y = self.head(x, e)
        return self._unpatchify(y if shards is None else shards.gather(y), grid)

    def _unpatchify(self, y: torch.Tensor, grid: tuple[int, int, int]) -> torch.Tensor:
        # y: [B, N, C * pt * ph * pw] -> [B, C, F, H, W]
        (f, h, w), (pt, ph, pw) = grid, self.config.patch_size
        y = y.reshape(y.shape[0], f, h, w, pt, ph, pw, self.config.out_channels)
        y = y.permute(0, 7, 1, 4, 2, 5, 3, 6)  # [B, C, f, pt, h, ph, w, pw]
        return y.reshape(y.shape[0], self.config.out_channels, f * pt, h * ph, w * pw)


def _gather_past(
    caches: tuple[ChunkKVCache, ...], layer: int, tokens: int
) -> tuple[torch.Tensor, torch.Tensor] | Fp8Past | None:
    """Layer ``layer``'s first ``tokens`` cached K/V of every sample: 2 x [B, tokens, H, D], or
    an ``Fp8Past`` for e4m3 caches (the cache's own views for one cache; concatenated for a
    batch of sessions)."""
    if not caches or not tokens:
        return None
    if len(caches) == 1:
        return caches[0].layer_past(layer, tokens)
    pasts = [c.layer_past(layer, tokens) for c in caches]
    if all(isinstance(p, Fp8Past) for p in pasts):
        fp8 = [p for p in pasts if isinstance(p, Fp8Past)]
        return Fp8Past(
            torch.cat([p.k for p in fp8]),
            torch.cat([p.v for p in fp8]),
            torch.cat([p.k_descale for p in fp8]),
            torch.cat([p.v_descale for p in fp8]),
        )
    if any(isinstance(p, Fp8Past) for p in pasts):
        raise InputShapeError("a batch mixes e4m3 and bf16 K/V caches")
    pairs = [p for p in pasts if not isinstance(p, Fp8Past)]
    return torch.cat([k for k, _ in pairs]), torch.cat([v for _, v in pairs])
