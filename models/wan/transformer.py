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
that in Wan ``norm3`` is the cross-attention norm and ``norm2`` the FFN norm. Numerics follow
diffusers: layer norms, modulation and residual updates in float32, cast back to the model dtype.
Forward paths have no host syncs and no data-dependent control flow.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from models.wan.attention import WanCrossAttention, WanSelfAttention
from models.wan.conditioning import (
    HookEmbedding,
    sinusoidal_embedding,
    text_embedding,
    time_embedding,
    time_projection,
)
from models.wan.config import WanDiTConfig
from models.wan.kv_cache import ChunkKVCache, WriteRun
from models.wan.rope import rope_cos_sin

__all__ = ["CrossKV", "InputShapeError", "WanBlock", "WanDiT", "dit_flops", "param_dtype"]

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


def _norm_fp32(norm: nn.Module, x: torch.Tensor) -> torch.Tensor:
    # x: [B, N, dim] -> float32 [B, N, dim]
    if isinstance(norm, nn.LayerNorm):
        weight = None if norm.weight is None else norm.weight.float()
        bias = None if norm.bias is None else norm.bias.float()
        return F.layer_norm(x.float(), norm.normalized_shape, weight, bias, norm.eps)
    return x.float()


class WanBlock(nn.Module):
    """Self-attention (3D RoPE) -> cross-attention to the prompt -> FFN, AdaLN-modulated."""

    def __init__(self, config: WanDiTConfig) -> None:
        super().__init__()
        dim, eps = config.dim, config.eps
        qk_norm = config.qk_norm is not None
        self.norm1 = nn.LayerNorm(dim, eps, elementwise_affine=False)
        self.self_attn = WanSelfAttention(dim, config.num_heads, qk_norm, eps)
        self.norm3 = nn.LayerNorm(dim, eps) if config.cross_attn_norm else nn.Identity()
        self.cross_attn = WanCrossAttention(dim, config.num_heads, qk_norm, eps)
        self.norm2 = nn.LayerNorm(dim, eps, elementwise_affine=False)
        self.ffn = nn.Sequential(
            nn.Linear(dim, config.ffn_dim),
            nn.GELU(approximate="tanh"),
            nn.Linear(config.ffn_dim, dim),
        )
        self.modulation = nn.Parameter(torch.randn(1, 6, dim) / dim**0.5)

    def forward(
        self,
        x: torch.Tensor,
        e0: torch.Tensor,
        cos: torch.Tensor,
        sin: torch.Tensor,
        cross_k: torch.Tensor,
        cross_v: torch.Tensor,
        past: tuple[torch.Tensor, torch.Tensor] | None = None,
        mask: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        # x: [B, N, dim]; e0: [B, 1 | N, 6, dim]; cos, sin: [N, D/2]; cross_k/v: [B, L, H, D]
        # -> x [B, N, dim], this call's self-attention k, v [B, N, H, D]
        mods = (self.modulation.float() + e0.float()).unbind(2)  # 6 x [B, 1 | N, dim]
        shift, scale, gate, c_shift, c_scale, c_gate = mods
        h = (_norm_fp32(self.norm1, x) * (1 + scale) + shift).type_as(x)
        attn, k, v = self.self_attn(h, cos, sin, past, mask)
        x = (x.float() + attn * gate).type_as(x)
        x = x + self.cross_attn(_norm_fp32(self.norm3, x).type_as(x), cross_k, cross_v)
        h = (_norm_fp32(self.norm2, x) * (1 + c_scale) + c_shift).type_as(x)
        x = (x.float() + self.ffn(h).float() * c_gate).type_as(x)
        return x, k, v


class WanHead(nn.Module):
    """Final modulated norm and the linear map back to patch pixels."""

    def __init__(self, config: WanDiTConfig) -> None:
        super().__init__()
        dim = config.dim
        self.norm = nn.LayerNorm(dim, config.eps, elementwise_affine=False)
        self.head = nn.Linear(dim, config.out_channels * config.patch_volume)
        self.modulation = nn.Parameter(torch.randn(1, 2, dim) / dim**0.5)

    def forward(self, x: torch.Tensor, e: torch.Tensor) -> torch.Tensor:
        # x: [B, N, dim]; e: [B, 1 | N, dim] -> [B, N, out_channels * patch_volume]
        shift, scale = (self.modulation.float() + e.float().unsqueeze(2)).unbind(2)
        return self.head((_norm_fp32(self.norm, x) * (1 + scale) + shift).type_as(x))


class WanDiT(nn.Module):
    """The Wan2.1 text-to-video transformer (see the module docstring for the three modes).

    Inputs are latents ``[B, C, F, H, W]`` with F, H, W divisible by the patch size (otherwise
    ``InputShapeError``), timesteps on Wan's 0..1000 scale, text features ``[B, L, text_dim]``.
    Optional hooks: ``action`` ([B, action_dim] per chunk) and ``audio`` ([B, F, audio_dim] per
    latent frame); passing one the config does not declare raises ``InputShapeError``.
    """

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
        return self._run(tokens, grid, 0, e, e0, cross)

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
        return self._run(tokens, grid, 0, e, e0, cross, mask=mask)

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
        weight = self.text_embedding[0].weight
        context = self.text_embedding(encoder_hidden_states.to(weight.dtype))  # [B, L, dim]
        ks, vs = zip(*(block.cross_attn.kv(context) for block in self.blocks), strict=True)
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
        tokens = self._embed_tokens(x, audio, grid)
        e, e0 = self._embed_time(timestep, action, grid[0])
        runs = cache.plan_write(frames) if write_cache else ()
        past_tokens, mask = cache.attention_keys(frames * tokens_per_frame)
        out = self._run(
            tokens,
            grid,
            frame_start,
            e,
            e0,
            cross,
            mask=mask,
            caches=(cache,),
            past_tokens=past_tokens,
            runs=(runs,) if runs else (),
        )
        if write_cache:
            cache.commit(runs, frames, frame_start)
        return out

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
            tuple(frame_starts),
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
        grid = tuple(size // p for size, p in zip(x.shape[2:], cfg.patch_size, strict=True))
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
        weight = self.time_embedding[0].weight
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
        proj = self.time_projection[1].weight
        e0 = self.time_projection(e.to(proj.dtype)).unflatten(-1, (6, self.config.dim))
        return e, e0

    def _run(
        self,
        tokens: torch.Tensor,
        grid: tuple[int, int, int],
        frame_start: int | tuple[int, ...],
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
        # frame_start: one position for the batch, or one per sample (cos/sin [B, N, D/2]);
        # caches: one per sample (or one of batch B); past_tokens: leading cache tokens each
        # block attends to (0: none, no concatenation); runs: per cache, its K/V writes
        tokens_per_frame = grid[1] * grid[2]
        if e.shape[1] > 1:  # per-frame conditioning: spread to that frame's tokens
            e = e.repeat_interleave(tokens_per_frame, dim=1)
            e0 = e0.repeat_interleave(tokens_per_frame, dim=1)
        starts = frame_start if isinstance(frame_start, tuple) else (frame_start,)
        tables = [
            rope_cos_sin(
                self.config.rope_split(), grid, start, self.config.rope_theta, tokens.device
            )
            for start in starts
        ]
        cos, sin = tables[0] if len(tables) == 1 else (torch.stack(t) for t in zip(*tables))
        x = tokens
        for index, block in enumerate(self.blocks):
            past = _gather_past(caches, index, past_tokens)
            x, k, v = block(x, e0, cos, sin, cross.k[index], cross.v[index], past, mask)
            for i, (cache, cache_runs) in enumerate(zip(caches, runs, strict=False)):
                if cache_runs:
                    rows = slice(None) if len(caches) == 1 else slice(i, i + 1)
                    cache.write(index, k[rows], v[rows], cache_runs)
        return self._unpatchify(self.head(x, e), grid)

    def _unpatchify(self, y: torch.Tensor, grid: tuple[int, int, int]) -> torch.Tensor:
        # y: [B, N, C * pt * ph * pw] -> [B, C, F, H, W]
        (f, h, w), (pt, ph, pw) = grid, self.config.patch_size
        y = y.reshape(y.shape[0], f, h, w, pt, ph, pw, self.config.out_channels)
        y = y.permute(0, 7, 1, 4, 2, 5, 3, 6)  # [B, C, f, pt, h, ph, w, pw]
        return y.reshape(y.shape[0], self.config.out_channels, f * pt, h * ph, w * pw)


def _gather_past(
    caches: tuple[ChunkKVCache, ...], layer: int, tokens: int
) -> tuple[torch.Tensor, torch.Tensor] | None:
    """Layer ``layer``'s first ``tokens`` cached K/V of every sample: 2 x [B, tokens, H, D]
    (the cache's own views for one cache; concatenated for a batch of sessions)."""
    if not caches or not tokens:
        return None
    if len(caches) == 1:
        return caches[0].layer(layer, tokens)
    pairs = [c.layer(layer, tokens) for c in caches]
    return torch.cat([k for k, _ in pairs]), torch.cat([v for _, v in pairs])


def dit_flops(
    config: WanDiTConfig,
    tokens_q: int,
    tokens_kv: int,
    text_len: int,
    *,
    batch: int = 1,
    include_text: bool = False,
) -> float:
    """Matmul FLOPs (2*m*n*k each) of one forward over ``tokens_q`` query tokens.

    ``tokens_kv`` is how many keys self-attention sees (cached + own; = ``tokens_q`` for a
    bidirectional forward). Cross-attention K/V and the text embedding are counted only with
    ``include_text`` (they are computed once per prompt). Elementwise work is not counted.
    """
    d, pv = config.dim, config.patch_volume
    per_layer = (
        4 * 2 * tokens_q * d * d  # self q, k, v, o
        + 2 * 2 * tokens_q * tokens_kv * d  # self QK^T and AV over all heads
        + 2 * 2 * tokens_q * d * d  # cross q, o
        + 2 * 2 * tokens_q * text_len * d  # cross QK^T and AV
        + 2 * 2 * tokens_q * d * config.ffn_dim  # FFN up and down
    )
    total = config.num_layers * per_layer
    total += 2 * tokens_q * d * config.in_channels * pv  # patch embedding
    total += 2 * tokens_q * d * config.out_channels * pv  # head
    total += 2 * d * (config.freq_dim + d + 6 * d)  # time embedding + projection
    if include_text:
        total += 2 * text_len * d * (config.text_dim + d)  # text embedding
        total += config.num_layers * 2 * 2 * text_len * d * d  # cross k, v
    return float(batch * total)
