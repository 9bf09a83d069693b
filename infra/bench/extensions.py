"""Extensions bench: residual caches' speed against their frame difference, and the
step time with no extension against today's.

One T2V job of a many-step card (default ``wan2.1-t2v-1.3b``: 50 Euler steps, CFG 5; seeded
random bf16 weights on CUDA) runs once per variant, in ONE process, the same seed and prompt
every time, so rows differ by the variant alone:

- ``none``: no extension enabled (the plain forward: ``DiffusionStepOp`` without hooks); it
  runs first (the reference of every row) and again last (the run-to-run noise);
- ``today``: the diffusion step as main computes it, called directly (the DiT forward and
  the CFG combine, no op dispatch), timed over the same steps: what "equals today's" means;
- ``fbcache@T`` / ``teacache@T``: the interceptor enabled with threshold T (``@0``: hooked,
  never reuses - the hooked forward's own overhead, and bit-identical to ``none``).

Per row: median and total denoising-step time (CUDA-synchronised wall time of each
``diffusion_step`` plan), speedup of the denoise against ``none``, how many steps reused
cached work, and the difference of the decoded frames (PSNR in dB over uint8 RGB, max-abs)
and of the final latents (max-abs) against ``none``. Random weights make the *trade* here a
property of random weights: which steps a threshold skips depends on how the sample moves,
and a trained model's sample moves differently - read the speedup per reused step and the
exactness at 0, not the PSNR, as the model's quality. A JSON of every row goes to ``--json``
(or ``$OUT/extensions.json``); the table is printed last. ``--budget-s`` starts no variant
after that many seconds.

    python -m infra.bench.extensions --device cuda            # H200, ~5 min
    python -m infra.bench.extensions --device cpu --model wan2.1-t2v-tiny-random --frames 5
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import sys
import time
from typing import Any

import torch

from models.instance import load_instance
from models.loops.extensions import deploy_extensions
from models.loops.ops import DiffusionStepArgs
from models.loops.requests import JobRequest
from models.registry import get
from runtime.contract import Done, PlanKind, StepResult

__all__ = ["main", "psnr", "run_job"]

# the two caches alternate, so a run cut short by --budget-s still has rows of both
DEFAULT_VARIANTS = (
    "none,today,fbcache@0,teacache@0,fbcache@0.1,teacache@0.2,fbcache@0.05,teacache@0.1,"
    "fbcache@0.2,teacache@0.4,none"
)


def psnr(a: torch.Tensor, b: torch.Tensor) -> float:
    """PSNR in dB of uint8 frames ``a`` against ``b`` (inf when equal)."""
    mse = float((a.float() - b.float()).pow(2).mean())
    return math.inf if mse == 0 else 10.0 * math.log10(255.0**2 / mse)


def _sync(device: str) -> None:
    if device == "cuda":
        torch.cuda.synchronize()


def run_job(
    instance: Any, request: JobRequest, device: str, *, max_steps: int | None = None
) -> dict[str, Any]:
    """Drive ``diffusion_denoise`` plan by plan, timing each step -> times, frames, latents
    (``max_steps``: stop after that many denoising steps, nothing decoded: a warm-up)."""
    loop = instance.loop("diffusion_denoise")
    state = loop.init(request, instance, None)
    step_s: list[float] = []
    step_args: list[DiffusionStepArgs] = []
    while not isinstance(plan := loop.next(state), Done):
        _sync(device)
        start = time.perf_counter()
        output = plan.op([plan.args])[0]
        _sync(device)
        wall = time.perf_counter() - start
        if plan.kind is PlanKind.DIFFUSION_STEP:
            step_s.append(wall)
            step_args.append(plan.args)
        state = loop.advance(state, StepResult(output, wall, kind=plan.kind))
        if max_steps is not None and len(step_s) >= max_steps:
            return {"step_s": step_s}
    result = loop.finalize(state)
    return {
        "step_s": step_s,
        "args": step_args,
        "frames": result.outputs["frames"],
        "latents": result.outputs["latents"],
        "extensions": result.outputs.get("extensions", {}),
    }


def _today_steps(instance: Any, args: list[DiffusionStepArgs], device: str) -> list[float]:
    """Main's diffusion step body (forward + CFG + Euler), called directly on recorded args."""
    dit, times = instance.dit, []
    with torch.inference_mode():
        for a in args:
            _sync(device)
            start = time.perf_counter()
            x = a.x if a.init_seed is None else torch.randn_like(a.x)
            negative = a.negative if a.guidance_scale != 1.0 else None  # classifier-free guidance
            x_in = torch.cat((x, x)) if negative is not None else x
            text = torch.cat((a.text, negative)) if negative is not None else a.text
            t = torch.full((x_in.shape[0],), a.timestep, device=x.device, dtype=torch.float32)
            v = dit(x_in, t, text).float()
            if negative is not None:
                v = v[1:] + a.guidance_scale * (v[:1] - v[1:])
            (x.float() + (a.sigma_next - a.sigma) * v).to(a.x.dtype)
            _sync(device)
            times.append(time.perf_counter() - start)
    return times


def _row(run: dict[str, Any], base: dict[str, Any] | None, name: str) -> dict[str, Any]:
    steps = run["step_s"]
    row: dict[str, Any] = {
        "variant": name,
        "steps": len(steps),
        "step_median_ms": 1000 * statistics.median(steps),
        "denoise_s": sum(steps),
        "extensions": run.get("extensions", {}),
    }
    if base is not None and "frames" in run:
        row["speedup"] = sum(base["step_s"]) / sum(steps)
        row["psnr_db"] = psnr(run["frames"], base["frames"])
        row["frames_max_abs"] = int((run["frames"].int() - base["frames"].int()).abs().max())
        diff = (run["latents"].float() - base["latents"].float()).abs().max()
        row["latents_max_abs"] = float(diff)
        row["bit_identical"] = bool(torch.equal(run["latents"], base["latents"]))
    return row


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="dreamrt bench extensions", description=__doc__)
    parser.add_argument("--device", default="cuda", choices=["cuda", "cpu"])
    parser.add_argument("--model", default="wan2.1-t2v-1.3b")
    parser.add_argument("--frames", type=int, default=33, help="pixel frames of the T2V job")
    parser.add_argument("--width", type=int, default=None)
    parser.add_argument("--height", type=int, default=None)
    parser.add_argument("--variants", default=DEFAULT_VARIANTS)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--budget-s", type=float, default=420.0)
    parser.add_argument("--json", default=None)
    args = parser.parse_args(argv)
    if args.device == "cuda" and not torch.cuda.is_available():
        print("extensions bench: CUDA is not available (--device cpu)", file=sys.stderr)
        return 2
    started = time.perf_counter()
    cuda = args.device == "cuda"
    card = get(args.model)
    instance = load_instance(
        card,
        device=args.device,
        precision="bf16" if cuda else "fp32",
        random_weights=True,
        extensions=deploy_extensions([("fbcache", {}), ("teacache", {})]),
    )
    json_path = args.json or os.path.join(os.environ.get("OUT", "."), "extensions.json")
    header = {
        "model": card.model_id,
        "device": torch.cuda.get_device_name() if cuda else "cpu",
        "frames": args.frames,
        "width": args.width or card.default_profile.width,
        "height": args.height or card.default_profile.height,
        "seed": args.seed,
    }

    def request(extensions: dict[str, Any]) -> JobRequest:
        return JobRequest(
            task="t2v",
            prompt="a red fox running through fresh snow",
            num_frames=args.frames,
            width=args.width,
            height=args.height,
            seed=args.seed,
            extensions=extensions,
        )

    off = {"fbcache": {"enabled": False}, "teacache": {"enabled": False}}
    # warm-up (kernels, allocator) of both paths so the first measured row is not the slowest
    run_job(instance, request(off), args.device, max_steps=3)
    hooked = {**off, "fbcache": {"enabled": True, "threshold": 0.0}}
    run_job(instance, request(hooked), args.device, max_steps=3)
    rows: list[dict[str, Any]] = []
    base: dict[str, Any] | None = None
    for name in args.variants.split(","):
        if time.perf_counter() - started > args.budget_s:
            rows.append({"variant": name, "skipped": f"budget of {args.budget_s:.0f} s spent"})
            continue
        try:
            if name == "none":  # again at the end: the run-to-run noise of the same job
                saved, instance.extensions = instance.extensions, {}
                run = run_job(instance, request({}), args.device)
                instance.extensions = saved
                reference, base = base, base or run
            elif name == "today":
                if base is None:
                    raise RuntimeError("'today' needs the 'none' row first")
                run = {"step_s": _today_steps(instance, base["args"], args.device)}
                reference = base
            else:
                ext, _, threshold = name.partition("@")
                params = {**off, ext: {"enabled": True, "threshold": float(threshold or 0)}}
                run = run_job(instance, request(params), args.device)
                reference = base
            rows.append(_row(run, reference, name))
        except Exception as exc:  # recorded; the next variant runs
            rows.append({"variant": name, "error": f"{type(exc).__name__}: {exc}"})
        with open(json_path, "w") as f:
            json.dump({**header, "rows": rows}, f, indent=2)
    header["wall_s"] = round(time.perf_counter() - started, 1)
    with open(json_path, "w") as f:
        json.dump({**header, "rows": rows}, f, indent=2)
    _print_table(header, rows)
    return 0


def _cell(row: dict[str, Any], key: str, fmt: str) -> str:
    return format(row[key], fmt) if key in row else "—"


def _print_table(header: dict[str, Any], rows: list[dict[str, Any]]) -> None:
    print(
        f"\nextensions on {header['device']}: {header['model']} T2V {header['frames']} frames "
        f"{header['width']}x{header['height']}, random weights, seed {header['seed']}"
    )
    print(
        "| variant | step median ms | denoise s | speedup | reused/steps | PSNR dB | "
        "frames max-abs | latents max-abs | bit-identical |"
    )
    print("| --- " * 9 + "|")
    for r in rows:
        if "step_median_ms" not in r:
            print(f"| {r['variant']} | {r.get('error') or r.get('skipped')} |" + " |" * 7)
            continue
        used = next(iter(r["extensions"].values()), None)
        reused = f"{used['reused']}/{r['steps']}" if used else "—"

        print(
            f"| {r['variant']} | {r['step_median_ms']:.1f} | {r['denoise_s']:.2f} | "
            f"{_cell(r, 'speedup', '.2f')} | {reused} | {_cell(r, 'psnr_db', '.1f')} | "
            f"{_cell(r, 'frames_max_abs', 'd')} | {_cell(r, 'latents_max_abs', '.3g')} | "
            f"{r.get('bit_identical', '—')} |"
        )


if __name__ == "__main__":
    raise SystemExit(main())
