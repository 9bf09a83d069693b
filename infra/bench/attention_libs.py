"""Every attention backend alone on the Wan shapes, in one call: time and error vs bf16 SDPA.

Shapes (queries x keys, 12 heads of 128, bf16, no mask): 4,680 x 18,720 (one chunk of 3 latent
frames against a steady-state window of 12), 1,560 x 18,720 (the latency mode's 1-frame chunk)
and 4,680 x 4,680 (a chunk against itself: the first chunk of a session). Per shape and
backend (``models.wan.kernels.attention.ATTENTION_BACKENDS``, through the same custom op the
DiT calls): who served the call (the kernel, or SDPA and why: a package missing, a kernel that
raised), median ms (CUDA events), TFLOP/s (4 Nq Nk D H), and the error vs bf16 SDPA and vs
fp32 (``attention_bench.run_micro``). A backend that cannot import or run gets its reason in its
row; the others go on.

Then the FP8 library kernels without their quantisation (operands quantised once, outside the
timing) and the quantisation alone: what a cached, fused quantisation would leave. First of
all the environment (torch, CUDA, cuDNN, the GPU, the packages' versions, what
``torch.nn.attention.list_flash_attention_impls`` lists), so the JSON says what ran; last, what
``activate_flash_attention_impl`` answers for each listed impl (SDPA's own FA3/FA4 route).

    python -m infra.bench.attention_libs [--backends ...] [--json F]   (default $OUT/...)
    python -m infra.bench.attention_libs --device cpu                  (a dry run, tiny shapes)
"""

from __future__ import annotations

import argparse
import importlib.metadata
import json
import os
import time
import traceback
from collections.abc import Callable
from typing import Any

import torch

from infra.bench.attention_bench import print_micro, run_micro, time_ms

__all__ = ["SHAPES", "environment", "main"]

BACKENDS = "auto,cudnn,flash,sage,fp8-triton,fp8qk-triton,fa3,fa3-fp8,cudnn-fp8"
SHAPES = ((4680, 18720), (1560, 18720), (4680, 4680))  # (queries, keys)
CPU_SHAPES = ((48, 160), (16, 160), (48, 48))
PACKAGES = ("torch", "triton", "fa3-fwd", "nvidia-cudnn-frontend", "sageattention")


def environment() -> dict[str, Any]:
    """What ran: versions, the device, SDPA's registered flash implementations."""
    env: dict[str, Any] = {"torch_cuda": torch.version.cuda, "packages": {}}
    for name in PACKAGES:
        try:
            env["packages"][name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            env["packages"][name] = None
    if torch.cuda.is_available():
        env["device"] = torch.cuda.get_device_name()
        env["capability"] = list(torch.cuda.get_device_capability())
        env["cudnn"] = torch.backends.cudnn.version()
    attention = torch.nn.attention
    lister = getattr(attention, "list_flash_attention_impls", None)
    env["flash_attention_impls"] = lister() if lister else "no list_flash_attention_impls"
    try:
        import cudnn

        env["cudnn_frontend_backend"] = cudnn.backend_version()
    except Exception as exc:
        env["cudnn_frontend_backend"] = f"{type(exc).__name__}: {exc}"
    return env


def activation_probe() -> dict[str, str]:
    """What ``torch.nn.attention.activate_flash_attention_impl`` says for each impl it lists
    (FA3 wants ``flash_attn_interface``, FA4 ``flash_attn.cute``); run after the timings, and
    an impl that does activate is put back (``restore_flash_attention_impl``)."""
    attention = torch.nn.attention
    lister = getattr(attention, "list_flash_attention_impls", None)
    if lister is None:
        return {}
    found = {}
    for impl in lister():
        try:
            attention.activate_flash_attention_impl(impl)
            found[impl] = "activated"
            restore = getattr(attention, "restore_flash_attention_impl", None)
            if restore is not None:
                restore()
        except Exception as exc:
            found[impl] = f"{type(exc).__name__}: {exc}"[:300]
    return found


def _operands(queries: int, keys: int, heads: int, device: str, key_scale: float):
    # the inputs run_micro draws (same seed, same order), for the kernel-alone timings
    gen = torch.Generator(device=device).manual_seed(0)
    dtype = torch.bfloat16 if device == "cuda" else torch.float32

    def rand(n: int, scale: float = 1.0) -> torch.Tensor:
        return (torch.randn((1, n, heads, 128), generator=gen, device=device) * scale).to(dtype)

    return rand(queries), rand(keys, key_scale), rand(keys)


def kernels_alone(q, k, v, reps: int, flops: float) -> list[dict[str, Any]]:
    """The FP8 library kernels on operands quantised beforehand, and the quantisation alone."""
    from models.wan.kernels import library as lib

    cases: list[tuple[str, Callable[[], Callable[[], Any]]]] = []

    def quantise(per_head: bool) -> Callable[[], Any]:
        return lambda: [lib.quantize(t, per_head) for t in (q, k, v)]

    def fa3_fp8() -> Callable[[], Any]:
        from fa3_fwd_interface import flash_attn_func

        (q8, dq), (k8, dk), (v8, dv) = (lib.quantize(t, True) for t in (q, k, v))
        return lambda: flash_attn_func(q8, k8, v8, q_descale=dq, k_descale=dk, v_descale=dv)

    def cudnn_fp8() -> Callable[[], Any]:
        lib.cudnn_fp8_attention(q, k, v)  # builds (or finds) the graph of this shape
        graph = lib._CUDNN_GRAPHS[(q.device, tuple(q.shape), tuple(k.shape))]
        (q8, dq), (k8, dk), (v8, dv) = (lib.quantize(t, False) for t in (q, k, v))
        return lambda: graph(q8, k8, v8, dq, dk, dv)

    cases += [("quantise Q,K,V per head", lambda: quantise(True))]
    cases += [("quantise Q,K,V per tensor", lambda: quantise(False))]
    cases += [("fa3-fp8 kernel alone", fa3_fp8), ("cudnn-fp8 graph alone", cudnn_fp8)]
    rows = []
    for label, make in cases:
        row: dict[str, Any] = {"what": label}
        try:
            with torch.inference_mode():
                row["ms"] = time_ms(make(), reps, q.is_cuda)
            if "quantise" not in label:
                row["tflops"] = flops / (row["ms"] * 1e-3) / 1e12
        except Exception as exc:
            row["error"] = f"{type(exc).__name__}: {exc}"
        rows.append(row)
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cuda", choices=["cuda", "cpu"])
    parser.add_argument("--backends", default=BACKENDS)
    parser.add_argument("--heads", type=int, default=None, help="default 12 (cpu: 2)")
    parser.add_argument("--reps", type=int, default=20)
    parser.add_argument("--key-scale", type=float, default=1.5)
    parser.add_argument("--sweep", action="store_true", help="also our FP8 kernel's configs")
    parser.add_argument("--json", default=None, help="default $OUT/attention_libs.json")
    args = parser.parse_args(argv)
    cuda = args.device == "cuda"
    if cuda and not torch.cuda.is_available():
        print("attention_libs: CUDA is not available (--device cpu for a dry run)")
        return 2
    heads = args.heads or (12 if cuda else 2)
    reps = args.reps if cuda else 2
    path = args.json or (
        os.path.join(os.environ["OUT"], "attention_libs.json") if "OUT" in os.environ else None
    )
    result: dict[str, Any] = {"environment": environment(), "shapes": []}
    print(json.dumps(result["environment"]))
    for queries, keys in SHAPES if cuda else CPU_SHAPES:
        t0 = time.perf_counter()
        entry: dict[str, Any]
        try:
            entry = run_micro(
                device=args.device,
                queries=queries,
                keys=keys,
                heads=heads,
                head_dim=128,
                backends=args.backends.split(","),
                reps=reps,
                key_scale=args.key_scale,
                sweep=args.sweep and (queries, keys) == SHAPES[0],
            )
            q, k, v = _operands(queries, keys, heads, args.device, args.key_scale)
            flops = 4.0 * queries * keys * 128 * heads
            entry["alone"] = kernels_alone(q, k, v, reps, flops)
            del q, k, v
        except Exception as exc:  # a whole shape failing (out of memory, ...) is recorded
            entry = {"shape": {"queries": queries, "keys": keys}, "error": traceback.format_exc()}
            print(f"shape {queries} x {keys} failed: {type(exc).__name__}: {exc}")
        entry["seconds"] = time.perf_counter() - t0
        result["shapes"].append(entry)
        if path:
            with open(path, "w") as f:
                json.dump(result, f, indent=2)
    result["environment"]["flash_attention_activation"] = activation_probe()
    if path:
        with open(path, "w") as f:
            json.dump(result, f, indent=2)
    print(json.dumps(result["environment"]["flash_attention_activation"]))
    for entry in result["shapes"]:
        if "rows" in entry:
            print_micro(entry)
        for row in entry.get("alone", []):
            detail = row.get("error") or f"{row['ms']:.3f} ms" + (
                f", {row['tflops']:.0f} TFLOP/s" if "tflops" in row else ""
            )
            print(f"  {row['what']}: {detail}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
