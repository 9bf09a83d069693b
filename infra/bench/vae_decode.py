"""Streaming VAE decode of the Wan2.1 VAE, one steady-state chunk, several execution variants.

A chunk is 3 latent frames at 832x480 (12 video frames) decoded with the session's causal
decoder cache, as ``chunk_rollout`` does. Variants, side by side in one process:

- ``eager``: what the loop runs today (bf16, NCDHW).
- ``channels_last``: weights and activations in channels-last-3d (NDHWC), the layout cuDNN's
  3D convolutions prefer on Hopper.
- ``compiled``: ``torch.compile`` of the decoder (fuses the norms, SiLU and residual adds
  around the convolutions).
- ``compiled_cl``: both (what ``WanInstance.compile`` serves).
- ``compiled_cl_bench``: both, with ``torch.backends.cudnn.benchmark`` (cuDNN times its
  convolution algorithms at the steady shape once, then keeps the fastest).

``--profile VARIANT`` runs three steady decodes of that variant under ``torch.profiler`` and
reports where the device time goes: the top kernels, and the share of convolutions, of
copies/concatenations (the causal cache's padding) and of the rest.

Each is checked against ``eager`` on the same latents (max |diff| of the [-1, 1] output) and
timed with CUDA events (median of ``--iters`` after warm-up). Prints one table last.

    python -m infra.bench.vae_decode [--iters 10] [--variants eager,channels_last,...] [--json F]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from collections.abc import Callable, Sequence
from typing import NotRequired, TypedDict

import torch

from models.wan.vae.autoencoder import WanVAE
from models.wan.vae.cache import CausalCache
from models.wan.vae.config import WanVAEConfig

VARIANTS = ("eager", "channels_last", "compiled", "compiled_cl", "compiled_cl_bench")
_CL = ("channels_last", "compiled_cl", "compiled_cl_bench")

DecodeFn = Callable[[torch.Tensor, CausalCache], torch.Tensor]


class _Profile(TypedDict):
    total_ms: float
    shares: dict[str, float]  # device time by kernel category, fractions of total_ms
    top: list[tuple[str, float]]  # (kernel, ms), the slowest first


class _VariantResult(TypedDict):
    median_ms: float
    min_ms: float
    max_abs_err_vs_eager: float
    profile: NotRequired[_Profile]


def _decode_fn(vae: WanVAE, variant: str) -> DecodeFn:
    decoder: DecodeFn = vae.decoder
    torch.backends.cudnn.benchmark = variant.endswith("_bench")
    if variant in _CL:
        for module in vae.modules():
            if isinstance(module, torch.nn.Conv3d):
                module.weight.data = module.weight.data.contiguous(
                    memory_format=torch.channels_last_3d
                )
    if variant.startswith("compiled"):
        decoder = torch.compile(vae.decoder)

    def decode(z: torch.Tensor, cache: CausalCache) -> torch.Tensor:
        x = vae.post_quant_conv(z)
        if variant in _CL:
            x = x.contiguous(memory_format=torch.channels_last_3d)
        return decoder(x, cache).clamp(-1.0, 1.0)

    return decode


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--iters", type=int, default=10)
    parser.add_argument("--variants", default=",".join(VARIANTS))
    parser.add_argument("--width", type=int, default=832)
    parser.add_argument("--height", type=int, default=480)
    parser.add_argument("--json", default=None)
    parser.add_argument("--profile", default="", help="a variant to profile (kernel breakdown)")
    args = parser.parse_args(argv)
    if not torch.cuda.is_available():
        print("vae_decode needs CUDA", file=sys.stderr)
        return 2
    torch.manual_seed(0)
    lh, lw = args.height // 8, args.width // 8
    with torch.device("cuda"):
        base = WanVAE(WanVAEConfig.preset("wan2.1")).to(torch.bfloat16).eval()
    state = base.state_dict()
    z_first = torch.randn(1, 16, 3, lh, lw, device="cuda", dtype=torch.bfloat16)
    chunks = [torch.randn(1, 16, 3, lh, lw, device="cuda", dtype=torch.bfloat16) for _ in range(4)]
    results: dict[str, _VariantResult] = {}
    reference: torch.Tensor | None = None
    for variant in args.variants.split(","):
        with torch.device("cuda"):
            vae = WanVAE(WanVAEConfig.preset("wan2.1")).to(torch.bfloat16).eval()
        vae.load_state_dict(state)
        decode = _decode_fn(vae, variant)
        times: list[float] = []
        with torch.inference_mode():
            cache = vae.new_decoder_cache(1, lh, lw)
            decode(z_first, cache)  # the stream's first chunk
            outputs = [decode(z, cache) for z in chunks]  # steady state, also warm-up/compile
            if reference is None:
                reference = torch.cat(outputs, dim=2).float()
            err = (torch.cat(outputs, dim=2).float() - reference).abs().max().item()
            for i in range(args.iters):
                start, end = (
                    torch.cuda.Event(enable_timing=True),
                    torch.cuda.Event(enable_timing=True),
                )
                start.record()
                decode(chunks[i % len(chunks)], cache)
                end.record()
                end.synchronize()
                times.append(start.elapsed_time(end))
            breakdown = _profile(decode, chunks, cache) if variant == args.profile else None
        results[variant] = {
            "median_ms": statistics.median(times),
            "min_ms": min(times),
            "max_abs_err_vs_eager": err,
        }
        if breakdown is not None:
            results[variant]["profile"] = breakdown
        del vae, decode
        torch.cuda.empty_cache()
    if args.json:
        with open(args.json, "w") as f:
            json.dump(
                {
                    "device": torch.cuda.get_device_name(),
                    "torch": torch.__version__,
                    "size": [args.width, args.height],
                    "results": results,
                },
                f,
                indent=2,
            )
    print(
        f"\nWan2.1 VAE streaming decode, 3 latent frames -> 12 frames at {args.width}x"
        f"{args.height}, bf16, {torch.cuda.get_device_name()}, torch {torch.__version__}"
    )
    print("| variant | median ms | min ms | x eager | max abs err vs eager |")
    print("| --- | --- | --- | --- | --- |")
    eager = results["eager"]["median_ms"] if "eager" in results else None
    for name, r in results.items():
        ratio = eager / r["median_ms"] if eager else float("nan")
        print(
            f"| {name} | {r['median_ms']:.1f} | {r['min_ms']:.1f} | {ratio:.2f} | "
            f"{r['max_abs_err_vs_eager']:.4f} |"
        )
    for name, r in results.items():
        if (p := r.get("profile")) is not None:
            print(f"\nwhere {name}'s device time goes (3 decodes, {p['total_ms']:.1f} ms):")
            print(", ".join(f"{k} {v:.0%}" for k, v in p["shares"].items()))
            for kernel, ms in p["top"][:8]:
                print(f"  {ms:8.2f} ms  {kernel[:100]}")
    return 0


def _profile(decode: DecodeFn, chunks: Sequence[torch.Tensor], cache: CausalCache) -> _Profile:
    """Device time of three steady decodes by kernel: top kernels and category shares."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for z in chunks[:3]:
            decode(z, cache)
        torch.cuda.synchronize()
    kernels: dict[str, float] = {}
    for event in prof.events():
        if event.device_type.name == "CUDA":
            kernels[event.name] = kernels.get(event.name, 0.0) + event.device_time / 1000.0
    total = sum(kernels.values()) or 1.0

    def category(name: str) -> str:
        low = name.lower()
        if any(t in low for t in ("conv", "xmma", "cudnn", "implicit", "sm90", "gemm", "cutlass")):
            return "convolution"
        if any(t in low for t in ("copy", "cat", "memcpy", "memset")):
            return "copy/cat"
        return "other (norms, activations, upsampling)"

    shares: dict[str, float] = {}
    for name, ms in kernels.items():
        shares[category(name)] = shares.get(category(name), 0.0) + ms / total
    top = sorted(kernels.items(), key=lambda kv: -kv[1])[:15]
    return {"total_ms": total, "shares": shares, "top": top}


if __name__ == "__main__":
    raise SystemExit(main())
