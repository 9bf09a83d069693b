"""``infra.bench.fp8_ops``: its rows, its static-scale linear and its verdict (CPU dry run)."""

from __future__ import annotations

import torch
from torch import nn

from infra.bench import fp8_ops
from models.wan.kernels.fp8_linear import E4M3_MAX, Fp8Linear


def test_the_static_linear_fixes_its_scale_on_the_first_call_and_keeps_it() -> None:
    torch.manual_seed(0)
    linear = nn.Linear(32, 48)
    static = fp8_ops.StaticFp8Linear(linear)
    x = torch.randn(5, 7, 32)
    with torch.inference_mode():
        first = static(x)
        scale = static.act_scale.clone()
        static(x * 3)  # larger inputs later: the scale stays what the first call fixed
    expected = x.abs().amax() * fp8_ops.HEADROOM / E4M3_MAX
    assert torch.allclose(scale, expected.reshape(1, 1))
    assert torch.equal(static.act_scale, scale)
    reference = linear(x)
    dynamic = Fp8Linear(linear, per_tensor=True)(x)
    # within e4m3's precision of the bf16 result, like the served per-tensor linear
    err = (first - reference).norm() / reference.norm()
    assert err < 0.1
    assert err < 3 * ((dynamic - reference).norm() / reference.norm()) + 1e-3


def test_a_dry_run_times_every_op_in_every_variant_that_applies() -> None:
    result = fp8_ops.run(device="cpu", profiles=[(32, 32)], iters=1, compile=False)
    seen = {(row["op"], row["variant"]) for row in result["rows"]}
    for op in ("qkv", "out_proj", "cross", "ffn"):
        assert {(op, v) for v in fp8_ops.LINEAR_VARIANTS} <= seen
    assert {("attention", "bf16"), ("attention", "fp8-kv")} <= seen
    assert {("block", "bf16"), ("block", "fp8-kv"), ("block", "fp8-static+fp8-kv")} <= seen
    for row in result["rows"]:
        assert row["ms"] > 0 and row["profile"] == "32x32"
        if row["variant"] != "bf16":  # compared with the bf16 op, and lossy but close
            assert 0 < row["rel_l2"] < 0.2, row
    assert result["fp8_gemm"] is False and len(result["verdict"]) == 1


def test_the_verdict_keeps_fp8_linears_only_for_a_tenth_off_a_step() -> None:
    def rows(fp8_ms: float) -> list[dict[str, object]]:
        return [
            {"profile": "p", "op": "block", "variant": "bf16", "ms": 1.2},
            {"profile": "p", "op": "block", "variant": "fp8-kv", "ms": 1.0},
            {"profile": "p", "op": "block", "variant": "fp8-row+fp8-kv", "ms": fp8_ms},
            {"profile": "p", "op": "block", "variant": "fp8-static+fp8-kv", "ms": fp8_ms + 0.05},
        ]

    (kept,) = fp8_ops.verdict(rows(0.85))
    assert "+15.0%" in kept and "(keep them)" in kept and "(fp8-row)" in kept
    (dropped,) = fp8_ops.verdict(rows(0.95))
    assert "+5.0%" in dropped and "below the 10 %" in dropped
