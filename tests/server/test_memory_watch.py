"""MemoryWatch: off unless asked, and its report names what grew since the baseline."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import tracemalloc

from server.ops.memory_watch import MemoryWatch, holders, mallinfo


class _Grower:
    pass


def test_off_unless_the_environment_asks(tmp_path) -> None:
    assert MemoryWatch.from_env(tmp_path, {}) is None
    watch = MemoryWatch.from_env(
        tmp_path, {"DREAMRT_DEBUG_MEMORY": "30", "DREAMRT_DEBUG_MEMORY_BASELINE": "120"}
    )
    assert watch is not None
    assert (watch.every_s, watch.baseline_s) == (30.0, 120.0)
    assert watch.out == tmp_path / "memory-debug.jsonl"


async def test_a_report_on_sigusr1_names_the_growing_type_and_line(tmp_path) -> None:
    watch = MemoryWatch(0, frames=2, holder_types=1, out=tmp_path / "m.jsonl")  # 0: on SIGUSR1
    watch.start()
    try:
        os.kill(os.getpid(), signal.SIGUSR1)  # the first report is the baseline
        await asyncio.sleep(0.05)
        held = [_Grower() for _ in range(5000)]  # the "leak"
        payload = [bytes(1000) for _ in range(200)]  # ~200 kB from one line
        os.kill(os.getpid(), signal.SIGUSR1)
        await asyncio.sleep(0.05)
    finally:
        await watch.close()
    assert not tracemalloc.is_tracing()  # stopped again: it was started here
    lines = [json.loads(line) for line in (tmp_path / "m.jsonl").read_text().splitlines()]
    assert len(lines) == 2, lines
    report = lines[-1]
    assert dict(report["top_types"]).get("_Grower", 0) >= 5000
    assert report["traced_diff"] >= 200_000
    where = [frame for grower in report["top_growers"] for frame in grower["where"]]
    assert any(frame.endswith("test_memory_watch.py:35") for frame in where), where
    assert report["rss"] > 0
    assert report["held_by"]["_Grower"][0] == "list(len 5000)"
    assert len(held) + len(payload) == 5200


def test_mallinfo_reports_glibc_heap() -> None:
    info = mallinfo()
    assert info == {} or info["in_use"] > 0  # empty only without glibc's mallinfo2


def test_holders_names_the_dict_key_and_the_owner() -> None:
    class Registry:
        def __init__(self) -> None:
            self.entries: dict[str, object] = {}

    registry, item = Registry(), _Grower()
    registry.entries["ses_1"] = item
    chain = holders(item)
    # (an instance's own __dict__ shows as its key only where Python keeps one apart)
    chain = [hop for hop in chain if hop != "dict['entries']"]
    assert chain[0] == "dict['ses_1']" and chain[1].endswith("Registry"), chain
    assert registry.entries
