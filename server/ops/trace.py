"""``POST /v1/profile``: a torch-profiler trace of what the executor runs for a few seconds of
serving, and where the device's time went (docs/api.md).

``ExecutorTrace`` is one of the engine's observers (``runtime.observers.Observer``): its hooks
run on the executor thread, the one thread that launches tensor work, so the profiler starts
and stops there, at batch boundaries, and every batch of the window is a labelled range in the
trace (``<kind> x<plans>``). ``request`` arms it from the event loop; the first batch after
that starts the profiler, the first boundary ``seconds`` later stops it, and the request's
future gets the stopped profiler. ``summarize`` (a worker thread: exporting a GPU trace takes
seconds) writes the Chrome trace (chrome://tracing, Perfetto) and reads from it:

- per plan kind the batches and their wall seconds, and the executor's busy fraction (time
  inside batches over the window: the rest is the event loop's and the scheduler's);
- on a GPU the device's busy fraction (the union of its kernels' intervals over the window),
  the kernels' count, the longest idle gaps between kernels (host gaps: launch overhead,
  host syncs, an executor waiting for work) and the kernels that took longest.

One trace at a time; a request while one is armed or running is refused (``TraceBusy``).
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

if TYPE_CHECKING:
    from runtime.observers import BatchInfo, Observation

__all__ = ["MAX_SECONDS", "ExecutorTrace", "TraceBusy", "capture", "summarize"]

MAX_SECONDS = 30.0
IDLE_WAIT_S = 10.0  # what a request waits beyond its seconds for the executor to run something


class TraceBusy(RuntimeError):
    """A trace is armed or running already."""


@dataclass
class _Window:
    """One requested trace: armed on the event loop, run on the executor thread."""

    seconds: float
    loop: asyncio.AbstractEventLoop
    done: asyncio.Future[_Captured]
    profiler: Any = None
    began_s: float = 0.0
    batches: list[tuple[str, int, float]] = field(default_factory=list)  # kind, plans, wall_s
    ranges: list[Any] = field(default_factory=list)  # the open record_function range


@dataclass(frozen=True, slots=True)
class _Captured:
    profiler: Any
    window_s: float
    batches: tuple[tuple[str, int, float], ...]


class ExecutorTrace:
    """The observer behind ``POST /v1/profile`` (module docstring)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._window: _Window | None = None

    def request(self, seconds: float) -> asyncio.Future[_Captured]:
        """Arm a trace of ``seconds`` (event loop) -> the future of what it captured; raises
        ``TraceBusy`` while another is armed or running."""
        if not 0 < seconds <= MAX_SECONDS:
            raise ValueError(f"seconds={seconds} must be in (0, {MAX_SECONDS:g}]")
        loop = asyncio.get_running_loop()
        with self._lock:
            if self._window is not None:
                raise TraceBusy("a trace is running; one at a time")
            window = _Window(seconds, loop, loop.create_future())
            self._window = window
        return window.done

    def cancel(self, done: asyncio.Future[_Captured]) -> None:
        """Give up a request (event loop): its window is dropped once the executor is at a
        batch boundary (a started profiler is stopped there and its trace thrown away)."""
        with self._lock:
            window = self._window
            if window is not None and window.done is done and window.profiler is None:
                self._window = None
        done.cancel()

    # executor thread ----------------------------------------------------------------------

    def before_batch(self, info: BatchInfo) -> None:
        if self._window is None:  # nothing armed: every batch but a trace's, no lock taken
            return
        with self._lock:  # ``cancel`` drops an unstarted window under the same lock
            window = self._window
            if window is None:
                return
            if window.profiler is None:
                if window.done.cancelled():
                    self._window = None
                    return
                activities = [torch.profiler.ProfilerActivity.CPU]
                if torch.cuda.is_available():
                    activities.append(torch.profiler.ProfilerActivity.CUDA)
                profiler = torch.profiler.profile(activities=activities, record_shapes=False)
                profiler.__enter__()
                window.profiler, window.began_s = profiler, time.perf_counter()
        label = torch.profiler.record_function(f"{info.kind} x{info.batch_size}")
        label.__enter__()
        window.ranges.append(label)

    def after_batch(
        self, info: BatchInfo, outputs: Sequence[object], wall_s: float
    ) -> Observation | None:
        window = self._window
        if window is None or window.profiler is None:
            return None
        while window.ranges:
            window.ranges.pop().__exit__(None, None, None)
        window.batches.append((info.kind, info.batch_size, wall_s))
        if window.done.cancelled():
            self._stop(window, deliver=False)
        elif time.perf_counter() - window.began_s >= window.seconds:
            self._stop(window, deliver=True)
        return None

    def _stop(self, window: _Window, *, deliver: bool) -> None:
        with self._lock:
            self._window = None
        window_s = time.perf_counter() - window.began_s
        if window.profiler is not None:
            if torch.cuda.is_available():
                torch.cuda.synchronize()  # the window's kernels into the trace
            window.profiler.__exit__(None, None, None)
        if deliver:
            captured = _Captured(window.profiler, window_s, tuple(window.batches))
            window.loop.call_soon_threadsafe(_resolve, window.done, captured)


def _resolve(done: asyncio.Future[_Captured], captured: _Captured) -> None:
    if not done.done():
        done.set_result(captured)


def summarize(captured: _Captured, path: Path, *, top: int = 10) -> dict[str, Any]:
    """Write ``captured``'s Chrome trace to ``path`` and say where the time went (module
    docstring) -> the body of ``POST /v1/profile``. Seconds throughout; a worker thread's
    work (the export of a GPU trace takes seconds)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    captured.profiler.export_chrome_trace(str(path))
    window_s = captured.window_s
    kinds: dict[str, dict[str, float]] = {}
    for kind, plans, wall_s in captured.batches:
        entry = kinds.setdefault(kind, {"batches": 0, "plans": 0, "seconds": 0.0})
        entry["batches"] += 1
        entry["plans"] += plans
        entry["seconds"] += wall_s
    busy_s = sum(wall_s for _, _, wall_s in captured.batches)
    body: dict[str, Any] = {
        "trace": str(path),
        "window_s": round(window_s, 4),
        "batches": len(captured.batches),
        "by_kind": {k: {**v, "seconds": round(v["seconds"], 4)} for k, v in sorted(kinds.items())},
        "executor_busy_fraction": round(busy_s / window_s, 4) if window_s > 0 else 0.0,
        "device": _device_summary(captured.profiler, window_s, top),
    }
    return body


def _device_summary(profiler: Any, window_s: float, top: int) -> dict[str, Any] | None:
    """The device's kernels in the window: busy fraction, idle gaps, the longest kernels;
    None where the trace has no device kernels (a CPU server)."""
    kernels = []
    for event in profiler.events():
        device = getattr(event, "device_type", None)
        if device is None or device == torch.autograd.DeviceType.CPU:
            continue
        start, end = event.time_range.start, event.time_range.end  # microseconds
        if end > start:
            kernels.append((start, end, event.name))
    if not kernels:
        return None
    kernels.sort()
    busy_us, gaps = 0.0, []
    cur_start, cur_end = kernels[0][0], kernels[0][1]
    for start, end, _ in kernels[1:]:
        if start > cur_end:
            busy_us += cur_end - cur_start
            gaps.append(start - cur_end)
            cur_start, cur_end = start, end
        else:
            cur_end = max(cur_end, end)
    busy_us += cur_end - cur_start
    totals: dict[str, list[float]] = {}
    for start, end, name in kernels:
        entry = totals.setdefault(name, [0, 0.0])
        entry[0] += 1
        entry[1] += end - start
    longest = sorted(totals.items(), key=lambda item: -item[1][1])[:top]
    gaps.sort(reverse=True)
    return {
        "kernels": len(kernels),
        "busy_fraction": round(busy_us / 1e6 / window_s, 4) if window_s > 0 else 0.0,
        "idle_s": round(sum(gaps) / 1e6, 4),
        "longest_gaps_ms": [round(g / 1e3, 3) for g in gaps[:top]],
        "top_kernels": [
            {"name": name[:120], "calls": int(calls), "seconds": round(us / 1e6, 4)}
            for name, (calls, us) in longest
        ],
    }


async def capture(trace: ExecutorTrace, seconds: float, path: Path) -> dict[str, Any]:
    """A trace of ``seconds`` written to ``path`` -> its summary; ``TimeoutError`` if the
    window did not end within ``seconds`` + ``IDLE_WAIT_S`` (an idle executor: nothing to
    trace)."""
    done = trace.request(seconds)
    try:
        captured = await asyncio.wait_for(asyncio.shield(done), timeout=seconds + IDLE_WAIT_S)
    except TimeoutError:
        trace.cancel(done)
        raise
    except asyncio.CancelledError:
        trace.cancel(done)
        raise
    return await asyncio.to_thread(summarize, captured, path)
