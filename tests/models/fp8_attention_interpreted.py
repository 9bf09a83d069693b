"""The Triton FP8 attention kernel, run by Triton's interpreter on the CPU.

Not collected by the suite's file pattern: ``test_fp8_attention.py`` runs this file in a child
pytest with ``TRITON_INTERPRET=1``, which must be set before Triton is first imported (its
standard library functions are decorated at import).

Two claims: the kernel computes exactly its documented algorithm (per-token e4m3 Q and K,
per-channel e4m3 V, block-wise online softmax with P scaled by 256 and cast per block; compared
with a torch emulation of that algorithm, fp32 rounding apart), on shapes with tails in both
the queries and the keys, several heads and a batch of 2; and that algorithm tracks fp32
attention as closely as e4m3 allows (cosine >= 0.995 on random inputs).

The interpreter's float -> e4m3 cast (Triton 3.6-3.9) drops the carry when rounding up crosses a
power of two (0.1238 becomes 0.0625); hardware rounds correctly, so the fixture swaps in torch's
cast (the same round-to-nearest-even as the GPU's ``cvt.rn.satfinite``).
"""

from __future__ import annotations

import importlib
import math
import os

import pytest
import torch
import torch.nn.functional as F

if os.environ.get("TRITON_INTERPRET") != "1":
    pytest.skip("run through test_fp8_attention.py (TRITON_INTERPRET=1)", allow_module_level=True)

F8 = torch.float8_e4m3fn


@pytest.fixture(scope="module")
def fa(monkeymodule):
    import numpy as np
    import triton.language as tl

    interp = importlib.import_module("triton.runtime.interpreter")
    original = interp._convert_float

    def convert(data, src, dst, rounding_mode):
        if dst == tl.float8e4nv and src in (tl.float32, tl.float16, tl.bfloat16):
            raw = np.ascontiguousarray(data)
            if src == tl.bfloat16:
                t = torch.from_numpy(raw.view(np.int16).copy()).view(torch.bfloat16)
            else:
                t = torch.from_numpy(raw.view(np.float32 if src == tl.float32 else np.float16))
            return t.to(F8).view(torch.uint8).numpy().reshape(raw.shape)
        return original(data, src, dst, rounding_mode)

    monkeymodule.setattr(interp, "_convert_float", convert)
    return importlib.import_module("models.wan.kernels.fp8_attention")


@pytest.fixture(scope="module")
def monkeymodule():
    with pytest.MonkeyPatch.context() as mp:
        yield mp


def emulate(q, k, v, block_n: int, pv_fp8: bool) -> torch.Tensor:
    """The kernel's algorithm in torch. q: [B, Nq, H, D]; k, v: [B, Nk, H, D] -> [B, Nq, H, D]"""

    def per_token(x):  # -> e4m3 values (as float) [B, H, N, D], scales [B, H, N]
        s = x.float().abs().amax(-1, keepdim=True).clamp_min(1e-12) / 448
        return (x.float() / s).to(F8).float().transpose(1, 2), s[..., 0].transpose(1, 2)

    d = q.shape[-1]
    q8, qs = per_token(q)
    k8, ks = per_token(k)
    qs = qs * (1.4426950408889634 / math.sqrt(d))
    if pv_fp8:
        vs = v.float().abs().amax(1, keepdim=True).clamp_min(1e-12) / 448  # [B, 1, H, D]
        vv = (v.float() / vs).to(F8).float().transpose(1, 2)
    else:
        vv = v.float().transpose(1, 2)
    b, h, nq = q8.shape[:3]
    m = torch.full((b, h, nq), -math.inf)
    l_sum = torch.zeros(b, h, nq)
    acc = torch.zeros(b, h, nq, d)
    for start in range(0, k.shape[1], block_n):
        keys = slice(start, start + block_n)
        s = (q8 @ k8[:, :, keys].transpose(-1, -2)) * qs[..., None] * ks[:, :, None, keys]
        m_new = torch.maximum(m, s.amax(-1))
        p = torch.exp2(s - m_new[..., None])
        alpha = torch.exp2(m - m_new)
        l_sum = l_sum * alpha + p.sum(-1)
        p = (p * 256).to(F8).float() if pv_fp8 else p
        acc = acc * alpha[..., None] + p @ vv[:, :, keys]
        m = m_new
    out = acc / l_sum[..., None]
    if pv_fp8:
        out = out * vs.transpose(1, 2) / 256
    return out.transpose(1, 2)


def sdpa(q, k, v):
    return F.scaled_dot_product_attention(
        q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)
    ).transpose(1, 2)


@pytest.mark.parametrize(
    ("shape", "pv_fp8"),
    [((2, 70, 150, 2, 32), True), ((1, 100, 300, 3, 64), True), ((1, 100, 300, 3, 64), False)],
)
def test_the_kernel_computes_its_algorithm_and_tracks_fp32_attention(fa, shape, pv_fp8) -> None:
    b, nq, nk, h, d = shape  # 70 and 100 queries, 150 and 300 keys: tails in both
    gen = torch.Generator().manual_seed(d)
    q, k, v = (torch.randn(b, n, h, d, generator=gen) for n in (nq, nk, nk))
    k = k * 2.0  # peakier scores than unit-variance keys give
    config = fa.KernelConfig(block_m=32, block_n=32, num_warps=4, num_stages=1)
    out = fa.fp8_attention(q, k, v, pv_fp8=pv_fp8, config=config)
    assert out.shape == q.shape and out.dtype == q.dtype and out.is_contiguous()
    assert (out - emulate(q, k, v, 32, pv_fp8)).abs().max().item() < 1e-5
    ref = sdpa(q, k, v)
    assert F.cosine_similarity(out.flatten(), ref.flatten(), dim=0).item() >= 0.995
    # lossy, but not by accident: e4m3 leaves a visible error
    assert (out - ref).abs().max().item() > 1e-3


def test_quantisers_round_trip_within_e4m3_precision(fa) -> None:
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(2, 37, 3, 32, generator=gen) * 5.0
    x8, scale = fa.quantize_rows(x)
    assert x8.dtype == F8 and scale.shape == (2, 3, 37)
    back = x8.float() * scale.transpose(1, 2)[..., None]
    assert ((back - x).abs() <= x.abs() * 2**-4 + 1e-6).all()  # half an ulp of a 3-bit mantissa
    assert torch.allclose(back.abs().amax(-1), x.abs().amax(-1))  # the row max is exact
    v8t, vscale = fa.quantize_v(x)
    assert v8t.shape == (2, 3, 32, 37) and vscale.shape == (2, 3, 32)
    back = (v8t.float() * vscale[..., None]).permute(0, 3, 1, 2)
    assert ((back - x).abs() <= x.abs() * 2**-4 + 1e-6).all()
