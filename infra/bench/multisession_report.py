"""What ``infra.bench.multisession`` prints and writes: per-run plan costs, the cost snapshot
(measured seconds per plan kind and shape per profile) and the final table.

``ShapeProfiler`` is the engine's ``Profiler`` (it still calibrates the cost model and keeps
per-kind samples) that also keeps every batch's per-plan time under its ``(kind, shape_sig)``,
which the cost snapshot needs: one kind has several shapes (a first chunk's decode parts, a
re-cache of however many frames).

Cost snapshot format (``cost_snapshot.json``; ``tests/runtime/data/cost_snapshot_h200.json`` is
one)::

    {"card": ..., "device": ..., "device_name": ..., "torch": ...,
     "profiles": {"832x480@16": {"chunk_seconds": 0.75, "shapes": {"chunk_step": {
         "c3x60x104": {"median_s": .., "p95_s": .., "n": .., "device_median_s": ..}}}}},
     "cost_model": CostModel.snapshot()}

``cost_model`` is what the server persists in ``<data-dir>/cost/<card>@<device>.json``.
"""

from __future__ import annotations

import json
import threading
from collections import defaultdict
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from infra.bench.sim_viewer import percentile
from runtime.cost import CostModel
from runtime.observers import BatchInfo, Observation, Profiler

__all__ = [
    "ShapeProfiler",
    "compare_refusal",
    "cost_snapshot",
    "format_costs",
    "format_table",
    "write_json",
]


class ShapeProfiler(Profiler):
    """A ``Profiler`` that also records per-plan seconds by ``(kind, shape_sig)``."""

    def __init__(self, cost: CostModel | None = None) -> None:
        super().__init__(cost)
        self.by_shape: dict[tuple[str, str], list[tuple[float, float | None]]] = defaultdict(list)
        self._shape_lock = threading.Lock()

    def after_batch(self, info: BatchInfo, outputs: Sequence[Any], wall_s: float) -> Observation:
        observation = super().after_batch(info, outputs, wall_s)
        n = info.batch_size
        device_s = None if observation.device_s is None else observation.device_s / n
        with self._shape_lock:
            self.by_shape[(info.kind, info.shape_sig)].append((wall_s / n, device_s))
        return observation


def format_costs(profiler: Profiler) -> str:
    """One line per plan kind: median / p95 ms and count (device time where measured)."""
    device = profiler.device_summary()
    lines = []
    for kind, wall in profiler.summary().items():
        line = f"    {kind:<12} wall {wall.median_s * 1e3:8.1f} / {wall.p95_s * 1e3:8.1f} ms"
        if kind in device:
            d = device[kind]
            line += f"   device {d.median_s * 1e3:8.1f} / {d.p95_s * 1e3:8.1f} ms"
        lines.append(f"{line}   n={wall.count}")
    return "\n".join(lines)


def cost_snapshot(
    meta: dict[str, Any],
    samples: dict[str, dict[tuple[str, str], list]],
    chunk_seconds: dict[str, float],
    cost: CostModel,
) -> dict[str, Any]:
    """The cost snapshot (module docstring) from per-profile ``(kind, shape) -> samples``."""
    profiles: dict[str, Any] = {}
    for key, by_shape in samples.items():
        shapes: dict[str, dict[str, Any]] = defaultdict(dict)
        for (kind, sig), values in sorted(by_shape.items()):
            wall = [w for w, _ in values]
            dev = [d for _, d in values if d is not None]
            shapes[kind][sig] = {
                "median_s": percentile(wall, 0.5),
                "p95_s": percentile(wall, 0.95),
                "n": len(wall),
                "device_median_s": percentile(dev, 0.5),
            }
        profiles[key] = {"chunk_seconds": chunk_seconds.get(key), "shapes": dict(shapes)}
    return {**meta, "profiles": profiles, "cost_model": cost.snapshot()}


def compare_refusal(runs: list[dict[str, Any]]) -> list[str]:
    """small+1 vs small, per policy: was the next session refused, and did the admitted
    sessions notice (``vs_small``: per-session delta of fps and stalls/min, stored in the run)?"""
    base = {r["scheduler"]: r for r in runs if r["scenario"] == "small"}
    lines = []
    for run in (r for r in runs if r["scenario"] == "small+1"):
        ref = base.get(run["scheduler"])
        deltas = (
            {
                sid: {
                    "fps": s["fps"] - ref["sessions"][sid]["fps"],
                    "stalls_per_min": (s["stalls_per_min"] or 0)
                    - (ref["sessions"][sid]["stalls_per_min"] or 0),
                }
                for sid, s in run["sessions"].items()
            }
            if ref
            else {}
        )
        run["vs_small"] = deltas
        answer = run["refusal"]["answer"]
        verdict = (
            "admission refused the next one"
            if run["refusal"]["refused"]
            else "ADMISSION ADMITTED THE NEXT ONE"
        )
        worst = max((abs(d["fps"]) for d in deltas.values()), default=float("nan"))
        lines.append(
            f"small+1 / {run['scheduler']}: {verdict} ({answer.get('reason')}, retry "
            f"after {answer.get('retry_after_s')} s); admitted sessions vs N=limit: "
            f"max |delta fps| {worst:.2f}"
        )
    return lines


def write_json(path: str | None, data: dict[str, Any]) -> None:
    if path:
        Path(path).parent.mkdir(parents=True, exist_ok=True)
        Path(path).write_text(json.dumps(data, indent=1, default=str))


def _num(value: float | None, fmt: str) -> str:
    return "-" if value is None else format(value, fmt)


def format_table(runs: list[dict[str, Any]]) -> str:
    """The one table: a row per scenario x scheduler x session, then the job rows."""
    head = (
        "| scenario | scheduler | session | fps | stalls/min | p95 ms | p99 ms | min slack ms "
        "| first frame s | prompt->applied s | action->applied s |"
    )
    lines = [head, "|" + " --- |" * 11]
    jobs = []
    for run in runs:
        for sid, s in run["sessions"].items():
            lines.append(
                f"| {run['scenario']} | {run['scheduler']} | {sid} | {s['fps']:.1f} | "
                f"{_num(s['stalls_per_min'], '.1f')} | {_num(s['interval_ms']['p95'], '.0f')} | "
                f"{_num(s['interval_ms']['p99'], '.0f')} | {_num(s['slack_ms']['min'], '.0f')} | "
                f"{_num(s['first_frame_s'], '.2f')} | {_num(s['prompt_to_applied_s'], '.2f')} | "
                f"{_num(s['action_to_applied_s'], '.2f')} |"
            )
        if run.get("job") is not None:
            jobs.append((run, run["job"]))
    gates = [run for run in runs if run.get("gate") and "identical" in run["gate"]]
    if gates:
        lines += [
            "",
            "| interleave gate: s0 of | scheduler | vs | chunks | bit-identical | max / mean abs |",
            "|" + " --- |" * 6,
        ]
        for run in gates:
            g = run["gate"]
            mean = g.get("mean_abs")
            lines.append(
                f"| {run['scenario']} | {run['scheduler']} | {g['reference']} | {g['chunks']} | "
                f"{_num(g['identical'], '')} | {_num(g.get('max_abs'), '')} / "
                f"{_num(mean, '.4f')} |"
            )
    if jobs:
        lines += [
            "",
            "| scenario | scheduler | job | completion s | alone s | x alone |",
            "|" + " --- |" * 6,
        ]
        for run, job in jobs:
            lines.append(
                f"| {run['scenario']} | {run['scheduler']} | t2v {job['num_frames']} "
                f"frames | {_num(job['completion_s'], '.2f')} | "
                f"{_num(job['alone_s'], '.2f')} | {_num(job['x_alone'], '.2f')} |"
            )
    return "\n".join(lines)
