"""A world of N CPU processes joined by gloo over loopback, for multi-process tests.

``run_world(fn, n, *args)`` spawns ``n`` processes; each initialises the default process group
(gloo, ``MASTER_ADDR=127.0.0.1``, a free port), calls ``fn(rank, n, *args)`` and sends back what
it returns (picklable) or its traceback. Returns the results in rank order; raises
``WorldError`` with every failed rank's traceback. ``fn`` must be importable (a module-level
function) because the processes are spawned, not forked (torch and threads do not fork safely).
"""

from __future__ import annotations

import os
import socket
import traceback
from collections.abc import Callable
from typing import Any

import torch.multiprocessing as mp

__all__ = ["WorldError", "run_world"]


class WorldError(RuntimeError):
    """One or more ranks raised (the message holds their tracebacks) or never reported."""


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _entry(rank: int, n: int, port: int, fn: Callable[..., Any], args: tuple, queue: Any) -> None:
    import torch
    import torch.distributed as dist

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.set_num_threads(1)  # two ranks on a shared 2-core machine
    try:
        dist.init_process_group("gloo", rank=rank, world_size=n)
        queue.put((rank, True, fn(rank, n, *args)))
    except BaseException:
        queue.put((rank, False, traceback.format_exc()))
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()


def run_world(fn: Callable[..., Any], n: int, *args: Any, timeout_s: float = 120.0) -> list[Any]:
    ctx = mp.get_context("spawn")
    queue = ctx.Queue()
    port = _free_port()
    procs = [
        ctx.Process(target=_entry, args=(rank, n, port, fn, args, queue), daemon=True)
        for rank in range(n)
    ]
    for p in procs:
        p.start()
    results: dict[int, tuple[bool, Any]] = {}
    try:
        for _ in range(n):
            rank, ok, value = queue.get(timeout=timeout_s)
            results[rank] = (ok, value)
    except Exception as exc:  # queue.Empty: a rank hung or died without reporting
        raise WorldError(f"ranks {sorted(set(range(n)) - set(results))} never reported") from exc
    finally:
        for p in procs:
            p.join(timeout=10)
            if p.is_alive():
                p.kill()
    failed = {r: v for r, (ok, v) in results.items() if not ok}
    if failed:
        raise WorldError("\n".join(f"rank {r}:\n{tb}" for r, tb in sorted(failed.items())))
    return [results[r][1] for r in range(n)]
