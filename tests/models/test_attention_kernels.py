"""Attention backend selection and fallback: a lossy kernel never crashes a call, it logs why
SDPA served instead, and where SDPA serves the result is SDPA's, bit for bit."""

from __future__ import annotations

import logging
import sys
import types
from dataclasses import dataclass

import pytest
import torch
import torch.nn.functional as F

from models.wan.kernels import attention as attention_kernels
from models.wan.kernels.attention import (
    ATTENTION_BACKENDS,
    LowPrecisionAttention,
    SageAttention,
    UnknownBackendError,
    select_backend,
)

LOGGER = "models.wan.kernels.attention"


@pytest.fixture(autouse=True)
def _fresh_fallback_log(monkeypatch):
    # each (backend, reason) is logged once per process: start every test with none logged
    monkeypatch.setattr(attention_kernels, "_LOGGED", set())


def qkv(d: int = 64, nq: int = 10, nk: int = 24, heads: int = 2, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    return tuple(torch.randn(1, n, heads, d, generator=g) for n in (nq, nk, nk))


def fallbacks(caplog) -> list[str]:
    return [r.getMessage() for r in caplog.records if "falls back to SDPA" in r.getMessage()]


def test_every_backend_is_registered_and_an_unknown_name_lists_them() -> None:
    assert sorted(ATTENTION_BACKENDS) == [
        "auto",
        "cudnn",
        "cudnn-fp8",
        "fa3",
        "fa3-fp8",
        "flash",
        "fp8-triton",
        "fp8qk-triton",
        "sage",
        "sdpa",
    ]
    assert [n for n, b in ATTENTION_BACKENDS.items() if b.lossy] == [
        "sage",
        "fp8-triton",
        "fp8qk-triton",
        "fa3-fp8",
        "cudnn-fp8",
    ]
    with pytest.raises(UnknownBackendError, match=r"'int4'.*'auto'.*'sage'"):
        select_backend("int4")


def test_on_the_cpu_a_lossy_backend_is_sdpa_bit_for_bit_and_says_so_once(caplog) -> None:
    q, k, v = qkv()
    ref = ATTENTION_BACKENDS["auto"](q, k, v)
    backend = ATTENTION_BACKENDS["fp8-triton"]
    with caplog.at_level(logging.WARNING, logger=LOGGER):
        outs = [backend(q, k, v) for _ in range(3)]
    assert all(torch.equal(out, ref) for out in outs)
    assert outs[0].shape == (1, 10, 128)
    lines = [m for m in fallbacks(caplog) if "'fp8-triton'" in m]
    assert lines == ["attention backend 'fp8-triton' falls back to SDPA: device cpu (CUDA only)"]


@pytest.mark.parametrize(
    ("name", "d", "masked", "reason"),
    [
        ("sage", 32, False, "head dim 32 not in (64, 96, 128)"),
        ("fp8-triton", 80, False, "head dim 80 not in (32, 64, 128)"),
        ("fp8-triton", 64, True, "masked attention (a cache with holes)"),
    ],
)
def test_what_a_lossy_kernel_does_not_take(name, d, masked, reason) -> None:
    q, k, v = qkv(d=d)
    mask = torch.ones(1, 1, 1, 24, dtype=torch.bool) if masked else None
    assert ATTENTION_BACKENDS[name].unsupported(q, k, v, mask) == reason


def test_a_backend_whose_package_is_missing_resolves_to_sdpa(monkeypatch, caplog) -> None:
    monkeypatch.setitem(sys.modules, "sageattention", None)  # import raises
    with caplog.at_level(logging.WARNING, logger=LOGGER):
        backend = select_backend("sage")
    assert backend is ATTENTION_BACKENDS["auto"]
    assert any(
        "'sage' unavailable: sageattention not importable" in r.message for r in caplog.records
    )


def test_sage_is_called_in_our_layout_with_k_smoothed_out_of_place(monkeypatch) -> None:
    calls = []

    def sageattn(q, k, v, tensor_layout, is_causal, smooth_k):
        calls.append((tensor_layout, is_causal, smooth_k, k.mean(dim=1).abs().max().item()))
        out = F.scaled_dot_product_attention(
            q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)
        )
        return out.transpose(1, 2)

    monkeypatch.setitem(sys.modules, "sageattention", types.SimpleNamespace(sageattn=sageattn))
    q, k, v = qkv()
    k = k + 3.0  # a large common offset: smoothing removes it, softmax does not notice
    k_before = k.clone()
    out = SageAttention().run(q, k, v)
    assert torch.equal(k, k_before)  # the cache's K is never modified
    layout, causal, smooth, k_mean = calls[0]
    assert (layout, causal, smooth) == ("NHD", False, False) and k_mean < 1e-5
    ref = ATTENTION_BACKENDS["auto"](q, k, v).unflatten(-1, (2, 64))
    assert out.shape == q.shape and torch.allclose(out, ref, atol=1e-5)


@dataclass(eq=False)
class _Scripted(LowPrecisionAttention):
    """A 'kernel' that runs anywhere and raises or returns what the test says."""

    name: str = "scripted"
    head_dims: tuple[int, ...] = (64,)
    behaviour: str = "raise"

    def unsupported(self, q, k, v, mask):
        return None if mask is None else "masked attention (a cache with holes)"

    def run(self, q, k, v):
        if self.behaviour == "raise":
            raise RuntimeError("PTX for sm_90a not found")
        return torch.zeros_like(q)  # garbage that runs


@pytest.mark.parametrize(
    ("behaviour", "reason"),
    [
        ("raise", "kernel failed: RuntimeError: PTX for sm_90a not found"),
        ("garbage", "self-check failed: cosine"),
    ],
)
def test_a_kernel_that_fails_or_computes_garbage_is_switched_off(
    monkeypatch, caplog, behaviour, reason
) -> None:
    backend = _Scripted(behaviour=behaviour)
    monkeypatch.setitem(ATTENTION_BACKENDS, "scripted", backend)
    q, k, v = qkv()
    ref = ATTENTION_BACKENDS["auto"](q, k, v)
    with caplog.at_level(logging.WARNING, logger=LOGGER):
        first, second = backend(q, k, v), backend(q, k, v)
    assert torch.equal(first, ref) and torch.equal(second, ref)
    assert backend.broken is not None and backend.broken.startswith(reason)
    assert len([m for m in fallbacks(caplog) if "'scripted'" in m]) == 1


@pytest.mark.slow
def test_a_lossy_backend_traces_into_one_graph_without_breaks() -> None:
    from models.wan.dit.attention import WanSelfAttention
    from models.wan.dit.rope import rope_cos_sin

    module = WanSelfAttention(64, 4, True, 1e-6).eval()
    x = torch.randn(1, 12, 64)
    cos, sin = rope_cos_sin((8, 4, 4), (3, 2, 2), 0)
    past = (torch.randn(1, 24, 4, 16), torch.randn(1, 24, 4, 16))
    with torch.inference_mode():
        ref = module(x, cos, sin, past)[0]
        module.kernel = ATTENTION_BACKENDS["fp8-triton"]
        traced = torch.compile(module, backend="aot_eager", fullgraph=True)
        out = traced(x, cos, sin, past)[0]
    assert torch.equal(out, ref)  # on the CPU the op's body served SDPA
