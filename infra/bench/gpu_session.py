"""One realtime session of the Wan2.1-1.3B causal card through the engine, on one GPU.

The whole serving path below the network: ``Engine`` (scheduler + executor thread + profiler)
drives ``chunk_rollout`` (text encode, 4 denoise steps, KV update, VAE decode to uint8 RGB
frames on the host, ready for the encoder) at 832x480, chunks of 3 latent frames, KV window
9 + 3 sink (``--window 21`` for the 21-frame variant), random bf16 weights.

Variants, measured side by side in one process:

- ``baseline``: eager PyTorch, attention always masked (the first implementation).
- ``nomask``: eager; a full K/V cache drops the mask, so SDPA may pick flash / cuDNN kernels.
- ``compiled``: ``nomask`` plus ``WanInstance.compile()``: ``torch.compile`` of every DiT block
  (one graph for all 30) and of the VAE decoder (3D conv weights channels-last).

For each: steady-state FPS including decode, time to first frame, per-step and per-chunk
latency (median, p95), DiT MFU (``dit_flops`` / measured step time / ``--peak-tflops``),
peak memory, and engine overhead (chunk wall time minus the device time of its plans).
Parity: every variant's frames against the baseline's (same seed), as mean/max absolute
uint8 difference. Prints one table last; ``--json`` writes everything.

    python -m infra.bench.gpu_session [--chunks 8] [--window 12] [--variants baseline,nomask,compiled]
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import json
import statistics
import sys
import time
from typing import Any

import torch

from models.instance import WanInstance, load_instance
from models.loops.requests import SessionRequest
from models.registry import get
from models.wan.kv_cache import ChunkKVCache
from models.wan.transformer import dit_flops
from runtime.contract import Emission, Priority
from runtime.cost import CostModel, DeviceConstants
from runtime.engine import Engine
from runtime.observers import Profiler

VARIANTS = ("baseline", "nomask", "compiled")


def _with_window(card: Any, window: int) -> Any:
    caches = dict(card.caches)
    caches["chunk_kv"] = dataclasses.replace(caches["chunk_kv"],
                                             window_latent_frames=window - caches["chunk_kv"].sink_latent_frames)
    return dataclasses.replace(card, caches=caches)


def _percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[max(0, min(len(ordered) - 1, round(q * (len(ordered) - 1))))]


def _sync() -> None:
    if torch.cuda.is_available():
        torch.cuda.synchronize()


async def _run_session(instance: WanInstance, chunks: int) -> dict[str, Any]:
    profiler = Profiler()  # CUDA events when CUDA is there
    engine = Engine(cost=CostModel(DeviceConstants.h200()), observers=[profiler])
    await engine.start()
    emitted: list[tuple[float, torch.Tensor]] = []

    def on_emit(emission: Emission) -> None:
        if emission.spec.stream == "media":
            emitted.append((time.perf_counter(), emission.output))

    _sync()
    start = time.perf_counter()
    # Batch class: no playout deadlines, so the lead limit does not cap the rate we measure.
    handle = engine.spawn(instance.loop("chunk_rollout"),
                          SessionRequest(prompt="a red ball rolling on green grass", seed=7,
                                         max_chunks=chunks),
                          instance, loop_id="bench", priority=Priority.BATCH, on_emit=on_emit)
    await handle.result()
    await engine.close()
    stamps = [start] + [t for t, _ in emitted]
    chunk_wall = [b - a for a, b in zip(stamps, stamps[1:])]
    return {"chunk_wall_s": chunk_wall, "frames": [f for _, f in emitted],
            "wall": {k: profiler.wall_samples(k) for k in ("text_encode", "chunk_step",
                                                            "kv_update", "vae_decode")},
            "device": {k: profiler.device_samples(k) or profiler.wall_samples(k)
                       for k in ("text_encode", "chunk_step", "kv_update", "vae_decode")}}


def _prepare(variant: str, instance: WanInstance) -> None:
    # The baseline keeps the mask on a full cache, as the first implementation did.
    ChunkKVCache.full = property(lambda self: False) if variant == "baseline" else _FULL
    if variant == "compiled":
        instance.compile()


_FULL = ChunkKVCache.full


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--chunks", type=int, default=10)
    parser.add_argument("--window", type=int, default=12,
                        help="latent frames each chunk step attends to (sinks + window)")
    parser.add_argument("--variants", default=",".join(VARIANTS))
    parser.add_argument("--peak-tflops", type=float, default=790.0)
    parser.add_argument("--json", default=None)
    parser.add_argument("--model", default="wan2.1-1.3b-causal")
    parser.add_argument("--device", default="cuda", choices=["cuda", "cpu"],
                        help="cpu: a dry run of the script on a small card")
    args = parser.parse_args(argv)
    if args.device == "cuda" and not torch.cuda.is_available():
        print("gpu_session: CUDA is not available (--device cpu for a dry run)", file=sys.stderr)
        return 2
    cuda = args.device == "cuda"
    variants = args.variants.split(",")
    card = _with_window(get(args.model), args.window)
    instance = load_instance(card, device=args.device, precision="bf16" if cuda else "fp32",
                             random_weights=True)
    profile = card.default_profile
    stride = card.latent.spatial_stride
    lh, lw = profile.height // stride, profile.width // stride
    t = instance.tokens_per_frame(lh, lw)
    c = profile.chunk_latent_frames
    # each step attends to the whole window: sinks + cached frames + the chunk itself
    step_flops = dit_flops(instance.dit.config, c * t, args.window * t, instance.text_len)

    device_name = torch.cuda.get_device_name() if cuda else "cpu"
    results: dict[str, dict[str, Any]] = {}
    reference: list[torch.Tensor] | None = None
    # Chunks before the K/V cache is full attend with a mask (other kernels, other graphs):
    # steady state starts one chunk after it fills.
    sink, ring = instance.kv_geometry(c)
    first_steady = -(-(sink + ring) // c) + 1
    if args.chunks <= first_steady:
        parser.error(f"--chunks must exceed {first_steady} to reach steady state")
    for variant in variants:
        _prepare(variant, instance)
        # warm-up through steady state: kernel selection and compilation of every graph
        asyncio.run(_run_session(instance, first_steady + 1))
        if cuda:
            torch.cuda.reset_peak_memory_stats()
        run = asyncio.run(_run_session(instance, args.chunks))
        steady = run["chunk_wall_s"][first_steady:]
        frames = [f.shape[0] for f in run["frames"]][first_steady:]
        step_dev = run["device"]["chunk_step"][-profile.steps * len(steady):]
        device_per_chunk = [sum(x) for x in zip(*[iter(step_dev)] * profile.steps)]
        kv = run["device"]["kv_update"][-len(steady):]
        dec = run["device"]["vae_decode"][-len(steady):]
        busy = [a + b + c for a, b, c in zip(device_per_chunk, kv, dec)]
        overhead = [w - b for w, b in zip(steady, busy)]
        parity = None
        if reference is None:
            reference = run["frames"]
        else:
            diffs = [(a.float() - b.float()).abs() for a, b in zip(run["frames"], reference)]
            parity = {"mean_abs_uint8": float(torch.cat([d.flatten() for d in diffs]).mean()),
                      "max_abs_uint8": float(max(d.max() for d in diffs))}
        step_med = statistics.median(step_dev)
        results[variant] = {
            "fps": sum(frames) / sum(steady),
            "first_frame_s": run["chunk_wall_s"][0],
            "step_ms_median": step_med * 1e3, "step_ms_p95": _percentile(step_dev, 0.95) * 1e3,
            "chunk_ms_median": statistics.median(steady) * 1e3,
            "chunk_ms_p95": _percentile(steady, 0.95) * 1e3,
            "decode_ms_median": statistics.median(dec) * 1e3,
            "kv_update_ms_median": statistics.median(kv) * 1e3,
            "mfu": step_flops / step_med / (args.peak_tflops * 1e12),
            "peak_gib": torch.cuda.max_memory_allocated() / 2**30 if cuda else float("nan"),
            "engine_overhead_ms_median": statistics.median(overhead) * 1e3,
            "parity_vs_baseline": parity, "raw": {k: v for k, v in run.items() if k != "frames"},
        }
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"window": args.window, "chunks": args.chunks, "step_flops": step_flops,
                       "device": device_name, "torch": torch.__version__,
                       "results": results}, f, indent=2)
    base = results.get("baseline")
    print(f"\n{args.model}, {profile.width}x{profile.height}, {profile.steps} steps, chunks of "
          f"{c} latent frames, window {args.window} (incl. sinks), {device_name}, "
          f"torch {torch.__version__}; DiT step = {step_flops / 1e12:.1f} TFLOP")
    print("| variant | FPS incl. decode | x baseline | first frame s | step ms (p95) | "
          "chunk ms (p95) | decode ms | MFU | peak GiB | engine overhead ms | parity (mean/max) |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |")
    for name, r in results.items():
        ratio = r["fps"] / base["fps"] if base else float("nan")
        par = r["parity_vs_baseline"]
        par_s = "ref" if par is None else f"{par['mean_abs_uint8']:.2f}/{par['max_abs_uint8']:.0f}"
        print(f"| {name} | {r['fps']:.1f} | {ratio:.2f} | {r['first_frame_s']:.2f} | "
              f"{r['step_ms_median']:.1f} ({r['step_ms_p95']:.1f}) | {r['chunk_ms_median']:.0f} "
              f"({r['chunk_ms_p95']:.0f}) | {r['decode_ms_median']:.0f} | {r['mfu']:.0%} | "
              f"{r['peak_gib']:.1f} | {r['engine_overhead_ms_median']:.1f} | {par_s} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
