"""Self-attention kernels alone, on the Wan chunk shape: time and error per backend.

One chunk's queries (3 latent frames x 1560 tokens = 4,680) against what a steady-state step of
window 12 attends to (18,720 keys: 3 sink + 6 cached frames and the chunk's own 3), 12 heads of
128, bf16, no mask - the call the DiT makes 30 times per step, 5 times per chunk. Inputs
are random (N(0, 1), keys scaled by ``--key-scale`` for peakier softmaxes than unit scores
give); random weights cannot show the real models' attention statistics, so the errors are
indicative, the frame differences of ``gpu_session`` and the tiny-world quality guard decide.

Per backend (``models.wan.kernels.attention.ATTENTION_BACKENDS``): who served the call (the
kernel, or SDPA and why), median milliseconds (CUDA events), effective TFLOP/s (4 Nq Nk D H
FLOPs), and the output's error against bf16 SDPA and against fp32 attention (relative L2,
max abs, cosine). ``--sweep`` also times every block configuration of our FP8 kernel
(``models.wan.kernels.fp8_attention.CANDIDATES``, plus the fastest with the tensor-core FP8
accumulator instead of fp32 registers). On the CPU (``--device cpu``) shapes are small and
every lossy backend is SDPA: a dry run of the script.

    python -m infra.bench.attention_bench [--backends auto,cudnn,sage,fp8-triton] [--json F]
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import json
import statistics
import time
from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F

from models.wan.kernels.attention import ATTENTION_BACKENDS, LowPrecisionAttention, attend

__all__ = ["main", "run_micro", "time_ms"]

DEFAULT_BACKENDS = "auto,cudnn,flash,sage,fp8-triton,fp8qk-triton"


def time_ms(fn: Callable[[], Any], reps: int, cuda: bool, warm: int = 1) -> float:
    """Median milliseconds of ``reps`` calls of ``fn`` after ``warm`` untimed ones (compile,
    tune): CUDA events on a GPU, the wall clock elsewhere."""
    for _ in range(warm):
        fn()
    times = []
    for _ in range(reps):
        if cuda:
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            fn()
            end.record()
            end.synchronize()
            times.append(start.elapsed_time(end))
        else:
            t0 = time.perf_counter()
            fn()
            times.append((time.perf_counter() - t0) * 1e3)
    return statistics.median(times)


def _errors(out: torch.Tensor, ref: torch.Tensor) -> dict[str, float]:
    a, b = out.float().flatten(), ref.float().flatten()
    return {
        "rel_l2": float((a - b).norm() / b.norm().clamp_min(1e-30)),
        "max_abs": float((a - b).abs().max()),
        "cosine": float(F.cosine_similarity(a, b, dim=0)),
    }


def _served_by(backend: Any, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> str:
    if not isinstance(backend, LowPrecisionAttention):
        return "SDPA"
    reason = backend.broken or backend.unsupported(q, k, v, None)
    return "kernel" if reason is None else f"SDPA ({reason})"


def run_micro(
    *,
    device: str,
    queries: int,
    keys: int,
    heads: int,
    head_dim: int,
    backends: list[str],
    reps: int = 10,
    key_scale: float = 1.5,
    sweep: bool = True,
) -> dict[str, Any]:
    """The micro-benchmark (module docstring) -> {"shape", "rows", "sweep"}; a backend that
    raises gets an ``error`` row and the others still run."""
    cuda = device == "cuda"
    dtype = torch.bfloat16 if cuda else torch.float32
    gen = torch.Generator(device=device).manual_seed(0)

    def rand(n: int, scale: float = 1.0) -> torch.Tensor:
        x = torch.randn((1, n, heads, head_dim), generator=gen, device=device) * scale
        return x.to(dtype)

    q, k, v = rand(queries), rand(keys, key_scale), rand(keys)
    flops = 4.0 * queries * keys * head_dim * heads
    with torch.inference_mode():
        ref16 = attend(q, k, v)  # [1, Nq, H * D], PyTorch's SDPA choice
        ref32 = attend(q.float(), k.float(), v.float())
        rows = []
        for name in backends:
            row: dict[str, Any] = {"backend": name}
            try:
                backend = ATTENTION_BACKENDS[name]
                missing = backend.missing()
                if missing is not None:
                    row["served_by"] = f"SDPA ({missing})"
                    rows.append(row)
                    continue
                out = backend(q, k, v)  # the first call self-checks and may tune
                row["served_by"] = _served_by(backend, q, k, v)
                row["ms"] = time_ms(functools.partial(backend, q, k, v), reps, cuda)
                row["tflops"] = flops / (row["ms"] * 1e-3) / 1e12
                row["vs_bf16_sdpa"] = _errors(out, ref16)
                row["vs_fp32"] = _errors(out, ref32)
            except Exception as exc:  # recorded, the table goes on
                row["error"] = f"{type(exc).__name__}: {exc}"
            rows.append(row)
        configs = _sweep(q, k, v, reps, flops) if sweep and cuda else []
    shape = {"queries": queries, "keys": keys, "heads": heads, "head_dim": head_dim}
    return {
        "shape": shape | {"dtype": str(dtype), "device": device},
        "rows": rows,
        "sweep": configs,
    }


def _sweep(q, k, v, reps: int, flops: float) -> list[dict[str, Any]]:
    """Every candidate block configuration of our FP8 kernel (PV in FP8), then the fastest
    with the tensor-core accumulator."""
    try:
        from models.wan.kernels import fp8_attention as fa
    except Exception as exc:
        return [{"error": f"{type(exc).__name__}: {exc}"}]
    operands = fa.prepared(q, k, v, pv_fp8=True)
    rows: list[dict[str, Any]] = []
    timed: list[tuple[float, fa.KernelConfig]] = []
    for config in fa.CANDIDATES:
        try:
            ms = fa.time_config(config, operands, reps=reps)
            rows.append({"config": config.label, "ms": ms, "tflops": flops / (ms * 1e-3) / 1e12})
            timed.append((ms, config))
        except Exception as exc:
            rows.append({"config": config.label, "error": f"{type(exc).__name__}: {exc}"})
    if timed:
        best = dataclasses.replace(min(timed, key=lambda t: t[0])[1], exact_acc=False)
        try:
            ms = fa.time_config(best, operands, reps=reps)
            rows.append({"config": best.label, "ms": ms, "tflops": flops / (ms * 1e-3) / 1e12})
        except Exception as exc:
            rows.append({"config": best.label, "error": f"{type(exc).__name__}: {exc}"})
    return rows


def print_micro(micro: dict[str, Any]) -> None:
    s = micro["shape"]
    print(
        f"\nattention alone: {s['queries']} queries x {s['keys']} keys, {s['heads']} heads of "
        f"{s['head_dim']}, {s['dtype']} on {s['device']} (error vs bf16 SDPA | vs fp32)"
    )
    print("| backend | served by | ms | TFLOP/s | rel L2 | max abs | cosine | rel L2 vs fp32 |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- |")
    for r in micro["rows"]:
        if "error" in r:
            print(f"| {r['backend']} | error: {r['error'][:120]} | | | | | | |")
        elif "ms" not in r:
            print(f"| {r['backend']} | {r['served_by']} | | | | | | |")
        else:
            e, e32 = r["vs_bf16_sdpa"], r["vs_fp32"]
            print(
                f"| {r['backend']} | {r['served_by']} | {r['ms']:.3f} | {r['tflops']:.0f} | "
                f"{e['rel_l2']:.4f} | {e['max_abs']:.4f} | {e['cosine']:.5f} | "
                f"{e32['rel_l2']:.4f} |"
            )
    for r in micro["sweep"]:
        detail = r.get("error") or f"{r['ms']:.3f} ms, {r['tflops']:.0f} TFLOP/s"
        print(f"  fp8-triton {r.get('config', '')}: {detail}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cuda", choices=["cuda", "cpu"])
    parser.add_argument("--backends", default=DEFAULT_BACKENDS)
    parser.add_argument("--queries", type=int, default=None, help="default 4680 (cpu: 96)")
    parser.add_argument("--keys", type=int, default=None, help="default 18720 (cpu: 300)")
    parser.add_argument("--heads", type=int, default=None, help="default 12 (cpu: 2)")
    parser.add_argument("--head-dim", type=int, default=128)
    parser.add_argument("--key-scale", type=float, default=1.5)
    parser.add_argument("--reps", type=int, default=10)
    parser.add_argument("--no-sweep", action="store_true")
    parser.add_argument("--json", default=None)
    args = parser.parse_args(argv)
    if args.device == "cuda" and not torch.cuda.is_available():
        print("attention_bench: CUDA is not available (--device cpu for a dry run)")
        return 2
    micro = run_micro(
        **micro_shape(args), backends=args.backends.split(","), sweep=not args.no_sweep
    )
    print_micro(micro)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(micro, f, indent=2)
    return 0


def micro_shape(args: argparse.Namespace) -> dict[str, Any]:
    """Shape arguments of ``run_micro`` from parsed options (the Wan shape on CUDA)."""
    cpu = args.device == "cpu"
    return {
        "device": args.device,
        "queries": args.queries or (96 if cpu else 4680),
        "keys": args.keys or (300 if cpu else 18720),
        "heads": args.heads or (2 if cpu else 12),
        "head_dim": args.head_dim,
        "key_scale": args.key_scale,
        "reps": args.reps if not cpu else 2,
    }


if __name__ == "__main__":
    raise SystemExit(main())
