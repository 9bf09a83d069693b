"""Quality guard for the lossy serving levers: tiny-world's evaluation with each lever off and on.

Random Wan weights cannot show quality; tiny-world is a trained model. Every lever runs
``models.tinyworld.evaluation.evaluate`` (the four thresholds of ``dreamrt eval tiny-world``)
on a fresh instance in ONE process, with the same seeds, the same scripted inputs and one
calibrated frame classifier, so the rows differ by the lever alone. A lever **passes** if all
four thresholds still pass and no thresholded metric drops more than 1 point (percentage point)
below the ``off`` row; only a lever that passes may become a serving default.

Levers (``--levers``, comma-separated; ``+`` combines, e.g. ``fp8attn+fp8``), named as the GPU
session bench names them:

| lever | what | ``WanInstance.configure`` |
| --- | --- | --- |
| ``fp8attn`` | our Triton e4m3 attention, P V in FP8 | ``attention="fp8-triton"`` |
| ``fp8qk`` | our Triton e4m3 attention, P V in 16 bits | ``attention="fp8qk-triton"`` |
| ``sage`` | sageattention 1.0.x (INT8 Q K^T, FP16 P V) | ``attention="sage"`` |
| ``fp8`` / ``fp8t`` | FP8 linears, row-wise / per-tensor scales | ``fp8="row"`` / ``"tensor"`` |
| ``fold`` | K/V update in the last denoising step | ``kv_update="last_step"`` |
| ``kvfp8`` | the chunk-K/V cache stored in e4m3 (per-head scales) | ``kv_cache="fp8"`` |

What each row really measured is in its "served by" column. tiny-world's DiT is the Wan block
(``WanSelfAttention`` with the selected kernel) at **head dim 32** (dim 128, 4 heads): sage
(head dims 64/96/128) never runs there - SDPA serves every call and the row equals ``off``;
our FP8 kernel takes head dim 32 and runs on CUDA. On the CPU every attention lever is SDPA
(a plumbing check: the row equals ``off`` bit for bit), while FP8 linears compute their
quantised values in float32 (the GPU GEMM's inputs), fold changes the loop and kvfp8 stores the
cache in e4m3 (read dequantised at head dim 32, where FA3's FP8 kernel does not run) - those
rows measure the lever anywhere. Writes the JSON after every lever; a lever that fails to run gets
its error in the table.

    python -m infra.bench.quality_guard --device cuda [--rollouts 50] [--long-s 60] [--json F]
"""

from __future__ import annotations

import argparse
import json
import time
import traceback
from typing import Any

import torch

from models.instance import load_instance
from models.tinyworld.card import TINY_WORLD
from models.tinyworld.evaluation.classify import FrameClassifier
from models.tinyworld.evaluation.evaluate import THRESHOLDS, evaluate
from models.wan.kernels.attention import ATTENTION_BACKENDS, LowPrecisionAttention

__all__ = ["LEVERS", "lever_config", "main", "run_guard"]

LEVERS: dict[str, dict[str, Any]] = {
    "fp8attn": {"attention": "fp8-triton"},
    "fp8qk": {"attention": "fp8qk-triton"},
    "sage": {"attention": "sage"},
    "fp8": {"fp8": "row"},
    "fp8t": {"fp8": "tensor"},
    "fold": {"kv_update": "last_step"},
    "kvfp8": {"kv_cache": "fp8"},
}
DEFAULT_LEVERS = "fp8attn,fp8qk,sage,fp8,fp8t,fold"
MAX_DROP_POINTS = 1.0


def lever_config(lever: str) -> dict[str, Any]:
    """``configure`` arguments of a lever name (``off``, one of ``LEVERS``, or ``a+b``)."""
    config: dict[str, Any] = {}
    for part in [] if lever == "off" else lever.split("+"):
        if part not in LEVERS:
            raise ValueError(f"unknown lever {part!r}; known: {sorted(LEVERS)}")
        clash = set(config) & set(LEVERS[part])
        if clash:
            raise ValueError(f"lever {lever!r} sets {sorted(clash)} twice")
        config |= LEVERS[part]
    return config


def _served_by(instance: Any, before: dict[str, int], requested: str) -> str:
    name = instance.levers.get("attention", "auto")
    backend = ATTENTION_BACKENDS[name]
    if name != requested:  # the package is missing here: selection resolved to SDPA
        return f"{requested}: not importable, attention {name}"
    if not isinstance(backend, LowPrecisionAttention):
        return f"attention {name}"
    kernel = backend.calls["kernel"] - before["kernel"]
    sdpa = backend.calls["sdpa"] - before["sdpa"]
    return f"{name}: kernel {kernel} calls, SDPA {sdpa}"


def run_guard(
    *,
    device: str,
    levers: list[str],
    rollouts: int,
    chunks: int = 18,
    long_s: float = 60.0,
    seed: int = 0,
    json_path: str | None = None,
    classifier: FrameClassifier | None = None,
    budget_s: float | None = None,
) -> dict[str, Any]:
    """Evaluate ``off`` and every lever (module docstring) -> {"rows": {lever: row}, ...}.
    ``classifier``: a calibrated one (default: calibrated here, as ``dreamrt eval`` does);
    ``budget_s``: start no lever after this many seconds (the rest: ``skipped``)."""
    start = time.perf_counter()
    if classifier is None:
        profile = TINY_WORLD.default_profile
        classifier = FrameClassifier(profile.height, profile.width)
        classifier.calibrate()
    out: dict[str, Any] = {
        "device": device,
        "rollouts": rollouts,
        "chunks": chunks,
        "long_s": long_s,
        "seed": seed,
        "thresholds": THRESHOLDS,
        "rows": {},
    }
    for lever in ["off", *levers]:
        if budget_s is not None and time.perf_counter() - start > budget_s:
            out["rows"][lever] = {"skipped": f"budget of {budget_s:.0f} s spent"}
            continue
        try:
            config = lever_config(lever)
            instance = load_instance(TINY_WORLD, device=device)
            instance.configure(**config)
            requested = config.get("attention", "auto")
            backend = ATTENTION_BACKENDS[instance.levers["attention"]]
            before = dict(getattr(backend, "calls", {}))
            report = evaluate(
                instance,
                rollouts=rollouts,
                chunks=chunks,
                long_s=long_s,
                seed=seed,
                classifier=classifier,
            )
            row = {name: getattr(report, name) for name in THRESHOLDS}
            row |= {
                "passed_thresholds": report.passed,
                "verdicts": report.verdicts,
                "levers": dict(instance.levers),
                "served_by": _served_by(instance, before, requested),
                "wall_s": report.wall_s,
            }
        except Exception as exc:  # recorded, the next lever runs
            row = {"error": f"{type(exc).__name__}: {exc}", "traceback": traceback.format_exc()}
        out["rows"][lever] = row
        _judge(out["rows"])
        if json_path:
            with open(json_path, "w") as f:
                json.dump(out, f, indent=2)
    out["wall_s"] = round(time.perf_counter() - start, 1)
    if json_path:
        with open(json_path, "w") as f:
            json.dump(out, f, indent=2)
    return out


def _judge(rows: dict[str, dict[str, Any]]) -> None:
    """Deltas (points) against ``off`` and each lever's verdict, in place."""
    off = rows.get("off")
    for row in rows.values():
        if "passed_thresholds" not in row or off is None or "passed_thresholds" not in off:
            continue
        row["delta_points"] = {m: 100.0 * (row[m] - off[m]) for m in THRESHOLDS}
        worst = min(row["delta_points"].values())
        row["max_drop_points"] = max(0.0, -worst)
        row["passes"] = bool(row["passed_thresholds"]) and row["max_drop_points"] <= MAX_DROP_POINTS


def print_table(result: dict[str, Any]) -> None:
    names = list(THRESHOLDS)
    print(
        f"\ntiny-world quality guard on {result['device']}: {result['rollouts']} rollouts x "
        f"{result['chunks']} chunks + {result['long_s']:.0f} s; a lever passes if every "
        f"threshold passes and no metric drops > {MAX_DROP_POINTS:.0f} point below off"
    )
    header = " | ".join(f"{n} (>= {THRESHOLDS[n]:.0%}) | Δ pt" for n in names)
    print(f"| lever | served by | {header} | thresholds | max drop pt | verdict |")
    print("| --- " * (2 * len(names) + 5) + "|")
    for lever, r in result["rows"].items():
        if "passed_thresholds" not in r:
            what = f"failed: {r['error'][:160]}" if "error" in r else f"skipped: {r['skipped']}"
            print(f"| {lever} | {what} |" + " |" * (2 * len(names) + 3))
            continue
        cells = []
        for n in names:
            mark = "" if r["verdicts"].get(n, True) else " ✗"
            delta = r.get("delta_points", {}).get(n)
            cells.append(
                f"{100 * r[n]:.1f} %{mark} | " + ("—" if delta is None else f"{delta:+.1f}")
            )
        passed = "pass" if r["passed_thresholds"] else "FAIL"
        if lever == "off":
            verdict, drop = "reference", "—"
        else:
            verdict = "passes" if r.get("passes") else "fails"
            drop = f"{r['max_drop_points']:.1f}" if "max_drop_points" in r else "—"
        print(
            f"| {lever} | {r['served_by']} | {' | '.join(cells)} | {passed} | {drop} | {verdict} |"
        )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cuda", choices=["cuda", "cpu"])
    parser.add_argument("--levers", default=DEFAULT_LEVERS)
    parser.add_argument("--rollouts", type=int, default=50)
    parser.add_argument("--chunks", type=int, default=18)
    parser.add_argument("--long-s", type=float, default=60.0)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--json", default=None)
    parser.add_argument(
        "--budget-s", type=float, default=None, help="start no lever after this many seconds"
    )
    args = parser.parse_args(argv)
    if args.device == "cuda" and not torch.cuda.is_available():
        print("quality_guard: CUDA is not available (--device cpu runs it on the CPU)")
        return 2
    if args.device == "cpu":
        torch.set_num_threads(1)  # as dreamrt eval does: what a served session gets
    levers = [lever for lever in args.levers.split(",") if lever]
    for lever in levers:
        try:
            lever_config(lever)
        except ValueError as exc:
            parser.error(str(exc))
    result = run_guard(
        device=args.device,
        levers=levers,
        rollouts=args.rollouts,
        chunks=args.chunks,
        long_s=args.long_s,
        seed=args.seed,
        json_path=args.json,
        budget_s=args.budget_s,
    )
    print_table(result)
    return 0 if all("error" not in r for r in result["rows"].values()) else 1


if __name__ == "__main__":
    raise SystemExit(main())
