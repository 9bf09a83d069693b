"""A soak on loopback: sessions joining and leaving, prompts and actions, jobs, churn and one
injected fault per minute against one real ``dreamrt serve`` process, then a summary table.

    python -m infra.load.soak --minutes 15 [--watchers 3] [--model tiny-world] [--out F.json]
        [--churn-every 30] [--checkpoints 2] [--debug-memory] [--checkout DIR]

starts the server itself (``--fault-injection``, short unwatched/connect timeouts so that
abandoned sessions are reclaimed, the REST rate limit off for the load's own token-less client)
and runs, until the time is up:

- ``--watchers`` viewers, each in a loop: a session created and watched over aiortc for
  5-15 s while prompts (switch or cut) and actions arrive every 0.5-2 s over REST, then
  deleted, or (one in five) abandoned without a word;
- a job worker: a short ``t2v`` or ``t2i`` job, waited for, every ~10 s;
- churn: every 30 s, one session ended each way of ``infra.load.churn`` (cancelled and
  abandoned mid-negotiation, watched then deleted, watched then vanished);
- one fault per minute (``POST /v1/faults``: nan, exception, oom in turn) into a watched
  session, which must then end ``failed`` and nobody else;
- a sample every 10 s of the server's RSS, file descriptors and threads (``/proc``).

``--checkpoints N`` times during the run (default 2, evenly spread) the load pauses until the
server is idle and has trimmed its heap, and its memory, fds and threads are sampled; at the
end the same again; ``infra.load.leak_check`` judges the growth between them.
``--debug-memory`` has the server report its heap at every idle checkpoint
(``server/ops/memory_watch.py``, into its data dir).
The table counts sessions served, frames received, stalls, jobs, faults and the sessions they
failed (any other failure is a finding), HTTP 5xx (503 with ``Retry-After`` is admission
refusing on a full server, counted apart), and plots RSS over time. Exit code 0 when nothing
unexpected happened.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import signal
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from infra.load.leak_check import Checkpoint, leak_verdict

__all__ = ["SoakStats", "main", "run_soak", "rss_plot"]

FAULT_KINDS = ("nan", "exception", "oom")
KEYS = ("w", "a", "s", "d")


@dataclass
class SoakStats:
    minutes: float = 0.0
    sessions: int = 0
    frames: int = 0
    stalls: int = 0
    prompts: int = 0
    actions: int = 0
    abandoned: int = 0
    refused: int = 0  # 503 + Retry-After: the server was full (by design)
    http_5xx: int = 0
    jobs_ok: int = 0
    jobs_failed: int = 0
    churned: int = 0
    faults: int = 0
    failed_by_fault: int = 0
    failed_other: int = 0
    findings: list[str] = field(default_factory=list)
    # s, anonymous RSS MiB, fds, threads, RSS MiB (with file-backed pages)
    samples: list[tuple[float, float, int, int, float]] = field(default_factory=list)
    leaks: dict[str, Any] = field(default_factory=dict)
    checkpoints: list[dict[str, Any]] = field(default_factory=list)  # idle samples (Checkpoint)

    def table(self) -> str:
        leaks = self.leaks
        rows = [
            ("duration", f"{self.minutes:.1f} min"),
            (
                "sessions served",
                f"{self.sessions} ({self.abandoned} abandoned, {self.churned} churn)",
            ),
            ("frames received", f"{self.frames}"),
            ("stalls", f"{self.stalls}"),
            ("prompts / actions", f"{self.prompts} / {self.actions}"),
            ("jobs", f"{self.jobs_ok} succeeded, {self.jobs_failed} failed"),
            ("faults injected", f"{self.faults}: {self.failed_by_fault} sessions failed by them"),
            ("other failures", f"{self.failed_other}"),
            ("HTTP 5xx", f"{self.http_5xx} (+{self.refused} 503 full, with Retry-After)"),
            ("left when idle", leaks.get("summary", "?")),
            ("idle anon RSS", " -> ".join(f"{c['rss_mib']:.1f}" for c in self.checkpoints)),
        ]
        width = max(len(name) for name, _ in rows)
        out = [f"{name:<{width}}  {value}" for name, value in rows]
        out += ["", "anonymous RSS MiB over time", rss_plot(self.samples)]
        out += [f"finding: {f}" for f in self.findings[:20]]
        return "\n".join(out)


def rss_plot(samples: list[tuple[Any, ...]], height: int = 6, width: int = 60) -> str:
    """RSS over time as a text plot (one column per bucket of samples)."""
    if not samples:
        return "(no samples)"
    values = [s[1] for s in samples]
    step = max(1, -(-len(values) // width))
    cols = [max(values[i : i + step]) for i in range(0, len(values), step)]
    low, high = min(cols), max(cols)
    span = max(high - low, 1e-9)
    lines = []
    for row in range(height - 1, -1, -1):
        level = low + span * row / max(1, height - 1)
        marks = "".join("*" if v >= level - span / (2 * height) else " " for v in cols)
        lines.append(f"{level:8.1f} |{marks}")
    lines.append(f"{'':8} +{'-' * len(cols)}  {samples[-1][0] / 60:.1f} min")
    return "\n".join(lines)


class _Soak:
    def __init__(
        self, url: str, pid: int, stats: SoakStats, seed: int, churn_every_s: float = 30.0
    ) -> None:
        self.url = url
        self.churn_every_s = churn_every_s
        self.pid = pid
        self.stats = stats
        self.rng = random.Random(seed)
        self.stop = asyncio.Event()
        self.watched: dict[str, float] = {}  # session watched now -> when its watcher ends it
        self.faulted: set[str] = set()
        self.running = asyncio.Event()  # cleared at an idle checkpoint: no new work starts
        self.running.set()

    def _http_error(self, exc: Any, what: str) -> None:
        status = getattr(exc, "status", None)
        if status == 503:
            self.stats.refused += 1
        elif status is not None and status >= 500:
            self.stats.http_5xx += 1
            self.stats.findings.append(f"{what}: {status} {exc}")
        elif status is None or status not in (404, 409):  # 404/409: a session just ended
            self.stats.findings.append(f"{what}: {exc!r}")

    async def watcher(self, index: int) -> None:
        from clients.python.api import DreamrtClient
        from clients.python.viewer import Viewer

        async with DreamrtClient(self.url) as api:
            while await self._may_start():
                viewer, sid, vanish = Viewer(api), None, self.rng.random() < 0.2
                try:
                    await viewer.connect(f"soak {index}", seed=self.rng.randrange(1 << 16))
                    sid = viewer.session_id
                    assert sid is not None  # connect() created the session
                    self.stats.sessions += 1
                    until = time.monotonic() + self.rng.uniform(5, 15)
                    self.watched[sid] = until
                    while time.monotonic() < until and not self.stop.is_set():
                        await asyncio.sleep(self.rng.uniform(0.5, 2.0))
                        if self.rng.random() < 0.4:
                            mode = "cut" if self.rng.random() < 0.2 else "switch"
                            await api.prompt(sid, f"soak {self.rng.randrange(100)}", mode)
                            self.stats.prompts += 1
                        else:
                            await api.actions(sid, [self.rng.choice(KEYS)])
                            self.stats.actions += 1
                    await self._ended(api, viewer, sid)
                except Exception as exc:  # noqa: BLE001 - counted, the soak goes on
                    if sid is not None and sid in self.faulted:
                        await self._ended(api, viewer, sid)
                    else:
                        self._http_error(exc, f"watcher {index}")
                        await asyncio.sleep(1.0)
                finally:
                    self.watched.pop(sid or "", None)
                    self.stats.frames += len(viewer.frames)
                    self.stats.abandoned += int(vanish)
                    await _quietly(viewer.close(delete=not vanish))

    async def _ended(self, api: Any, viewer: Any, sid: str) -> None:
        try:
            status = await api.session(sid)
        except Exception:  # noqa: BLE001 - a failed session may be gone already
            status = {"state": "failed" if sid in self.faulted else "gone", "stalls": 0}
        self.stats.stalls += int(status.get("stalls", 0))
        if status["state"] == "failed":
            if sid in self.faulted:
                self.stats.failed_by_fault += 1
            else:
                self.stats.failed_other += 1
                self.stats.findings.append(f"session {sid} failed: {status.get('error')}")
        elif sid in self.faulted:
            self.stats.findings.append(f"session {sid} faulted but {status['state']}")

    async def jobs(self) -> None:
        from clients.python.api import DreamrtClient

        async with DreamrtClient(self.url) as api:
            while await self._may_start():
                try:
                    task = self.rng.choice(("t2v", "t2i"))
                    frames = 8 if task == "t2v" else None
                    job = await api.submit_job(task, "soak job", num_frames=frames)
                    while (state := (await api.job(job))["state"]) not in ("succeeded", "failed"):
                        await asyncio.sleep(0.5)
                    self.stats.jobs_ok += state == "succeeded"
                    self.stats.jobs_failed += state == "failed"
                except Exception as exc:  # noqa: BLE001
                    self._http_error(exc, "jobs")
                await _sleep(self.stop, 10.0)

    async def churn(self) -> None:
        from infra.load.churn import WAYS, ChurnResult, _one

        while not await _sleep(self.stop, self.churn_every_s) and await self._may_start():
            for way in WAYS:
                try:
                    await _one(self.url, way, ChurnResult(), None)
                    self.stats.churned += 1
                except Exception as exc:  # noqa: BLE001
                    self._http_error(exc, f"churn {way}")

    async def faults(self) -> None:
        import httpx

        kinds = iter(FAULT_KINDS * 10_000)
        async with httpx.AsyncClient(base_url=self.url, timeout=10) as http:
            while not await _sleep(self.stop, 60.0):
                # a session its watcher keeps 3 s more at least: it fails before it is deleted
                now = time.monotonic()
                targets = sorted(
                    s
                    for s, until in self.watched.items()
                    if until - now > 3 and s not in self.faulted
                )
                if not targets or not self.running.is_set():
                    continue
                target = self.rng.choice(targets)
                self.faulted.add(target)
                answer = await http.post("/v1/faults", json={"target": target, "kind": next(kinds)})
                if answer.status_code == 202:
                    self.stats.faults += 1
                else:
                    self.faulted.discard(target)

    async def _may_start(self) -> bool:
        """Waits out an idle checkpoint; False once the soak is over."""
        while not self.running.is_set() and not self.stop.is_set():
            await _sleep(self.stop, 0.2)
        return not self.stop.is_set()

    async def sampler(self, start_s: float) -> None:
        import httpx

        from infra.load.churn import sample_process

        while True:
            try:
                s = await sample_process(self.url, self.pid)
            except httpx.HTTPError as exc:  # a slow /metrics (e.g. under --debug-memory)
                self.stats.findings.append(f"sample missed: {exc!r}")
            else:
                self.stats.samples.append(
                    (
                        time.monotonic() - start_s,
                        s.rss_anon_bytes / 2**20,
                        s.fds,
                        s.threads,
                        s.rss_bytes / 2**20,
                    )
                )
            if await _sleep(self.stop, 10.0):
                return


async def _sleep(stop: asyncio.Event, seconds: float) -> bool:
    """Sleeps ``seconds`` or until ``stop``; True once stopped."""
    try:
        await asyncio.wait_for(stop.wait(), seconds)
    except TimeoutError:
        return False
    return True


async def _quietly(awaitable: Any) -> None:
    try:
        await awaitable
    except Exception:  # noqa: BLE001 - closing after a failure
        return


async def run_soak(
    url: str,
    pid: int,
    *,
    minutes: float,
    watchers: int = 3,
    seed: int = 0,
    churn_every_s: float = 30.0,
    checkpoints: int = 2,
    signal_report: bool = False,
) -> SoakStats:
    """The soak of the module docstring against a running server (``pid`` for ``/proc``)."""
    from infra.load.churn import SETTLE_S, WAYS, ChurnResult, _one, sample_process, wait_idle

    stats = SoakStats()
    soak = _Soak(url, pid, stats, seed, churn_every_s)
    # the baseline: idle after a warm-up (every way of ending a session, two at a time), so the
    # pools that grow on demand to a fixed size are in it
    for _ in range(2):
        await asyncio.gather(*(_one(url, way, ChurnResult(), None) for way in WAYS))
    await wait_idle(url, 60.0)
    await asyncio.sleep(SETTLE_S)
    base = await sample_process(url, pid)
    start_s = time.monotonic()
    tasks = [asyncio.create_task(soak.watcher(i)) for i in range(watchers)]
    tasks += [asyncio.create_task(t) for t in (soak.jobs(), soak.churn(), soak.faults())]
    sampler = asyncio.create_task(soak.sampler(start_s))
    segment_s = minutes * 60 / (checkpoints + 1)
    marks: list[Checkpoint] = []
    for _ in range(checkpoints):  # load, then an idle checkpoint; the pauses are not load time
        await _sleep(soak.stop, segment_s)
        soak.running.clear()
        marks.append(await _idle_sample(url, pid, len(marks) + 1, stats, signal_report))
        soak.running.set()
    await _sleep(soak.stop, segment_s)
    soak.stop.set()
    await asyncio.gather(*tasks, return_exceptions=True)
    stats.minutes = (time.monotonic() - start_s) / 60
    await sampler
    idle_start = time.monotonic()
    end = await _idle_sample(url, pid, len(marks) + 1, stats, signal_report)
    idle_s = time.monotonic() - idle_start
    stats.checkpoints = [asdict(m) for m in (*marks, end)]
    stats.leaks = leak_verdict(
        Checkpoint(0, 0, base.rss_anon_bytes / 2**20, base.fds, base.threads), marks, end
    )
    stats.leaks["idle_after_s"] = round(idle_s, 1)
    end_s = time.monotonic() - start_s
    stats.samples.append((end_s, end.rss_mib, end.fds, end.threads, end.rss_total_mib))
    return stats


async def _idle_sample(
    url: str, pid: int, segments: int, stats: SoakStats, signal_report: bool
) -> Checkpoint:
    """Waits until the server is idle (and has trimmed its heap), then samples it."""
    from infra.load.churn import SETTLE_S, sample_process, wait_idle

    for _ in range(5):  # a session created just as the load paused: wait for it too
        await wait_idle(url, 180.0)
        await asyncio.sleep(SETTLE_S)
        s = await sample_process(url, pid)
        clean = s.slabs_free == s.slabs_capacity and s.server_tasks == 0 and s.peers == 0
        if clean:
            break
    if signal_report:  # the server's memory report at this idle point (server/ops/memory_watch.py)
        os.kill(pid, signal.SIGUSR1)
        await asyncio.sleep(SETTLE_S)
    rss, total = s.rss_anon_bytes / 2**20, s.rss_bytes / 2**20
    return Checkpoint(
        segments, stats.sessions, round(rss, 1), s.fds, s.threads, clean, round(total, 1)
    )


def passed(stats: SoakStats) -> bool:
    return (
        stats.http_5xx == 0
        and stats.failed_other == 0
        and stats.failed_by_fault == stats.faults
        and bool(stats.leaks.get("ok"))
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m infra.load.soak", description=__doc__)
    parser.add_argument("--minutes", type=float, default=15.0)
    parser.add_argument("--watchers", type=int, default=3)
    parser.add_argument("--model", default="tiny-world")
    parser.add_argument("--max-sessions", type=int, default=8)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--churn-every", type=float, default=30.0, help="seconds between bursts")
    parser.add_argument(
        "--checkpoints", type=int, default=2, help="idle checkpoints spread through the run"
    )
    parser.add_argument(
        "--debug-memory",
        action="store_true",
        help="the server's memory report (server/ops/memory_watch.py) at every idle checkpoint",
    )
    parser.add_argument(
        "--checkout",
        type=Path,
        default=None,
        help="the checkout whose server runs (an A/B: the same soak against another commit)",
    )
    parser.add_argument("--out", type=Path, default=None, help="JSON of the stats")
    args = parser.parse_args(argv)
    import aioice.ice

    from infra.browser_harness import ServerProcess

    aioice.ice.get_host_addresses = lambda use_ipv4, use_ipv6: ["127.0.0.1"]
    root = Path(tempfile.mkdtemp(prefix="dreamrt-soak-"))
    server = ServerProcess(
        root / "data",
        root / "server.log",
        extra_args=(
            *("--model", args.model, "--max-sessions", str(args.max_sessions)),
            *("--fault-injection", "--unwatched-timeout", "2", "--connect-timeout", "2"),
            *("--rest-rate", "0"),
        ),
        env={"DREAMRT_DEBUG_MEMORY": "0"} if args.debug_memory else None,  # on SIGUSR1 only
        **({} if args.checkout is None else {"cwd": args.checkout}),
    ).start()
    print(f"server data dir and log: {root}", flush=True)
    try:
        stats = asyncio.run(
            run_soak(
                server.url,
                server.pid,
                minutes=args.minutes,
                watchers=args.watchers,
                seed=args.seed,
                churn_every_s=args.churn_every,
                checkpoints=args.checkpoints,
                signal_report=args.debug_memory,
            )
        )
    finally:
        server.stop(timeout_s=30.0)
    log = server.log_path.read_text(errors="replace")
    if "Traceback" in log:
        stats.findings.append(f"server log has a Traceback ({server.log_path})")
    print(stats.table())
    ok = passed(stats) and "Traceback" not in log
    print("passed:", ok)
    if args.out is not None:
        args.out.write_text(json.dumps(asdict(stats), indent=1))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
