"""GPU checks of the serving levers (CUDA only; skipped elsewhere): the FP8 attention kernel on
the Wan chunk shape, the lossy backends serving their kernels, and CUDA-graph replays of two
alternating sessions bit-identical to eager calls. The CPU tests cover the same logic under
Triton's interpreter and with a replaying recorder; these say the device agrees."""

from __future__ import annotations

import importlib.util

import pytest
import torch
import torch.nn.functional as F

from models.wan.dit.config import WanDiTConfig
from models.wan.dit.cuda_graphs import ChunkGraphs
from models.wan.dit.transformer import WanDiT
from models.wan.kernels.attention import ATTENTION_BACKENDS, attend
from models.wan.kv.slabs import KVSlabBuffer, SlabGeometry

pytestmark = pytest.mark.gpu


def wan_qkv(queries: int = 4680, keys: int = 18720, seed: int = 0):
    g = torch.Generator(device="cuda").manual_seed(seed)
    return tuple(
        (torch.randn(1, n, 12, 128, generator=g, device="cuda") * s).bfloat16()
        for n, s in ((queries, 1.0), (keys, 1.5), (keys, 1.0))
    )


def cosine(a: torch.Tensor, b: torch.Tensor) -> float:
    return F.cosine_similarity(a.float().flatten(), b.float().flatten(), dim=0).item()


@pytest.mark.parametrize("pv_fp8", [True, False])
def test_fp8_kernel_on_the_wan_chunk_shape(pv_fp8: bool) -> None:
    from models.wan.kernels.fp8_attention import fp8_attention

    q, k, v = wan_qkv()
    out = fp8_attention(q, k, v, pv_fp8=pv_fp8)
    ref = attend(q.float(), k.float(), v.float()).unflatten(-1, (12, 128))
    assert out.shape == q.shape and out.dtype == torch.bfloat16
    assert torch.isfinite(out).all()
    assert cosine(out, ref) >= 0.995


@pytest.mark.parametrize("name", ["fp8-triton", "fp8qk-triton", "sage"])
def test_a_lossy_backend_serves_its_kernel_on_the_gpu(name: str) -> None:
    if name == "sage" and importlib.util.find_spec("sageattention") is None:
        pytest.skip("sageattention is not installed")
    backend = ATTENTION_BACKENDS[name]
    q, k, v = wan_qkv(queries=1560, keys=6240)
    before = dict(backend.calls)
    with torch.inference_mode():
        out = backend(q, k, v)
    assert backend.broken is None, backend.broken
    assert (
        backend.calls["kernel"] == before["kernel"] + 1 and backend.calls["sdpa"] == before["sdpa"]
    )
    assert cosine(out, attend(q.float(), k.float(), v.float())) >= 0.99


@torch.inference_mode()
def _two_sessions(model: WanDiT, buffer: KVSlabBuffer, chunks: int) -> list[torch.Tensor]:
    caches = [buffer.cache(0), buffer.cache(1)]
    g = torch.Generator(device="cuda").manual_seed(3)
    crosses = [model.cross_kv(torch.randn(1, 8, 32, generator=g, device="cuda")) for _ in range(3)]
    outs = []
    for n in range(chunks):
        for s, cache in enumerate(caches):
            cross = crosses[2] if (s == 1 and n >= 5) else crosses[s]  # a prompt switch
            x = torch.randn(1, 16, 1, 8, 8, generator=g, device="cuda").bfloat16()
            for t in (1000.0, 500.0):
                v = model.forward_chunk(x, torch.tensor([t], device="cuda"), cross, cache, n)
                x = (x.float() - 0.5 * v.float()).bfloat16()
            outs.append(x)
            model.forward_chunk(x, torch.zeros(1, device="cuda"), cross, cache, n, write_cache=True)
    return outs


def test_cuda_graph_replays_of_alternating_sessions_are_bit_identical() -> None:
    cfg = WanDiTConfig(
        name="gpu-graphs", dim=128, num_layers=2, num_heads=2, ffn_dim=256, freq_dim=32, text_dim=32
    )
    torch.manual_seed(0)
    model = WanDiT(cfg).cuda().bfloat16().eval()
    geometry = SlabGeometry(sink_frames=1, window_frames=3, tokens_per_frame=16)

    def buffer() -> KVSlabBuffer:
        return KVSlabBuffer(cfg, geometry, num_slabs=2, device="cuda", dtype=torch.bfloat16)

    eager = _two_sessions(model, buffer(), chunks=9)
    model.chunk_graphs = graphs = ChunkGraphs()
    graphed = _two_sessions(model, buffer(), chunks=9)
    assert graphs.disabled is None, graphs.disabled
    assert graphs.num_graphs == 2 * (1 + 3) and graphs.stats["replays"] > 0
    assert all(torch.equal(a, b) for a, b in zip(graphed, eager, strict=True))
