"""C0 parity: WanDiT vs diffusers' WanTransformer3DModel (random weights, CPU fp32).

Relative error throughout: ``max|ours - ref| / max|ref|`` over the whole output tensor.
"""

from __future__ import annotations

import pytest
import torch
from diffusers import WanTransformer3DModel
from diffusers.models.transformers.transformer_wan import WanRotaryPosEmbed
from torch.nn.attention import SDPBackend, sdpa_kernel
from torch.utils.flop_counter import FlopCounterMode

from models.checkpoint.load import load_transformer
from models.wan.dit.config import ConfigError, WanDiTConfig
from models.wan.dit.flops import dit_flops
from models.wan.dit.rope import rope_cos_sin
from models.wan.dit.transformer import InputShapeError, WanDiT
from models.wan.kv.cache import ChunkKVCache

TOLERANCE = 1e-5


def rel_err(ours: torch.Tensor, ref: torch.Tensor) -> float:
    return ((ours - ref).abs().max() / ref.abs().max()).item()


def make_reference(cfg: WanDiTConfig, seed: int) -> WanTransformer3DModel:
    """A diffusers model with random weights; norm affines perturbed so they are not trivial."""
    torch.manual_seed(seed)
    model = WanTransformer3DModel(**cfg.to_diffusers_config()).eval()
    with torch.no_grad():
        for name, param in model.named_parameters():
            if ".norm" in name:
                param.add_(0.1 * torch.randn_like(param))
    return model


# (config, latent [F, H, W], text length, batch): odd token grids, odd head counts, T2I (F=1),
# patch sizes other than (1, 2, 2), no cross-attention norm, qk_norm=None (diffusers still
# applies its q/k norms then, and so must the loaded model).
CASES = [
    pytest.param(WanDiTConfig.preset("tiny"), (3, 4, 6), 5, 1, id="tiny"),
    pytest.param(
        WanDiTConfig(
            dim=60,
            num_layers=2,
            num_heads=3,
            ffn_dim=96,
            freq_dim=32,
            in_channels=5,
            out_channels=3,
            text_dim=24,
        ),
        (5, 6, 10),
        7,
        2,
        id="odd-grid-3-heads",
    ),
    pytest.param(
        WanDiTConfig(
            dim=48,
            num_layers=3,
            num_heads=4,
            ffn_dim=80,
            freq_dim=16,
            patch_size=(1, 1, 1),
            in_channels=16,
            out_channels=16,
            text_dim=8,
            qk_norm=None,
            cross_attn_norm=False,
        ),
        (1, 3, 5),
        1,
        2,
        id="t2i-patch1-no-cross-norm",
    ),
    pytest.param(
        WanDiTConfig(
            dim=36,
            num_layers=1,
            num_heads=1,
            ffn_dim=40,
            freq_dim=8,
            patch_size=(2, 2, 2),
            in_channels=3,
            out_channels=2,
            text_dim=12,
        ),
        (4, 2, 6),
        3,
        1,
        id="patch222-1-head",
    ),
]


@pytest.mark.parametrize(("cfg", "latent", "text_len", "batch"), CASES)
def test_matches_diffusers_loaded_from_a_diffusers_directory(
    tmp_path, cfg: WanDiTConfig, latent: tuple[int, int, int], text_len: int, batch: int
) -> None:
    ref = make_reference(cfg, seed=sum(latent) + text_len)
    ref.save_pretrained(tmp_path / "dit")
    ours = load_transformer(tmp_path / "dit")
    x = torch.randn(batch, cfg.in_channels, *latent)
    t = torch.tensor([999.0, 17.5][:batch])
    text = torch.randn(batch, text_len, cfg.text_dim)

    with torch.no_grad():
        expected = ref(x, t, text).sample
        got = ours(x, t, text)

    assert got.shape == expected.shape == (batch, cfg.out_channels, *latent)
    assert rel_err(got, expected) <= TOLERANCE


def test_block_causal_is_causal_across_chunks_and_bidirectional_within() -> None:
    torch.manual_seed(0)
    model = WanDiT(WanDiTConfig.preset("tiny")).eval()
    x, t, text = torch.randn(1, 16, 4, 4, 4), torch.tensor([500.0]), torch.randn(1, 3, 32)
    with torch.no_grad():
        full = model(x, t, text)
        one_chunk = model.forward_block_causal(x, t, text, chunk_frames=4)
        causal = model.forward_block_causal(x, t, text, chunk_frames=2)
        first_alone = model(x[:, :, :2], t, text)
    assert rel_err(one_chunk, full) <= TOLERANCE
    # chunk 0 cannot see chunk 1: it is what the first two frames give on their own
    assert rel_err(causal[:, :, :2], first_alone) <= TOLERANCE
    assert rel_err(causal[:, :, :2], full[:, :, :2]) > 1e-3


def test_rope_matches_diffusers_table_and_stays_finite_far_out() -> None:
    cfg = WanDiTConfig(dim=120, num_heads=2)  # head_dim 60 -> split (20, 20, 20)
    table = WanRotaryPosEmbed(cfg.head_dim, cfg.patch_size, max_seq_len=1024)
    grid = (3, 2, 4)
    ref_cos, ref_sin = table(torch.zeros(1, 16, grid[0], grid[1] * 2, grid[2] * 2))
    for frame_start in (0, 7):
        cos, sin = rope_cos_sin(cfg.rope_split(), grid, frame_start)
        if frame_start == 0:
            assert torch.equal(cos, ref_cos[0, :, 0, 0::2])
            assert torch.equal(sin, ref_sin[0, :, 0, 0::2])
    far_cos, far_sin = rope_cos_sin(cfg.rope_split(), grid, frame_start=3_600_000)
    assert torch.isfinite(far_cos).all() and torch.isfinite(far_sin).all()
    assert torch.allclose(far_cos**2 + far_sin**2, torch.ones_like(far_cos), atol=1e-6)
    # the frame part changed, the spatial part (positions within a frame) did not
    t_half = cfg.rope_split()[0] // 2
    assert not torch.equal(far_cos[:, :t_half], cos[:, :t_half])
    assert torch.equal(far_cos[:, t_half:], cos[:, t_half:])


def test_flop_count_matches_torch_flop_counter() -> None:
    cfg = WanDiTConfig(dim=64, num_layers=2, num_heads=2, ffn_dim=96, freq_dim=32, text_dim=24)
    model = WanDiT(cfg).eval()
    x, t, text = torch.randn(1, 16, 2, 4, 6), torch.tensor([3.0]), torch.randn(1, 5, 24)
    tokens_q = 2 * 2 * 3
    # the math SDPA backend runs attention as bmm, which the counter sees (fused kernels on CPU
    # are not counted)
    math_sdpa = sdpa_kernel(SDPBackend.MATH)
    with torch.no_grad(), math_sdpa, FlopCounterMode(display=False) as bidirectional:
        model(x, t, text)
    assert bidirectional.get_total_flops() == dit_flops(
        cfg, tokens_q, tokens_q, 5, include_text=True
    )

    cache = ChunkKVCache.allocate(
        cfg,
        batch=1,
        sink_frames=1,
        window_frames=3,
        tokens_per_frame=6,
        device="cpu",
        dtype=torch.float32,
    )
    with torch.no_grad():
        cross = model.cross_kv(text)
    # an empty cache is not read at all; a full one is read whole (4 frames x 6 tokens)
    with torch.no_grad(), sdpa_kernel(SDPBackend.MATH), FlopCounterMode(display=False) as chunk:
        model.forward_chunk(x, t, cross, cache, frame_start=0)
    assert chunk.get_total_flops() == model.flops_per_chunk(tokens_q, tokens_q, 5)
    with torch.no_grad():
        for start in (0, 2):
            model.forward_chunk(x, t, cross, cache, frame_start=start, write_cache=True)
    assert cache.full
    with torch.no_grad(), sdpa_kernel(SDPBackend.MATH), FlopCounterMode(display=False) as chunk:
        model.forward_chunk(x, t, cross, cache, frame_start=4)
    assert chunk.get_total_flops() == model.flops_per_chunk(tokens_q, 4 * 6 + tokens_q, 5)


def test_rejects_shapes_the_config_cannot_take() -> None:
    model = WanDiT(WanDiTConfig.preset("tiny"))
    text = torch.randn(1, 3, 32)
    with pytest.raises(InputShapeError, match=r"not divisible by patch"):
        model(torch.randn(1, 16, 2, 5, 4), torch.tensor([1.0]), text)
    with pytest.raises(InputShapeError, match=r"C=16"):
        model(torch.randn(1, 4, 2, 4, 4), torch.tensor([1.0]), text)
    with pytest.raises(InputShapeError, match=r"text_dim=32"):
        model(torch.randn(1, 16, 2, 4, 4), torch.tensor([1.0]), torch.randn(1, 3, 31))
    with pytest.raises(InputShapeError, match=r"action_dim > 0"):
        model(torch.randn(1, 16, 2, 4, 4), torch.tensor([1.0]), text, action=torch.zeros(1, 10))


def test_config_presets_and_formats() -> None:
    big = WanDiTConfig.preset("wan2.1-1.3b")
    assert (big.dim, big.num_layers, big.num_heads, big.ffn_dim, big.head_dim) == (
        1536,
        30,
        12,
        8960,
        128,
    )
    assert big.tokens_per_frame(60, 104) == 1560  # 480x832 video
    assert WanDiTConfig.from_original_config(big.to_original_config(), name=big.name) == big
    assert WanDiTConfig.from_diffusers_config(big.to_diffusers_config(), name=big.name) == big
    with pytest.raises(ConfigError, match="num_heads=5"):
        WanDiTConfig(dim=64, num_heads=5)
    with pytest.raises(ConfigError, match="image_dim"):
        WanDiTConfig.from_diffusers_config({**big.to_diffusers_config(), "image_dim": 1280})
    with pytest.raises(ConfigError, match="i2v"):
        WanDiTConfig.from_original_config({**big.to_original_config(), "model_type": "i2v"})
