"""Suite-wide fixtures and markers: GPU tests skip without CUDA; each test process gets its share
of the cores."""

from __future__ import annotations

import os

import pytest


def _share_the_cores() -> None:
    """``make test`` runs PYTEST_WORKERS test processes side by side (pytest-xdist). Left alone,
    torch gives each of them every core for its intra-op threads, and the servers they start
    too: on the 2-core CI machine two workers' threads then take turns on each core, and a
    CPU-bound test ran 5x slower (the tiny-world evaluation: 96 s beside a copy of itself, 18 s
    with one thread each). Each worker gets ``cores // workers`` threads, and the processes it
    starts (servers, SPMD ranks) inherit that through ``OMP_NUM_THREADS``. An explicit
    ``OMP_NUM_THREADS`` wins."""
    workers = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1") or 1)
    if workers < 2 or "OMP_NUM_THREADS" in os.environ:
        return
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    threads = max(1, (cores or 1) // workers)
    os.environ["OMP_NUM_THREADS"] = str(threads)
    try:
        import torch
    except ImportError:
        return
    torch.set_num_threads(threads)


_share_the_cores()


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    # files marked `first` (minutes of setup) run before the rest: with `make test`'s workers
    # side by side, one starts them while the others take the short files, instead of the
    # suite ending on them (a stable sort: the order within each group is collection order)
    items.sort(key=lambda item: item.get_closest_marker("first") is None)
    try:
        import torch

        has_cuda = torch.cuda.is_available()
    except ImportError:
        has_cuda = False
    if has_cuda:
        return
    skip_gpu = pytest.mark.skip(reason="needs CUDA")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip_gpu)
