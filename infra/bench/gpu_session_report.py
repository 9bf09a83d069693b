"""What ``gpu_session`` reports: per-variant summaries, frame parity, the JSON and the tables.

A variant's summary comes from its measured session (steady-state chunks only); parity compares
its uint8 frames with three references of the same seed: the eager ``baseline``, the reference
variant (``--reference``, default ``compiled+overlap``: what the lossy levers are judged
against), and - for a ``+graphs`` variant - the same variant without CUDA graphs, which must be
bit-identical. A variant that failed has an ``error`` and no numbers.
"""

from __future__ import annotations

import json
import statistics
from typing import Any

import torch

__all__ = ["parity", "print_tables", "row", "summarize", "without_option", "write_json"]


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[max(0, min(len(ordered) - 1, round(q * (len(ordered) - 1))))]


def parity(frames: list[torch.Tensor], reference: list[torch.Tensor]) -> dict[str, Any]:
    diffs = [(a.float() - b.float()).abs() for a, b in zip(frames, reference, strict=True)]
    return {
        "mean_abs_uint8": float(torch.cat([d.flatten() for d in diffs]).mean()),
        "max_abs_uint8": float(max(d.max() for d in diffs)),
        "identical": all(torch.equal(a, b) for a, b in zip(frames, reference, strict=True)),
    }


def without_option(variant: str, option: str) -> str:
    base, *options = variant.split("+")
    return "+".join([base, *[o for o in options if o != option]])


def summarize(
    probe: dict[str, Any],
    run: dict[str, Any],
    *,
    steps: int,
    first_steady: int,
    step_flops: float,
    peak_tflops: float,
    cuda: bool,
) -> dict[str, Any]:
    """Numbers of one variant from its first-frame probe and measured session."""
    steady = run["chunk_wall_s"][first_steady:]
    frames = [f.shape[0] for f in run["frames"]][first_steady:]
    step_dev = run["device"]["chunk_step"][-steps * len(steady) :]
    device_per_chunk = [sum(x) for x in zip(*[iter(step_dev)] * steps)]
    # no KV-update plans with +fold: the last step writes the cache
    kv = run["device"]["kv_update"][-len(steady) :] or [0.0] * len(steady)
    dec = run["device"]["vae_decode"][-len(steady) :]
    busy = [a + b + c for a, b, c in zip(device_per_chunk, kv, dec)]
    overhead = [w - b for w, b in zip(steady, busy)]
    step_med = statistics.median(step_dev)
    return {
        "fps": sum(frames) / sum(steady),
        "first_frame_s": probe["first_frame_s"],
        "first_chunk_s": probe["chunk_wall_s"][0],
        "first_chunk_device_ms": {k: [x * 1e3 for x in v] for k, v in probe["device"].items()},
        "step_ms_median": step_med * 1e3,
        "step_ms_p95": percentile(step_dev, 0.95) * 1e3,
        "chunk_ms_median": statistics.median(steady) * 1e3,
        "chunk_ms_p95": percentile(steady, 0.95) * 1e3,
        "decode_ms_median": statistics.median(dec) * 1e3,
        "kv_update_ms_median": statistics.median(kv) * 1e3,
        "mfu": step_flops / step_med / (peak_tflops * 1e12),
        "peak_gib": torch.cuda.max_memory_allocated() / 2**30 if cuda else float("nan"),
        "engine_overhead_ms_median": statistics.median(overhead) * 1e3,
        "raw": {k: v for k, v in run.items() if k != "frames"},
    }


def write_json(path: str | None, header: dict[str, Any], results: dict[str, Any]) -> None:
    if path:
        with open(path, "w") as f:
            json.dump({**header, "results": results}, f, indent=2)


def _par(p: dict[str, Any] | None, is_ref: bool) -> str:
    if p is None:
        return "ref" if is_ref else "—"
    return f"{p['mean_abs_uint8']:.2f}/{p['max_abs_uint8']:.0f}"


def row(name: str, r: dict[str, Any], base: dict[str, Any] | None, reference: str = "") -> str:
    if "error" in r or "skipped" in r:
        what = f"failed: {r['error'][:160]}" if "error" in r else f"skipped: {r['skipped']}"
        return f"| {name} | {what} |" + " |" * 13
    ratio = r["fps"] / base["fps"] if base and "fps" in base else float("nan")
    ident = r.get("graphs_identical")
    ident_s = "—" if ident is None else ("yes" if ident else "**no**")
    vs_ref = r.get("parity_vs_reference")
    return (
        f"| {name} | {r['fps']:.1f} | {ratio:.2f} | {r['first_frame_s']:.2f} | "
        f"{r['step_ms_median']:.1f} ({r['step_ms_p95']:.1f}) | {r['chunk_ms_median']:.0f} "
        f"({r['chunk_ms_p95']:.0f}) | {r['kv_update_ms_median']:.0f} | "
        f"{r['decode_ms_median']:.0f} | {r['mfu']:.0%} | {r['peak_gib']:.1f} | "
        f"{r['engine_overhead_ms_median']:.1f} | {_par(r['parity_vs_baseline'], True)} | "
        f"{_par(vs_ref, name == reference)} | {ident_s} | {r['setup']['attention']} |"
    )


def print_tables(results: dict[str, dict[str, Any]], reference: str) -> None:
    base = results.get("baseline")
    print(
        "| variant | FPS incl. decode | x baseline | first frame s | step ms (p95) | "
        "chunk ms (p95) | KV update ms | decode ms | DiT MFU | peak GiB | engine overhead ms | "
        f"parity vs baseline (mean/max) | vs {reference} | = without graphs | attention |"
    )
    print("| --- " * 15 + "|")
    for name, r in results.items():
        print(row(name, r, base, reference))
    print(
        "\nfirst chunk of a fresh session (device ms): text encode | 4 steps | KV update | decode"
    )
    for name, r in results.items():
        if "fps" not in r:
            continue
        first = r["first_chunk_device_ms"]
        print(
            f"| {name} | {sum(first['text_encode']):.0f} | "
            f"{' + '.join(f'{x:.0f}' for x in first['chunk_step'])} | "
            f"{sum(first['kv_update']):.0f} | {sum(first['vae_decode']):.0f} |"
        )
    graphed = {
        n: r["setup"]["graph_stats"]
        for n, r in results.items()
        if r.get("setup", {}).get("graph_stats")
    }
    for name, stats in graphed.items():
        print(f"CUDA graphs, {name}: {stats}")
