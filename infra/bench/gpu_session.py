"""One realtime session of the Wan2.1-1.3B causal card through the engine, on one GPU.

The whole serving path below the network: ``Engine`` (scheduler + executor thread + profiler)
drives ``chunk_rollout`` (text encode, 4 denoise steps, KV update, VAE decode to uint8 RGB
frames on the host, ready for the encoder) at 832x480, chunks of 3 latent frames, KV window
9 + 3 sink (``--window 21`` for the 21-frame variant), random bf16 weights.

Variants, measured side by side in one process (``--variants``, comma-separated):

- ``baseline``: eager PyTorch, attention always masked over the whole cache (the first
  implementation).
- ``nomask``: eager; attention reads only the filled prefix of the K/V cache, unmasked, so SDPA
  may pick flash / cuDNN kernels from the first chunk on.
- ``compiled``: ``nomask`` plus ``WanInstance.compile()``: ``torch.compile`` of every DiT block
  (one graph for all 30) and of the VAE decoder (3D conv weights channels-last).
- options joined with ``+``: ``compiled+cudnn`` / ``+flash`` (SDPA kernel preference),
  ``+overlap`` (the VAE decode on a second CUDA stream beside the next plans),
  ``+convbench`` (``torch.backends.cudnn.benchmark``: cuDNN times its conv algorithms; stays
  on for later variants), ``+fp8`` / ``+fp8t`` (FP8 linears in the blocks with row-wise /
  per-tensor scales: ``models/wan/fp8.py``), ``+fold`` (the card's K/V update moved into the
  last denoising step, ``KVUpdate.LAST_STEP``: one forward less per chunk, but not what the
  recipe trained with, so its frames differ by design).

Each variant gets a fresh instance with the same seeded random weights.

For each: steady-state FPS including decode, time to first frame, per-step and per-chunk
latency (median, p95), DiT MFU (``dit_flops`` / measured step time / ``--peak-tflops``),
peak memory, and engine overhead (chunk wall time minus the device time of its plans).
Parity: every variant's frames against the baseline's (same seed), as mean/max absolute
uint8 difference. Time to first frame comes from a one-chunk session with a prompt never seen
before (its text encode runs; kernels are warm). Prints the tables last; ``--json``
writes everything.

    python -m infra.bench.gpu_session [--chunks 8] [--window 12] \
        [--variants baseline,nomask,compiled]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
import json
import statistics
import sys
import time
from collections.abc import Iterator
from typing import Any

import torch

from models.instance import WanInstance, load_instance
from models.loops.requests import SessionRequest
from models.registry import get
from models.wan.dit_flops import dit_flops
from models.wan.fp8 import Fp8Linear, scaled_mm_supported
from models.wan.kv_cache import ChunkKVCache
from runtime.contract import Emission, Priority
from runtime.cost import CostModel, DeviceConstants
from runtime.engine import Engine
from runtime.observers import Profiler

VARIANTS = ("baseline", "compiled", "compiled+cudnn", "compiled+cudnn+fp8")
_KINDS = ("text_encode", "chunk_step", "kv_update", "vae_decode")


def _with_window(card: Any, window: int) -> Any:
    caches = dict(card.caches)
    caches["chunk_kv"] = dataclasses.replace(
        caches["chunk_kv"], window_latent_frames=window - caches["chunk_kv"].sink_latent_frames
    )
    return dataclasses.replace(card, caches=caches)


def _percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[max(0, min(len(ordered) - 1, round(q * (len(ordered) - 1))))]


def _sync() -> None:
    if torch.cuda.is_available():
        torch.cuda.synchronize()


class _Served:
    """One engine (one executor thread) serving a variant's sessions, as a server does: the
    per-thread kernel-plan caches (cuDNN attention and convolution plans) stay warm across
    sessions. Each session's samples are its own slice of the shared profiler."""

    def __init__(self) -> None:
        self.profiler = Profiler()  # CUDA events when CUDA is there
        self.engine = Engine(cost=CostModel(DeviceConstants.h200()), observers=[self.profiler])
        self.sessions = 0

    async def __aenter__(self) -> _Served:
        await self.engine.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.engine.close()

    def samples(self) -> dict[str, tuple[list[float], list[float]]]:
        p = self.profiler
        return {k: (p.wall_samples(k), p.device_samples(k) or p.wall_samples(k)) for k in _KINDS}


async def _run_session(
    served: _Served, instance: WanInstance, chunks: int, prompt: str
) -> dict[str, Any]:
    engine = served.engine
    before = {k: len(w) for k, (w, _) in served.samples().items()}
    served.sessions += 1
    emitted: list[tuple[float, torch.Tensor]] = []  # one per chunk: its parts joined
    first_frame: list[float] = []
    partial: list[torch.Tensor] = []

    def on_emit(emission: Emission) -> None:
        if emission.spec.stream != "media":
            return
        now = time.perf_counter()
        first_frame[:] = first_frame or [now]
        partial.append(emission.output)
        if emission.spec.meta.final:  # a session's first chunk comes in 2 parts
            emitted.append((now, torch.cat(partial)))
            partial.clear()

    _sync()
    start = time.perf_counter()
    # Batch class: no playout deadlines, so the lead limit does not cap the rate we measure.
    handle = engine.spawn(
        instance.loop("chunk_rollout"),
        SessionRequest(prompt=prompt, seed=7, max_chunks=chunks),
        instance,
        loop_id=f"bench-{served.sessions}",
        priority=Priority.BATCH,
        on_emit=on_emit,
    )
    await handle.result()
    after = served.samples()
    stamps = [start] + [t for t, _ in emitted]
    chunk_wall = [b - a for a, b in zip(stamps, stamps[1:])]
    return {
        "chunk_wall_s": chunk_wall,
        "first_frame_s": first_frame[0] - start,
        "frames": [f for _, f in emitted],
        "wall": {k: w[before[k] :] for k, (w, _) in after.items()},
        "device": {k: d[before[k] :] for k, (_, d) in after.items()},
    }


async def _variant(
    instance: WanInstance,
    warmup_chunks: int,
    chunks: int,
    variant: str,
    trace: bool,
    trace_dir: str,
) -> tuple[dict[str, Any], dict[str, Any]]:
    """Warm-up, first-frame probe and measured session of one variant on one engine."""
    async with _Served() as served:
        # warm-up through steady state: kernel selection and compilation of every graph
        await _run_session(served, instance, warmup_chunks, "warm-up: grass and a red ball")
        if torch.cuda.is_available():
            torch.cuda.reset_peak_memory_stats()
        # time to first frame: a fresh session with a prompt never seen (its text encode runs)
        with _maybe_trace(trace, trace_dir, variant):
            probe = await _run_session(served, instance, 1, f"first-frame probe: {variant}")
        run = await _run_session(served, instance, chunks, "a red ball rolling on green grass")
    return probe, run


_FULL, _PREFIX = ChunkKVCache.full, ChunkKVCache.prefix_frames


def _prepare(variant: str, instance: WanInstance) -> dict[str, Any]:
    base, *options = variant.split("+")
    unknown = {
        o
        for o in options
        if o not in ("cudnn", "flash", "fp8", "fp8t", "overlap", "convbench", "fold")
    }
    if base not in ("baseline", "nomask", "compiled") or unknown:
        raise SystemExit(f"gpu_session: unknown variant {variant!r}")
    # The baseline masks attention over every cache slot, as the first implementation did.
    masked = base == "baseline"
    ChunkKVCache.full = property(lambda self: False) if masked else _FULL
    ChunkKVCache.prefix_frames = property(lambda self: None) if masked else _PREFIX
    if "fold" in options:  # the card's recipe says otherwise: a measured deviation
        spec = dataclasses.replace(instance.card.loops["chunk_rollout"], kv_update="last_step")
        instance.card = dataclasses.replace(
            instance.card, loops={**instance.card.loops, "chunk_rollout": spec}
        )
    if base == "compiled":
        attention = next((o for o in options if o in ("cudnn", "flash")), "auto")
        if "convbench" in options:
            torch.backends.cudnn.benchmark = True
        fp8 = "row" if "fp8" in options else "tensor" if "fp8t" in options else None
        instance.compile(attention=attention, fp8=fp8, overlap_decode="overlap" in options)
    return {
        "fp8_linears": sum(isinstance(m, Fp8Linear) for m in instance.dit.modules()),
        "scaled_mm": scaled_mm_supported(instance.device),
        "sdpa_backends": [b.name for b in instance.dit.blocks[0].self_attn.backends or ()],
        "overlap_decode": instance.decode_op.overlap,
        "cudnn_benchmark": torch.backends.cudnn.benchmark,
    }


@contextlib.contextmanager
def _maybe_trace(enabled: bool, out_dir: str, variant: str) -> Iterator[None]:
    """torch.profiler around the block; writes the op table (by self CPU and by CUDA time)."""
    if not enabled:
        yield
        return
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        yield
    name = variant.replace("+", "_")
    averages = prof.key_averages()
    with open(f"{out_dir}/trace_{name}.txt", "w") as f:
        f.write(averages.table(sort_by="self_cpu_time_total", row_limit=40))
        f.write("\n")
        f.write(averages.table(sort_by="cuda_time_total", row_limit=40))
    prof.export_chrome_trace(f"{out_dir}/trace_{name}.json")


def _parity(frames: list[torch.Tensor], reference: list[torch.Tensor]) -> dict[str, float]:
    diffs = [(a.float() - b.float()).abs() for a, b in zip(frames, reference, strict=True)]
    return {
        "mean_abs_uint8": float(torch.cat([d.flatten() for d in diffs]).mean()),
        "max_abs_uint8": float(max(d.max() for d in diffs)),
    }


def _write_json(
    args: argparse.Namespace,
    step_flops: float,
    device_name: str,
    results: dict[str, dict[str, Any]],
) -> None:
    if args.json:
        with open(args.json, "w") as f:
            json.dump(
                {
                    "window": args.window,
                    "chunks": args.chunks,
                    "step_flops": step_flops,
                    "device": device_name,
                    "torch": torch.__version__,
                    "results": results,
                },
                f,
                indent=2,
            )


def _row(name: str, r: dict[str, Any], base: dict[str, Any] | None) -> str:
    ratio = r["fps"] / base["fps"] if base else float("nan")
    par = r["parity_vs_baseline"]
    par_s = "ref" if par is None else f"{par['mean_abs_uint8']:.2f}/{par['max_abs_uint8']:.0f}"
    return (
        f"| {name} | {r['fps']:.1f} | {ratio:.2f} | {r['first_frame_s']:.2f} | "
        f"{r['step_ms_median']:.1f} ({r['step_ms_p95']:.1f}) | {r['chunk_ms_median']:.0f} "
        f"({r['chunk_ms_p95']:.0f}) | {r['kv_update_ms_median']:.0f} | "
        f"{r['decode_ms_median']:.0f} | {r['mfu']:.0%} | {r['peak_gib']:.1f} | "
        f"{r['engine_overhead_ms_median']:.1f} | {par_s} |"
    )


def _print_tables(results: dict[str, dict[str, Any]]) -> None:
    base = results.get("baseline")
    print(
        "| variant | FPS incl. decode | x baseline | first frame s | step ms (p95) | "
        "chunk ms (p95) | KV update ms | decode ms | DiT MFU | peak GiB | engine overhead ms | "
        "parity (mean/max) |"
    )
    print("| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |")
    for name, r in results.items():
        print(_row(name, r, base))
    print(
        "\nfirst chunk of a fresh session (device ms): text encode | 4 steps | KV update | decode"
    )
    for name, r in results.items():
        first = r["first_chunk_device_ms"]
        print(
            f"| {name} | {sum(first['text_encode']):.0f} | "
            f"{' + '.join(f'{x:.0f}' for x in first['chunk_step'])} | "
            f"{sum(first['kv_update']):.0f} | {sum(first['vae_decode']):.0f} |"
        )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--chunks", type=int, default=10)
    parser.add_argument(
        "--window",
        type=int,
        default=12,
        help="latent frames each chunk step attends to (sinks + window)",
    )
    parser.add_argument("--variants", default=",".join(VARIANTS))
    parser.add_argument("--peak-tflops", type=float, default=790.0)
    parser.add_argument("--json", default=None)
    parser.add_argument(
        "--trace", default="", help="variants whose first-frame session runs under torch.profiler"
    )
    parser.add_argument("--trace-dir", default=".", help="where traces and op tables go")
    parser.add_argument("--model", default="wan2.1-1.3b-causal")
    parser.add_argument(
        "--device",
        default="cuda",
        choices=["cuda", "cpu"],
        help="cpu: a dry run of the script on a small card",
    )
    args = parser.parse_args(argv)
    if args.device == "cuda" and not torch.cuda.is_available():
        print("gpu_session: CUDA is not available (--device cpu for a dry run)", file=sys.stderr)
        return 2
    cuda = args.device == "cuda"
    variants = args.variants.split(",")
    # Each variant adds graphs (per K/V prefix length, per kernel choice) to the blocks' one
    # code object; keep them all rather than fall back to eager.
    torch._dynamo.config.cache_size_limit = 64
    torch._dynamo.config.accumulated_cache_size_limit = 512
    card = _with_window(get(args.model), args.window)

    def fresh_instance() -> WanInstance:
        # the same seeded random weights every time: each variant starts from eager bf16
        return load_instance(
            card, device=args.device, precision="bf16" if cuda else "fp32", random_weights=True
        )

    instance = fresh_instance()
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
    previous: list[torch.Tensor] | None = None
    # Chunks before the K/V cache is full attend with a mask (other kernels, other graphs):
    # steady state starts one chunk after it fills.
    sink, ring = instance.kv_geometry(c)
    first_steady = -(-(sink + ring) // c) + 1
    if args.chunks <= first_steady:
        parser.error(f"--chunks must exceed {first_steady} to reach steady state")
    for index, variant in enumerate(variants):
        if index:
            del instance
            torch._dynamo.reset()
            if cuda:
                torch.cuda.empty_cache()
            instance = fresh_instance()
        setup = _prepare(variant, instance)
        print(f"{variant}: {setup}", flush=True)
        probe, run = asyncio.run(
            _variant(
                instance,
                first_steady + 1,
                args.chunks,
                variant,
                variant in args.trace.split(","),
                args.trace_dir,
            )
        )
        steady = run["chunk_wall_s"][first_steady:]
        frames = [f.shape[0] for f in run["frames"]][first_steady:]
        step_dev = run["device"]["chunk_step"][-profile.steps * len(steady) :]
        device_per_chunk = [sum(x) for x in zip(*[iter(step_dev)] * profile.steps)]
        # no KV-update plans with +fold: the last step writes the cache
        kv = run["device"]["kv_update"][-len(steady) :] or [0.0] * len(steady)
        dec = run["device"]["vae_decode"][-len(steady) :]
        busy = [a + b + c for a, b, c in zip(device_per_chunk, kv, dec)]
        overhead = [w - b for w, b in zip(steady, busy)]
        parity = None if reference is None else _parity(run["frames"], reference)
        parity_prev = None if previous is None else _parity(run["frames"], previous)
        reference = run["frames"] if reference is None else reference
        previous = run["frames"]
        step_med = statistics.median(step_dev)
        results[variant] = {
            "fps": sum(frames) / sum(steady),
            "first_frame_s": probe["first_frame_s"],
            "first_chunk_s": probe["chunk_wall_s"][0],
            "first_chunk_device_ms": {k: [x * 1e3 for x in v] for k, v in probe["device"].items()},
            "step_ms_median": step_med * 1e3,
            "step_ms_p95": _percentile(step_dev, 0.95) * 1e3,
            "chunk_ms_median": statistics.median(steady) * 1e3,
            "chunk_ms_p95": _percentile(steady, 0.95) * 1e3,
            "decode_ms_median": statistics.median(dec) * 1e3,
            "kv_update_ms_median": statistics.median(kv) * 1e3,
            "mfu": step_flops / step_med / (args.peak_tflops * 1e12),
            "peak_gib": torch.cuda.max_memory_allocated() / 2**30 if cuda else float("nan"),
            "engine_overhead_ms_median": statistics.median(overhead) * 1e3,
            "setup": setup,
            "parity_vs_baseline": parity,
            "parity_vs_previous_variant": parity_prev,
            "raw": {k: v for k, v in run.items() if k != "frames"},
        }
        _write_json(args, step_flops, device_name, results)  # what is done survives a timeout
        print(f"{variant}: {_row(variant, results[variant], results.get('baseline'))}", flush=True)
    _write_json(args, step_flops, device_name, results)
    print(
        f"\n{args.model}, {profile.width}x{profile.height}, {profile.steps} steps, chunks of "
        f"{c} latent frames, window {args.window} (incl. sinks), {device_name}, "
        f"torch {torch.__version__}; DiT step = {step_flops / 1e12:.1f} TFLOP"
    )
    _print_tables(results)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
