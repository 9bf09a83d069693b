"""FP8 linear layers for the DiT blocks: e4m3 weights and activations with float32 scales.

``Fp8Linear`` replaces an ``nn.Linear`` at serving time (``quantize_linears``). Row-wise
scaling (the default; one scale per output row of W and per token of x)::

    W  [N, K]  ->  W_q = e4m3(W / s_w),  s_w [N] = max|W[n, :]| / 448     (once, at load)
    x  [M, K]  ->  x_q = e4m3(x / s_x),  s_x [M] = max|x[m, :]| / 448     (every call)
    y = (x_q @ W_q^T) * s_x[:, None] * s_w[None, :] + b                   (one scaled GEMM)

``per_tensor=True`` uses one scale for all of W and one for all of x (cuBLAS's tensor-wise FP8
GEMM; coarser, so an outlier anywhere costs every value precision).

On CUDA (compute capability >= 8.9) the product is ``torch._scaled_mm`` with row-wise scales,
which runs at twice the bf16 matmul rate on Hopper; elsewhere the same quantised values are
multiplied in float32, so CPU tests check the numerics that the GPU path computes. The output
dtype is the input's. Quantisation error is the price: the GPU session benchmark reports the
frames' difference to bf16 next to the speed (infra/bench/RESULTS.md), and serving with FP8 is
an explicit choice (``WanInstance.compile(fp8=True)``), never a default.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import nn

__all__ = ["E4M3_MAX", "Fp8Linear", "quantize_linears", "scaled_mm_supported"]

E4M3_MAX = 448.0  # largest finite float8_e4m3fn
_MIN_SCALE = 1e-12


def scaled_mm_supported(device: torch.device) -> bool:
    """True where ``torch._scaled_mm`` runs FP8 GEMMs (CUDA, compute capability >= 8.9)."""
    return (
        device.type == "cuda"
        and torch.cuda.is_available()
        and torch.cuda.get_device_capability(device) >= (8, 9)
    )


def _quantize(x: torch.Tensor, per_tensor: bool) -> tuple[torch.Tensor, torch.Tensor]:
    # x: [M, K] -> e4m3 [M, K], float32 scale [M, 1] (max |row| maps to E4M3_MAX), or [1, 1]
    amax = x.abs().amax() if per_tensor else x.abs().amax(dim=1)
    scale = amax.reshape(-1, 1).float().clamp_min(_MIN_SCALE) / E4M3_MAX
    q = (x.float() / scale).clamp(-E4M3_MAX, E4M3_MAX).to(torch.float8_e4m3fn)
    return q, scale


class Fp8Linear(nn.Module):
    """An ``nn.Linear`` computed in FP8 (module docstring). Inference only: no gradients.

    Buffers: ``weight_fp8`` [N, K] e4m3, ``weight_scale`` [1, N] float32 ([1, 1] per tensor);
    ``bias`` [N] in the original dtype (or None).
    """

    weight_fp8: torch.Tensor
    weight_scale: torch.Tensor
    bias: torch.Tensor | None

    def __init__(self, linear: nn.Linear, *, per_tensor: bool = False) -> None:
        super().__init__()
        if linear.in_features % 16 or linear.out_features % 16:
            raise ValueError(
                f"FP8 GEMMs need features divisible by 16; got "
                f"{linear.in_features} -> {linear.out_features}"
            )
        self.in_features, self.out_features = linear.in_features, linear.out_features
        self.per_tensor = per_tensor
        weight, scale = _quantize(linear.weight.detach(), per_tensor)
        self.register_buffer("weight_fp8", weight)
        self.register_buffer("weight_scale", scale.t().contiguous())
        bias = None if linear.bias is None else linear.bias.detach().clone()
        self.register_buffer("bias", bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # x: [..., K] -> [..., N] in x's dtype
        rows = x.reshape(-1, self.in_features)
        x_q, x_scale = _quantize(rows, self.per_tensor)
        x_q = x_q.contiguous()  # the GEMM takes a row-major A
        if scaled_mm_supported(x.device):
            y = torch._scaled_mm(
                x_q,
                self.weight_fp8.t(),
                scale_a=x_scale,
                scale_b=self.weight_scale,
                out_dtype=x.dtype,
            )
        else:
            y = (x_q.float() * x_scale) @ (self.weight_fp8.float() * self.weight_scale.t()).t()
            y = y.to(x.dtype)
        if self.bias is not None:
            y = y + self.bias.to(y.dtype)
        return y.reshape(*x.shape[:-1], self.out_features)

    def extra_repr(self) -> str:
        scaling = "per tensor" if self.per_tensor else "row-wise"
        return f"in_features={self.in_features}, out_features={self.out_features}, e4m3 {scaling}"


def quantize_linears(
    module: nn.Module, select: Callable[[str], bool], *, per_tensor: bool = False
) -> list[str]:
    """Replace every ``nn.Linear`` under ``module`` whose qualified name ``select`` accepts by
    an ``Fp8Linear`` (in place); -> the names replaced."""
    targets = [
        (name, child)
        for name, child in module.named_modules()
        if isinstance(child, nn.Linear) and select(name)
    ]
    for name, linear in targets:
        parent_name, _, attr = name.rpartition(".")
        parent = module.get_submodule(parent_name) if parent_name else module
        setattr(parent, attr, Fp8Linear(linear, per_tensor=per_tensor))
    return [name for name, _ in targets]
