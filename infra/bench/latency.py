"""``dreamrt bench latency``: time to steer through the real server, explained step by step.

Starts ``dreamrt serve`` (a subprocess on a free loopback port; ``--url`` uses a running one)
once per ``--variants`` entry - ``fast`` (the time-to-steer cuts), ``baseline`` (the first
build's input path: ``serve --steering baseline``) or ``server`` (whatever the server does; for
an older checkout given with ``--server-root``) - and runs each ``--scenarios`` entry
(``N`` or ``NxFPS``: N concurrent sessions, optionally at FPS) against it with measuring aiortc
viewers (``infra.bench.latency_probe``). Prints, per variant and scenario, where the time of a
prompt switch and of a key goes (the server's stages: received -> latched -> started ->
generated -> decoded -> enqueued -> sent, then the first changed frame at the viewer), the
session start (create -> offer answered -> connected -> first frame generated -> sent ->
received) and the delivered fps; ``--json`` writes every trial.

    python -m infra.bench.latency                          # CPU smoke: tiny-world, fast
    python -m infra.bench.latency --variants fast,baseline --prompts 12 --actions 12
    python -m infra.bench.latency --device cuda --model wan2.1-1.3b-causal --compile \\
        --random-weights --variants fast,baseline --scenarios 1,3x8

``dreamrt bench gpu-latency`` is this with the H200 latency mode preset
(``infra.bench.gpu_latency``).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import re
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx

if __package__ in (None, ""):  # run as a script: make the repository importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from infra.bench.latency_probe import ProbeConfig, ProbeResult, probe_session
from infra.bench.sim_viewer import percentile
from infra.browser_harness import REPO_ROOT, ServerProcess

__all__ = ["main", "run_variant", "summarize"]

INPUT_STAGES = ("latched", "started", "generated", "decoded", "enqueued", "sent")
START_STAGES = ("offer", "answered", "connected", "generated", "sent")


def _stat(values: list[float | None], q: float) -> float | None:
    return percentile([v for v in values if v is not None], q)


def summarize(results: list[ProbeResult]) -> dict[str, Any]:
    """Medians and tails of every stage over the sessions of one scenario (milliseconds)."""
    out: dict[str, Any] = {"inputs": {}, "start": {}}
    trials = [t for r in results for t in r.trials]
    for kind in ("prompt", "action"):
        mine = [t for t in trials if t["kind"] == kind]
        if not mine:
            continue
        rows: dict[str, Any] = {"n": len(mine)}
        for stage in INPUT_STAGES:
            values = [t["server"].get(f"{stage}_s") for t in mine]
            rows[stage] = (_stat(values, 0.5), _stat(values, 0.95))
        for key in ("received_ms", "applied_ms", "wire_ms", "frame_ms"):
            values = [t[key] for t in mine]
            rows[key] = (_stat(values, 0.5), _stat(values, 0.95))
        dropped = [t["server"].get("dropped_frames") for t in mine]
        dropped = [d for d in dropped if d is not None]
        rows["dropped_frames_mean"] = round(sum(dropped) / len(dropped), 2) if dropped else None
        out["inputs"][kind] = rows
    starts = [r.start for r in results if r.start]
    for stage in START_STAGES:
        values = [s.get("server", {}).get(f"{stage}_s") for s in starts]
        out["start"][stage] = (_stat(values, 0.5), _stat(values, 1.0))
    for key in ("create_ms", "connected_ms", "first_wire_ms", "first_frame_ms"):
        values = [s.get(key) for s in starts]
        out["start"][key] = (_stat(values, 0.5), _stat(values, 1.0))
    after_answer = [
        s["server"]["sent_s"] - s["server"]["answered_s"]
        for s in starts
        if s.get("server", {}).get("sent_s") is not None
        and s["server"].get("answered_s") is not None
    ]
    out["start"]["sent_after_answer"] = (_stat(after_answer, 0.5), _stat(after_answer, 1.0))
    out["fresh_fps"] = round(sum(r.fresh_fps for r in results) / max(1, len(results)), 2)
    out["stall_frames"] = sum(r.stall_frames for r in results)
    out["errors"] = [e for r in results for e in r.errors]
    return out


def _fmt(pair: tuple[float | None, float | None]) -> tuple[str, str]:
    return tuple("—" if v is None else f"{v:.0f}" for v in pair)  # type: ignore[return-value]


def _print(title: str, summary: dict[str, Any], chunk_s: float) -> None:
    print(f"\n{title}")
    inputs = summary["inputs"]
    kinds = [k for k in ("prompt", "action") if k in inputs]
    head = " | ".join(f"{k} p50 | {k} p95" for k in kinds)
    print(f"| ms after the input | {head} |")
    print("| --- |" + " --- |" * (2 * len(kinds)))
    rows = [(f"server: {s}", s) for s in INPUT_STAGES]
    rows += [
        ("viewer: input.received", "received_ms"),
        ("viewer: *.applied", "applied_ms"),
        ("viewer: first changed frame, first packet", "wire_ms"),
        ("viewer: first changed frame decoded (aiortc: +1 frame)", "frame_ms"),
    ]
    for label, key in rows:
        cells = " | ".join(" | ".join(_fmt(inputs[k][key])) for k in kinds)
        print(f"| {label} | {cells} |")
    dropped = " | ".join(f"{inputs[k]['dropped_frames_mean']} | n={inputs[k]['n']}" for k in kinds)
    print(f"| backlog frames dropped (mean) | {dropped} |")
    start = summary["start"]
    print("\n| session start, ms after create | p50 | max |\n| --- | --- | --- |")
    for stage in START_STAGES:
        print(f"| server: {stage} | {' | '.join(_fmt(start[stage]))} |")
    for key, label in (
        ("create_ms", "viewer: create answered"),
        ("connected_ms", "viewer: ICE/DTLS connected"),
        ("first_wire_ms", "viewer: first frame, first packet"),
        ("first_frame_ms", "viewer: first frame decoded (aiortc: +1 frame)"),
        ("sent_after_answer", "server: first frame sent after the answer"),
    ):
        print(f"| {label} | {' | '.join(_fmt(start[key]))} |")
    print(f"\ndelivered {summary['fresh_fps']} fps (fresh frames), {summary['stall_frames']} stall")
    print("frames over the trials. Goals ('sent' is the server's send, 'wire' the")
    print("first packet at this viewer):")
    chunk_ms = 1000 * chunk_s
    for kind, goal in (
        (
            "prompt",
            f"p50 <= one chunk + 150 = {chunk_ms + 150:.0f} ms, p95 <= 1.5 chunks = "
            f"{1.5 * chunk_ms:.0f} ms (CPU tiny-world: p50 <= 450 ms)",
        ),
        ("action", "p50 <= 200 ms in the latency mode"),
    ):
        if kind in inputs:
            sent, wire = _fmt(inputs[kind]["sent"]), _fmt(inputs[kind]["wire_ms"])
            print(
                f"  {kind} -> first changed frame: sent p50 {sent[0]} / p95 {sent[1]} ms, wire "
                f"p50 {wire[0]} / p95 {wire[1]} ms; goal {goal}"
            )
    print(
        f"  first frame sent {_fmt(start['sent_after_answer'])[0]} ms after the offer answer "
        "(goal <= 300 ms)"
    )
    for error in summary["errors"]:
        print(f"  trial failed: {error}")


def _served(url: str) -> dict[str, Any]:
    cards = httpx.get(f"{url}/v1/models", timeout=10.0).json()["data"]
    return next(c for c in cards if c.get("served"))


async def _scenario(url: str, sessions: int, cfg: ProbeConfig) -> list[ProbeResult]:
    return list(await asyncio.gather(*(probe_session(url, cfg, i) for i in range(sessions))))


def _parse_scenarios(text: str) -> list[tuple[int, int | None]]:
    out = []
    for item in text.split(","):
        n, _, fps = item.strip().partition("x")
        out.append((int(n), int(fps) if fps else None))
    return out


def _server_args(args: argparse.Namespace, variant: str) -> tuple[str, ...]:
    extra = ["--device", args.device, "--unwatched-timeout", "0", "--log-level", "warning"]
    extra += ["--max-sessions", str(max(n for n, _ in _parse_scenarios(args.scenarios)))]
    if args.model:
        extra += ["--model", args.model]
    if args.compile:
        extra.append("--compile")
    if args.random_weights:
        extra.append("--random-weights")
    if args.chunk_frames is not None:
        extra += ["--chunk-frames", str(args.chunk_frames)]
    if variant != "server":
        extra += ["--steering", variant]
    return (*extra, *args.server_arg)


def run_variant(args: argparse.Namespace, variant: str, url: str) -> dict[str, Any]:
    """Every ``args.scenarios`` entry against the server at ``url`` (``variant`` names it in
    the printed titles) -> ``{"card", "profile", "scenarios": {"NxFPS": {"summary",
    "sessions"}}}``; prints each scenario's table."""
    card = _served(url)
    profile = card["default_profile"]
    fps = profile["fps"]
    stride = 4 if card.get("family") == "wan" else 1  # the Wan VAE: 4 frames per latent frame
    chunk_s = profile["chunk_latent_frames"] * stride / fps
    can_act = "input.action" in card["capabilities"]
    report: dict[str, Any] = {"card": card["id"], "profile": profile, "scenarios": {}}
    for sessions, scenario_fps in _parse_scenarios(args.scenarios):
        cfg = ProbeConfig(
            prompts=tuple(card.get("examples") or ["a red ball on grass", "a blue square"]),
            num_prompts=args.prompts,
            num_actions=args.actions if can_act else 0,
            chunk_s=chunk_s * fps / (scenario_fps or fps),
            fps=scenario_fps,
            start="" if args.start == "none" else args.start,
            warmup_s=args.warmup_s,
            gap_s=args.gap_s,
            seed=args.seed,
        )
        results = asyncio.run(_scenario(url, sessions, cfg))
        summary = summarize(results)
        name = f"{sessions}x{scenario_fps or fps}"
        title = (
            f"time to steer: {variant}, {card['id']} {profile['width']}x{profile['height']}, "
            f"{name} (sessions x fps), chunks of {profile['chunk_latent_frames']} latent frames "
            f"= {cfg.chunk_s:.3f} s, start {args.start}"
        )
        _print(title, summary, cfg.chunk_s)
        report["scenarios"][name] = {
            "summary": summary,
            "sessions": [r.__dict__ for r in results],
        }
    return report


def _log_findings(text: str, ready_at: str = "") -> dict[str, Any]:
    """What the server's log says went wrong while it served: event-loop stalls (their
    lengths, ``server.ops.loop_watchdog``) and dynamo recompiles after ``ready_at`` (the time of
    day, ``HH:MM:SS``, the server answered its health check; with ``TORCH_LOGS=recompiles``:
    the warm-up's own compiles before it are expected)."""
    stalls = [float(m) for m in re.findall(r"event loop stood still for ([0-9.]+) s", text)]
    recompiles = [
        f"{clock} {fn} {where}"
        for clock, fn, where in re.findall(
            r"^V\d{4} (\d\d:\d\d:\d\d)\S* .*Recompiling function (\S+) in (\S+)", text, re.M
        )
        if clock >= ready_at
    ]
    findings = {"stalls_s": stalls, "recompiles_after_ready": recompiles}
    if stalls or recompiles:
        print(f"server log: {len(stalls)} event-loop stalls {stalls}, {len(recompiles)} recompiles")
    return findings


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="dreamrt bench latency", description=__doc__)
    parser.add_argument("--url", default=None, help="a running server (default: start one)")
    parser.add_argument("--server-root", type=Path, default=REPO_ROOT, help="checkout to serve")
    parser.add_argument("--model", default=None)
    parser.add_argument("--device", default="cpu", choices=["cpu", "cuda", "auto"])
    parser.add_argument("--compile", action="store_true")
    parser.add_argument("--random-weights", action="store_true")
    parser.add_argument("--chunk-frames", type=int, default=None)
    parser.add_argument("--variants", default="fast", help="fast, baseline, server (comma list)")
    parser.add_argument("--scenarios", default="1", help="sessions[xFPS], comma list: 1,3x8")
    parser.add_argument("--prompts", type=int, default=6, help="prompt switches per session")
    parser.add_argument("--actions", type=int, default=6, help="key changes per session")
    parser.add_argument("--start", default="now", choices=["now", "viewer", "none"])
    parser.add_argument("--warmup-s", type=float, default=2.0)
    parser.add_argument("--gap-s", type=float, default=0.6, help="pause before each input")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--server-arg", action="append", default=[], help="extra serve argument")
    parser.add_argument("--startup-timeout-s", type=float, default=240.0)
    parser.add_argument("--json", type=Path, default=None)
    parser.add_argument("--keep-logs", type=Path, default=None, help="copy server logs here")
    args = parser.parse_args(argv)
    variants = [v.strip() for v in args.variants.split(",") if v.strip()]
    report: dict[str, Any] = {"argv": argv, "variants": {}}
    if args.url is not None:
        report["variants"]["server"] = run_variant(args, "server", args.url.rstrip("/"))
    else:
        with tempfile.TemporaryDirectory(prefix="dreamrt-latency-") as tmp:
            for variant in variants:
                root = Path(tmp) / variant
                server = ServerProcess(
                    root / "data",
                    root / "server.log",
                    extra_args=_server_args(args, variant),
                    cwd=args.server_root,
                )
                began_s = time.monotonic()
                server.start(timeout_s=args.startup_timeout_s)
                ready_at = time.strftime("%H:%M:%S")
                print(f"\n{variant}: server ready after {time.monotonic() - began_s:.1f} s")
                try:
                    report["variants"][variant] = run_variant(args, variant, server.url)
                finally:
                    server.stop()
                    log_text = (root / "server.log").read_text(errors="replace")
                    if variant in report["variants"]:
                        findings = _log_findings(log_text, ready_at)
                        report["variants"][variant]["server_log"] = findings
                    if args.keep_logs is not None:
                        args.keep_logs.mkdir(parents=True, exist_ok=True)
                        (args.keep_logs / f"server-{variant}.log").write_text(log_text)
    if args.json is not None:
        args.json.write_text(json.dumps(report, indent=1, default=str))
        print(f"\nwrote {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
