"""Self-attention kernels that ``WanInstance.compile(attention=NAME)`` selects, with SDPA fallback.

| name | kernel | numerics |
| --- | --- | --- |
| ``auto`` | ``fa3`` where ``fa3-fwd`` is installed, else ``sdpa`` (``select_backend``) | exact |
| ``sdpa`` | SDPA, PyTorch's choice (cuDNN's fused kernel on the H200 with torch 2.11) | exact |
| ``flash`` / ``cudnn`` | SDPA with that kernel tried first | exact |
| ``sage`` | ``sageattention`` 1.0.x (PyPI; pure Triton): INT8 Q K^T per block, FP16 P V | lossy |
| ``fp8-triton`` | ours (``models/wan/kernels/fp8_attention.py``): e4m3 Q K^T and P V | lossy |
| ``fp8qk-triton`` | ours: e4m3 Q K^T, P V in V's 16-bit dtype | lossy |
| ``fa3`` | FlashAttention-3's Hopper forward (PyPI ``fa3-fwd``, prebuilt), bf16 | exact |
| ``fa3-fp8`` | the same, e4m3 Q, K, V with per-(batch, head) scales, bf16 out | lossy |
| ``cudnn-fp8`` | cuDNN's FP8 attention (``nvidia-cudnn-frontend``), per-tensor scales | lossy |

The library backends and what each candidate library needs on the H200 (sizes, JIT, FP8):
``models/wan/kernels/library.py``.

``auto`` prefers FA3 because it is the fastest exact kernel measured on the H200 (1.05 ms per
call against cuDNN's 1.10 at 4,680 x 18,720; 28.8 FPS against 27.1 in the GPU-session bench,
infra/bench/RESULTS.md) and, being bf16, needs no quality guard; where it does not apply (not
Hopper, not bf16, a mask) its calls fall back to SDPA like any kernel backend's.

"exact" means bf16 SDPA, which earlier measurements compare against (frames differ only by
kernel rounding). A lossy backend changes the frames by design; the GPU session bench reports
how much and the tiny-world quality guard (``infra/bench/quality_guard.py``) decides whether it
may be a default.

**Fallback, never a crash.** A backend whose package cannot be imported resolves to ``auto`` at
selection (``select_backend``, logged). At call time a kernel backend (every one but SDPA's)
runs only where it applies
(CUDA, no mask, its head dims and dtypes, a first-use self-check against SDPA passed); any other
call runs SDPA instead, and the first such call per (backend, reason) logs why. A kernel that
raises is disabled for the process (logged) and SDPA serves from then on.

Under ``torch.compile`` a kernel backend is one opaque custom op (``dreamrt::lowp_attention``):
its support checks and logging run in eager Python at call time, never as graph breaks, and
CUDA-graph capture records whatever kernels the op launched.
"""

from __future__ import annotations

import importlib
import logging
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

__all__ = [
    "ATTENTION_BACKENDS",
    "AttentionBackend",
    "CudnnFp8Attention",
    "Fa3Attention",
    "Fp8TritonAttention",
    "LowPrecisionAttention",
    "SageAttention",
    "SdpaAttention",
    "UnknownBackendError",
    "attend",
    "select_backend",
]

log = logging.getLogger(__name__)
_LOGGED: set[tuple[str, str]] = set()  # (backend, reason) already logged once


class UnknownBackendError(KeyError):
    """An attention backend name that is not in ``ATTENTION_BACKENDS`` (lists the known ones)."""


def attend(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    mask: torch.Tensor | None = None,
    backends: tuple[SDPBackend, ...] | None = None,
) -> torch.Tensor:
    """Scaled dot-product attention over heads; ``mask`` is True where a key may be attended.
    ``backends``: SDPA kernels to prefer, in order (``None``: PyTorch's choice).

    q: [B, Nq, H, D]; k, v: [B, Nk, H, D]; mask: broadcastable to [B, H, Nq, Nk] -> [B, Nq, H * D]
    """
    q, k, v = q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)
    if backends is None:
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)  # [B, H, Nq, D]
    else:
        with sdpa_kernel(list(backends), set_priority=True):
            out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
    return out.transpose(1, 2).flatten(2).type_as(q)


class AttentionBackend:
    """Contract of a self-attention kernel: ``backend(q, k, v, mask) -> [B, Nq, H * D]`` in q's
    dtype, for q: [B, Nq, H, D], k, v: [B, Nk, H, D], mask None or True = attend. ``lossy``
    says whether its numerics differ from bf16 SDPA by more than kernel rounding."""

    name: str = ""
    lossy: bool = False

    def missing(self) -> str | None:
        """Why the backend cannot be used in this process (a package not importable), or None."""
        return None

    def __call__(
        self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor | None = None
    ) -> torch.Tensor:  # pragma: no cover - every subclass defines it
        raise NotImplementedError


@dataclass(frozen=True, eq=False)
class SdpaAttention(AttentionBackend):
    """PyTorch SDPA with an optional kernel preference (``order``; None: PyTorch's choice)."""

    name: str = "auto"
    order: tuple[SDPBackend, ...] | None = None

    def __call__(self, q, k, v, mask=None):
        return attend(q, k, v, mask, self.order)


@dataclass(eq=False)
class LowPrecisionAttention(AttentionBackend):
    """A kernel outside SDPA (lossy unless it says otherwise: ``fa3``) behind the
    ``dreamrt::lowp_attention`` custom op, with fallback to SDPA (module docstring). Subclasses
    say where they apply (``unsupported``) and run (``run``)."""

    name: str = ""
    lossy: bool = True
    head_dims: tuple[int, ...] = (64, 128)
    fp8_cores: bool = False  # needs FP8 tensor cores (compute capability >= 8.9)
    # reason the kernel is off for good in this process (it raised, or failed its self-check)
    broken: str | None = None
    checked: set[tuple] = field(default_factory=set)  # (device, head dim, dtype) self-checked
    # calls served by the kernel / by SDPA instead (what a measurement actually measured)
    calls: dict[str, int] = field(default_factory=lambda: {"kernel": 0, "sdpa": 0})

    def unsupported(
        self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor | None
    ) -> str | None:
        """Why this call cannot run on the kernel (None: it can); the device is checked last,
        after the kernel's own limits (head dims)."""
        if mask is not None:
            return "masked attention (a cache with holes)"
        if q.dtype not in (torch.float16, torch.bfloat16, torch.float32):
            return f"dtype {q.dtype}"
        if k.shape[2] != q.shape[2]:
            return f"{q.shape[2]} query heads vs {k.shape[2]} key heads"
        if q.shape[3] not in self.head_dims:
            return f"head dim {q.shape[3]} not in {self.head_dims}"
        if q.device.type != "cuda":
            return f"device {q.device.type} (CUDA only)"
        if self.fp8_cores and torch.cuda.get_device_capability(q.device) < (8, 9):
            return "no FP8 tensor cores (compute capability < 8.9)"
        return None

    def run(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        """q: [B, Nq, H, D]; k, v: [B, Nk, H, D] -> [B, Nq, H, D] contiguous, q's dtype."""
        raise NotImplementedError  # pragma: no cover

    def __call__(self, q, k, v, mask=None):
        return torch.ops.dreamrt.lowp_attention(q, k, v, mask, self.name).flatten(2)

    def attend_or_fallback(
        self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor | None
    ) -> torch.Tensor:
        """The custom op's body: the kernel where it applies, SDPA otherwise -> [B, Nq, H, D]."""
        reason = self.broken or self.unsupported(q, k, v, mask) or self._self_check(q)
        if reason is None:
            try:
                out = self.run(q, k, v)
                self.calls["kernel"] += 1
                return out
            except Exception as exc:  # a kernel that cannot compile or launch here
                self.broken = reason = f"kernel failed: {type(exc).__name__}: {exc}"
        _note_fallback(self.name, reason)
        self.calls["sdpa"] += 1
        return attend(q, k, v, mask).unflatten(-1, (q.shape[2], q.shape[3])).contiguous()

    def _self_check(self, q: torch.Tensor) -> str | None:
        """Once per (device, head dim, dtype): the kernel against fp32 SDPA on a small random
        problem with tails (cosine similarity >= 0.99), so a kernel that compiles but computes
        garbage on this device never serves. Skipped while a CUDA graph is being captured
        (then SDPA serves that call: capture follows an eager warm-up of the same shapes)."""
        key = (q.device, q.shape[3], q.dtype)
        if key in self.checked:
            return None
        if q.device.type == "cuda" and torch.cuda.is_current_stream_capturing():
            return "not self-checked yet (CUDA graph capture)"
        gen = torch.Generator(device=q.device).manual_seed(0)
        a, b, c = (
            torch.randn((1, n, 2, q.shape[3]), generator=gen, device=q.device).to(q.dtype)
            for n in (200, 700, 700)
        )
        try:
            ours = self.run(a, b, c).float()
        except Exception as exc:
            self.broken = f"kernel failed: {type(exc).__name__}: {exc}"
            return self.broken
        ref = attend(a.float(), b.float(), c.float()).unflatten(-1, (2, q.shape[3]))
        cos = F.cosine_similarity(ours.flatten(), ref.flatten(), dim=0).item()
        if not cos >= 0.99:
            self.broken = f"self-check failed: cosine {cos:.4f} vs fp32 SDPA"
            return self.broken
        self.checked.add(key)
        return None


@dataclass(eq=False)
class SageAttention(LowPrecisionAttention):
    """``sageattention.sageattn`` (1.0.x: Triton kernels; INT8 Q K^T with per-block scales,
    FP16 P V). K is smoothed (its mean over keys subtracted: softmax-invariant) out of place:
    sageattn's own ``smooth_k`` subtracts in place, and our K is the tensor the cache keeps."""

    name: str = "sage"
    head_dims: tuple[int, ...] = (64, 96, 128)

    def missing(self) -> str | None:
        try:
            importlib.import_module("sageattention")
        except Exception as exc:  # not installed, or its Triton import fails
            return f"sageattention not importable ({type(exc).__name__}: {exc})"
        return None

    def run(self, q, k, v):
        from sageattention import sageattn

        q, k, v = (t if t.stride(-1) == 1 else t.contiguous() for t in (q, k, v))
        k = k - k.mean(dim=1, keepdim=True)
        out = sageattn(q, k, v, tensor_layout="NHD", is_causal=False, smooth_k=False)
        return out.to(q.dtype).contiguous()


@dataclass(eq=False)
class Fp8TritonAttention(LowPrecisionAttention):
    """Our Triton e4m3 flash attention (``models/wan/kernels/fp8_attention.py``); ``pv_fp8=False``
    keeps P V in 16 bits. Needs FP8 tensor cores (compute capability >= 8.9)."""

    name: str = "fp8-triton"
    pv_fp8: bool = True
    head_dims: tuple[int, ...] = (32, 64, 128)  # models.wan.kernels.fp8_attention.HEAD_DIMS
    fp8_cores: bool = True

    def missing(self) -> str | None:
        try:
            importlib.import_module("models.wan.kernels.fp8_attention")
        except Exception as exc:  # Triton not installed
            return f"Triton kernel not importable ({type(exc).__name__}: {exc})"
        return None

    def run(self, q, k, v):
        from models.wan.kernels.fp8_attention import fp8_attention

        return fp8_attention(q, k, v, pv_fp8=self.pv_fp8)


@dataclass(eq=False)
class Fa3Attention(LowPrecisionAttention):
    """FlashAttention-3's Hopper forward from the ``fa3-fwd`` wheel (prebuilt sm90 kernels, no
    JIT); ``fp8``: e4m3 operands (``library.quantize`` per batch and head). Its
    build has no FP16 kernels, so the bf16 mode takes bf16 only."""

    name: str = "fa3"
    lossy: bool = False
    fp8: bool = False
    # FA3 rounds a head dim up to its kernels' (64 ... 256); 32 is left to the self-check
    head_dims: tuple[int, ...] = (32, 64, 96, 128, 192, 256)

    def missing(self) -> str | None:
        from models.wan.kernels.library import FA3_MODULE, library_missing

        return library_missing(FA3_MODULE, "fa3-fwd")

    def unsupported(self, q, k, v, mask):
        if not self.fp8 and q.dtype != torch.bfloat16:
            return f"dtype {q.dtype} (this FA3 build: bf16 only)"
        if (reason := super().unsupported(q, k, v, mask)) is not None:
            return reason
        if torch.cuda.get_device_capability(q.device)[0] != 9:
            return "not a Hopper GPU (FA3's kernels are sm90)"
        return None

    def run(self, q, k, v):
        from models.wan.kernels.library import fa3_attention

        return fa3_attention(q, k, v, fp8=self.fp8)


@dataclass(eq=False)
class CudnnFp8Attention(LowPrecisionAttention):
    """cuDNN's FP8 fused attention through ``nvidia-cudnn-frontend`` (``sdpa_fp8``), over the
    libcudnn that torch loads; needs FP8 tensor cores (compute capability >= 8.9)."""

    name: str = "cudnn-fp8"
    head_dims: tuple[int, ...] = (32, 64, 128)
    fp8_cores: bool = True

    def missing(self) -> str | None:
        from models.wan.kernels.library import CUDNN_MODULE, library_missing

        return library_missing(CUDNN_MODULE, "nvidia-cudnn-frontend")

    def run(self, q, k, v):
        from models.wan.kernels.library import cudnn_fp8_attention

        return cudnn_fp8_attention(q, k, v)


ATTENTION_BACKENDS: dict[str, AttentionBackend] = {
    b.name: b
    for b in (
        SdpaAttention("auto", None),  # what select_backend("auto") is without FA3
        SdpaAttention("sdpa", None),
        SdpaAttention(
            "flash", (SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION, SDPBackend.MATH)
        ),
        SdpaAttention(
            "cudnn",
            (
                SDPBackend.CUDNN_ATTENTION,
                SDPBackend.FLASH_ATTENTION,
                SDPBackend.EFFICIENT_ATTENTION,
                SDPBackend.MATH,
            ),
        ),
        SageAttention(),
        Fp8TritonAttention(),
        Fp8TritonAttention(name="fp8qk-triton", pv_fp8=False),
        Fa3Attention(),
        Fa3Attention(name="fa3-fp8", lossy=True, fp8=True),
        CudnnFp8Attention(),
    )
}


def select_backend(name: str) -> AttentionBackend:
    """The backend called ``name``: ``auto`` is FA3 where its package is installed, else
    SDPA's choice; one that cannot be imported here resolves to ``auto`` (logged).
    ``UnknownBackendError`` names the known ones."""
    backend = ATTENTION_BACKENDS.get(name)
    if backend is None:
        raise UnknownBackendError(f"attention {name!r} is not one of {sorted(ATTENTION_BACKENDS)}")
    if name == "auto":
        return _auto()
    problem = backend.missing()
    if problem is not None:
        log.warning("attention backend %r unavailable: %s; self-attention uses auto", name, problem)
        return _auto()
    return backend


def _auto() -> AttentionBackend:
    fa3 = ATTENTION_BACKENDS["fa3"]
    return fa3 if fa3.missing() is None else ATTENTION_BACKENDS["auto"]


def _note_fallback(name: str, reason: str) -> None:
    if (name, reason) not in _LOGGED:
        _LOGGED.add((name, reason))
        log.warning("attention backend %r falls back to SDPA: %s", name, reason)


@torch.library.custom_op("dreamrt::lowp_attention", mutates_args=())
def _lowp_attention(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor | None, backend: str
) -> torch.Tensor:
    # q: [B, Nq, H, D]; k, v: [B, Nk, H, D] -> [B, Nq, H, D] contiguous
    chosen = ATTENTION_BACKENDS[backend]
    assert isinstance(chosen, LowPrecisionAttention)  # the only backends that call the op
    return chosen.attend_or_fallback(q, k, v, mask)


@_lowp_attention.register_fake
def _(q, k, v, mask, backend):
    return q.new_empty(q.shape)
