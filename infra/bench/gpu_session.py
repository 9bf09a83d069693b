"""One realtime session of the Wan2.1-1.3B causal card through the engine, on one GPU.

The whole serving path below the network: ``Engine`` (scheduler + executor thread + profiler)
drives ``chunk_rollout`` (text encode, 4 denoise steps, KV update, VAE decode to uint8 RGB
frames on the host, ready for the encoder) at 832x480, chunks of 3 latent frames, KV window
9 + 3 sink (``--window 21`` for the 21-frame variant), random bf16 weights. Every session runs
on slab 0 of the instance's preallocated K/V buffer, as a server's sessions do.

Variants, measured side by side in one process (``--variants``, comma-separated), each on a
fresh instance with the same seeded random weights:

- ``baseline``: eager PyTorch, attention always masked over the whole cache (the first
  implementation).
- ``nomask``: eager; attention reads only the filled prefix of the K/V cache, unmasked. Options
  on ``nomask`` apply the levers without ``torch.compile`` (``WanInstance.configure``: CPU dry
  runs, or to see a lever without compilation).
- ``compiled``: ``nomask`` plus ``WanInstance.compile()``: ``torch.compile`` of every DiT block
  (one graph for all 30) and of the VAE decoder (3D conv weights channels-last).
- options joined with ``+``: attention ``+cudnn`` / ``+flash`` (SDPA kernel preference),
  ``+sage`` (sageattention: INT8 Q K^T, FP16 P V), ``+fp8attn`` / ``+fp8qk`` (our Triton e4m3
  attention, P V in FP8 / in bf16), ``+fa3`` / ``+fa3fp8`` (FlashAttention-3's Hopper forward
  from ``fa3-fwd``, bf16 / e4m3), ``+cudnnfp8`` (cuDNN's FP8 attention through
  ``nvidia-cudnn-frontend``) - at most one; ``+overlap`` (the VAE decode on a second
  CUDA stream); ``+graphs`` (CUDA graphs of the steady-state chunk forwards); ``+convbench``
  (``torch.backends.cudnn.benchmark``; stays on for later variants); ``+fp8`` / ``+fp8t`` (FP8
  linears, row-wise / per-tensor scales); ``+kvfp8`` (the chunk-K/V cache in e4m3, read by
  FA3's FP8 kernel: ``models/wan/kv/fp8.py``); ``+fold`` (the K/V update in the last denoising
  step: one forward less per chunk, not what the recipe trained); ``+taehv`` (the VAE decoder
  swapped for the component ``--tiny-decoder MODULE:FACTORY`` names, called as
  ``FACTORY(instance, weights=--tiny-decoder-weights)`` and returning a VAE-like codec; for a
  tiny streaming decoder built elsewhere).

A variant that fails (an option that cannot run here, a kernel error) gets its error string in
the table and the JSON; the others still run. The JSON is rewritten after every variant.

For each: steady-state FPS including decode, time to first frame, per-step and per-chunk
latency (median, p95), DiT MFU (``dit_flops`` / measured step time / ``--peak-tflops``),
peak memory, engine overhead (chunk wall time minus the device time of its plans), and frame
parity (``gpu_session_report``): vs the eager baseline, vs ``--reference`` (what lossy levers
are judged against), and for ``+graphs`` whether the frames equal the same variant without
graphs bit for bit. Time to first frame comes from a one-chunk session with a prompt never seen
before (its text encode runs; kernels are warm). Before the sessions, ``--micro`` times the
attention backends alone on the step's shape with their error vs bf16 SDPA
(``attention_bench``). Prints the tables last.

    python -m infra.bench.gpu_session [--chunks 10] [--window 12] \
        [--variants baseline,compiled+overlap,compiled+overlap+graphs] [--json F]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
import importlib
import sys
import time
import traceback
from collections.abc import Iterator
from typing import Any, TypedDict

import torch

from infra.bench import attention_bench
from infra.bench.gpu_session_report import (
    parity,
    print_tables,
    row,
    summarize,
    without_option,
    write_json,
)
from models.instance import WanInstance, load_instance
from models.loops.ops import DecodeOp
from models.loops.requests import SessionRequest
from models.registry import get
from models.wan.dit.cuda_graphs import ChunkGraphs
from models.wan.dit.flops import dit_flops
from models.wan.kernels.fp8_linear import Fp8Linear, scaled_mm_supported
from models.wan.kv.cache import ChunkKVCache
from runtime.contract import Emission, Priority
from runtime.cost import CostModel, DeviceConstants
from runtime.engine import Engine
from runtime.observers import Profiler

VARIANTS = ("baseline", "compiled+overlap", "compiled+overlap+graphs", "compiled+overlap+fp8attn")
_KINDS = ("text_encode", "chunk_step", "kv_update", "vae_decode")
# option -> attention backend (models.wan.kernels.attention); at most one per variant
_ATTENTION = {
    "cudnn": "cudnn",
    "flash": "flash",
    "sage": "sage",
    "fp8attn": "fp8-triton",
    "fp8qk": "fp8qk-triton",
    "fa3": "fa3",
    "fa3fp8": "fa3-fp8",
    "cudnnfp8": "cudnn-fp8",
}
_OPTIONS = {
    *_ATTENTION,
    *("fp8", "fp8t", "kvfp8", "overlap", "convbench", "fold", "graphs", "taehv"),
}


class VariantError(ValueError):
    """A variant this bench cannot set up (unknown option, a missing --tiny-decoder, ...)."""


def _with_window(card: Any, window: int) -> Any:
    caches = dict(card.caches)
    caches["chunk_kv"] = dataclasses.replace(
        caches["chunk_kv"], window_latent_frames=window - caches["chunk_kv"].sink_latent_frames
    )
    return dataclasses.replace(card, caches=caches)


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
        SessionRequest(prompt=prompt, seed=7, max_chunks=chunks, kv_slab=0),
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
        runner = instance.dit.chunk_graphs
        graphs = runner if isinstance(runner, ChunkGraphs) else None
        before = dict(graphs.stats) if graphs is not None else {}
        run = await _run_session(served, instance, chunks, "a red ball rolling on green grass")
    if graphs is not None:  # the measured session should only replay what warm-up captured
        run["graph_stats"] = {
            "after_warmup": before,
            "measured": {k: v - before[k] for k, v in graphs.stats.items()},
            "graphs": graphs.num_graphs,
            "disabled": graphs.disabled,
        }
    return probe, run


# The cache's own properties, and the baseline's: every slot masked, as the first
# implementation attended (set on the class for the variant's run).
_LIVE_SLOTS = {name: vars(ChunkKVCache)[name] for name in ("full", "prefix_frames")}
_MASKED_SLOTS = {"full": property(lambda self: False), "prefix_frames": property(lambda self: None)}


class _Levers(TypedDict):
    """The keyword arguments of ``WanInstance.compile`` / ``configure`` a variant sets."""

    attention: str
    fp8: str | None
    overlap_decode: bool
    cuda_graphs: bool
    kv_update: str | None
    kv_cache: str | None


def _prepare(variant: str, instance: WanInstance, args: argparse.Namespace) -> dict[str, Any]:
    """Apply a variant's levers to a fresh instance -> what is in force (``VariantError`` for
    one that cannot be set up)."""
    base, *options = variant.split("+")
    unknown = set(options) - _OPTIONS
    if base not in ("baseline", "nomask", "compiled") or unknown:
        raise VariantError(f"unknown variant {variant!r} (options: {sorted(_OPTIONS)})")
    attention = [_ATTENTION[o] for o in options if o in _ATTENTION]
    if len(attention) > 1:
        raise VariantError(f"{variant!r} names {len(attention)} attention backends")
    if base == "baseline" and options:
        raise VariantError("baseline takes no options (it is the eager, masked reference)")
    # The baseline masks attention over every cache slot, as the first implementation did.
    masked = base == "baseline"
    for name, slots in (_MASKED_SLOTS if masked else _LIVE_SLOTS).items():
        setattr(ChunkKVCache, name, slots)
    if "convbench" in options:
        torch.backends.cudnn.benchmark = True
    levers: _Levers = {
        "attention": attention[0] if attention else "auto",
        "fp8": "row" if "fp8" in options else "tensor" if "fp8t" in options else None,
        "overlap_decode": "overlap" in options,
        "cuda_graphs": "graphs" in options,
        "kv_update": "last_step" if "fold" in options else None,
        "kv_cache": "fp8" if "kvfp8" in options else None,
    }
    if base == "compiled":
        instance.compile(**levers)
    elif options:
        instance.configure(**levers)
    if "taehv" in options:
        _swap_decoder(instance, args)
    return {
        **instance.levers,
        "fp8_linears": sum(isinstance(m, Fp8Linear) for m in instance.dit.modules()),
        "scaled_mm": scaled_mm_supported(instance.device),
        "overlap_decode": instance.decode_op.overlap,
        "cudnn_benchmark": torch.backends.cudnn.benchmark,
    }


def _swap_decoder(instance: WanInstance, args: argparse.Namespace) -> None:
    """``+taehv``: the card's VAE replaced by ``--tiny-decoder MODULE:FACTORY``'s codec (it must
    offer what ``DecodeOp`` and the loop use: ``denormalize``, ``decode_chunk``,
    ``new_decoder_cache``, ``decoder_cache_bytes``); the decode overlap setting is kept."""
    if not args.tiny_decoder:
        raise VariantError("+taehv needs --tiny-decoder MODULE:FACTORY")
    module_name, _, factory_name = args.tiny_decoder.partition(":")
    try:
        factory = getattr(importlib.import_module(module_name), factory_name or "build_decoder")
    except (ImportError, AttributeError) as exc:
        raise VariantError(f"--tiny-decoder {args.tiny_decoder!r}: {exc}") from None
    vae = factory(instance, weights=args.tiny_decoder_weights)
    overlap = instance.decode_op.overlap
    instance.vae = instance.components["vae"] = vae
    instance.decode_op = DecodeOp(vae)
    instance.decode_op.set_overlap(overlap, instance.device)
    instance.levers["decoder"] = args.tiny_decoder


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
    parser.add_argument(
        "--reference",
        default="compiled+overlap",
        help="the variant lossy levers are compared with (parity column 'vs REFERENCE')",
    )
    parser.add_argument(
        "--no-micro", dest="micro", action="store_false", help="skip the attention micro-bench"
    )
    parser.add_argument("--micro-backends", default=attention_bench.DEFAULT_BACKENDS)
    parser.add_argument(
        "--tiny-decoder",
        default=None,
        metavar="MODULE:FACTORY",
        help="+taehv: the decoder component to swap in (FACTORY(instance, weights=...))",
    )
    parser.add_argument("--tiny-decoder-weights", default=None, metavar="PATH")
    parser.add_argument(
        "--budget-s",
        type=float,
        default=None,
        help="start no variant after this many seconds of sessions (the rest: 'skipped')",
    )
    args = parser.parse_args(argv)
    # the micro-bench's shape options (the Wan shape on CUDA, a small one on the CPU)
    args.queries = args.keys = args.heads = None
    args.head_dim, args.key_scale, args.reps = 128, 1.5, 10
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
    header = {
        "window": args.window,
        "chunks": args.chunks,
        "step_flops": step_flops,
        "device": device_name,
        "torch": torch.__version__,
        "command": " ".join(sys.argv),
    }
    if args.micro:
        try:
            header["attention_micro"] = attention_bench.run_micro(
                **attention_bench.micro_shape(args), backends=args.micro_backends.split(",")
            )
            attention_bench.print_micro(header["attention_micro"])
        except Exception as exc:  # recorded; the sessions still run
            header["attention_micro"] = {"error": f"{type(exc).__name__}: {exc}"}
    results: dict[str, dict[str, Any]] = {}
    frames: dict[str, list[torch.Tensor]] = {}
    # Chunks before the K/V cache is full attend with a mask (other kernels, other graphs):
    # steady state starts one chunk after it fills.
    sink, ring = instance.kv_geometry(c)
    first_steady = -(-(sink + ring) // c) + 1
    if args.chunks <= first_steady:
        parser.error(f"--chunks must exceed {first_steady} to reach steady state")
    started = time.perf_counter()
    for index, variant in enumerate(variants):
        if args.budget_s is not None and time.perf_counter() - started > args.budget_s:
            results[variant] = {"skipped": f"--budget-s {args.budget_s:.0f} spent"}
            print(f"{variant}: skipped (budget)", flush=True)
            continue
        try:
            if index:
                del instance
                torch._dynamo.reset()
                if cuda:
                    torch.cuda.empty_cache()
                instance = fresh_instance()
            # levers first: the K/V storage (kvfp8) is fixed once a slab exists
            setup = _prepare(variant, instance, args)
            instance.reserve_kv_slabs(profile, 1)
            print(f"{variant}: {setup}", flush=True)
            warmup = max(first_steady + 1, instance.warmup_chunks(profile))
            trace = variant in args.trace.split(",")
            probe, run = asyncio.run(
                _variant(instance, warmup, args.chunks, variant, trace, args.trace_dir)
            )
            setup["graph_stats"] = run.pop("graph_stats", None)
            result = summarize(
                probe,
                run,
                steps=profile.steps,
                first_steady=first_steady,
                step_flops=step_flops,
                peak_tflops=args.peak_tflops,
                cuda=cuda,
            )
        except Exception as exc:  # recorded in the table and the JSON; the next variant runs
            results[variant] = {
                "error": f"{type(exc).__name__}: {exc}",
                "traceback": traceback.format_exc(limit=8),
            }
            print(f"{variant}: failed: {results[variant]['error']}", flush=True)
            write_json(args.json, header, results)
            continue
        frames[variant] = run["frames"]
        base = "baseline" if "baseline" in frames else next(iter(frames))
        result["setup"] = setup
        result["parity_vs_baseline"] = (
            None if base == variant else parity(run["frames"], frames[base])
        )
        ref = args.reference if args.reference in frames else None
        result["parity_vs_reference"] = (
            None if ref in (None, variant) else parity(run["frames"], frames[ref])
        )
        plain = without_option(variant, "graphs")
        result["graphs_identical"] = (
            parity(run["frames"], frames[plain])["identical"]
            if plain != variant and plain in frames
            else None
        )
        results[variant] = result
        write_json(args.json, header, results)  # what is done survives a timeout
        print(
            f"{variant}: {row(variant, result, results.get('baseline'), args.reference)}",
            flush=True,
        )
    print(
        f"\n{args.model}, {profile.width}x{profile.height}, {profile.steps} steps, chunks of "
        f"{c} latent frames, window {args.window} (incl. sinks), {device_name}, "
        f"torch {torch.__version__}; DiT step = {step_flops / 1e12:.1f} TFLOP"
    )
    print_tables(results, args.reference)
    write_json(args.json, header, results)
    return 0 if all("error" not in r for r in results.values()) else 1


if __name__ == "__main__":
    raise SystemExit(main())
