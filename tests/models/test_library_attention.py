"""The attention backends of other libraries (fa3-fwd, nvidia-cudnn-frontend) on a machine
without them: selection resolves to SDPA and says why, every call falls back, the FP8
quantisation stays in e4m3's range, and FA3 is called with our layout and its descales."""

from __future__ import annotations

import logging
import sys
import types

import pytest
import torch
import torch.nn.functional as F

from models.wan.kernels import attention as attention_kernels
from models.wan.kernels.attention import ATTENTION_BACKENDS, Fa3Attention, select_backend
from models.wan.kernels.library import E4M3_MAX, quantize

LOGGER = "models.wan.kernels.attention"
LIBRARY_BACKENDS = {
    "fa3": ("fa3_fwd_interface", "fa3-fwd"),
    "fa3-fp8": ("fa3_fwd_interface", "fa3-fwd"),
    "cudnn-fp8": ("cudnn", "nvidia-cudnn-frontend"),
}


@pytest.fixture(autouse=True)
def _fresh_fallback_log(monkeypatch):
    monkeypatch.setattr(attention_kernels, "_LOGGED", set())


def qkv(d: int = 64, nq: int = 10, nk: int = 24, heads: int = 2, dtype=torch.float32):
    g = torch.Generator().manual_seed(0)
    return tuple(torch.randn(1, n, heads, d, generator=g).to(dtype) for n in (nq, nk, nk))


@pytest.mark.parametrize("name", sorted(LIBRARY_BACKENDS))
def test_a_library_backend_whose_package_is_missing_resolves_to_sdpa(
    monkeypatch, caplog, name
) -> None:
    module, package = LIBRARY_BACKENDS[name]
    monkeypatch.setitem(sys.modules, module, None)  # import raises
    with caplog.at_level(logging.WARNING, logger=LOGGER):
        backend = select_backend(name)
    assert backend is ATTENTION_BACKENDS["auto"]
    assert any(
        f"{name!r} unavailable: {package} not importable" in r.getMessage() for r in caplog.records
    )


@pytest.mark.parametrize(
    ("name", "d", "dtype", "reason"),
    [
        ("fa3", 64, torch.float32, "dtype torch.float32 (this FA3 build: bf16 only)"),
        ("fa3", 64, torch.bfloat16, "device cpu (CUDA only)"),
        ("fa3-fp8", 80, torch.bfloat16, "head dim 80 not in (32, 64, 96, 128, 192, 256)"),
        ("fa3-fp8", 128, torch.float32, "device cpu (CUDA only)"),
        ("cudnn-fp8", 96, torch.bfloat16, "head dim 96 not in (32, 64, 128)"),
        ("cudnn-fp8", 128, torch.bfloat16, "device cpu (CUDA only)"),
    ],
)
def test_where_a_library_kernel_does_not_apply(name, d, dtype, reason) -> None:
    q, k, v = qkv(d=d, dtype=dtype)
    assert ATTENTION_BACKENDS[name].unsupported(q, k, v, None) == reason


@pytest.mark.parametrize("name", sorted(LIBRARY_BACKENDS))
def test_on_the_cpu_a_library_backend_is_sdpa_bit_for_bit_and_says_so(caplog, name) -> None:
    q, k, v = qkv(dtype=torch.bfloat16)
    ref = ATTENTION_BACKENDS["auto"](q, k, v)
    with caplog.at_level(logging.WARNING, logger=LOGGER):
        out = ATTENTION_BACKENDS[name](q, k, v)
    assert torch.equal(out, ref) and out.dtype == torch.bfloat16
    assert f"attention backend {name!r} falls back to SDPA: device cpu (CUDA only)" in [
        r.getMessage() for r in caplog.records
    ]


@pytest.mark.parametrize("per_head", [True, False])
def test_quantize_stays_in_e4m3_range_and_round_trips(per_head) -> None:
    g = torch.Generator().manual_seed(1)
    x = torch.randn(2, 300, 3, 64, generator=g) * torch.tensor([0.01, 1.0, 40.0])[:, None]
    x = x.to(torch.bfloat16)
    x8, descale = quantize(x, per_head=per_head)
    assert x8.dtype == torch.float8_e4m3fn and x8.shape == x.shape and x8.is_contiguous()
    assert descale.shape == ((2, 3) if per_head else (1, 1, 1, 1))
    codes = x8.float()
    assert not codes.isnan().any() and codes.abs().max() == E4M3_MAX  # the max maps to 448
    back = codes * (descale[:, None, :, None] if per_head else descale)
    rel = ((back - x.float()).norm() / x.float().norm()).item()
    assert rel < 0.04  # 3 mantissa bits
    if per_head:  # every head uses its own range: the 0.01 head is as precise as the 40 one
        for h in range(3):
            err = (back[:, :, h] - x[:, :, h].float()).norm() / x[:, :, h].float().norm()
            assert err < 0.04


def test_quantize_never_overflows_into_nan_and_both_cast_paths_agree(monkeypatch) -> None:
    # the largest value lands on 448 up to rounding: it must round to 448, not past it to NaN;
    # the fused cast (mul writing e4m3) and the two-step one give the same bytes
    from models.wan.kernels import library as library_attention

    for seed in range(20):
        g = torch.Generator().manual_seed(seed)
        x = (torch.randn(1, 64, 4, 32, generator=g) * (1 + seed / 7)).to(torch.bfloat16)
        fused, _ = quantize(x, per_head=True)
        monkeypatch.setattr(library_attention, "_FUSED_CAST", [False])
        two_step, _ = quantize(x, per_head=True)
        monkeypatch.setattr(library_attention, "_FUSED_CAST", [True])
        assert not fused.float().isnan().any()
        assert torch.equal(fused.view(torch.uint8), two_step.view(torch.uint8))


@pytest.mark.parametrize("fp8", [False, True])
def test_fa3_is_called_in_our_layout_with_per_head_descales(monkeypatch, fp8) -> None:
    calls = []

    def flash_attn_func(q, k, v, q_descale=None, k_descale=None, v_descale=None):
        calls.append((q.dtype, k.dtype, v.dtype, q_descale, k_descale, v_descale))
        if q.dtype == torch.float8_e4m3fn:  # what FA3 computes from its FP8 operands
            q, k, v = (t.float() * s[:, None, :, None] for t, s in zip((q, k, v), calls[0][3:]))
        out = F.scaled_dot_product_attention(
            q.transpose(1, 2).float(), k.transpose(1, 2).float(), v.transpose(1, 2).float()
        )
        return out.transpose(1, 2).to(torch.bfloat16)  # [B, Nq, H, D], bf16 as FA3 returns

    fake = types.SimpleNamespace(flash_attn_func=flash_attn_func)
    monkeypatch.setitem(sys.modules, "fa3_fwd_interface", fake)
    q, k, v = qkv(d=128, heads=3, dtype=torch.bfloat16)
    out = Fa3Attention(fp8=fp8).run(q, k, v)
    dtypes, descales = calls[0][:3], calls[0][3:]
    if fp8:
        assert dtypes == (torch.float8_e4m3fn,) * 3
        assert all(s.shape == (1, 3) and s.dtype == torch.float32 for s in descales)
    else:
        assert dtypes == (torch.bfloat16,) * 3 and descales == (None, None, None)
    ref = ATTENTION_BACKENDS["auto"](q.float(), k.float(), v.float()).unflatten(-1, (3, 128))
    assert out.shape == q.shape and out.dtype == torch.bfloat16 and out.is_contiguous()
    cos = F.cosine_similarity(out.float().flatten(), ref.flatten(), dim=0)
    assert cos > (0.995 if fp8 else 0.9999)


class _FakeCudnn(types.SimpleNamespace):
    """The slice of cudnn-frontend's graph API that ``sdpa_fp8`` uses, computing what cuDNN
    documents: S = Q K^T dq dk scale, P = softmax(S) (e4m3 after * scale_s), O = P V ds dv so;
    like Hopper it refuses a bf16 output, so the e4m3-output path is what runs."""

    def __init__(self):
        dt = types.SimpleNamespace(FP8_E4M3="e4m3", FLOAT="fp32", BFLOAT16="bf16")
        super().__init__(data_type=dt, heur_mode=types.SimpleNamespace(A="A", FALLBACK="F"))
        self.builds, self.streams = [], []
        self.create_handle = lambda: "handle"
        self.set_stream = lambda handle, stream: self.streams.append(stream)
        self.pygraph = lambda **kw: _FakeGraph(self)


class _FakeTensor:
    def __init__(self, name, dim=None, data_type=None):
        self.name, self.dim, self.data_type = name, dim, data_type

    def set_output(self, _):
        return self

    def set_dim(self, dim):
        self.dim = dim
        return self

    def set_stride(self, _):
        return self

    def set_data_type(self, data_type):
        self.data_type = data_type
        return self


class _FakeGraph:
    def __init__(self, cudnn):
        self.cudnn = cudnn

    def tensor(self, name, dim, stride, data_type):
        return _FakeTensor(name, dim, data_type)

    def sdpa_fp8(self, q, k, v, *scales, generate_stats, attn_scale, use_causal_mask, name):
        assert generate_stats is False and use_causal_mask is False and len(scales) == 6
        self.inputs, self.scales, self.attn_scale = (q, k, v), scales, attn_scale
        self.o = _FakeTensor("o")
        return self.o, None, _FakeTensor("amax_s"), _FakeTensor("amax_o")

    def validate(self):
        pass

    build_operation_graph = create_execution_plans = build_plans = lambda self, *a: None

    def check_support(self):
        self.cudnn.builds.append(self.o.data_type)
        if self.o.data_type == "bf16":
            raise RuntimeError("No valid engine configs for SDPA_FP8 with BF16 O")

    def get_workspace_size(self):
        return 0

    def execute(self, pack, workspace, handle):
        def bhsd(t):  # our [B, N, H, D] memory as cuDNN's [b, h, s, d]
            return pack[t].float().transpose(1, 2)

        q, k, v = (bhsd(t) for t in self.inputs)
        dq, dk, dv, ds, ss, so = (pack[t].item() for t in self.scales)
        p = torch.softmax(q @ k.transpose(-1, -2) * dq * dk * self.attn_scale, dim=-1)
        p8 = (p * ss).to(torch.float8_e4m3fn).float()
        o = (p8 @ v) * ds * dv * so  # [b, h, s, d]
        pack[self.o].copy_(o.transpose(1, 2).to(pack[self.o].dtype))


def test_cudnn_fp8_wires_its_scales_and_dequantises_an_e4m3_output(monkeypatch) -> None:
    from models.wan.kernels import library as library_attention

    fake = _FakeCudnn()
    monkeypatch.setitem(sys.modules, "cudnn", fake)
    monkeypatch.setattr(library_attention, "_CUDNN_GRAPHS", {})
    monkeypatch.setattr(library_attention, "_CUDNN_HANDLES", {})
    q, k, v = qkv(d=64, nq=40, nk=96, heads=3, dtype=torch.bfloat16)
    v = v * 5.0  # O's e4m3 scale follows V's range
    out = library_attention.cudnn_fp8_attention(q, k, v)
    again = library_attention.cudnn_fp8_attention(q, k, v)
    assert fake.builds == ["bf16", "e4m3"]  # bf16 out refused, then e4m3 out, built once
    assert torch.equal(out, again) and out.shape == q.shape and out.dtype == torch.bfloat16
    ref = ATTENTION_BACKENDS["auto"](q.float(), k.float(), v.float()).unflatten(-1, (3, 64))
    rel = ((out.float() - ref).norm() / ref.norm()).item()
    assert rel < 0.08  # e4m3 Q, K, V, P and O


def test_auto_is_fa3_where_its_package_is_installed_else_sdpa(monkeypatch) -> None:
    fa3 = ATTENTION_BACKENDS["fa3"]
    monkeypatch.setattr(type(fa3), "missing", lambda self: "no module named 'fa3_fwd_interface'")
    assert select_backend("auto") is ATTENTION_BACKENDS["auto"]  # SDPA's choice
    assert select_backend("fa3") is ATTENTION_BACKENDS["auto"]  # asked for, absent: auto
    monkeypatch.setattr(type(fa3), "missing", lambda self: None)
    assert select_backend("auto") is fa3
    assert select_backend("sdpa") is ATTENTION_BACKENDS["sdpa"]  # SDPA whatever is installed
    # where FA3 does not apply (here: the CPU), its calls are SDPA's, so auto stays exact
    q, k, v = (torch.randn(1, 16, 2, 64, dtype=torch.bfloat16) for _ in range(3))
    assert fa3.unsupported(q, k, v, None) is not None
    assert torch.equal(fa3(q, k, v), ATTENTION_BACKENDS["sdpa"](q, k, v))
