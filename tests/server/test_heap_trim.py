"""HeapTrim: a collection and a trim after sessions ended, never while one is live."""

from __future__ import annotations

import asyncio

from server.heap_trim import HeapTrim


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
