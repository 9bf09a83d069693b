"""GPU smoke: the wan2.1-1.3b-causal card (random bf16 weights) through ``chunk_rollout``.

Runs a few chunks of a session at the card's profile (832x480, 4 steps, chunks of 3 latent
frames, KV window 9 + 3 sink) through the real loop and ops, plan by plan, synchronising the
device around each plan so every plan's time is its own. Eager PyTorch, no optimisation: this
is the first timing of the architecture, not the performance work (infra/bench/gpu_session.py).

    python -m infra.bench.gpu_smoke [--chunks 4] [--json OUT.json]

Prints one table last; ``--json`` writes every sample.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import time
from collections import defaultdict

import torch

from models.instance import load_instance
from models.loops.requests import SessionRequest
from models.registry import get
from runtime.contract import StepResult, WorkPlan
from runtime.driver import Driver, InlineContext


def _sync() -> None:
    if torch.cuda.is_available():
        torch.cuda.synchronize()


class TimedContext(InlineContext):
    """InlineContext that times each plan with device synchronisation on both sides."""

    def __init__(self) -> None:
        super().__init__("bench")
        self.samples: dict[str, list[float]] = defaultdict(list)
        self.flops: dict[str, float] = {}

    async def execute(self, plan: WorkPlan) -> StepResult:
        _sync()
        start = time.perf_counter()
        result = await super().execute(plan)
        _sync()
        elapsed = time.perf_counter() - start
        self.samples[plan.kind.value].append(elapsed)
        self.flops[plan.kind.value] = plan.flops
        return result


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--chunks", type=int, default=4)
    parser.add_argument("--model", default="wan2.1-1.3b-causal")
    parser.add_argument("--device", default="cuda", choices=["cuda", "cpu"])
    parser.add_argument("--json", default=None)
    args = parser.parse_args(argv)
    if args.device == "cuda" and not torch.cuda.is_available():
        print("gpu_smoke: CUDA is not available (use --device cpu for a dry run)", file=sys.stderr)
        return 2
    cuda = args.device == "cuda"

    t0 = time.perf_counter()
    instance = load_instance(
        get(args.model),
        device=args.device,
        precision="bf16" if cuda else "fp32",
        random_weights=True,
    )
    _sync()
    load_s = time.perf_counter() - t0
    loop = instance.loop("chunk_rollout")
    ctx = TimedContext()
    request = SessionRequest(prompt="a red ball rolling on grass", seed=0, max_chunks=args.chunks)
    chunk_walls: list[float] = []
    frames: list[int] = []

    async def run() -> None:
        driver = Driver(loop, ctx)
        driver.init(request, instance)
        start = time.perf_counter()
        seen = 0
        while await driver.step():
            media = [e for e in ctx.emissions if e.spec.stream == "media"]
            if len(media) > seen:
                now = time.perf_counter()
                chunk_walls.append(now - start)
                frames.append(media[-1].output.shape[0])
                start, seen = now, len(media)
        driver.finalize()

    if cuda:
        torch.cuda.reset_peak_memory_stats()
    asyncio.run(run())
    peak_gib = torch.cuda.max_memory_allocated() / 2**30 if cuda else float("nan")

    def ms(values: list[float]) -> str:
        return f"{statistics.median(values) * 1e3:8.1f}"

    step = ctx.samples["chunk_step"]
    steady = chunk_walls[1:] or chunk_walls
    steady_frames = frames[1:] or frames
    fps = sum(steady_frames) / sum(steady)
    tflops = ctx.flops["chunk_step"] / statistics.median(step[len(step) // 2 :]) / 1e12
    summary = {
        "model": args.model,
        "torch": torch.__version__,
        "device": torch.cuda.get_device_name() if cuda else "cpu",
        "load_s": load_s,
        "chunks": args.chunks,
        "frames_per_chunk": frames,
        "chunk_wall_s": chunk_walls,
        "plan_samples_s": dict(ctx.samples),
        "plan_flops": ctx.flops,
        "steady_fps": fps,
        "dit_step_tflops": tflops,
        "peak_gib": peak_gib,
    }
    if args.json:
        with open(args.json, "w") as f:
            json.dump(summary, f, indent=2)
    profile = instance.card.default_profile
    print(
        f"\n{args.model} on {summary['device']}, eager {instance.precision}, random weights, "
        f"{profile.width}x{profile.height}, chunks of {profile.chunk_latent_frames} latent "
        f"frames, {profile.steps} steps"
    )
    print("| plan | n | median ms | min ms |")
    print("| --- | --- | --- | --- |")
    for kind, values in ctx.samples.items():
        print(f"| {kind} | {len(values)} | {ms(values)} | {min(values) * 1e3:8.1f} |")
    print(f"| chunk (wall, steady) | {len(steady)} | {ms(steady)} | {min(steady) * 1e3:8.1f} |")
    print(
        f"first chunk {chunk_walls[0] * 1e3:.0f} ms; steady {fps:.1f} FPS incl. decode; "
        f"DiT step {tflops:.0f} TFLOP/s; peak {peak_gib:.1f} GiB; load {load_s:.1f} s"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
