"""``dreamrt bench capacity``: how many live sessions one GPU serves, through the real server.

For each ``--setups`` entry a fresh ``dreamrt serve`` (subprocess, loopback) with admission on,
then sessions of that setup's profile are asked for one at a time, each watched by a real aiortc
viewer (``clients.python.viewer``), ``--ramp-s`` apart, until the server refuses one (503 +
``Retry-After``: admission) or ``--max-sessions`` are up. Every admitted session is then
watched for ``--seconds`` while its viewer switches prompts every ``--switch-every-s`` (3.5 s;
0: never), the sessions' switches spread over the period; per viewer:

- delivered fps: fresh frames (not stall repeats) over the window;
- stalls per minute: gaps between fresh frames longer than ``STALL_FACTOR`` x the nominal
  interval (a viewer sees the picture stand still);
- p95 frame interval of fresh frames, against the nominal 1/fps.

A setup is ``NAME=WxH@FPS[/DECODER][;serve args]``: the profile of its sessions, the decoder they
ask for (``"decoder"`` of ``POST /v1/sessions``) and the extra ``dreamrt serve`` arguments of its
server (``--kv-cache fp8`` ...), for instance ``"full=832x480@16"``, ``"tiny=832x480@16/tiny"``.
Prints one table last; ``--json`` writes every viewer's numbers and the server log's stalls and
compiles.

    python -m infra.bench.capacity --model wan2.1-1.3b-causal --compile --random-weights \\
        --setups "full=832x480@16,small=480x272@16" --seconds 30
    python -m infra.bench.capacity                         # CPU smoke: tiny-world
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import json
import re
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

if __package__ in (None, ""):  # run as a script: make the repository importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import httpx

from clients.python.api import ApiCallError, DreamrtClient
from clients.python.viewer import Viewer
from infra.browser_harness import ServerProcess

__all__ = [
    "Setup",
    "admitted_load",
    "compiles_after_ready",
    "frame_stats",
    "load_cell",
    "main",
    "parse_setup",
    "refusal_reason",
    "run_setup",
    "engine_time",
    "setup_rows",
    "time_per_minute",
    "time_rows",
    "trace_line",
]

STALL_FACTOR = 2.0  # a fresh-frame gap this many nominal intervals long is a stall
_SETUP = re.compile(
    r"^(?P<name>[\w.-]+)=(?:(?P<w>\d+)x(?P<h>\d+))?(?:@(?P<fps>\d+))?(?:/(?P<decoder>full|tiny))?$"
)


@dataclass(frozen=True, slots=True)
class Setup:
    """One server configuration and the profile its sessions ask for (None: the card's)."""

    name: str
    width: int | None = None
    height: int | None = None
    fps: int | None = None
    serve_args: tuple[str, ...] = ()
    decoder: str | None = None  # the sessions' decoder ("full" | "tiny"); None: the card's


def parse_setup(text: str) -> Setup:
    """``NAME=WxH@FPS[/DECODER][;serve args]`` -> ``Setup`` (``ValueError`` names what is
    wrong)."""
    head, _, rest = text.partition(";")
    match = _SETUP.match(head.strip())
    if match is None:
        raise ValueError(f"setup {text!r}: expected NAME=WxH@FPS[/DECODER][;serve args]")
    ints = {k: int(match[k]) if match[k] else None for k in ("w", "h", "fps")}
    return Setup(
        match["name"], ints["w"], ints["h"], ints["fps"], tuple(rest.split()), match["decoder"]
    )


def frame_stats(received_s: list[float], fps: int, window_s: float) -> dict[str, float]:
    """Delivered fps, stalls per minute and interval percentiles of fresh frames received at
    ``received_s`` (monotonic seconds, ascending) over a window of ``window_s``."""
    gaps = [b - a for a, b in zip(received_s, received_s[1:], strict=False)]
    nominal = 1.0 / fps
    stalls = sum(1 for g in gaps if g > STALL_FACTOR * nominal)
    ordered = sorted(gaps)

    def pct(q: float) -> float:
        return ordered[min(len(ordered) - 1, int(q * len(ordered)))] if ordered else float("nan")

    return {
        "fps": round(len(received_s) / window_s, 2) if window_s > 0 else 0.0,
        "stalls_per_min": round(60.0 * stalls / window_s, 2) if window_s > 0 else 0.0,
        "p50_interval_ms": round(1000 * pct(0.5), 1),
        "p95_interval_ms": round(1000 * pct(0.95), 1),
        "max_interval_ms": round(1000 * ordered[-1], 1) if ordered else float("nan"),
        "p95_over_nominal": round(pct(0.95) / nominal, 3) if ordered else float("nan"),
    }


def _by_kind(text: str, series: str) -> dict[str, float]:
    """The values of ``series{kind="..."}`` in a ``/metrics`` page, by kind."""
    prefix = f"{series}{{kind="
    return {
        line[len(prefix) :].split('"')[1]: float(line.rsplit(" ", 1)[1])
        for line in text.splitlines()
        if line.startswith(prefix)
    }


def compiles_after_ready(url: str) -> dict[str, float]:
    """``dreamrt_compiles_after_ready_total`` by kind, read from ``/metrics``."""
    text = httpx.get(f"{url}/metrics", timeout=10.0).text
    return _by_kind(text, "dreamrt_compiles_after_ready_total")


def engine_time(url: str) -> dict[str, tuple[float, float]]:
    """Per plan kind the executor's calls and their wall seconds so far (``/metrics``:
    ``dreamrt_engine_batches_total``, ``dreamrt_engine_batch_seconds_total``)."""
    text = httpx.get(f"{url}/metrics", timeout=10.0).text
    calls = _by_kind(text, "dreamrt_engine_batches_total")
    seconds = _by_kind(text, "dreamrt_engine_batch_seconds_total")
    return {kind: (n, seconds.get(kind, 0.0)) for kind, n in calls.items()}


def time_per_minute(
    before: dict[str, tuple[float, float]], after: dict[str, tuple[float, float]], window_s: float
) -> dict[str, dict[str, float]]:
    """What each plan kind took of the executor between two ``engine_time`` reads, per minute
    of ``window_s``: ``calls`` and ``seconds`` (kinds that ran)."""
    scale = 60.0 / window_s if window_s > 0 else 0.0
    out = {}
    for kind, (calls, seconds) in sorted(after.items()):
        calls_0, seconds_0 = before.get(kind, (0.0, 0.0))
        if calls > calls_0:
            out[kind] = {
                "calls": round(scale * (calls - calls_0), 1),
                "seconds": round(scale * (seconds - seconds_0), 2),
            }
    return out


def time_rows(results: list[tuple[str, str, dict[str, Any]]], *, first: str) -> list[str]:
    """Where the executor's time went during each setup's watch: seconds per minute and calls
    per minute by plan kind (``time_per_minute``), e.g. what prompt switches add in
    ``text_encode`` and ``kv_recache`` and what a restart adds in ``chunk_step``."""
    kinds = sorted({k for _, _, r in results for k in r.get("engine_per_min", {})})
    lines = [
        f"| {first} | setup | " + " | ".join(f"{k} s/min (calls)" for k in kinds) + " |",
        "| --- | --- | " + " | ".join("---" for _ in kinds) + " |",
    ]
    for head, name, r in results:
        per = r.get("engine_per_min", {})
        cells = [f"{per[k]['seconds']} ({per[k]['calls']:.0f})" if k in per else "-" for k in kinds]
        lines.append(f"| {head} | {name} | " + " | ".join(cells) + " |")
    return lines


def admitted_load(url: str) -> dict[str, float]:
    """What admission holds now (``GET /v1/deployment``'s ``load``): the reserved GPU-s/s,
    the part of it that steering throws away (``--steering-cost``) and the capacity."""
    load = httpx.get(f"{url}/v1/deployment", timeout=10.0).json()["load"]
    keys = ("compute_gpu_s_per_s", "steering_gpu_s_per_s", "compute_capacity")
    return {key: float(load.get(key, 0.0)) for key in keys}


def load_cell(load: dict[str, float] | None) -> str:
    """``0.823 (0.051)``: the load admission held at the end of the watch (steering's part)."""
    if not load:
        return "-"
    return f"{load['compute_gpu_s_per_s']:.3f} ({load['steering_gpu_s_per_s']:.3f})"


def refusal_reason(refusal: dict[str, Any] | None) -> str:
    """A refusal's reason in a table cell: its code and the admission's sum (``no capacity
    for another session: compute (ses_x: 0.732+0.719 GPU-s/s > 0.900)`` -> ``capacity:
    compute 0.732+0.719 GPU-s/s > 0.900``); ``-`` for none."""
    if refusal is None:
        return "-"
    code = refusal.get("code") or "?"
    message = str(refusal.get("message") or "")
    match = re.search(r":\s*(\w+) \((?:\w+: )?([^)]*)\)", message)
    return f"{code}: {match[1]} {match[2]}" if match else str(code)


def setup_rows(results: list[tuple[str, str, dict[str, Any]]], *, first: str) -> list[str]:
    """The table of ``(server or setup, setup, run_setup's result)`` rows: per setup admitted,
    fps each at the viewer, the worst stalls/min, p95 and max frame interval, why the next
    session was refused, the load admission held at the end of the watch (steering's part in
    parentheses) and the compiles after ready once the setup ended."""
    lines = [
        f"| {first} | setup | admitted | fps each | stalls/min max | p95 ms max | max interval ms"
        " | refused with | load (steering) GPU-s/s | compiles after ready |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for head, name, r in results:
        if "error" in r:
            lines.append(f"| {head} | {name} | | error: {r['error'][:80]} | | | | | | |")
            continue
        s = r["sessions"]
        compiles = r.get("compiles_after_ready")
        lines.append(
            f"| {head} | {name} | {r['admitted']} | {[x['fps'] for x in s]} | "
            f"{max((x['stalls_per_min'] for x in s), default=0)} | "
            f"{max((x['p95_interval_ms'] for x in s), default=0)} | "
            f"{max((x['max_interval_ms'] for x in s), default=0)} | "
            f"{refusal_reason(r['refusal'])} | {load_cell(r.get('load'))} | "
            f"{'-' if compiles is None else int(sum(compiles.values()))} |"
        )
    return lines


@dataclass
class _Watched:
    session_id: str
    viewer: Viewer
    api: DreamrtClient
    profile: dict[str, int] = field(default_factory=dict)


async def _open(url: str, setup: Setup, index: int, timeout_s: float) -> _Watched | ApiCallError:
    api = DreamrtClient(url)
    await api.__aenter__()
    params: dict[str, int | str | None] = {
        "fps": setup.fps,
        "width": setup.width,
        "height": setup.height,
        "seed": index,
        "decoder": setup.decoder,
    }
    try:
        created = await api.create_session(f"capacity probe {index}: a red ball on grass", **params)
    except ApiCallError as exc:
        await api.__aexit__(None, None, None)
        return exc
    viewer = Viewer(api)
    viewer.profile = created["profile"]  # a joined session: fresh_frames needs its fps
    await viewer.connect(session_id=created["id"], timeout_s=timeout_s)
    await viewer.wait_first_frame(timeout_s)
    return _Watched(created["id"], viewer, api, created["profile"])


async def run_setup(url: str, setup: Setup, args: argparse.Namespace) -> dict[str, Any]:
    watched: list[_Watched] = []
    refusal: dict[str, Any] | None = None
    try:
        while len(watched) < args.max_sessions:
            got = await _open(url, setup, len(watched), args.timeout_s)
            if isinstance(got, ApiCallError):
                refusal = {
                    "status": got.status,
                    "code": got.code,
                    "message": got.message,
                    "retry_after_s": got.retry_after_s,
                }
                print(f"  {setup.name}: refused: {refusal}", flush=True)
                break
            watched.append(got)
            print(f"  {setup.name}: session {len(watched)} admitted ({got.profile})", flush=True)
            await asyncio.sleep(args.ramp_s)
        before = await asyncio.to_thread(engine_time, url)
        begin = time.monotonic()
        marks = [len(w.viewer.fresh_frames()) for w in watched]
        every_s = float(getattr(args, "switch_every_s", 0.0))
        switching = [
            asyncio.create_task(_switch_prompts(w, k, len(watched), every_s, begin + args.seconds))
            for k, w in enumerate(watched)
            if every_s > 0
        ]
        trace_s = float(getattr(args, "trace_s", 0.0))
        tracing = asyncio.create_task(_trace(url, trace_s, args.seconds / 3)) if trace_s else None
        await asyncio.sleep(args.seconds)
        end = time.monotonic()
        engine_per_min = time_per_minute(
            before, await asyncio.to_thread(engine_time, url), end - begin
        )
        switches = [await task for task in switching] or [0] * len(watched)
        trace = None if tracing is None else await tracing
        load = await asyncio.to_thread(admitted_load, url)
        sessions: list[dict[str, Any]] = []
        for w, mark in zip(watched, marks, strict=True):
            fresh = [f.received_s for f in w.viewer.fresh_frames()[mark:] if f.received_s <= end]
            stats = frame_stats(fresh, w.profile["fps"], end - begin)
            info = await w.api.session(w.session_id)
            sessions.append(
                {
                    "id": w.session_id,
                    "profile": w.profile,
                    **stats,
                    "prompt_switches": switches[len(sessions)],
                    "server": _subset(info),
                }
            )
    finally:
        for w in watched:
            await w.viewer.close(delete=False)
            try:
                await w.api.delete_session(w.session_id)
            finally:
                await w.api.__aexit__(None, None, None)
    return {
        "setup": dataclasses.asdict(setup),
        "admitted": len(watched),
        "refusal": refusal,
        "sessions": sessions,
        "engine_per_min": engine_per_min,
        "load": load,
        "trace": trace,
        "compiles_after_ready": await asyncio.to_thread(compiles_after_ready, url),
    }


async def _switch_prompts(w: _Watched, index: int, count: int, every_s: float, until: float) -> int:
    """Switch ``w``'s prompt every ``every_s`` until ``until`` (monotonic), the sessions'
    switches spread over the period (a viewer steering, as users do) -> switches sent."""
    await asyncio.sleep(every_s * (index + 1) / max(count, 1))
    sent = 0
    while time.monotonic() + 0.5 < until:
        scene = ("a red ball on grass", "a blue square on sand", "a green cone in snow")[sent % 3]
        await w.api.prompt(w.session_id, f"capacity probe {index}: {scene}")
        sent += 1
        await asyncio.sleep(every_s)
    return sent


async def _trace(url: str, seconds: float, after_s: float) -> dict[str, Any]:
    """``POST /v1/profile`` for ``seconds``, ``after_s`` into the watch -> its summary (the
    Chrome trace stays on the server's machine, under its data dir), or the error."""
    await asyncio.sleep(after_s)
    async with httpx.AsyncClient(timeout=seconds + 60.0) as http:
        got = await http.post(f"{url}/v1/profile", json={"seconds": seconds})
    return got.json() if got.status_code == 200 else {"error": f"{got.status_code} {got.text}"}


def trace_line(name: str, trace: dict[str, Any] | None) -> str:
    """One line of a setup's trace: executor and device busy, the device's idle time and its
    longest gaps between kernels, the longest kernel."""
    if not trace:
        return f"{name}: no trace"
    if "error" in trace:
        return f"{name}: trace failed: {trace['error'][:120]}"
    line = (
        f"{name}: {trace['window_s']:.2f}-s trace, {trace['batches']} batches, executor busy "
        f"{trace['executor_busy_fraction']:.0%}"
    )
    device = trace.get("device")
    if device:
        top = device["top_kernels"][0]["name"][:60] if device["top_kernels"] else "-"
        line += (
            f", device busy {device['busy_fraction']:.0%} ({device['kernels']} kernels, idle "
            f"{device['idle_s']:.3f} s, longest gaps {device['longest_gaps_ms'][:3]} ms; "
            f"longest kernel {top})"
        )
    return f"{line}; {trace['trace']}"


def _subset(info: dict[str, Any]) -> dict[str, Any]:
    keys = (
        "frames_sent",
        "stalls",
        "fps_measured",
        "media_dropped",
        "media_flushed",
        "decoder",
        "chunks",
    )
    return {k: info[k] for k in keys if k in info}


def _server_args(args: argparse.Namespace, setup: Setup) -> tuple[str, ...]:
    extra = ["--device", args.device, "--unwatched-timeout", "0", "--log-level", "warning"]
    extra += ["--max-sessions", str(args.max_sessions)]
    if args.model:
        extra += ["--model", args.model]
    if args.compile:
        extra.append("--compile")
    if args.random_weights:
        extra.append("--random-weights")
    return (*extra, *args.server_arg, *setup.serve_args)


def _log_findings(text: str) -> dict[str, Any]:
    stalls = [float(m) for m in re.findall(r"event loop stood still for ([0-9.]+) s", text)]
    compiles = re.findall(r"compiles after ready[^\n]*", text)
    return {"event_loop_stalls_s": stalls, "compile_lines": compiles[:20]}


def _print(report: dict[str, Any]) -> None:
    print()
    rows = [(f"{r.get('ready_s', 0):.0f} s", name, r) for name, r in report["setups"].items()]
    for line in setup_rows(rows, first="ready"):
        print(line)
    print()
    for line in time_rows(rows, first="ready"):
        print(line)
    for name, r in report["setups"].items():
        if r.get("trace") is not None:  # asked for (--trace-s): its line, or why it failed
            print(trace_line(name, r["trace"]))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--setups", default="default=", help="NAME=WxH@FPS[/DECODER][;serve args], ..."
    )
    parser.add_argument("--model", default=None)
    parser.add_argument("--device", default="cpu", choices=["cpu", "cuda", "auto"])
    parser.add_argument("--compile", action="store_true")
    parser.add_argument("--random-weights", action="store_true")
    parser.add_argument("--max-sessions", type=int, default=8)
    parser.add_argument("--ramp-s", type=float, default=3.0)
    parser.add_argument("--seconds", type=float, default=20.0)
    parser.add_argument(
        "--switch-every-s", type=float, default=3.5, help="prompt switch period (0: none)"
    )
    parser.add_argument(
        "--trace-s", type=float, default=0.0, help="POST /v1/profile this long in each watch"
    )
    parser.add_argument("--timeout-s", type=float, default=60.0)
    parser.add_argument("--startup-timeout-s", type=float, default=300.0)
    parser.add_argument("--server-arg", action="append", default=[], help="serve argument, all")
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args(argv)
    setups = [parse_setup(s) for s in args.setups.split(",") if s.strip()]
    report: dict[str, Any] = {"argv": argv or sys.argv[1:], "setups": {}}
    with tempfile.TemporaryDirectory(prefix="dreamrt-capacity-") as tmp:
        for setup in setups:
            root = Path(tmp) / setup.name
            server = ServerProcess(
                root / "data", root / "server.log", extra_args=_server_args(args, setup)
            )
            began = time.monotonic()
            try:
                server.start(timeout_s=args.startup_timeout_s)
                ready_s = time.monotonic() - began
                print(f"\n{setup.name}: server ready after {ready_s:.1f} s", flush=True)
                result = asyncio.run(run_setup(server.url, setup, args))
                result["ready_s"] = ready_s
            except Exception as exc:  # a setup that cannot run: the others still do
                result = {"error": f"{type(exc).__name__}: {exc}"}
            finally:
                server.stop()
            log_text = (root / "server.log").read_text(errors="replace")
            result["server_log"] = _log_findings(log_text)
            report["setups"][setup.name] = result
            if args.json is not None:
                args.json.write_text(json.dumps(report, indent=1, default=str))
    _print(report)
    return 0


if __name__ == "__main__":
    sys.exit(main())
