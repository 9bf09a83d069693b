"""What a compiled server does before it is ready, and all ``dreamrt compile`` does: the compile
cache (``server.ops.compile_cache``), the instance's precompiled regions in it
(``models.precompiled``), the measured plan costs kept beside them, and the warm-up of the
compiled set (``server.ops.warm_up``), with its progress.

``WarmUpProgress`` is what ``GET /readyz`` shows while a server starts (phase, warm-up stages
done of total, graphs ready: compiled here or loaded from the cache, of those the cache holds)
and what the console shows as a progress bar: one line per stage and one every
``BAR_INTERVAL_S`` while a stage runs (a log line, so it reads the same in a terminal, a
container's log and a file).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from models.compiled_set import CompiledSet
    from models.instance import WanInstance
    from models.precompiled import RegionReport
    from runtime.cost import CostModel
    from server.config.serve import ServerConfig

from server.ops.compile_cache import cost_file
from server.ops.warm_up import compile_summary, warm_up_set

__all__ = [
    "BAR_INTERVAL_S",
    "WarmStart",
    "WarmUpProgress",
    "compile_workers",
    "load_cost",
    "save_cost",
    "warm_start",
]

log = logging.getLogger("server.app")  # the server's start lines, in one logger

BAR_INTERVAL_S = 10.0
_BAR_WIDTH = 24


@dataclass
class WarmUpProgress:
    """A start's progress (module docstring); every field is read by ``/readyz``."""

    phase: str = "loading"  # loading -> warming_up -> calibrating -> ready (or: failed)
    stages_done: int = 0
    stages_total: int = 0
    stage: str = ""  # the stage running now, e.g. "832x480/3 sessions"
    graphs_ready: int = 0  # precompiled graphs in hand: compiled here or loaded
    graphs_loaded: int = 0  # of those, loaded from the compile cache
    graphs_cached: int | None = None  # graphs the compile cache held at start (None: no cache)
    started: float = field(default_factory=time.monotonic)
    graphs_of: Callable[[], tuple[int, int]] | None = None  # -> (ready, loaded), read live

    def snapshot(self) -> dict[str, object]:
        """The progress as ``/readyz`` shows it (``docs/api.md``)."""
        self._refresh()
        return {
            "phase": self.phase,
            "stage": self.stage,
            "stages_done": self.stages_done,
            "stages_total": self.stages_total,
            "graphs_ready": self.graphs_ready,
            "graphs_loaded": self.graphs_loaded,
            "graphs_cached": self.graphs_cached,
            "elapsed_s": round(time.monotonic() - self.started, 1),
        }

    def bar(self) -> str:
        """One console line: ``warm-up [#####-----] 3/8 832x480/3 job, 7 graphs ready (7 of 7
        from the cache), 41 s``."""
        self._refresh()
        total = max(self.stages_total, 1)
        filled = round(_BAR_WIDTH * self.stages_done / total)
        graphs = f"{self.graphs_ready} graphs ready"
        if self.graphs_cached is not None:
            graphs += f" ({self.graphs_loaded} of {self.graphs_cached} from the cache)"
        elapsed = time.monotonic() - self.started
        return (
            f"warm-up [{'#' * filled}{'-' * (_BAR_WIDTH - filled)}] "
            f"{self.stages_done}/{self.stages_total} {self.stage}, {graphs}, {elapsed:.0f} s"
        )

    def _refresh(self) -> None:
        if self.graphs_of is not None:
            self.graphs_ready, self.graphs_loaded = self.graphs_of()


@dataclass
class WarmStart:
    """What ``warm_start`` did: the compile cache directory (None without one), seconds per
    warm-up stage, Dynamo's counters (``compile_summary``) and the regions' own
    (``WanInstance.compile_stats``)."""

    directory: Path | None
    took: dict[str, float]
    dynamo: dict[str, float]
    regions: dict[str, RegionReport]

    def graph_breaks(self) -> list[str]:
        """Why a region could not be precompiled whole, and restarted analyses (each a graph
        break Dynamo traced around): what ``dreamrt compile`` fails on."""
        reasons = [
            f"{name}: {reason}"
            for name, stats in self.regions.items()
            for reason in stats.get("fallbacks", ())
        ]
        if self.dynamo.get("restarts"):
            reasons.append(f"{int(self.dynamo['restarts'])} restarted Dynamo analyses")
        return reasons


def load_cost(cost: CostModel, path: Path) -> None:
    """Calibrate ``cost`` from the snapshot at ``path`` if there is a usable one."""
    from runtime.cost import CostModelError

    if not path.exists():
        return
    try:
        entries = cost.load(json.loads(path.read_text()))
    except (OSError, ValueError, CostModelError) as exc:  # JSONDecodeError is a ValueError
        log.warning("cost calibration %s not loaded: %s", path, exc)
        return
    log.info("cost calibration: %d measured plan costs from %s", entries, path)


def save_cost(cost: CostModel, path: Path) -> None:
    """Write ``cost``'s measured plan costs to ``path`` (a failure is logged, not raised)."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(cost.snapshot(), indent=1))
    except OSError as exc:
        log.warning("cost calibration not saved to %s: %s", path, exc)


def compile_directory(config: ServerConfig, model_id: str, instance: WanInstance) -> Path | None:
    """The compile cache's directory for this card, device and levers (``--compile-cache``,
    default ``DATA_DIR/compile-cache``), with Inductor pointed at it and the instance's
    precompiled regions loaded from it; None for an instance that is not compiled."""
    if not config.model.compile:
        return None
    from server.ops.compile_cache import cache_key, use_compile_cache

    key = cache_key(model_id, instance.device, instance.levers, instance.precision)
    root = config.model.compile_cache or config.data_dir / "compile-cache"
    directory = use_compile_cache(root, key)
    loaded = instance.use_precompiled(directory / "regions")
    if loaded:
        log.info(
            "compile cache: %d precompiled graphs loaded (%s)",
            sum(loaded.values()),
            ", ".join(f"{name} {n}" for name, n in loaded.items()),
        )
    return directory


def compile_workers(config: ServerConfig) -> int:
    """The compile pool's workers for a fresh start: ``--compile-workers``, else the machine's
    cores up to 4 (a graph's build is mostly one core's Python; measured: 4 on the H200
    machine's 16 cores, 2 on a 2-core CPU machine), none on one core."""
    workers = config.model.compile_workers
    if workers is not None:
        return workers
    cores = os.cpu_count() or 1
    return min(4, cores) if cores >= 2 else 0


async def warm_start(
    instance: WanInstance,
    directory: Path | None,
    served: CompiledSet,
    num_slabs: int,
    cost: CostModel,
    progress: WarmUpProgress,
    compile_workers: int = 0,
) -> WarmStart:
    """Warm ``instance`` up at the profiles (and batch sizes) of ``served`` and calibrate
    ``cost`` (``warm_up_set``), showing
    ``progress`` on the console as it goes; the calibration is kept in ``directory``'s
    ``cost.json``. With ``compile_workers`` and nothing loaded from the cache, the warm-up
    first runs eagerly while that many worker processes compile the graphs it meets
    (``_compile_in_pool``). -> what it did."""
    stats = getattr(instance, "compile_stats", dict)
    cached = sum(s["loaded"] for s in stats().values()) if directory is not None else None
    progress.graphs_cached = cached
    progress.graphs_of = lambda: (
        sum(s["signatures"] for s in stats().values()),
        sum(s["loaded"] for s in stats().values()),
    )
    progress.phase = "warming_up"

    def stage(name: str, done: int, total: int) -> None:
        progress.stage, progress.stages_done, progress.stages_total = name, done, total
        if name == "calibration":
            progress.phase = "calibrating"
        log.info("%s", progress.bar())

    bar = asyncio.create_task(_bar(progress), name="dreamrt-warm-up-bar")
    try:
        pooled: dict[str, float] = {}
        if compile_workers > 0 and cached == 0 and _poolable(instance):
            pooled = await _compile_in_pool(instance, served, num_slabs, compile_workers, stage)
        took = await warm_up_set(
            instance,
            served.profiles,
            num_slabs,
            cost=cost,
            on_stage=stage,
            max_batch=served.max_batch,
        )
        took = {**pooled, **took}
    finally:
        bar.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await bar
    if directory is not None:
        save_cost(cost, cost_file(directory, instance.levers))
    done = WarmStart(directory, took, compile_summary(), stats())
    log.info(
        "warm-up done in %.1f s (%s)",
        sum(took.values()),
        ", ".join(f"{name} {s:.1f} s" for name, s in took.items()),
    )
    for name, region in done.regions.items():
        log.info(
            "compiling %s: %d graphs (%d compiled in %.1f s, %d loaded in %.1f s)%s",
            name,
            region["signatures"],
            region["compiled"],
            region["compile_s"],
            region["loaded"],
            region["load_s"],
            "; fell back to torch.compile: " + "; ".join(region["fallbacks"])
            if region["fallbacks"]
            else "",
        )
    if done.dynamo.get("graphs"):
        log.info(
            "Dynamo: %d graphs, tracing %.1f s, backend %.1f s (Inductor, or its compile "
            "cache), %d restarted analyses (graph breaks)",
            done.dynamo["graphs"],
            done.dynamo["tracing_s"],
            done.dynamo["backend_s"],
            done.dynamo["restarts"],
        )
    return done


def _poolable(instance: WanInstance) -> bool:
    """Whether a compile pool can build ``instance``'s graphs: it has precompiled regions to
    defer, and no CUDA graphs (the finding pass would capture its eager calls)."""
    stats: dict[str, RegionReport] = getattr(instance, "compile_stats", dict)()
    return (
        bool(stats)
        and hasattr(instance, "defer_compiles")
        and not instance.levers.get("cuda_graphs")
    )


async def _compile_in_pool(
    instance: WanInstance,
    served: CompiledSet,
    num_slabs: int,
    workers: int,
    stage: Callable[[str, int, int], None],
) -> dict[str, float]:
    """The warm-up once, eagerly, with every new graph handed to a ``CompilePool`` of
    ``workers`` processes; then wait for them and load what they made -> seconds of each part.
    A pool that cannot start or finish leaves the graphs to the warm-up that follows."""
    from models.compile_pool import CompilePool

    pool = CompilePool(workers)
    began = time.perf_counter()
    instance.defer_compiles(pool)
    try:
        await warm_up_set(
            instance,
            served.profiles,
            num_slabs,
            on_stage=lambda name, done, total: stage(f"finding graphs: {name}", done, total),
            max_batch=served.max_batch,
        )
        found = time.perf_counter()
        log.info("compiling %d graphs in %d worker processes", pool.pending(), workers)
        stage(f"compiling {pool.pending()} graphs in {workers} worker processes", 0, 1)
        results = await asyncio.to_thread(pool.finish)
    except Exception as exc:  # noqa: BLE001 - the warm-up after this compiles what is missing
        log.warning(
            "compile pool: %s: %s; the warm-up compiles the graphs", type(exc).__name__, exc
        )
        pool.close()
        results, found = [], time.perf_counter()
    loaded = instance.collect_compiles(results)
    done = time.perf_counter()
    log.info(
        "compile pool: %d of %d graphs compiled in %.1f s (%d workers; the warm-up found them "
        "in %.1f s)",
        loaded,
        len(results),
        done - found,
        workers,
        found - began,
    )
    return {"finding graphs": found - began, "compile pool": done - found}


async def _bar(progress: WarmUpProgress) -> None:
    """The progress bar while a stage runs (a graph compiles for minutes on a GPU)."""
    while True:
        await asyncio.sleep(BAR_INTERVAL_S)
        log.info("%s", progress.bar())
