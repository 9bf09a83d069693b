"""HeapTrim: a collection and a trim after sessions ended, never while one is live; what the
process held at ready frozen out of the collector's walk."""

from __future__ import annotations

import asyncio
import gc
import weakref

from server.ops.heap_trim import HeapTrim, freeze_loaded_heap


async def test_trims_once_sessions_ended_and_none_is_live() -> None:
    ended, busy = [0], [True]
    heap = HeapTrim(lambda: ended[0], busy=lambda: busy[0], check_s=0.01, min_gap_s=0.0)
    collected = []
    heap.trim_now = lambda: asyncio.sleep(0, collected.append(ended[0]))  # the work itself
    heap.start()
    await asyncio.sleep(0.05)
    assert collected == []  # nothing ended yet
    ended[0] = 3
    await asyncio.sleep(0.05)
    assert collected == []  # sessions are live: a full collection would stall them
    busy[0] = False
    await asyncio.sleep(0.05)
    assert collected == [3]  # once, until more sessions end
    await heap.close()
    await heap.close()  # idempotent


async def test_trim_now_collects_and_trims() -> None:
    heap = HeapTrim(lambda: 0)
    await heap.trim_now()
    assert heap.trims == (1 if heap._trim is not None else 0)  # noqa: SLF001 - glibc or not


class _Node:
    def __init__(self) -> None:
        self.me = self  # a reference cycle: only the collector frees it


def test_freeze_loaded_heap_keeps_what_exists_out_of_the_collectors_walk() -> None:
    loaded = _Node()
    loaded_ref = weakref.ref(loaded)
    undo = freeze_loaded_heap()
    try:
        assert gc.get_freeze_count() > 0
        del loaded
        gc.collect()
        assert loaded_ref() is not None  # frozen: a full collection no longer walks it
        served = _Node()
        served_ref = weakref.ref(served)
        del served
        gc.collect()
        assert served_ref() is None  # what serving creates after ready is still collected
    finally:
        undo()
    assert gc.get_freeze_count() == 0
    gc.collect()
    assert loaded_ref() is None  # unfrozen at shutdown: collectable again
