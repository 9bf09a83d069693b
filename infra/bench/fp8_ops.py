"""``dreamrt bench fp8-ops``: one DiT block's step op by op, bf16 against FP8.

What the FP8 levers buy, where: one ``WanBlock`` of the served DiT preset (``wan2.1-1.3b``:
dim 1536, 12 heads, FFN 8960) at a chunk of each profile (3 latent frames: 4,680 tokens at
832x480, 1,530 at 480x272) over a full K/V cache (3 sink + 6 ring frames) and a 512-token
prompt, random weights, batch 1. Each op is timed alone (CUDA events, median of ``--iters``),
compiled with Inductor as serving compiles the block (``--no-compile``: eager), in every
variant that applies to it:

- linears (``qkv``: the q, k, v projections with their norms; ``out_proj``; ``cross``: the
  cross-attention's q and o projections around its attention to the prompt; ``ffn``):
  ``bf16``; ``fp8-row`` (``models.wan.kernels.fp8_linear.Fp8Linear`` as served, row-wise
  scales, an amax pass over every activation per call); ``fp8-tensor`` (the same, one scale
  per tensor); ``fp8-static`` (one activation scale per linear fixed by a calibration call,
  ``StaticFp8Linear`` below: no amax pass, the quantisation a pointwise cast that Inductor
  fuses into the op before it). The static variant exists only here: it is what a static or
  delayed scaling would cost at best, measured before the product carries it.
- ``attention`` (the self-attention kernel over the cache and the chunk): ``bf16`` (the cache
  in the model's dtype, read by ``--attention``'s kernel: FA3 where installed) and ``fp8-kv``
  (the e4m3 cache with per-head descales, ``models.wan.kv.fp8.cached_attention``: FA3's FP8
  kernel where it runs).
- ``block``: the whole block, bf16 and each FP8 variant (with the FP8 cache).

The output error of each variant against bf16 (relative L2) is printed beside its time.
The last lines say what the FP8 linears gain on a step (30 blocks): the issue's rule is to keep
them only for a gain of 10 % or more. On the CPU (``--device cpu``) the shapes are the tiny
preset's and FP8 products are emulated in float32: a dry run of the script, not a measurement.

    dreamrt bench fp8-ops [--profiles 832x480,480x272] [--iters 20] [--json F]
    python -m infra.bench.fp8_ops ...  (the same)
"""

from __future__ import annotations

import argparse
import copy
import json
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

if __package__ in (None, ""):  # run as a script: make the repository importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import torch
from torch import nn

from infra.bench.attention_bench import time_ms
from models.wan.dit.block import WanBlock
from models.wan.dit.config import PRESETS, WanDiTConfig
from models.wan.kernels.attention import select_backend
from models.wan.kernels.fp8_linear import E4M3_MAX, Fp8Linear, quantize_linears, scaled_mm_supported
from models.wan.kv.fp8 import Fp8Past, quantize_with

__all__ = ["LINEAR_VARIANTS", "StaticFp8Linear", "main", "run"]

LINEAR_VARIANTS = ("bf16", "fp8-row", "fp8-tensor", "fp8-static")
ATTENTION_VARIANTS = ("bf16", "fp8-kv")
SINK_FRAMES, RING_FRAMES, CHUNK_FRAMES, TEXT_TOKENS = 3, 6, 3, 512
BLOCKS_PER_STEP = 30
KEEP_GAIN = 0.10  # FP8 linears stay only if they take this much off a step
HEADROOM = 4.0  # a static scale's room above the calibration call's amax


class StaticFp8Linear(Fp8Linear):
    """``Fp8Linear`` with one activation scale fixed by its first call (amax * HEADROOM /
    448 of that call's input) and tensor-wise GEMM scales: no amax pass afterwards."""

    act_scale: torch.Tensor

    def __init__(self, linear: nn.Linear) -> None:
        super().__init__(linear, per_tensor=True)
        self.register_buffer("act_scale", torch.ones(1, 1, device=linear.weight.device))
        self.calibrated = False

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        rows = x.reshape(-1, self.in_features)
        if not self.calibrated:  # the first call, eager: fixes the scale
            amax = rows.detach().abs().amax().float().clamp_min(1e-12)
            self.act_scale.copy_(amax.reshape(1, 1) * (HEADROOM / E4M3_MAX))
            self.calibrated = True
        x_q = (rows.float() / self.act_scale).clamp(-E4M3_MAX, E4M3_MAX).to(torch.float8_e4m3fn)
        if scaled_mm_supported(x.device):
            y = torch._scaled_mm(
                x_q,
                self.weight_fp8.t(),
                scale_a=self.act_scale,
                scale_b=self.weight_scale,
                out_dtype=x.dtype,
            )
        else:
            y = (x_q.float() * self.act_scale) @ (self.weight_fp8.float() * self.weight_scale).t()
            y = y.to(x.dtype)
        if self.bias is not None:
            y = y + self.bias.to(y.dtype)
        return y.reshape(*x.shape[:-1], self.out_features)


def _fp8_block(block: WanBlock, variant: str) -> WanBlock:
    """A copy of ``block`` with its linears in ``variant`` (``LINEAR_VARIANTS``)."""
    out = copy.deepcopy(block)
    if variant == "bf16":
        return out
    if variant == "fp8-static":
        for name, child in list(out.named_modules()):
            if isinstance(child, nn.Linear):
                parent_name, _, attr = name.rpartition(".")
                parent = out.get_submodule(parent_name) if parent_name else out
                setattr(parent, attr, StaticFp8Linear(child))
        return out
    quantize_linears(out, lambda name: True, per_tensor=variant == "fp8-tensor")
    return out


def _rel_l2(out: torch.Tensor, ref: torch.Tensor) -> float:
    a, b = out.float().flatten(), ref.float().flatten()
    return float((a - b).norm() / b.norm().clamp_min(1e-30))


def _tokens_per_frame(config: WanDiTConfig, width: int, height: int) -> int:
    return config.tokens_per_frame(height // 8, width // 8)


def _inputs(config: WanDiTConfig, tokens: int, device: str, dtype: torch.dtype) -> dict[str, Any]:
    gen = torch.Generator(device=device).manual_seed(0)
    heads, head_dim = config.num_heads, config.head_dim
    n, p = CHUNK_FRAMES * tokens, (SINK_FRAMES + RING_FRAMES) * tokens

    def rand(*shape: int) -> torch.Tensor:
        return torch.randn(shape, generator=gen, device=device).to(dtype)

    angles = torch.rand((n, head_dim // 2), generator=gen, device=device) * 6.28
    past = (rand(1, p, heads, head_dim), rand(1, p, heads, head_dim))
    k_descale = past[0].float().abs().amax(dim=(1, 3)) * 4.0 / E4M3_MAX  # [1, H]
    v_descale = past[1].float().abs().amax(dim=(1, 3)) * 4.0 / E4M3_MAX
    fp8_past = Fp8Past(
        quantize_with(past[0], k_descale), quantize_with(past[1], v_descale), k_descale, v_descale
    )
    return {
        "x": rand(1, n, config.dim),
        "e0": rand(1, 1, 6, config.dim) * 0.1,
        "cos": angles.cos(),
        "sin": angles.sin(),
        "cross_k": rand(1, TEXT_TOKENS, heads, head_dim),
        "cross_v": rand(1, TEXT_TOKENS, heads, head_dim),
        "past": past,
        "fp8_past": fp8_past,
        "q": rand(1, n, heads, head_dim),
        "k": rand(1, n, heads, head_dim),
        "v": rand(1, n, heads, head_dim),
    }


def _linear_ops(block: WanBlock, i: dict[str, Any]) -> dict[str, Callable[[], torch.Tensor]]:
    attn, cross = block.self_attn, block.cross_attn
    x = i["x"]
    return {
        "qkv": lambda: torch.cat((attn.norm_q(attn.q(x)), attn.norm_k(attn.k(x)), attn.v(x)), -1),
        "out_proj": lambda: attn.o(x),
        "cross": lambda: cross(x, i["cross_k"], i["cross_v"]),
        "ffn": lambda: block.ffn(x),
    }


def _attention_ops(block: WanBlock, i: dict[str, Any]) -> dict[str, Callable[[], torch.Tensor]]:
    from models.wan.kv.fp8 import cached_attention

    kernel = block.self_attn.kernel
    assert kernel is not None
    q, k, v, past = i["q"], i["k"], i["v"], i["past"]
    return {
        "bf16": lambda: kernel(
            q, torch.cat((past[0], k), dim=1), torch.cat((past[1], v), dim=1), None
        ),
        "fp8-kv": lambda: cached_attention(q, k, v, i["fp8_past"], None),
    }


def _maybe_compile(fn: Callable[[], torch.Tensor], compile: bool) -> Callable[[], torch.Tensor]:
    return torch.compile(fn, dynamic=False) if compile else fn


def run_profile(
    config: WanDiTConfig,
    width: int,
    height: int,
    *,
    device: str,
    iters: int,
    compile: bool,
    attention: str,
) -> list[dict[str, Any]]:
    """Rows (op, variant, ms, rel_l2 against bf16) of one profile."""
    cuda = device == "cuda"
    dtype = torch.bfloat16 if cuda else torch.float32
    torch.manual_seed(0)
    base = WanBlock(config).to(device=device, dtype=dtype).eval()
    base.self_attn.kernel = select_backend(attention)
    inputs = _inputs(config, _tokens_per_frame(config, width, height), device, dtype)
    # one copy per variant for the ops and one for the whole block: a static scale is fixed
    # by the first input its linear sees
    ops_of = {variant: _fp8_block(base, variant) for variant in LINEAR_VARIANTS}
    blocks = {variant: _fp8_block(base, variant) for variant in LINEAR_VARIANTS}
    torch._dynamo.reset()  # each op's code is compiled once per variant: a fresh count per profile
    rows: list[dict[str, Any]] = []

    def add(op: str, variant: str, fn: Callable[[], torch.Tensor], ref: torch.Tensor | None) -> Any:
        out = fn()  # eager first: the static variant calibrates on it
        compiled = _maybe_compile(fn, compile)
        ms = time_ms(compiled, iters, cuda, warm=3)  # compile, tune, warm
        row = {"op": op, "variant": variant, "ms": ms}
        if ref is not None:
            row["rel_l2"] = _rel_l2(out, ref)
        rows.append(row)
        return out

    with torch.inference_mode():
        for op in ("qkv", "out_proj", "cross", "ffn"):
            ref = None
            for variant in LINEAR_VARIANTS:
                out = add(op, variant, _linear_ops(ops_of[variant], inputs)[op], ref)
                ref = out if ref is None else ref
        ops = _attention_ops(base, inputs)
        ref = add("attention", "bf16", ops["bf16"], None)
        add("attention", "fp8-kv", ops["fp8-kv"], ref)
        args = [inputs[name] for name in ("x", "e0", "cos", "sin", "cross_k", "cross_v")]
        ref = None
        for variant in LINEAR_VARIANTS:
            for cache in ("bf16", "fp8-kv"):
                if variant != "bf16" and cache == "bf16":
                    continue  # the FP8 linears are measured with the FP8 cache they serve with
                past = inputs["past"] if cache == "bf16" else inputs["fp8_past"]
                block = blocks[variant]

                def call(block: WanBlock = block, past: Any = past) -> torch.Tensor:
                    return block(*args, past)[0]

                name = variant if cache == "bf16" else f"{variant}+fp8-kv"
                out = add("block", name.replace("bf16+", ""), call, ref)
                ref = out if ref is None else ref
    for row in rows:
        row["profile"] = f"{width}x{height}"
    return rows


def verdict(rows: list[dict[str, Any]]) -> list[str]:
    """What the FP8 linears gain on a step, per profile: the best FP8-linear block against the
    FP8-cache block (the K/V cache stays FP8 either way), over ``BLOCKS_PER_STEP`` blocks."""
    lines = []
    for profile in dict.fromkeys(row["profile"] for row in rows):
        of = [r for r in rows if r["profile"] == profile and r["op"] == "block"]
        block = {r["variant"]: r["ms"] for r in of}
        cache_only = block.get("fp8-kv")
        linear = {v: ms for v, ms in block.items() if v.startswith("fp8-") and v != "fp8-kv"}
        if cache_only is None or not linear:
            continue
        best = min(linear, key=linear.__getitem__)
        gain = 1.0 - linear[best] / cache_only
        keep = "keep them" if gain >= KEEP_GAIN else "below the 10 % the FP8 linears must earn"
        lines.append(
            f"{profile}: a step of {BLOCKS_PER_STEP} blocks {cache_only * BLOCKS_PER_STEP:.1f} ms "
            f"with the FP8 cache; best FP8 linears ({best.replace('+fp8-kv', '')}) "
            f"{linear[best] * BLOCKS_PER_STEP:.1f} ms: {gain:+.1%} ({keep})"
        )
    return lines


def table(rows: list[dict[str, Any]]) -> str:
    lines = ["| profile | op | variant | ms | rel L2 vs bf16 |", "| --- | --- | --- | --- | --- |"]
    for row in rows:
        err = f"{row['rel_l2']:.2e}" if "rel_l2" in row else "-"
        lines.append(
            f"| {row['profile']} | {row['op']} | {row['variant']} | {row['ms']:.3f} | {err} |"
        )
    return "\n".join(lines)


def run(
    *,
    device: str,
    profiles: list[tuple[int, int]],
    iters: int,
    compile: bool,
    attention: str = "auto",
    preset: str | None = None,
    on_profile: Callable[[dict[str, Any]], None] | None = None,
) -> dict[str, Any]:
    """Every profile in turn -> the result (device, preset, rows, verdict); ``on_profile`` is
    given the result so far after each profile (a run cut short keeps what it measured)."""
    config = PRESETS[preset or ("wan2.1-1.3b" if device == "cuda" else "tiny")]
    torch._dynamo.config.cache_size_limit = max(torch._dynamo.config.cache_size_limit, 16)
    result: dict[str, Any] = {
        "device": torch.cuda.get_device_name() if device == "cuda" else "cpu",
        "torch": torch.__version__,
        "preset": config.name,
        "compiled": compile,
        "fp8_gemm": scaled_mm_supported(torch.device(device)),
        "rows": [],
        "verdict": [],
    }
    for width, height in profiles:
        result["rows"] += run_profile(
            config, width, height, device=device, iters=iters, compile=compile, attention=attention
        )
        result["verdict"] = verdict(result["rows"])
        if on_profile is not None:
            on_profile(result)
    return result


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--profiles", default="832x480,480x272")
    parser.add_argument("--iters", type=int, default=20)
    parser.add_argument("--no-compile", action="store_true")
    parser.add_argument("--attention", default="auto")
    parser.add_argument("--preset", default=None, help="DiT preset (default: the served one)")
    parser.add_argument("--json", default=None)
    args = parser.parse_args(argv)
    profiles = [tuple(int(n) for n in p.split("x")) for p in args.profiles.split(",") if p]

    def save(result: dict[str, Any]) -> None:
        print(table(result["rows"]), flush=True)
        if args.json:
            Path(args.json).write_text(json.dumps(result, indent=2))

    result = run(
        device=args.device,
        profiles=[(w, h) for w, h in profiles],
        iters=args.iters,
        compile=not args.no_compile,
        attention=args.attention,
        preset=args.preset,
        on_profile=save,
    )
    print(
        f"\n{result['device']}, torch {result['torch']}, {result['preset']}, "
        f"compiled {result['compiled']}, FP8 GEMMs {result['fp8_gemm']}"
    )
    for line in result["verdict"]:
        print(line)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
