"""The tiny streaming decoder (TAEHV architecture, ``taew2_1`` layout) against the full Wan2.1
VAE decoder: one steady-state chunk, eager and compiled, side by side in one process.

A chunk is 3 latent frames at 832x480 -> 12 frames, decoded through the session's decoder cache
as ``DecodeOp`` does on the device (DiT latents -> the codec's scale -> decode -> uint8 RGB);
the host copy is left out (with overlap it runs on the side stream). Variants:

- ``wan_eager`` / ``taehv_eager``: the module as the loop runs it without ``--compile``.
- ``wan_compiled``: what ``WanInstance.compile()`` does to the VAE (3D conv weights
  channels-last, ``torch.compile`` of the decoder).
- ``taehv_compiled``: ``torch.compile`` of the TAEHV network (what ``WanInstance.compile()``
  does to it); ``taehv_compiled_cl``: with its 2D conv weights channels-last as well.

Random weights (speed does not depend on them), the serving precision (bf16 on CUDA, fp32 on
CPU). Timed with CUDA events on CUDA (``time.perf_counter`` on CPU): median of ``--iters`` after
warm-up; ms per chunk, frames/s, and the analytic FLOPs of the chunk (``decode_flops``). Prints
one table last and writes ``--json``.

    python -m infra.bench.tiny_decoder [--device cuda] [--iters 20] [--variants ...] [--json F]
    python -m infra.bench.tiny_decoder --device cpu --tiny --iters 2   # CPU smoke (tiny presets)
"""

from __future__ import annotations

import argparse
import functools
import json
import statistics
import sys
import time
from collections.abc import Callable

import torch

from models.wan.taehv.config import TAEHVConfig
from models.wan.taehv.decoder import TAEHVDecoder
from models.wan.vae.autoencoder import WanVAE, video_to_uint8
from models.wan.vae.cache import DecoderCache
from models.wan.vae.config import WanVAEConfig

VARIANTS = ("wan_eager", "wan_compiled", "taehv_eager", "taehv_compiled", "taehv_compiled_cl")
CHUNK_LATENT_FRAMES = 3


Codec = WanVAE | TAEHVDecoder


def _build(variant: str, tiny: bool, device: torch.device, dtype: torch.dtype) -> Codec:
    decoder, mode = variant.split("_", 1)
    torch.manual_seed(0)
    codec: Codec
    with device:
        if decoder == "wan":
            codec = WanVAE(WanVAEConfig.preset("tiny" if tiny else "wan2.1"))
        else:
            codec = TAEHVDecoder(TAEHVConfig.preset("tiny" if tiny else "taew2_1"))
    codec = codec.to(dtype).eval()
    conv, layout = (
        (torch.nn.Conv3d, torch.channels_last_3d)
        if decoder == "wan"
        else (torch.nn.Conv2d, torch.channels_last)
    )
    if mode == "compiled_cl" or (decoder == "wan" and mode == "compiled"):
        for module in codec.modules():
            if isinstance(module, conv):
                module.weight.data = module.weight.data.contiguous(memory_format=layout)
    if mode.startswith("compiled"):
        codec.decoder.compile()
    return codec


def _decode_fn(codec: Codec) -> Callable[[torch.Tensor, DecoderCache], torch.Tensor]:
    def decode(z: torch.Tensor, cache: DecoderCache) -> torch.Tensor:
        # what DecodeOp runs on the device: DiT latents -> uint8 [n, H, W, 3]
        return video_to_uint8(codec.decode_chunk(codec.denormalize(z), cache)[0])

    return decode


def _time(fn: Callable[[], object], device: torch.device) -> float:
    if device.type != "cuda":
        t0 = time.perf_counter()
        fn()
        return (time.perf_counter() - t0) * 1e3
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    fn()
    end.record()
    end.synchronize()
    return start.elapsed_time(end)


def measure(
    variant: str,
    *,
    tiny: bool,
    device: torch.device,
    iters: int,
    width: int,
    height: int,
    warmup: int = 4,
) -> dict[str, float]:
    """One variant: build, stream ``warmup`` chunks, time ``iters`` chunks (steady state)."""
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    t0 = time.perf_counter()
    codec = _build(variant, tiny, device, dtype)
    lh, lw = height // 8, width // 8
    g = torch.Generator(device="cpu").manual_seed(1)
    chunks = [
        torch.randn(1, 16, CHUNK_LATENT_FRAMES, lh, lw, generator=g).to(device, dtype)
        for _ in range(max(1, warmup))
    ]
    decode = _decode_fn(codec)
    times: list[float] = []
    with torch.inference_mode():
        cache = codec.new_decoder_cache(1, lh, lw)
        # Mid-stream from the start: the stream's first chunk (the Wan decoder's own graph) is
        # not what is measured, so it is neither decoded nor compiled (zeros as history do not
        # change the work).
        cache.frames_seen = 1
        frames = [decode(z, cache) for z in chunks]  # steady state: warm-up and compilation
        if device.type == "cuda":
            torch.cuda.synchronize()
        warm_s = time.perf_counter() - t0
        for i in range(iters):
            chunk = chunks[i % len(chunks)]
            times.append(_time(functools.partial(decode, chunk, cache), device))
    median = statistics.median(times)
    n = frames[-1].shape[0]
    flops = codec.decode_flops(CHUNK_LATENT_FRAMES, lh, lw)
    return {
        "median_ms": median,
        "min_ms": min(times),
        "frames_per_chunk": n,
        "frames_per_s": n / (median / 1e3),
        "gflop_per_chunk": flops / 1e9,
        "tflop_per_s": flops / (median / 1e3) / 1e12,
        "warmup_s": warm_s,
        "params_m": sum(p.numel() for p in codec.parameters()) / 1e6,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cuda", choices=["cuda", "cpu"])
    parser.add_argument("--iters", type=int, default=20)
    parser.add_argument("--warmup", type=int, default=4, help="chunks before timing (compiles)")
    parser.add_argument("--variants", default=None, help=f"comma list of {','.join(VARIANTS)}")
    parser.add_argument("--width", type=int, default=None, help="default 832 (--tiny: 64)")
    parser.add_argument("--height", type=int, default=None, help="default 480 (--tiny: 64)")
    parser.add_argument("--tiny", action="store_true", help="tiny presets (CPU smoke)")
    parser.add_argument("--json", default=None)
    args = parser.parse_args(argv)
    if args.device == "cuda" and not torch.cuda.is_available():
        print("tiny_decoder: CUDA is not available (use --device cpu --tiny)", file=sys.stderr)
        return 2
    variants = (args.variants or ",".join(VARIANTS)).split(",")
    unknown = sorted(set(variants) - set(VARIANTS))
    if unknown:
        print(f"tiny_decoder: unknown variants {unknown}; known {list(VARIANTS)}", file=sys.stderr)
        return 2
    width = args.width or (64 if args.tiny else 832)
    height = args.height or (64 if args.tiny else 480)
    device = torch.device(args.device)
    started = time.perf_counter()
    name = torch.cuda.get_device_name() if device.type == "cuda" else "cpu"
    results: dict[str, dict[str, float]] = {}
    report = {
        "device": name,
        "torch": torch.__version__,
        "size": [width, height],
        "tiny": args.tiny,
        "chunk_latent_frames": CHUNK_LATENT_FRAMES,
        "iters": args.iters,
        "results": results,
    }
    for variant in variants:
        results[variant] = r = measure(
            variant,
            tiny=args.tiny,
            device=device,
            iters=args.iters,
            width=width,
            height=height,
            warmup=args.warmup,
        )
        # a row and the JSON as each variant ends: a run cut short keeps what it measured
        print(
            f"{variant}: {r['median_ms']:.2f} ms/chunk, warm-up {r['warmup_s']:.1f} s", flush=True
        )
        report["wall_s"] = time.perf_counter() - started
        if args.json:
            with open(args.json, "w") as f:
                json.dump(report, f, indent=2)
        if device.type == "cuda":
            torch.cuda.empty_cache()
    print(
        f"\nStreaming decode of one chunk ({CHUNK_LATENT_FRAMES} latent frames -> "
        f"{next(iter(results.values()))['frames_per_chunk']} frames) at {width}x{height}"
        f"{' (tiny presets)' if args.tiny else ''}, {name}, torch {torch.__version__}"
    )
    columns = ("variant", "ms / chunk", "min ms", "frames/s", "x wan_eager", "GFLOP / chunk")
    print("| " + " | ".join((*columns, "TFLOP/s", "warm-up s")) + " |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- |")
    base = results.get("wan_eager", {}).get("median_ms")
    for variant, r in results.items():
        ratio = f"{base / r['median_ms']:.1f}" if base else "-"
        print(
            f"| {variant} | {r['median_ms']:.2f} | {r['min_ms']:.2f} | {r['frames_per_s']:.0f} | "
            f"{ratio} | {r['gflop_per_chunk']:.0f} | {r['tflop_per_s']:.2f} | {r['warmup_s']:.1f} |"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
