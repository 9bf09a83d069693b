"""Precompiled regions' graphs compiled side by side, by worker processes.

A fresh start compiles every graph of the compiled set; one after another in the server's
process they take 122 s of a 176-s ``dreamrt compile`` on the H200, 41.5 s in four workers
(infra/bench/RESULTS.md): each graph's build is mostly single-threaded Python. With a pool, the
warm-up first runs once to find the graphs: a region meeting a new call signature hands the call
to the pool (``Region.defer``) and runs it eagerly, so the warm-up goes on at eager speed. Each
worker - a process of its own (``spawn``: a CUDA context of its own) - receives the call (the
module and its arguments, CUDA tensors shared with the server's process, not copied: torch's
multiprocessing reductions) and compiles it with ``models.aot_artifact.compile_artifact``, the
region's own compile, and saves the artifact to the region's store. Once the pool is done the
regions load what the workers saved (``Region.collect``) and the warm-up runs again on them, as
a start from the compile cache does; a call the pool could not take or compile (it does not
pickle, it has a graph break) compiles in the server's process then, as without a pool.
"""

from __future__ import annotations

import logging
import os
import pickle
import queue
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from multiprocessing.reduction import ForkingPickler
from pathlib import Path
from typing import Any

import torch

__all__ = ["CompilePool", "PoolResult"]

log = logging.getLogger(__name__)

CRASH_WAIT_S = 120.0  # after a worker crashed: how long the pool waits for another result


@dataclass(frozen=True, slots=True)
class PoolResult:
    """One call the pool compiled: its region, the signature it was saved under (None: it
    failed, ``error`` says why) and the worker's seconds."""

    region: str
    signature: str | None
    seconds: float
    error: str = ""


class CompilePool:
    """``workers`` processes compiling region calls (module docstring). Thread-safe: regions
    submit from the engine's executor thread."""

    def __init__(self, workers: int, *, threads_per_worker: int | None = None) -> None:
        if workers < 1:
            raise ValueError(f"workers={workers} must be >= 1")
        self.workers = workers
        cores = os.cpu_count() or 1
        self._threads = threads_per_worker or max(1, cores // workers)
        self._context = torch.multiprocessing.get_context("spawn")
        self._jobs: Any = None
        self._results: Any = None
        self._processes: list[Any] = []
        self._lock = threading.Lock()
        self._submitted: dict[int, str] = {}  # job -> region
        self.began: float | None = None

    def submit(
        self,
        region: str,
        forward: Callable[..., object],
        full: tuple[object, ...],
        dynamic: Callable[..., Any] | None,
        store: Path,
    ) -> None:
        """Queue one call of ``region`` (``forward(*full)``, ``dynamic`` its rule) to be
        compiled and saved to ``store``. Raises whatever pickling the call raises (the caller
        compiles it itself then)."""
        with self._lock:
            job = len(self._submitted)
            # the call's grad and inference modes: part of its signature and of its graph
            modes = (torch.is_grad_enabled(), torch.is_inference_mode_enabled())
            payload = bytes(
                ForkingPickler.dumps((job, region, forward, full, dynamic, str(store), modes))
            )
            self._start()
            self._submitted[job] = region
            self._jobs.put(payload)

    def pending(self) -> int:
        with self._lock:
            return len(self._submitted)

    def finish(self, timeout_s: float = 1800.0) -> list[PoolResult]:
        """Wait for every submitted call, stop the workers -> one result per call."""
        results: list[PoolResult] = []
        with self._lock:
            expected = len(self._submitted)
        deadline = time.monotonic() + timeout_s
        last = time.monotonic()
        while len(results) < expected:
            try:
                job, signature, seconds, error = self._results.get(timeout=1.0)
            except queue.Empty:
                now = time.monotonic()
                # a worker that exited had crashed (they stop only when told): its call's
                # result will not come, so wait for the others a while, not for the deadline
                crashed = any(p.exitcode is not None for p in self._processes)
                if (
                    now > deadline
                    or not any(p.is_alive() for p in self._processes)
                    or (crashed and now - last > CRASH_WAIT_S)
                ):
                    log.warning("compile pool: %d calls not compiled", expected - len(results))
                    break
                continue
            last = time.monotonic()
            results.append(PoolResult(self._submitted[job], signature, seconds, error))
        self.close()
        return results

    def close(self) -> None:
        """Stop the workers (idempotent)."""
        with self._lock:
            processes, self._processes = self._processes, []
            for _ in processes:
                self._jobs.put(None)
        for process in processes:
            process.join(timeout=10.0)
            if process.is_alive():
                process.kill()

    def _start(self) -> None:
        if self._processes:
            return
        self.began = time.monotonic()
        self._jobs = self._context.Queue()
        self._results = self._context.Queue()
        for index in range(self.workers):
            process = self._context.Process(
                target=_work,
                args=(self._jobs, self._results, self._threads),
                name=f"dreamrt-compile-{index}",
                daemon=True,
            )
            process.start()
            self._processes.append(process)


def _work(jobs: Any, results: Any, threads: int) -> None:
    """A worker: compile and save each queued call until told to stop (``None``)."""
    import torch._inductor.config as inductor_config

    from models.aot_artifact import compile_artifact, save_artifact

    inductor_config.compile_threads = threads  # the machine's cores shared between workers
    while True:
        payload = jobs.get()
        if payload is None:
            return
        began = time.perf_counter()
        job = -1
        try:
            job, region, forward, full, dynamic, store, (grad, inference) = pickle.loads(payload)
            with torch.inference_mode(inference), torch.set_grad_enabled(grad):
                marks = () if dynamic is None else dynamic(full)
                signature, fn = compile_artifact(region, forward, full, marks)
            save_artifact(Path(store), signature, fn)
            results.put((job, signature, time.perf_counter() - began, ""))
        except Exception as exc:  # noqa: BLE001 - the server compiles this call itself
            text = str(exc).splitlines()[0] if str(exc) else ""
            results.put((job, None, time.perf_counter() - began, f"{type(exc).__name__}: {text}"))
