"""Attention kernels of other libraries, as the backends of ``kernels.attention`` call them.

What each candidate library needs on the H200 machine (torch 2.11+cu130, Python 3.12, no
network, nvcc 13.0 present; everything carried travels in 64 MiB *in all*, the ~9 MB working
tree and the msgspec wheel included), as read from PyPI on 2026-12-02 (`pip download --no-deps`
for cp312 manylinux x86_64; sizes are the wheels'):

- ``flashinfer-python`` 0.7.4: a 101.3 MB py3-none-any wheel, which alone is over the budget.
  Its FA3-based sm90 prefill (e4m3 too) is JIT: its CUDA sources (``data/csrc`` is 44 MB
  compressed) are compiled by nvcc + ninja on first use, unless prebuilt kernels come along:
  ``flashinfer-cubin`` (0.6.13 the newest) is 458 MB, ``flashinfer-jit-cache`` is on PyPI for
  no cp312 manylinux x86_64 (its wheels live on FlashInfer's own index, out of reach). It also
  requires ``nvidia-cutlass-dsl``, ``apache-tvm-ffi``, ``nvidia-cudnn-frontend``,
  ``cuda-tile``, ``nccl4py``. **Cannot travel.**
- ``flash-attn-4`` 4.0.0b36 (CuTe DSL): 0.5 MB itself, sm90 forward (``flash_fwd_sm90.py``;
  its FP8 forward is the sm100 path), JIT per shape without nvcc, but through
  ``nvidia-cutlass-dsl`` 4.8.1 = ``-libs-base`` 3.1 MB + ``-libs-core`` 1.6 MB + ``-libs-cu12``
  91.7 MB or ``-libs-cu13`` 92.0 MB (the MLIR compiler ``_cutlass_ir.so``, 193 MB unpacked;
  the cu13 set as a ``tar.xz -9`` is still 63.6 MB), plus ``quack-kernels`` 0.7 MB,
  ``apache-tvm-ffi`` 3.3 MB, ``torch-c-dlpack-ext`` 0.9 MB. **Cannot travel.**
- ``fa3-fwd`` 0.0.3: 27.6 MB, cp39-abi3 manylinux_2_24. FlashAttention-3's Hopper forward,
  prebuilt (CUDA 13.0, ``libcudart.so.13``; sm90 kernels for bf16 and e4m3, head dims 64-256;
  FP16, backward, paged KV and local attention left out of the build) against libtorch's
  stable ABI (only ``aoti_torch_*`` / ``torch_*`` C symbols, so one build serves torch >=
  2.10). Module ``fa3_fwd_interface``, ops ``torch.ops.fa3_fwd``; FP8 takes e4m3 Q, K, V with
  per-(batch, head) descales and returns bf16. Nothing to compile. **Fits**: backends ``fa3``
  and ``fa3-fp8``. (A third party's build of upstream's ``hopper/``, not Tri Dao's release.)
- ``nvidia-cudnn-frontend`` 1.32.0: 11.6 MB, cp312 manylinux_2_27. The cuDNN graph API over
  the libcudnn torch already loads (``nvidia-cudnn-cu13`` on the machine); ``import cudnn``
  needs none of its declared CuTe DSL dependency (only its Python-DSL kernels import it, and
  ``sdpa_fp8`` on the backend path is not one). ``sdpa_fp8`` takes per-tensor descales; on
  Hopper the output may have to be e4m3 (then dequantised here). **Fits**: ``cudnn-fp8``.

PyTorch itself: ``torch.nn.attention.activate_flash_attention_impl("FA3" | "FA4")`` (2.10+)
swaps SDPA's flash kernel for an external one, but it only *registers* kernels that a package
provides: FA3 needs a module exposing ``torch.ops.flash_attn_3`` (upstream's ``hopper/``
build, ``flash_attn_interface``, which is on no package index; ``fa3-fwd`` registers
``torch.ops.fa3_fwd`` instead, so it is called directly here), FA4 needs ``flash_attn.cute``
(the CuTe DSL above). SDPA's own kernels (flash = FA2, cuDNN, efficient) take no FP8 inputs;
cuDNN's FP8 attention is reached only through cudnn-frontend. ``attention_libs`` records what
the device's torch lists (``list_flash_attention_impls``) in its JSON.

Quantisation (both FP8 paths): e4m3 = x * 448 / amax, amax over (tokens, channels) per
(batch, head) for FA3 and over the whole tensor for cuDNN (its descales are scalars); the max
comes from one ``vector_norm(ord=inf)`` reduction, the scaled cast from a second pass. It runs
on every call (two reads of Q, K and V, one e4m3 write); the bench times it apart from the
kernel. Keeping the cached prefix's e4m3 K/V between steps would leave only the chunk's own.
"""

from __future__ import annotations

import importlib
import math

import torch

__all__ = [
    "CUDNN_MODULE",
    "E4M3_MAX",
    "FA3_MODULE",
    "cudnn_fp8_attention",
    "fa3_attention",
    "library_missing",
    "quantize",
]

FA3_MODULE = "fa3_fwd_interface"  # the fa3-fwd wheel
CUDNN_MODULE = "cudnn"  # the nvidia-cudnn-frontend wheel
E4M3_MAX = 448.0
_CUDNN_GRAPHS: dict[tuple, _CudnnFp8Graph] = {}
_CUDNN_HANDLES: dict[torch.device, object] = {}  # one cuDNN handle per device


def library_missing(module: str, package: str) -> str | None:
    """Why ``module`` (of PyPI ``package``) cannot be imported here, or None."""
    try:
        importlib.import_module(module)
    except Exception as exc:  # not installed, or its native library fails to load
        return f"{package} not importable ({type(exc).__name__}: {exc})"
    return None


def quantize(x: torch.Tensor, per_head: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """x [B, N, H, D] -> (e4m3 [B, N, H, D] contiguous, descale fp32): descale [B, H] (per
    head) or [1, 1, 1, 1] (per tensor), x ~= e4m3 * descale. Two passes over x: the max
    (one reduction), then the scaled cast, in fp32 and written as e4m3 by one kernel (the
    product is at most 448 up to fp32 rounding, which rounds to 448, never into NaN)."""
    dims = (1, 3) if per_head else (0, 1, 2, 3)
    amax = torch.linalg.vector_norm(x, ord=math.inf, dim=dims, keepdim=True, dtype=torch.float32)
    scale = E4M3_MAX / amax.clamp_min(1e-12)  # [B, 1, H, 1] or [1, 1, 1, 1], fp32
    x8 = _scaled_cast(x, scale)
    descale = scale.reciprocal()
    if per_head:
        descale = descale[:, 0, :, 0].contiguous()  # [B, H]
    return x8, descale


_FUSED_CAST = [True]  # mul writing e4m3 directly works here (until it raised once)


def _scaled_cast(x: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    # one kernel (mul computes in fp32 and casts on store) where this torch takes an e4m3
    # ``out``; otherwise the product in fp32, then a cast
    if _FUSED_CAST[0]:
        out = torch.empty(x.shape, device=x.device, dtype=torch.float8_e4m3fn)
        try:
            return torch.mul(x, scale, out=out)
        except (RuntimeError, TypeError):  # raised at dispatch, before any kernel ran
            _FUSED_CAST[0] = False
    return (x * scale).to(torch.float8_e4m3fn)


def fa3_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, fp8: bool) -> torch.Tensor:
    """FlashAttention-3 (fa3-fwd) on q: [B, Nq, H, D]; k, v: [B, Nk, H, D] -> [B, Nq, H, D]
    in q's dtype; ``fp8``: e4m3 operands with per-(batch, head) descales, else bf16 as given."""
    from fa3_fwd_interface import flash_attn_func

    if not fp8:
        return flash_attn_func(q, k, v).contiguous()
    (q8, dq), (k8, dk), (v8, dv) = (quantize(t, per_head=True) for t in (q, k, v))
    out = flash_attn_func(q8, k8, v8, q_descale=dq, k_descale=dk, v_descale=dv)
    return out.to(q.dtype).contiguous()


def cudnn_fp8_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """cuDNN's FP8 fused attention (cudnn-frontend ``sdpa_fp8``, per-tensor scales) on
    q: [B, Nq, H, D]; k, v: [B, Nk, H, D] -> [B, Nq, H, D] in q's dtype. One graph per shape,
    built on first use (heuristics and plan build: the warm-up pays it)."""
    (q8, dq), (k8, dk), (v8, dv) = (quantize(t, per_head=False) for t in (q, k, v))
    key = (q.device, tuple(q.shape), tuple(k.shape))
    graph = _CUDNN_GRAPHS.get(key)
    if graph is None:
        graph = _CUDNN_GRAPHS[key] = _CudnnFp8Graph(q8, k8)
    return graph(q8, k8, v8, dq, dk, dv).to(q.dtype)


class _CudnnFp8Graph:
    """One built ``sdpa_fp8`` graph for a (device, Q shape, K shape). Output in bf16 where the
    cuDNN build takes it, else in e4m3 scaled by ``448 / amax(V)`` (|O| <= max |V|: a convex
    combination of V's rows) and dequantised after."""

    def __init__(self, q8: torch.Tensor, k8: torch.Tensor) -> None:
        import cudnn

        self.cudnn = cudnn
        device = q8.device  # a tensor's CUDA device always has its index
        if device not in _CUDNN_HANDLES:
            _CUDNN_HANDLES[device] = cudnn.create_handle()
        self.handle = _CUDNN_HANDLES[device]
        self.p_scale = torch.full((1, 1, 1, 1), E4M3_MAX, device=device)  # P in [0, 1]
        self.p_descale = self.p_scale.reciprocal()
        self.amax = torch.empty((2, 1, 1, 1, 1), device=device)  # amax S, amax O (unused)
        errors = []
        for out_type in (cudnn.data_type.BFLOAT16, cudnn.data_type.FP8_E4M3):
            try:
                self._build(q8, k8, out_type)
                self.fp8_out = out_type == cudnn.data_type.FP8_E4M3
                return
            except Exception as exc:  # this cuDNN takes no such output: try the next
                errors.append(f"{out_type}: {type(exc).__name__}: {exc}")
        raise RuntimeError("cuDNN sdpa_fp8 graph not supported: " + " | ".join(errors))

    def _build(self, q8: torch.Tensor, k8: torch.Tensor, out_type: object) -> None:
        cudnn = self.cudnn
        e4m3, fp32 = cudnn.data_type.FP8_E4M3, cudnn.data_type.FLOAT
        g = cudnn.pygraph(
            io_data_type=e4m3,
            intermediate_data_type=fp32,
            compute_data_type=fp32,
            handle=self.handle,
        )
        b, nq, h, d = q8.shape
        nk = k8.shape[1]

        def bhsd(name: str, n: int) -> object:  # our [B, N, H, D] memory as cuDNN's [b, h, s, d]
            return g.tensor(
                name=name, dim=[b, h, n, d], stride=[n * h * d, d, h * d, 1], data_type=e4m3
            )

        self.tq, self.tk, self.tv = bhsd("q", nq), bhsd("k", nk), bhsd("v", nk)
        scalar = {"dim": [1, 1, 1, 1], "stride": [1, 1, 1, 1], "data_type": fp32}
        self.scales = [g.tensor(name=n, **scalar) for n in ("dq", "dk", "dv", "ds", "ss", "so")]
        o, _, amax_s, amax_o = g.sdpa_fp8(
            self.tq,
            self.tk,
            self.tv,
            *self.scales,
            generate_stats=False,
            attn_scale=1.0 / math.sqrt(d),
            use_causal_mask=False,
            name="sdpa_fp8",
        )
        o.set_output(True).set_dim([b, h, nq, d]).set_stride([nq * h * d, d, h * d, 1])
        o.set_data_type(out_type)
        for amax in (amax_s, amax_o):
            amax.set_output(True).set_dim([1, 1, 1, 1]).set_stride([1, 1, 1, 1])
            amax.set_data_type(fp32)
        g.validate()
        g.build_operation_graph()
        g.create_execution_plans([cudnn.heur_mode.A, cudnn.heur_mode.FALLBACK])
        g.check_support()
        g.build_plans()
        self.graph, self.o, self.amax_s, self.amax_o = g, o, amax_s, amax_o
        self.out_dtype = torch.bfloat16 if out_type == cudnn.data_type.BFLOAT16 else None
        size = g.get_workspace_size()
        self.workspace = torch.empty(max(size, 1), device=q8.device, dtype=torch.uint8)

    def __call__(self, q8, k8, v8, dq, dk, dv) -> torch.Tensor:
        # q8: [B, Nq, H, D]; k8, v8: [B, Nk, H, D] e4m3; descales [1, 1, 1, 1] -> [B, Nq, H, D]
        if self.fp8_out:
            o_scale = dv.reciprocal()  # 448 / amax(V): O's range is V's
            out = torch.empty(q8.shape, device=q8.device, dtype=torch.float8_e4m3fn)
        else:
            o_scale = torch.ones_like(dv)
            out = torch.empty(q8.shape, device=q8.device, dtype=self.out_dtype)
        if q8.is_cuda:  # kernels go on torch's stream (a CUDA graph being captured, too)
            self.cudnn.set_stream(self.handle, torch.cuda.current_stream(q8.device).cuda_stream)
        pack = dict(zip((self.tq, self.tk, self.tv), (q8, k8, v8), strict=True))
        values = (dq, dk, dv, self.p_descale, self.p_scale, o_scale)
        pack.update(zip(self.scales, values, strict=True))
        pack.update({self.o: out, self.amax_s: self.amax[0], self.amax_o: self.amax[1]})
        self.graph.execute(pack, self.workspace, handle=self.handle)
        if self.fp8_out:
            return out.float() * dv  # O = e4m3 / scale_o = e4m3 * amax(V) / 448
        return out
