"""ActivationTrace and ParityAligner (runtime/traces.py) on real diffusion_denoise jobs of the
tiny 50-step T2V card, through the real engine: the aligner names the first divergent step
and block of a run against a reference run."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
import torch

from models.loops.requests import JobRequest
from runtime.driver import run_inline
from runtime.traces import ActivationTrace, ParityAligner
from tests.models.conftest import CACHES_OFF, run_jobs


@pytest.fixture(scope="module")
def instance(t2v_instance: Any) -> Any:
    return t2v_instance


def job(threshold: float | None = None) -> JobRequest:
    extensions = dict(CACHES_OFF)
    if threshold is not None:
        extensions["fbcache"] = {"enabled": True, "threshold": threshold}
    return JobRequest(task="t2i", prompt="a lighthouse", seed=2, extensions=extensions)


async def run(instance: Any, loop_id: str, request: JobRequest, observers: list) -> Any:
    instance.block_observers = tuple(observers)
    try:
        return (await run_jobs(instance, {loop_id: request}, observers=observers))[loop_id]
    finally:
        instance.block_observers = ()


@pytest.fixture(scope="module")
def reference(instance: Any) -> tuple[ActivationTrace, Any]:
    trace = ActivationTrace(keep=True)
    outputs = asyncio.run(run(instance, "ref", job(), [trace]))
    return trace, outputs


def test_a_trace_records_every_step_and_block_and_changes_nothing(
    instance: Any, reference: tuple[ActivationTrace, Any]
) -> None:
    trace, traced = reference
    layers = instance.dit.config.num_layers
    records = trace.records("ref")
    outputs = [r for r in records if r.block is None]
    assert [r.step for r in outputs] == list(range(50))
    blocks = {(r.step, r.branch, r.block) for r in records if r.block is not None}
    assert len(blocks) == 50 * 2 * layers  # every block of both CFG branches at every step
    assert all(r.max_abs >= r.mean_abs > 0 for r in records)
    plain, _ = asyncio.run(run_inline(instance.loop("diffusion_denoise"), job(), instance))
    assert torch.equal(plain.outputs["latents"], traced["latents"])


def test_the_aligner_names_the_first_step_a_cache_reused(
    instance: Any, reference: tuple[ActivationTrace, Any]
) -> None:
    trace, _ = reference
    aligner = ParityAligner(trace, against={"cached": "ref", "exact": "ref"})
    own = ActivationTrace()
    asyncio.run(run(instance, "cached", job(0.1), [aligner, own]))
    # the steps whose blocks after block 0 did not run: the cache reused them
    ran: dict[int, set[int]] = {}
    for r in own.records("cached"):
        if r.block is not None:
            ran.setdefault(r.step, set()).add(r.block)
    reused = sorted(step for step, blocks in ran.items() if blocks == {0})
    assert reused, "the cache reused no step: the check would prove nothing"
    first = aligner.first_divergence("cached")
    assert first is not None and first.step == reused[0] and first.block is None
    assert first.max_abs > 0 and "step" in first.describe()
    # threshold 0: compared everywhere, no divergence
    before = aligner.compared
    asyncio.run(run(instance, "exact", job(0.0), [aligner]))
    assert aligner.first_divergence("exact") is None
    layers = instance.dit.config.num_layers
    assert aligner.compared - before == 50 * (2 * layers + 1)  # every block and step output


def test_the_aligner_names_the_first_divergent_block(
    instance: Any, reference: tuple[ActivationTrace, Any]
) -> None:
    trace, _ = reference
    aligner = ParityAligner(trace, against={"bent": "ref"}, atol=1e-6)
    bias = instance.dit.blocks[1].ffn[2].bias  # the tiny DiT has 2 blocks
    saved = bias.detach().clone()
    with torch.no_grad():
        bias.add_(1e-2)
    try:
        asyncio.run(run(instance, "bent", job(), [aligner]))
    finally:
        with torch.no_grad():
            bias.copy_(saved)
    first = aligner.first_divergence("bent")
    assert (first.step, first.block, first.branch) == (0, 1, "cond")
    with pytest.raises(ValueError, match="keep=True"):
        ParityAligner(ActivationTrace())
