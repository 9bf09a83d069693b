"""FP8 linears: the quantised product tracks the float one; replacement is targeted and complete."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from models.wan.dit.config import WanDiTConfig
from models.wan.dit.transformer import WanDiT
from models.wan.kernels.fp8_linear import E4M3_MAX, Fp8Linear, quantize_linears
from models.wan.kv.cache import ChunkKVCache


def test_fp8_linear_matches_the_float_product_within_e4m3_precision() -> None:
    torch.manual_seed(0)
    linear = nn.Linear(64, 32)
    x = torch.randn(5, 7, 64) * 3.0
    x[0, 0, 0] = 200.0  # an outlier token keeps its own scale; other tokens are unaffected
    fp8 = Fp8Linear(linear)
    ref, ours = linear(x), fp8(x)
    assert ours.shape == ref.shape and ours.dtype == ref.dtype
    # e4m3 has a 3-bit mantissa: ~3 % relative error per value, averaging down in the dot products
    err = (ours - ref).norm() / ref.norm()
    assert 1e-4 < err.item() < 0.05
    assert fp8.weight_fp8.dtype == torch.float8_e4m3fn
    assert fp8.weight_fp8.float().abs().amax(dim=1).allclose(torch.full((32,), E4M3_MAX))
    assert torch.equal(fp8.bias, linear.bias.detach())


def test_per_tensor_scaling_is_coarser_but_still_tracks_the_product() -> None:
    torch.manual_seed(0)
    linear = nn.Linear(64, 32)
    x = torch.randn(5, 7, 64)
    x[0, 0, 0] = 200.0  # one outlier now sets the scale of every token
    ref = linear(x)
    row, tensor = Fp8Linear(linear), Fp8Linear(linear, per_tensor=True)
    assert tensor.weight_scale.shape == (1, 1) and row.weight_scale.shape == (1, 32)
    err_row = ((row(x) - ref).norm() / ref.norm()).item()
    err_tensor = ((tensor(x) - ref).norm() / ref.norm()).item()
    assert err_row < err_tensor < 0.2


def test_fp8_linear_rejects_features_the_gemm_cannot_take() -> None:
    with pytest.raises(ValueError, match="divisible by 16"):
        Fp8Linear(nn.Linear(20, 32))


def test_quantized_dit_blocks_track_the_float_model() -> None:
    cfg = WanDiTConfig(
        name="fp8-test", dim=64, num_layers=2, num_heads=2, ffn_dim=128, freq_dim=16, text_dim=32
    )
    torch.manual_seed(1)
    model = WanDiT(cfg).eval()
    x, text = torch.randn(1, 16, 2, 4, 6), torch.randn(1, 5, 32)
    t = torch.tensor([500.0])
    with torch.no_grad():
        ref = model(x, t, text)
        replaced = quantize_linears(model, lambda name: name.startswith("blocks."))
        ours = model(x, t, text)
        cache = ChunkKVCache.allocate(
            cfg,
            batch=1,
            sink_frames=0,
            window_frames=2,
            tokens_per_frame=6,
            device="cpu",
            dtype=torch.float32,
        )
        chunk = model.forward_chunk(x, t, model.cross_kv(text), cache, 0)
    # every linear of both blocks (self q k v o, cross q k v o, FFN up and down), nothing else
    assert len(replaced) == 2 * 10 and all(n.startswith("blocks.") for n in replaced)
    assert isinstance(model.head.head, nn.Linear) and not isinstance(model.head.head, Fp8Linear)
    assert (ours - ref).norm() / ref.norm() < 0.05
    assert torch.isfinite(chunk).all()
