"""Chunk-KV cache in FP8: K and V quantised once, as they enter the cache, read by FP8 attention.

A bf16 session quantises nothing; an FP8-cache session (``WanInstance.configure(kv_cache=
"fp8")``) keeps its K/V slabs in e4m3 with one float32 *descale* per (layer, sample, head)::

    cache.k  [layers, B, slots, H, D] e4m3      cache.k_descale [layers, B, H] fp32
    K  ~=  cache.k.float() * k_descale[layer, b, h]     (the same for V)

Why one scale per head for the whole cache, not one per token: FlashAttention-3's FP8 kernel
takes exactly that (``k_descale`` [B, H]), so attention reads the cached prefix as stored, with
no per-call pass over it. Today's alternative (``fa3-fp8``) quantises the whole prefix at every
step of every chunk, which cost more than the FP8 kernel saved (infra/bench/RESULTS.md).

The scale is fixed by the first write into a reset cache: ``amax * HEADROOM / 448`` over that
chunk's clean K (or V) per head, so later chunks up to ``HEADROOM`` times larger still fit and
anything beyond is clamped (e4m3 is a float format: a generous scale costs precision only near
its subnormals, 2^-9 of the scale). The descale lives on the device and is computed there
(``torch.where`` on "not set yet" = 0), so a write syncs nothing and a CUDA graph may capture
it; ``ChunkKVCache.reset`` zeroes it with the buffers.

Attention (``cached_attention``): the chunk's own K/V are quantised with the cache's descale
and appended to the cached e4m3 prefix, Q is quantised per (sample, head) at each call (a few
microseconds: Q is one chunk's tokens), and FA3's FP8 kernel runs on them. Where that kernel
cannot run (no ``fa3-fwd``, not Hopper, a mask, a head dim it lacks) the same e4m3 values are
dequantised and SDPA runs on them, so the CPU computes what the GPU computes up to the
kernel's rounding.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

import torch

__all__ = [
    "E4M3_MAX",
    "HEADROOM",
    "Fp8Past",
    "cached_attention",
    "calibrated",
    "dequantize",
    "fa3_fp8_unsupported",
    "quantize_with",
]

log = logging.getLogger(__name__)

E4M3_MAX = 448.0  # largest finite float8_e4m3fn
HEADROOM = 4.0  # a cache's scale leaves room for values this many times its first chunk's max
_MIN_DESCALE = 1e-12
_LOGGED: set[str] = set()


@dataclass(frozen=True, slots=True)
class Fp8Past:
    """One layer's cached K/V in e4m3 with their descales: k, v [B, P, H, D] e4m3;
    k_descale, v_descale [B, H] fp32 (K ~= k * k_descale[:, None, :, None])."""

    k: torch.Tensor
    v: torch.Tensor
    k_descale: torch.Tensor
    v_descale: torch.Tensor


def calibrated(descale: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    """``descale`` where set (> 0), else the scale that maps ``x``'s max to 448 / HEADROOM.

    descale: [B, H] fp32 (0 = not set); x: [B, N, H, D] -> [B, H] fp32. Device-only (no sync).
    """
    amax = x.detach().abs().amax(dim=(1, 3)).float()  # [B, H]
    fresh = (amax * (HEADROOM / E4M3_MAX)).clamp_min(_MIN_DESCALE)
    return torch.where(descale > 0, descale, fresh)


def quantize_with(x: torch.Tensor, descale: torch.Tensor) -> torch.Tensor:
    """x: [B, N, H, D]; descale: [B, H] fp32 -> e4m3 [B, N, H, D] (x / descale, clamped to
    the format's range: a value past the scale's headroom saturates instead of becoming NaN)."""
    scaled = x.float() / descale[:, None, :, None]
    return scaled.clamp(-E4M3_MAX, E4M3_MAX).to(torch.float8_e4m3fn)


def dequantize(x8: torch.Tensor, descale: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """x8: [B, N, H, D] e4m3; descale: [B, H] -> [B, N, H, D] in ``dtype``."""
    return (x8.float() * descale[:, None, :, None]).to(dtype)


def _per_head_descale(x: torch.Tensor) -> torch.Tensor:
    # x: [B, N, H, D] -> [B, H] fp32: the descale mapping each head's max to 448 (no headroom:
    # Q is quantised for this call only)
    amax = x.detach().abs().amax(dim=(1, 3)).float()
    return (amax / E4M3_MAX).clamp_min(_MIN_DESCALE)


def fa3_fp8_unsupported(q: torch.Tensor, mask: torch.Tensor | None) -> str | None:
    """Why FA3's FP8 kernel cannot serve this call (None: it can)."""
    if mask is not None:
        return "masked attention (a cache with holes)"
    if q.device.type != "cuda":
        return f"device {q.device.type} (CUDA only)"
    if torch.cuda.get_device_capability(q.device)[0] != 9:
        return "not a Hopper GPU (FA3's kernels are sm90)"
    if q.shape[3] not in (64, 96, 128, 192, 256):
        return f"head dim {q.shape[3]}"
    from models.wan.kernels.library import FA3_MODULE, library_missing

    return library_missing(FA3_MODULE, "fa3-fwd")


def cached_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    past: Fp8Past,
    mask: torch.Tensor | None,
) -> torch.Tensor:
    """Attention of a chunk over an FP8 cache (module docstring), as one opaque custom op
    (``dreamrt::fp8_kv_attention``): its kernel choice runs in eager Python at call time, never
    as a graph break, and a CUDA graph records whatever it launched.

    q, k, v: [B, N, H, D] (this call's, post-RoPE, model dtype); past: the cached prefix;
    mask: None or [.., P + N] bool -> [B, N, H * D] in q's dtype
    """
    out = torch.ops.dreamrt.fp8_kv_attention(
        q, k, v, past.k, past.v, past.k_descale, past.v_descale, mask
    )
    return out.flatten(2)


def _note(reason: str) -> None:
    if reason not in _LOGGED:
        _LOGGED.add(reason)
        log.info("FP8 K/V cache read dequantised (FA3's FP8 kernel not used): %s", reason)


@torch.library.custom_op("dreamrt::fp8_kv_attention", mutates_args=())
def _fp8_kv_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    past_k: torch.Tensor,
    past_v: torch.Tensor,
    k_descale: torch.Tensor,
    v_descale: torch.Tensor,
    mask: torch.Tensor | None,
) -> torch.Tensor:
    # q, k, v: [B, N, H, D]; past_k, past_v: [B, P, H, D] e4m3; descales [B, H] fp32
    # -> [B, N, H, D] in q's dtype, contiguous
    k8 = torch.cat((past_k, quantize_with(k, k_descale)), dim=1)
    v8 = torch.cat((past_v, quantize_with(v, v_descale)), dim=1)
    reason = fa3_fp8_unsupported(q, mask)
    if reason is None:
        from fa3_fwd_interface import flash_attn_func

        q_descale = _per_head_descale(q)
        q8 = quantize_with(q, q_descale)
        out = flash_attn_func(
            q8, k8, v8, q_descale=q_descale, k_descale=k_descale, v_descale=v_descale
        )
        return out.to(q.dtype).contiguous()
    _note(reason)
    from models.wan.kernels.attention import attend

    kd, vd = dequantize(k8, k_descale, q.dtype), dequantize(v8, v_descale, q.dtype)
    return attend(q, kd, vd, mask).unflatten(-1, (q.shape[2], q.shape[3])).contiguous()


@_fp8_kv_attention.register_fake
def _(q, k, v, past_k, past_v, k_descale, v_descale, mask):
    return q.new_empty(q.shape)
