"""The leak check of a soak (``infra/load/soak.py``): growth between idle checkpoints.

Why not "the end against the idle baseline before any load" (what the soak first checked): a
server under load fills caches and pools that are bounded but empty at start (the text
embeddings' LRU, the default executor's threads, glibc's per-thread arenas, oneDNN's
primitives), so the first minutes of load grow the process by a fixed amount that says
nothing about days. Growth from the first idle checkpoint (after the first segment of load) to
the last does: a per-session or per-chunk structure that outlives its session keeps growing
there. Memory is the anonymous RSS (``RssAnon``: malloc's heap, torch's CPU tensors): the
file-backed rest (libraries, mmapped weights) is dropped by the kernel and read back as other
processes on the machine need memory; it moved a soak's ``VmRSS`` by 200 MiB in seconds.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

__all__ = ["RSS_TOLERANCE", "THREAD_SLACK", "Checkpoint", "leak_verdict"]

RSS_TOLERANCE = 0.05  # anonymous RSS growth allowed from the first idle checkpoint to the end
# threads the pools may still add after it: asyncio's default executor starts its threads one
# by one as work overlaps, up to min(32, CPUs + 4), 6 on the 2-core machine (measured: 12 -> 14)
THREAD_SLACK = 4


@dataclass(frozen=True)
class Checkpoint:
    """An idle sample: after ``load_segments`` segments of load and ``sessions`` served."""

    load_segments: int
    sessions: int
    rss_mib: float  # anonymous RSS (RssAnon): file-backed pages come and go with the neighbours
    fds: int
    threads: int
    clean: bool = True  # every slab free, no server task, no peer
    rss_total_mib: float = 0.0  # VmRSS


def leak_verdict(base: Checkpoint, marks: list[Checkpoint], end: Checkpoint) -> dict[str, Any]:
    """Growth from the first idle checkpoint in ``marks`` to ``end`` (from ``base``, the idle
    baseline before any load, without checkpoints). Passes when the server was clean at the
    end, its anonymous RSS grew at most ``RSS_TOLERANCE``, its fds at most 10 % and its threads
    by at most ``THREAD_SLACK``."""
    ref = marks[0] if marks else base
    ratios = {
        "rss": end.rss_mib / ref.rss_mib,
        "fds": end.fds / ref.fds,
        "threads": end.threads / ref.threads,
    }
    segments = max(1, end.load_segments - ref.load_segments)
    sessions = max(1, end.sessions - ref.sessions)
    grown = end.rss_mib - ref.rss_mib
    since = "the first idle checkpoint" if marks else "the idle baseline after a warm-up"
    return {
        **{k: round(v, 3) for k, v in ratios.items()},
        "rss_vs_baseline": round(end.rss_mib / base.rss_mib, 3),
        "rss_mib_per_segment": round(grown / segments, 2),
        "rss_mib_per_100_sessions": round(100 * grown / sessions, 2),
        "ok": end.clean
        and ratios["rss"] <= 1 + RSS_TOLERANCE
        and ratios["fds"] <= 1.10
        and end.threads <= ref.threads + THREAD_SLACK,
        "summary": (
            f"{'clean' if end.clean else 'NOT clean (slabs, tasks or peers left)'}; "
            f"anon RSS x{ratios['rss']:.3f} ({grown:+.1f} MiB, "
            f"{100 * grown / sessions:+.2f} MiB per 100 sessions), "
            f"fds x{ratios['fds']:.3f}, threads x{ratios['threads']:.3f} of "
            f"{since}; anon RSS x{end.rss_mib / base.rss_mib:.3f} of the idle baseline"
        ),
    }
