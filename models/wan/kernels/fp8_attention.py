"""FP8 (e4m3) flash-attention forward in Triton, for Wan's unmasked chunk attention.

The shape it is written for: the queries of one chunk (3 latent frames x 1560 tokens = 4,680)
against the filled K/V prefix plus the chunk itself (up to 18,720 keys), 12 heads of 128, no
mask, no causality inside the call. Operands are quantised first (one pass each, in Triton)::

    Q [B, Nq, H, D] -> q8 = e4m3(Q / sq),  sq [B, H, Nq] = max|Q[b, n, h, :]| / 448   per token
    K [B, Nk, H, D] -> k8 = e4m3(K / sk),  sk [B, H, Nk]                              per token
    V [B, Nk, H, D] -> v8 = e4m3(V / sv),  sv [B, H, D] = max_n |V[b, n, h, d]| / 448  per channel
                       stored transposed, v8t [B, H, D, Nk] (keys contiguous: the K-major
                       operand layout Hopper's FP8 tensor cores need for P @ V)

then one kernel per (query block, head, batch) streams the key blocks with an online softmax::

    S   = (q8 @ k8^T) * sq[:, None] * sk[None, :] * log2(e) / sqrt(D)    fp32 accumulator
    m   = running row max;  P = exp2(S - m)  in [0, 1];  l = running sum of P (fp32)
    acc = acc * exp2(m_old - m) + e4m3(256 P) @ v8      (each block's product summed in fp32)
    O   = acc * sv / (256 l)

P is scaled by 256 (a power of two: exact) before its cast so that small probabilities stay
out of e4m3's subnormal range. Each block's P @ V is accumulated in fp32 registers
(``EXACT_ACC``) rather than inside the tensor core's FP8 accumulator, whose reduced precision
over long sums is a known Hopper FP8 pitfall. ``pv_fp8=False`` keeps P @ V in V's 16-bit dtype
(only Q K^T in FP8): half the FLOPs stay exact.

Tails (Nq, Nk not multiples of the blocks) are masked; the last key block alone pays for it.
``fp8_attention`` picks a block configuration per shape bucket by timing a few candidates on
first use (never while a CUDA graph is being captured: then the default), so serving needs no
tuning step. Needs Triton and, on a GPU, FP8 tensor cores (compute capability >= 8.9);
``TRITON_INTERPRET=1`` runs it on the CPU (tests).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import NamedTuple

import torch
import triton
import triton.language as tl

__all__ = [
    "CANDIDATES",
    "DEFAULT_CONFIG",
    "HEAD_DIMS",
    "KernelConfig",
    "Operands",
    "fp8_attention",
    "prepared",
    "quantize_rows",
    "quantize_v",
    "time_config",
]

E4M3_MAX = 448.0
P_SCALE = 256.0
HEAD_DIMS = (32, 64, 128)
_LOG2E = 1.4426950408889634


@dataclass(frozen=True, slots=True)
class KernelConfig:
    """Block sizes and launch parameters of the attention kernel."""

    block_m: int = 128
    block_n: int = 64
    num_warps: int = 8
    num_stages: int = 3
    exact_acc: bool = True

    @property
    def label(self) -> str:
        acc = "" if self.exact_acc else " fp8acc"
        return f"m{self.block_m} n{self.block_n} w{self.num_warps} s{self.num_stages}{acc}"


DEFAULT_CONFIG = KernelConfig()
# What first use times (all with exact accumulation); the bench's micro section lists them.
CANDIDATES = (
    KernelConfig(128, 64, 8, 3),
    KernelConfig(128, 128, 8, 3),
    KernelConfig(128, 64, 4, 4),
    KernelConfig(64, 64, 4, 3),
    KernelConfig(64, 128, 4, 3),
    KernelConfig(128, 128, 8, 2),
)
_CHOSEN: dict[tuple, KernelConfig] = {}  # shape bucket -> config picked on first use


@triton.jit
def _row_tile(X, N, stride_xb, stride_xn, stride_xh, D: tl.constexpr, ROWS: tl.constexpr):
    # this program's ROWS tokens of one (batch, head) of X [B, N, H, D] (D contiguous)
    # -> (tile [ROWS, D] float32, b, h, token offsets [ROWS], in-range mask [ROWS])
    pid_n, h, b = tl.program_id(0), tl.program_id(1), tl.program_id(2).to(tl.int64)
    offs_n = pid_n * ROWS + tl.arange(0, ROWS)
    rows = offs_n < N
    ptrs = X + b * stride_xb + h * stride_xh + offs_n[:, None] * stride_xn
    x = tl.load(ptrs + tl.arange(0, D)[None, :], mask=rows[:, None], other=0.0)
    return x.to(tl.float32), b, h, offs_n, rows


@triton.jit
def _quantize_rows_kernel(
    X,
    X8,
    S,
    N,
    stride_xb,
    stride_xn,
    stride_xh,
    H: tl.constexpr,
    D: tl.constexpr,
    ROWS: tl.constexpr,
):
    # X [B, N, H, D] (any strides, D contiguous) -> X8 [B, N, H, D] contiguous e4m3,
    # S [B, H, N] float32 per-token scales
    x, b, h, offs_n, rows = _row_tile(X, N, stride_xb, stride_xn, stride_xh, D, ROWS)
    scale = tl.maximum(tl.max(tl.abs(x), axis=1), 1e-12) / 448.0
    x8 = (x / scale[:, None]).to(tl.float8e4nv)
    out = X8 + ((b * N + offs_n[:, None]) * H + h) * D + tl.arange(0, D)[None, :]
    tl.store(out, x8, mask=rows[:, None])
    tl.store(S + (b * H + h) * N + offs_n, scale, mask=rows)


@triton.jit
def _quantize_v_kernel(
    V,
    INV,
    V8T,
    N,
    stride_vb,
    stride_vn,
    stride_vh,
    H: tl.constexpr,
    D: tl.constexpr,
    ROWS: tl.constexpr,
):
    # V [B, N, H, D], INV [B, H, D] = 1 / sv -> V8T [B, H, D, N] e4m3 (keys contiguous)
    v, b, h, offs_n, rows = _row_tile(V, N, stride_vb, stride_vn, stride_vh, D, ROWS)
    offs_d = tl.arange(0, D)
    inv = tl.load(INV + (b * H + h) * D + offs_d)
    v8 = (v * inv[None, :]).to(tl.float8e4nv)
    out = V8T + ((b * H + h) * D + offs_d[None, :]) * N + offs_n[:, None]
    tl.store(out, v8, mask=rows[:, None])


@triton.jit
def _key_block(
    acc,
    l_i,
    m_i,
    q,
    qs,
    K8,
    KS,
    VB,
    start_n,
    N_K,
    stride_kn,
    stride_vn,
    stride_vd,
    BLOCK_N: tl.constexpr,
    D: tl.constexpr,
    MASKED: tl.constexpr,
    PV_FP8: tl.constexpr,
    EXACT_ACC: tl.constexpr,
):
    # one key block: acc [BM, D], l_i, m_i [BM], q [BM, D] e4m3, qs [BM] (incl. softmax scale)
    offs_n = start_n + tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, D)
    k_ptrs = K8 + offs_n[None, :] * stride_kn + offs_d[:, None]  # [D, BN]
    v_ptrs = VB + offs_n[:, None] * stride_vn + offs_d[None, :] * stride_vd  # [BN, D]
    if MASKED:
        keys = offs_n < N_K
        k = tl.load(k_ptrs, mask=keys[None, :], other=0.0)
        ks = tl.load(KS + offs_n, mask=keys, other=0.0)
        v = tl.load(v_ptrs, mask=keys[:, None], other=0.0)
    else:
        k = tl.load(k_ptrs)
        ks = tl.load(KS + offs_n)
        v = tl.load(v_ptrs)
    s = tl.dot(q, k) * qs[:, None] * ks[None, :]  # [BM, BN] fp32, log2 units
    if MASKED:
        s = tl.where(keys[None, :], s, float("-inf"))
    m_new = tl.maximum(m_i, tl.max(s, axis=1))
    p = tl.math.exp2(s - m_new[:, None])
    alpha = tl.math.exp2(m_i - m_new)
    l_i = l_i * alpha + tl.sum(p, axis=1)
    acc = acc * alpha[:, None]
    if PV_FP8:
        p8 = (p * 256.0).to(tl.float8e4nv)
        if EXACT_ACC:
            acc += tl.dot(p8, v)
        else:
            acc = tl.dot(p8, v, acc)
    else:
        acc = tl.dot(p.to(v.dtype), v, acc)
    return acc, l_i, m_new


@triton.jit
def _attention_kernel(
    Q8,
    QS,
    K8,
    KS,
    VB,
    VS,
    OUT,
    N_Q,
    N_K,
    N_FULL,
    SM_SCALE,
    stride_vb,
    stride_vh,
    stride_vn,
    stride_vd,
    stride_ob,
    stride_on,
    stride_oh,
    H: tl.constexpr,
    D: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    PV_FP8: tl.constexpr,
    EXACT_ACC: tl.constexpr,
):
    # Q8 [B, Nq, H, D], K8 [B, Nk, H, D] e4m3 contiguous; QS [B, H, Nq], KS [B, H, Nk];
    # VB: v8t [B, H, D, Nk] e4m3 (PV_FP8) or V [B, Nk, H, D] (strides given); VS [B, H, D]
    pid_m, h, b = tl.program_id(0), tl.program_id(1), tl.program_id(2).to(tl.int64)
    bh = b * H + h
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, D)
    rows = offs_m < N_Q
    q = tl.load(
        Q8 + ((b * N_Q + offs_m[:, None]) * H + h) * D + offs_d[None, :],
        mask=rows[:, None],
        other=0.0,
    )
    qs = tl.load(QS + bh * N_Q + offs_m, mask=rows, other=0.0)
    qs = qs * SM_SCALE  # softmax scale in log2 units
    k_base = K8 + b * N_K * H * D + h * D
    ks_base = KS + bh * N_K
    v_base = VB + b * stride_vb + h * stride_vh
    m_i = tl.full([BLOCK_M], float("-inf"), dtype=tl.float32)
    l_i = tl.zeros([BLOCK_M], dtype=tl.float32)
    acc = tl.zeros([BLOCK_M, D], dtype=tl.float32)
    for start_n in range(0, N_FULL, BLOCK_N):  # N_FULL: keys in whole blocks
        start_n = tl.multiple_of(start_n, BLOCK_N)
        acc, l_i, m_i = _key_block(
            acc,
            l_i,
            m_i,
            q,
            qs,
            k_base,
            ks_base,
            v_base,
            start_n,
            N_K,
            H * D,
            stride_vn,
            stride_vd,
            BLOCK_N,
            D,
            False,
            PV_FP8,
            EXACT_ACC,
        )
    if N_FULL < N_K:
        acc, l_i, m_i = _key_block(
            acc,
            l_i,
            m_i,
            q,
            qs,
            k_base,
            ks_base,
            v_base,
            N_FULL,
            N_K,
            H * D,
            stride_vn,
            stride_vd,
            BLOCK_N,
            D,
            True,
            PV_FP8,
            EXACT_ACC,
        )
    if PV_FP8:
        vs = tl.load(VS + bh * D + offs_d)
        out = acc * (vs[None, :] / 256.0) / l_i[:, None]
    else:
        out = acc / l_i[:, None]
    o_ptrs = OUT + b * stride_ob + h * stride_oh + offs_m[:, None] * stride_on + offs_d[None, :]
    tl.store(o_ptrs, out.to(OUT.dtype.element_ty), mask=rows[:, None])


def _rows_block(d: int) -> int:
    return max(16, 4096 // d)  # ~4K elements per program


def quantize_rows(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-token e4m3 quantisation. x: [B, N, H, D] (D contiguous) -> (x8 [B, N, H, D]
    contiguous e4m3, scales [B, H, N] float32) with x ~= x8 * scale."""
    b, n, h, d = x.shape
    x8 = torch.empty((b, n, h, d), device=x.device, dtype=torch.float8_e4m3fn)
    scale = torch.empty((b, h, n), device=x.device, dtype=torch.float32)
    rows = _rows_block(d)
    _quantize_rows_kernel[(triton.cdiv(n, rows), h, b)](
        x, x8, scale, n, x.stride(0), x.stride(1), x.stride(2), H=h, D=d, ROWS=rows
    )
    return x8, scale


def quantize_v(v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-channel e4m3 quantisation, transposed. v: [B, N, H, D] (D contiguous) ->
    (v8t [B, H, D, N] e4m3, scales [B, H, D] float32) with v[b, n, h, d] ~= v8t[b, h, d, n] * s."""
    b, n, h, d = v.shape
    amax = torch.linalg.vector_norm(v, ord=math.inf, dim=1, dtype=torch.float32)  # [B, H, D]
    scale = amax.clamp_min(1e-12) / E4M3_MAX
    inv = (1.0 / scale).contiguous()
    v8t = torch.empty((b, h, d, n), device=v.device, dtype=torch.float8_e4m3fn)
    rows = _rows_block(d)
    _quantize_v_kernel[(triton.cdiv(n, rows), h, b)](
        v, inv, v8t, n, v.stride(0), v.stride(1), v.stride(2), H=h, D=d, ROWS=rows
    )
    return v8t, scale


def _launch(
    q8: torch.Tensor,
    qs: torch.Tensor,
    k8: torch.Tensor,
    ks: torch.Tensor,
    vb: torch.Tensor,
    vs: torch.Tensor,
    out: torch.Tensor,
    pv_fp8: bool,
    config: KernelConfig,
) -> None:
    b, n_q, h, d = q8.shape
    n_k = k8.shape[1]
    if pv_fp8:  # v8t [B, H, D, Nk]
        strides = (vb.stride(0), vb.stride(1), vb.stride(3), vb.stride(2))
    else:  # v [B, Nk, H, D]
        strides = (vb.stride(0), vb.stride(2), vb.stride(1), vb.stride(3))
    _attention_kernel[(triton.cdiv(n_q, config.block_m), h, b)](
        q8,
        qs,
        k8,
        ks,
        vb,
        vs,
        out,
        n_q,
        n_k,
        n_k // config.block_n * config.block_n,
        _LOG2E / math.sqrt(d),
        *strides,
        out.stride(0),
        out.stride(1),
        out.stride(2),
        H=h,
        D=d,
        BLOCK_M=config.block_m,
        BLOCK_N=config.block_n,
        PV_FP8=pv_fp8,
        EXACT_ACC=config.exact_acc,
        num_warps=config.num_warps,
        num_stages=config.num_stages,
    )


def fp8_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    *,
    pv_fp8: bool = True,
    config: KernelConfig | None = None,
) -> torch.Tensor:
    """Softmax attention with e4m3 operands (module docstring); no mask.

    q: [B, Nq, H, D]; k, v: [B, Nk, H, D] (the last dim contiguous; D in ``HEAD_DIMS``)
    -> [B, Nq, H, D] contiguous, in q's dtype. ``config`` None: the one picked for this
    shape bucket (timed on first use on a GPU; ``DEFAULT_CONFIG`` while capturing a graph).
    """
    q, k, v = (t if t.stride(-1) == 1 else t.contiguous() for t in (q, k, v))
    q8, qs = quantize_rows(q)
    k8, ks = quantize_rows(k)
    if pv_fp8:
        vb, vs = quantize_v(v)
    else:
        vb, vs = v, qs  # vs unused without PV_FP8
    out = torch.empty(q.shape, device=q.device, dtype=q.dtype)
    if config is None:
        config = _pick_config(Operands(q8, qs, k8, ks, vb, vs, out, pv_fp8))
    _launch(q8, qs, k8, ks, vb, vs, out, pv_fp8, config)
    return out


class Operands(NamedTuple):
    """One call's prepared operands: e4m3 Q and K with their row scales, V (e4m3 and its
    scales with ``pv_fp8``, else as given) and the output buffer."""

    q8: torch.Tensor
    qs: torch.Tensor
    k8: torch.Tensor
    ks: torch.Tensor
    vb: torch.Tensor
    vs: torch.Tensor
    out: torch.Tensor
    pv_fp8: bool


def _bucket(q8: torch.Tensor, k8: torch.Tensor, pv_fp8: bool) -> tuple:
    b, n_q, h, d = q8.shape
    pow2 = 1 << max(0, (k8.shape[1] - 1).bit_length())
    return (q8.device, b * h, 1 << max(0, (n_q - 1).bit_length()), pow2, d, pv_fp8)


def _pick_config(operands: Operands) -> KernelConfig:
    key = _bucket(operands.q8, operands.k8, operands.pv_fp8)
    chosen = _CHOSEN.get(key)
    if chosen is not None:
        return chosen
    if operands.q8.device.type != "cuda" or torch.cuda.is_current_stream_capturing():
        return DEFAULT_CONFIG
    timings = []
    for config in CANDIDATES:
        try:
            timings.append((time_config(config, operands), config))
        except Exception:  # a config the device cannot run (shared memory, registers)
            continue
    _CHOSEN[key] = min(timings, key=lambda t: t[0])[1] if timings else DEFAULT_CONFIG
    return _CHOSEN[key]


def time_config(config: KernelConfig, operands: Operands, *, reps: int = 5) -> float:
    """Median milliseconds of one kernel launch with ``config`` on prepared operands - first
    use and the bench's sweep."""
    _launch(*operands, config)  # compile, warm
    times = []
    for _ in range(reps):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        _launch(*operands, config)
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end))
    return sorted(times)[len(times) // 2]


def prepared(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, pv_fp8: bool = True) -> Operands:
    """The kernel's operands for ``time_config`` (quantised inputs, output buffer)."""
    q8, qs = quantize_rows(q)
    k8, ks = quantize_rows(k)
    vb, vs = quantize_v(v) if pv_fp8 else (v, qs)
    out = torch.empty(q.shape, device=q.device, dtype=q.dtype)
    return Operands(q8, qs, k8, ks, vb, vs, out, pv_fp8)
