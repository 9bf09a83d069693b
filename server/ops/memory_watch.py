"""An opt-in memory diagnosis of the running server: where the heap grows, between a baseline
and now.

``DREAMRT_DEBUG_MEMORY=K`` (seconds) in the server's environment turns it on: tracemalloc
starts with the server (``DREAMRT_DEBUG_MEMORY_FRAMES`` frames per traceback, default 8), a
baseline is taken ``DREAMRT_DEBUG_MEMORY_BASELINE`` seconds after start (default ``K``), and
every ``K`` seconds after it one report goes to the log and, as a JSON line, to
``<data dir>/memory-debug.jsonl``. ``SIGUSR1`` asks for one report now (the first one, if no
baseline was taken yet, is the baseline); ``K = 0`` reports only then (``infra/load/soak.py
--debug-memory`` signals at its idle checkpoints, so that reports compare idle with idle):

- RSS (``/proc/self/status``) and glibc's own accounting (``mallinfo2``: bytes in use by
  malloc, bytes free but kept in its arenas, bytes in mmapped blocks), so that heap growth that
  is allocator retention (free pages held by arenas) is told apart from live objects;
- the bytes of torch's live CPU tensor storages (allocated in C++, unseen by tracemalloc);
- what tracemalloc traces now (every Python-level allocation, torch's CPU tensors included
  only as far as Python allocates them) and the top growers by traceback since the baseline;
- the garbage-collected objects by type, the top growers in count since the baseline, and
  for each grower that is not a builtin container, who holds its newest instance (a chain of
  referrers: ``Engine._loops['ses_…'] <- LoopRecord.result <- …``).

A full collection runs before each report (what survives one is what is held, not garbage
waiting for the collector), so a report stalls the event loop for as long as a collection and
``gc.get_objects()`` take: hundreds of milliseconds with a model loaded. This is a diagnosis,
not something to leave on in production; tracemalloc also slows every allocation.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import gc
import json
import logging
import os
import signal
import sys
import time
import tracemalloc
import types
from collections import Counter, deque
from collections.abc import Mapping
from pathlib import Path
from typing import Any

__all__ = ["MemoryWatch", "holders", "mallinfo", "type_counts"]

log = logging.getLogger(__name__)

ENV_EVERY = "DREAMRT_DEBUG_MEMORY"
ENV_BASELINE = "DREAMRT_DEBUG_MEMORY_BASELINE"
ENV_FRAMES = "DREAMRT_DEBUG_MEMORY_FRAMES"


class _MallInfo2(ctypes.Structure):
    _fields_ = [  # noqa: RUF012 - the ctypes layout of glibc's struct mallinfo2
        (name, ctypes.c_size_t)
        for name in (
            "arena",
            "ordblks",
            "smblks",
            "hblks",
            "hblkhd",
            "usmblks",
            "fsmblks",
            "uordblks",
            "fordblks",
            "keepcost",
        )
    ]


def mallinfo() -> dict[str, int]:
    """glibc's heap accounting in bytes (empty without glibc 2.33+): ``in_use`` by malloc's
    callers, ``free_kept`` (freed, still in the arenas: RSS the allocator keeps),
    ``mmapped`` (large blocks, returned to the OS when freed)."""
    try:
        fn = ctypes.CDLL("libc.so.6").mallinfo2
    except (OSError, AttributeError):
        return {}
    fn.restype = _MallInfo2
    info = fn()
    return {"in_use": info.uordblks, "free_kept": info.fordblks, "mmapped": info.hblkhd}


def type_counts(objects: list[object] | None = None) -> Counter[str]:
    """The garbage-collected objects of the process by type name."""
    return Counter(type(o).__name__ for o in (gc.get_objects() if objects is None else objects))


_BUILTIN = frozenset(
    ("tuple", "dict", "list", "set", "frozenset", "function", "cell", "method", "ReferenceType")
)


def _describe(holder: object, held: object) -> str:
    if isinstance(holder, dict):
        key = next((k for k, v in holder.items() if v is held), None)
        return f"dict[{key!r:.60}]"
    if isinstance(holder, (list, tuple, set, frozenset, deque)):
        return f"{type(holder).__name__}(len {len(holder)})"
    return type(holder).__qualname__


def holders(obj: object, *, depth: int = 6, skip: tuple[object, ...] = ()) -> list[str]:
    """Who holds ``obj``: one chain of referrers, nearest first (frames and ``skip`` left
    out). A dict that is an instance's ``__dict__`` shows as the key it holds ``obj`` under,
    then the instance's type."""
    ignore = {id(s) for s in skip}
    chain, seen, current = [], {id(obj)}, obj
    for _ in range(depth):
        refs = [
            r
            for r in gc.get_referrers(current)
            if id(r) not in seen and id(r) not in ignore and not isinstance(r, types.FrameType)
        ]
        if not refs:
            break
        holder = refs[0]
        del refs  # this list holds ``current`` too: the next hop must not find it
        chain.append(_describe(holder, current))
        seen.add(id(holder))
        current = holder
    return chain


def tensor_bytes(objects: list[Any]) -> dict[str, int]:
    """Bytes and count of the distinct CPU storages of the live torch tensors among
    ``objects`` (torch allocates them in C++: tracemalloc never sees them)."""
    torch = sys.modules.get("torch")
    if torch is None:
        return {}
    storages: dict[int, int] = {}
    for o in objects:
        if issubclass(type(o), torch.Tensor) and o.device.type == "cpu":  # no __class__ lookups
            with contextlib.suppress(RuntimeError):  # meta, sparse, tensors without storage
                storage = o.untyped_storage()
                storages[storage.data_ptr()] = storage.nbytes()
    return {"bytes": sum(storages.values()), "storages": len(storages)}


def _rss_bytes() -> int:
    with open("/proc/self/status") as status:
        line = next(line for line in status if line.startswith("VmRSS"))
    return int(line.split()[1]) * 1024


class MemoryWatch:
    """``start()`` starts tracemalloc and the periodic task, ``close()`` ends both."""

    def __init__(
        self,
        every_s: float,
        *,
        baseline_s: float | None = None,
        frames: int = 8,
        top: int = 12,
        holder_types: int = 5,
        out: Path | None = None,
    ) -> None:
        self.every_s = every_s
        self.baseline_s = every_s if baseline_s is None else baseline_s
        self.frames = frames
        self.top = top
        self.holder_types = holder_types  # each hop of a chain walks every object: a few only
        self.out = out
        self.reports: list[dict[str, object]] = []
        self._baseline: tuple[tracemalloc.Snapshot, Counter[str], float] | None = None
        self._task: asyncio.Task[None] | None = None
        self._started_here = False
        self._signal = False

    @classmethod
    def from_env(cls, data_dir: Path, env: Mapping[str, str] = os.environ) -> MemoryWatch | None:
        """The watch ``$DREAMRT_DEBUG_MEMORY`` asks for, or None when it is unset."""
        every = env.get(ENV_EVERY)
        if not every:
            return None
        baseline = env.get(ENV_BASELINE)
        return cls(
            float(every),
            baseline_s=float(baseline) if baseline else None,
            frames=int(env.get(ENV_FRAMES, 8)),
            out=Path(data_dir) / "memory-debug.jsonl",
        )

    def start(self) -> None:
        if not tracemalloc.is_tracing():
            tracemalloc.start(self.frames)
            self._started_here = True
        loop = asyncio.get_running_loop()
        if self.every_s > 0:
            self._task = loop.create_task(self._run(), name="dreamrt-memwatch")
        with contextlib.suppress(ValueError, RuntimeError, NotImplementedError):  # main thread
            loop.add_signal_handler(signal.SIGUSR1, self._on_signal)
            self._signal = True
        log.warning(
            "memory diagnosis on (%s): %s, and on SIGUSR1, to %s",
            ENV_EVERY,
            f"baseline in {self.baseline_s:.0f} s, a report every {self.every_s:.0f} s"
            if self.every_s > 0
            else "reports",
            self.out,
        )

    def take_baseline(self) -> None:
        gc.collect()
        self._baseline = (tracemalloc.take_snapshot(), type_counts(), time.monotonic())

    def report(self) -> dict[str, object]:
        """One report against the baseline (taken now if there is none)."""
        if self._baseline is None:
            self.take_baseline()
        assert self._baseline is not None
        snapshot0, counts0, t0 = self._baseline
        gc.collect()
        snapshot = tracemalloc.take_snapshot()
        objects = gc.get_objects()
        counts = type_counts(objects)
        skip = [tracemalloc.Filter(False, tracemalloc.__file__)]
        diff = snapshot.filter_traces(skip).compare_to(snapshot0.filter_traces(skip), "traceback")
        growers = [
            {
                "size_diff": stat.size_diff,
                "count_diff": stat.count_diff,
                "size": stat.size,
                "where": [f"{f.filename}:{f.lineno}" for f in stat.traceback][-self.frames :],
            }
            for stat in diff[: self.top]
        ]
        types = sorted(
            ((name, counts[name] - counts0.get(name, 0)) for name in counts),
            key=lambda item: -item[1],
        )
        held_by = {}
        grown = [name for name, n in types[: self.top] if n > 0 and name not in _BUILTIN]
        for name in grown[: self.holder_types]:
            newest = next(o for o in reversed(objects) if type(o).__name__ == name)
            held_by[name] = holders(newest, skip=(objects,))
        tensors = tensor_bytes(objects)
        del objects
        traced, _peak = tracemalloc.get_traced_memory()
        report = {
            "since_baseline_s": round(time.monotonic() - t0, 1),
            "rss": _rss_bytes(),
            "malloc": mallinfo(),
            "torch_cpu": tensors,
            "traced": traced,
            "traced_diff": sum(stat.size_diff for stat in diff),
            "objects": sum(counts.values()),
            "objects_diff": sum(counts.values()) - sum(counts0.values()),
            "top_types": [[name, n] for name, n in types[: self.top] if n > 0],
            "top_growers": growers,
            "held_by": held_by,
        }
        self.reports.append(report)
        return report

    def _write(self, report: dict[str, Any]) -> None:
        log.warning(
            "memory: rss %.1f MiB, traced %+.1f MiB, objects %+d since baseline; top %s",
            report["rss"] / 2**20,
            report["traced_diff"] / 2**20,
            report["objects_diff"],
            report["top_types"][:5],
        )
        if self.out is not None:
            with self.out.open("a") as out:
                out.write(json.dumps(report) + "\n")

    def _on_signal(self) -> None:
        self._write(self.report())

    async def _run(self) -> None:
        await asyncio.sleep(self.baseline_s)
        self.take_baseline()
        while True:
            await asyncio.sleep(self.every_s)
            self._write(self.report())

    async def close(self) -> None:
        if self._signal:
            asyncio.get_running_loop().remove_signal_handler(signal.SIGUSR1)
            self._signal = False
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
        if self._started_here:
            with contextlib.suppress(RuntimeError):
                tracemalloc.stop()
            self._started_here = False
