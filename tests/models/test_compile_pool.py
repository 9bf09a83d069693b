"""``models.compile_pool``: a region's new signatures compiled by worker processes while the
calls run eagerly, then loaded (``Region.defer`` / ``collect``); what the pool cannot take or
compile is compiled in the calling process, as without a pool. Real ``spawn`` workers and
Inductor's CPU backend (seconds a graph)."""

from __future__ import annotations

import logging
import os
import time

import pytest
import torch
from torch import nn

from models.compile_guard import CompileGuard
from models.compile_pool import CompilePool
from models.precompiled import Region, aot_supported

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(not aot_supported(), reason="this torch has no aot_compile"),
]


class _Block(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.linear = nn.Linear(8, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.nn.functional.gelu(self.linear(x)) + x


class _Breaks(_Block):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        torch._dynamo.graph_break()
        return self.linear(x)


def _eager(block: nn.Module, x: torch.Tensor) -> torch.Tensor:
    saved, block._compiled_call_impl = block._compiled_call_impl, None
    try:
        return block(x)
    finally:
        block._compiled_call_impl = saved


def test_the_pool_compiles_new_signatures_while_the_calls_run_eagerly(tmp_path) -> None:
    torch.manual_seed(0)
    blocks = [_Block(), _Block()]
    region = Region("blocks", _Block.forward, blocks, CompileGuard())
    region.use_store(tmp_path)
    pool = CompilePool(2, threads_per_worker=1)
    region.defer(pool)
    inputs = [torch.randn(3, 8), torch.randn(5, 8)]  # two signatures
    with torch.inference_mode():
        first = [blocks[i % 2](x) for i, x in enumerate(inputs)]
        again = blocks[0](inputs[0])  # the same signature: handed over once, eager again
    assert pool.pending() == 2 and region.stats.compiled == 0 and region.signatures() == 0
    results = pool.finish(timeout_s=600)
    assert sorted(r.region for r in results) == ["blocks", "blocks"]
    assert all(r.signature and not r.error for r in results)
    assert region.collect(results) == 2
    assert region.signatures() == 2 and region.stats.compiled == 2
    with torch.inference_mode():
        for i, x in enumerate(inputs):
            torch.testing.assert_close(blocks[i % 2](x), _eager(blocks[i % 2], x))
            torch.testing.assert_close(first[i], _eager(blocks[i % 2], x))
        torch.testing.assert_close(again, _eager(blocks[0], inputs[0]))
    # a fresh region on the same store loads both: the workers' artifacts are the cache's
    other = Region("blocks", _Block.forward, [_Block()], CompileGuard())
    assert other.use_store(tmp_path) == 2


def test_what_the_pool_cannot_take_or_compile_is_compiled_here(tmp_path, caplog) -> None:
    caplog.set_level(logging.WARNING)
    block = _Block()
    block.not_picklable = lambda: None  # a call that does not pickle
    region = Region("unpicklable", _Block.forward, [block], CompileGuard())
    region.use_store(tmp_path)
    pool = CompilePool(1, threads_per_worker=1)
    region.defer(pool)
    with torch.inference_mode():
        block(torch.randn(2, 8))
    assert region.stats.compiled == 1 and pool.pending() == 0  # compiled in this process
    assert "compiled here, not by the pool" in caplog.text
    pool.close()

    breaks = _Breaks()
    region = Region("breaks", _Breaks.forward, [breaks], CompileGuard())
    region.use_store(tmp_path)
    pool = CompilePool(1, threads_per_worker=1)
    region.defer(pool)
    x = torch.randn(2, 8)
    with torch.inference_mode():
        torch.testing.assert_close(breaks(x), _eager(breaks, x))
    results = pool.finish(timeout_s=600)
    assert len(results) == 1 and results[0].signature is None and results[0].error
    assert region.collect(results) == 0
    with torch.inference_mode():  # its next call compiles here: a graph break falls back to JIT
        torch.testing.assert_close(breaks(x), _eager(breaks, x))
    assert region.stats.fallbacks


class _Exits:
    """An argument whose unpickling ends the process that receives it: a worker that crashes."""

    def __reduce__(self) -> tuple[object, tuple[int]]:
        return (os._exit, (3,))


class _Marked(_Block):
    def forward(self, x: torch.Tensor, marker: object) -> torch.Tensor:
        return self.linear(x)


def test_a_crashed_worker_ends_the_wait_and_its_call_compiles_here(tmp_path) -> None:
    block = _Marked()
    region = Region("crashing", _Marked.forward, [block], CompileGuard())
    region.use_store(tmp_path)
    pool = CompilePool(1, threads_per_worker=1)
    region.defer(pool)
    x, marker = torch.randn(2, 8), _Exits()
    with torch.inference_mode():
        eager = block(x, marker)
    began = time.monotonic()
    results = pool.finish(timeout_s=600)
    assert results == [] and time.monotonic() - began < 120  # not the deadline
    assert region.collect(results) == 0
    with torch.inference_mode():
        torch.testing.assert_close(block(x, marker), eager)
