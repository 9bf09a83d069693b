"""``dreamrt bench warm-serving``: what a compiled server costs to start, and whether anything
compiles once it is ready.

One run, up to three servers (``dreamrt serve --compile``, subprocesses on loopback), all given
one ``--compile-cache`` directory:

1. **fresh**: ready time with an empty compile cache (with ``--empty-local-caches``, Inductor's
   and Triton's default caches are emptied before each server too, as on a new machine). Then
   the ``--setups`` of ``infra.bench.capacity`` on this server (sessions per GPU with admission
   on; each waits until admission is no longer tightened by earlier deadline misses). Then the
   mixed scenario (unless ``--mixed-on`` leaves ``fresh`` out): one session at the card's
   profile watched by a real aiortc viewer; after ``--baseline-s`` a t2v job of
   ``--job-frames`` is submitted, and the session's fresh frames are timed until the job ends
   (delivered fps, p95 and max frame interval, against the baseline window); then the same
   job alone, for the job's time against alone.
   ``dreamrt_compiles_after_ready_total`` is read at ready, after the mixed scenario and at the
   end.
2. **cached**: the same card and ``--compile-cache`` again: the ready time of a restart (of a
   "fresh machine" that mounts the cache, with ``--empty-local-caches``), then its
   ``--cached-setups`` and (``--mixed-on cached``) the mixed scenario. With ``--cache DIR``
   the cached phase may run in a later invocation than the fresh one (``--phases cached``).
   On either server, ``--latency-on`` adds one session's time to steer (``infra.bench.latency``:
   prompt -> applied, first frame) after the setups.
3. optional ``--second-model``: another card on the same cache directory (a cache of its own
   within it: the key names the card), its ready time and its ``--second-setups``.

Prints one table last; ``--json`` writes everything, with each server log's stalls and the
lines that report a compile outside the set.

    python -m infra.bench.warm_serving --model wan2.1-1.3b-causal --device cuda \\
        --random-weights --setups "full=832x480@16,tiny=832x480@16/tiny,small=480x272@16"
    python -m infra.bench.warm_serving          # CPU smoke: the tiny random Wan card
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

if __package__ in (None, ""):  # run as a script: make the repository importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import httpx

from clients.python.api import DreamrtClient
from clients.python.viewer import Viewer
from infra.bench.capacity import (
    compiles_after_ready,
    frame_stats,
    parse_setup,
    run_setup,
    setup_rows,
    time_rows,
    trace_line,
)
from infra.bench.latency import run_variant
from infra.browser_harness import ServerProcess

__all__ = ["compiles_after_ready", "main"]

_DONE = ("succeeded", "failed", "cancelled")


def _empty_local_caches() -> list[str]:
    """Inductor's and Triton's default caches on this machine (not ``--compile-cache``)."""
    from torch._inductor.runtime.cache_dir_utils import default_cache_dir

    gone = []
    for path in (Path(default_cache_dir()), Path.home() / ".triton" / "cache"):
        if path.exists():
            shutil.rmtree(path, ignore_errors=True)
            gone.append(str(path))
    return gone


async def _finish(api: DreamrtClient, job_id: str, timeout_s: float) -> dict[str, Any]:
    deadline = time.monotonic() + timeout_s
    while (job := await api.job(job_id))["state"] not in _DONE:
        if time.monotonic() > deadline:
            return {**job, "state": f"still {job['state']} after {timeout_s:.0f} s"}
        await asyncio.sleep(0.1)
    return job


async def _mixed(url: str, args: argparse.Namespace) -> dict[str, Any]:
    """One watched session, a job beside it, then the job alone (module docstring)."""
    async with DreamrtClient(url) as api:
        viewer = Viewer(api)
        created_s = time.monotonic()
        try:
            await viewer.connect("a lantern-lit canal town at dusk", seed=1)
            await viewer.wait_first_frame(args.timeout_s)
            first_frame_s = viewer.frames[0].received_s - created_s
            fps = viewer.profile["fps"]
            await asyncio.sleep(args.baseline_s)
            job_began = time.monotonic()
            job_id = await api.submit_job(
                "t2v", "a red kite over the sea", num_frames=args.job_frames, seed=2
            )
            job = await _finish(api, job_id, args.job_timeout_s)
            job_s = time.monotonic() - job_began
            fresh = [f.received_s for f in viewer.fresh_frames()]
            baseline = [t for t in fresh if job_began - args.baseline_s <= t < job_began]
            during = [t for t in fresh if job_began <= t < job_began + job_s]
            sid = viewer.session_id
        finally:
            await viewer.close()
        alone_began = time.monotonic()
        alone_id = await api.submit_job(
            "t2v", "a red kite over the sea", num_frames=args.job_frames, seed=2
        )
        alone = await _finish(api, alone_id, args.job_timeout_s)
        alone_s = time.monotonic() - alone_began
    return {
        "session": sid,
        "first_frame_s": round(first_frame_s, 3),
        "baseline": frame_stats(baseline, fps, args.baseline_s),
        "during_job": frame_stats(during, fps, job_s),
        "job": {"id": job_id, "state": job["state"], "seconds": round(job_s, 2)},
        "job_alone": {"id": alone_id, "state": alone["state"], "seconds": round(alone_s, 2)},
    }


def _serve_args(args: argparse.Namespace, model: str | None, cache: Path) -> tuple[str, ...]:
    extra = ["--device", args.device, "--compile", "--compile-cache", str(cache)]
    extra += ["--unwatched-timeout", "0", "--max-sessions", str(args.max_sessions)]
    if model:
        extra += ["--model", model]
    if args.random_weights:
        extra.append("--random-weights")
    return (*extra, *args.server_arg)


def _log_findings(path: Path) -> dict[str, Any]:
    text = path.read_text(errors="replace") if path.exists() else ""
    lines = text.splitlines()
    return {
        "stall_lines": [ln for ln in lines if "event loop stood still" in ln][:20],
        "outside_set_lines": [ln for ln in lines if "outside the compiled set" in ln][:20],
        "warm_up_lines": [ln for ln in lines if "warm-up done" in ln or "compile cache:" in ln],
        "tracebacks": text.count("Traceback"),
    }


def _server(
    root: Path, name: str, args: argparse.Namespace, model: str | None, cache: Path, log: Path
) -> tuple[ServerProcess, float]:
    server = ServerProcess(root / name / "data", log, extra_args=_serve_args(args, model, cache))
    began = time.monotonic()
    server.start(timeout_s=args.startup_timeout_s)
    ready_s = time.monotonic() - began
    print(f"{name}: ready after {ready_s:.1f} s", flush=True)
    return server, ready_s


def _phase(
    root: Path,
    name: str,
    args: argparse.Namespace,
    model: str | None,
    cache: Path,
    work: Any,
    report: dict[str, Any],
    save: Any,
) -> None:
    """Start a server, run ``work(url, result, save)`` against it (it fills ``result`` and
    saves as it goes, so a run cut short keeps what it measured), stop it; errors are
    recorded."""
    emptied = _empty_local_caches() if args.empty_local_caches else []
    result: dict[str, Any] = {"model": model, "emptied": emptied}
    report["phases"][name] = result
    # straight into --keep-logs when given: a run cut short still leaves its servers' logs
    keep = args.keep_logs
    log = keep / f"warm_serving_{name}.log" if keep is not None else root / name / "server.log"
    server = None
    try:
        server, result["ready_s"] = _server(root, name, args, model, cache, log)
        result["compiles_at_ready"] = compiles_after_ready(server.url)
        save()
        work(server.url, result, save)
        result["compiles_at_end"] = compiles_after_ready(server.url)
    except Exception as exc:  # a phase that fails leaves the others' results
        result["error"] = f"{type(exc).__name__}: {exc}"[-2000:]
        print(f"{name}: {result['error']}", flush=True)
    finally:
        if server is not None:
            server.stop(timeout_s=30.0)
    result["log"] = _log_findings(log)
    save()


def _untightened(url: str, timeout_s: float = 45.0) -> float:
    """Wait until admission's capacity is not lowered by recent deadline misses (they age out:
    ``runtime.admission``) -> seconds waited; a setup then measures the full capacity."""
    began = time.monotonic()
    while time.monotonic() - began < timeout_s:
        load = httpx.get(f"{url}/v1/deployment", timeout=10.0).json()["load"]
        if not load["tightened"]:
            break
        time.sleep(1.0)
    return round(time.monotonic() - began, 1)


def _run_setups(url: str, text: str, args: argparse.Namespace, result: dict, save: Any) -> None:
    """The capacity setups against ``url``, one after another, each saved as it ends."""
    done = result.setdefault("setups", {})
    for setup in (parse_setup(t) for t in text.split(",") if t.strip()):
        waited_s = _untightened(url)
        got = asyncio.run(run_setup(url, setup, args))
        done[setup.name] = {**got, "waited_untightened_s": waited_s}
        fps = [x["fps"] for x in got["sessions"]]
        print(
            f"  {setup.name}: {got['admitted']} admitted, fps {fps}, refusal {got['refusal']}"
            f" (waited {waited_s} s for an untightened admission)",
            flush=True,
        )
        save()


def _time_to_steer(url: str, args: argparse.Namespace) -> dict[str, Any]:
    """One session's time to steer (``infra.bench.latency``: ``--prompts`` switches, keys
    where the card takes them) -> the summary: stage medians and tails, the session start."""
    probe = argparse.Namespace(
        scenarios="1",
        prompts=args.prompts,
        actions=args.prompts,
        start="now",
        warmup_s=2.0,
        gap_s=0.6,
        seed=0,
    )
    report = run_variant(probe, "server", url)
    return next(iter(report["scenarios"].values()))["summary"]


def _serving_work(
    args: argparse.Namespace, setups: str, mixed_too: bool, latency_too: bool = False
) -> Any:
    """The capacity ``setups``, then (``latency_too``) one session's time to steer, then
    (``mixed_too``) the mixed scenario."""

    def work(url: str, result: dict[str, Any], save: Any) -> None:
        if setups:  # first: the mixed scenario's deadline misses would lower capacity
            _run_setups(url, setups, args, result, save)
        if latency_too:
            steer = result["time_to_steer"] = _time_to_steer(url, args)
            prompt = steer["inputs"].get("prompt", {})
            print(
                f"  time to steer: prompt -> applied p50/p95 {prompt.get('applied_ms')} ms, "
                f"first frame p50/max {steer['start']['first_frame_ms']} ms",
                flush=True,
            )
            save()
        if not mixed_too:
            return
        mixed = result["mixed"] = asyncio.run(_mixed(url, args))
        result["compiles_after_mixed"] = compiles_after_ready(url)
        print(
            f"  mixed: first frame {mixed['first_frame_s']} s; session {mixed['baseline']} "
            f"before the job, {mixed['during_job']} during it; job {mixed['job']}, alone "
            f"{mixed['job_alone']}; compiles {result['compiles_after_mixed']}",
            flush=True,
        )
        save()

    return work


def _print(report: dict[str, Any]) -> None:
    print("\n| server | ready s | compiles at ready / at end | outside-set log lines |")
    print("| --- | --- | --- | --- |")
    for name, r in report["phases"].items():
        print(
            f"| {name} | {r.get('ready_s', float('nan')):.1f} | {r.get('compiles_at_ready')} / "
            f"{r.get('compiles_at_end')} | {len(r['log']['outside_set_lines'])} |"
            + (f" error: {r['error'][:100]}" if "error" in r else "")
        )
    for name, r in report["phases"].items():
        steer = r.get("time_to_steer")
        if steer:
            prompt = steer["inputs"].get("prompt", {})
            print(
                f"\n{name} server, time to steer: prompt -> applied p50/p95 "
                f"{prompt.get('applied_ms')} ms over {prompt.get('n', 0)} switches; first frame "
                f"after create + offer p50/max {steer['start']['first_frame_ms']} ms"
            )
    for name, r in report["phases"].items():
        mixed = r.get("mixed")
        if not mixed:
            continue
        b, d = mixed["baseline"], mixed["during_job"]
        print(
            f"\n| {name} server: session | fps | p95 interval ms | max interval ms | stalls/min |"
        )
        print("| --- | --- | --- | --- | --- |")
        for label, s in (("before the job", b), ("during the job", d)):
            print(
                f"| {label} | {s['fps']} | {s['p95_interval_ms']} | {s['max_interval_ms']} | "
                f"{s['stalls_per_min']} |"
            )
        print(
            f"job {mixed['job']['state']} in {mixed['job']['seconds']} s beside the session, "
            f"{mixed['job_alone']['seconds']} s alone; first frame {mixed['first_frame_s']} s; "
            f"compiles after it {r.get('compiles_after_mixed')}"
        )
    rows = [
        (name, setup, s)
        for name, r in report["phases"].items()
        for setup, s in r.get("setups", {}).items()
    ]
    for table in (setup_rows, time_rows):
        print()
        for line in table(rows, first="server"):
            print(line)
    for _, setup, r in rows:
        if r.get("trace"):
            print(trace_line(setup, r["trace"]))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="dreamrt bench warm-serving", description=__doc__)
    parser.add_argument("--model", default="wan-tiny-random")
    parser.add_argument("--device", default="cpu", choices=["cpu", "cuda", "auto"])
    parser.add_argument("--random-weights", action="store_true")
    parser.add_argument("--max-sessions", type=int, default=6)
    parser.add_argument("--baseline-s", type=float, default=5.0)
    parser.add_argument("--job-frames", type=int, default=241)
    parser.add_argument("--job-timeout-s", type=float, default=240.0)
    parser.add_argument("--setups", default="", help="capacity setups on the fresh server")
    parser.add_argument("--cached-setups", default="", help="capacity setups on the cached server")
    parser.add_argument(
        "--mixed-on",
        default="fresh",
        help="the phases whose server runs the mixed scenario (comma list; 'none': no phase)",
    )
    parser.add_argument(
        "--latency-on",
        default="none",
        help="the phases whose server measures one session's time to steer (comma list)",
    )
    parser.add_argument("--prompts", type=int, default=6, help="prompt switches, time to steer")
    parser.add_argument("--second-model", default=None)
    parser.add_argument("--second-setups", default="")
    parser.add_argument("--phases", default="fresh,cached,second")
    parser.add_argument("--ramp-s", type=float, default=2.0)
    parser.add_argument("--seconds", type=float, default=12.0, help="capacity watch window")
    parser.add_argument(
        "--switch-every-s", type=float, default=3.5, help="prompt switch period in capacity setups"
    )
    parser.add_argument(
        "--trace-s",
        type=float,
        default=0.0,
        help="POST /v1/profile this long in each capacity setup's watch (0: none)",
    )
    parser.add_argument("--timeout-s", type=float, default=60.0)
    parser.add_argument("--startup-timeout-s", type=float, default=600.0)
    parser.add_argument("--server-arg", action="append", default=[], help="serve argument, all")
    parser.add_argument(
        "--cache",
        type=Path,
        default=None,
        help="the --compile-cache of every server (default: a temp dir); the fresh phase empties"
        " it first, so a later run's cached phase can reuse what this run's fresh one wrote",
    )
    parser.add_argument(
        "--empty-local-caches",
        action="store_true",
        help="empty Inductor's and Triton's default caches before each server (a new machine)",
    )
    parser.add_argument("--keep-logs", type=Path, default=None, help="copy server logs here")
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args(argv)
    phases = {p.strip() for p in args.phases.split(",")}
    mixed_on = {p.strip() for p in args.mixed_on.split(",")}
    latency_on = {p.strip() for p in args.latency_on.split(",")}
    report: dict[str, Any] = {"argv": argv or sys.argv[1:], "phases": {}}

    def save() -> None:
        if args.json is not None:
            args.json.write_text(json.dumps(report, indent=1, default=str))

    with tempfile.TemporaryDirectory(prefix="dreamrt-warm-") as tmp:
        root = Path(tmp)
        cache = args.cache or root / "compile-cache"
        os.environ.pop("TORCHINDUCTOR_CACHE_DIR", None)  # the servers use --compile-cache

        if "fresh" in phases:
            shutil.rmtree(cache, ignore_errors=True)
            fresh = _serving_work(
                args, args.setups, "fresh" in mixed_on, latency_too="fresh" in latency_on
            )
            _phase(root, "fresh", args, args.model, cache, fresh, report, save)
        if "cached" in phases:
            cached = _serving_work(
                args, args.cached_setups, "cached" in mixed_on, latency_too="cached" in latency_on
            )
            _phase(root, "cached", args, args.model, cache, cached, report, save)
        if "second" in phases and args.second_model:
            second = _serving_work(args, args.second_setups, mixed_too=False)
            _phase(root, "second", args, args.second_model, cache, second, report, save)
    _print(report)
    return 0


if __name__ == "__main__":
    sys.exit(main())
