"""The composition root: the engine gets the configured scheduling policy and reports its
batches to the app's metrics."""

from __future__ import annotations

from pathlib import Path

import pytest

from runtime.baseline_schedulers import ChunkRoundRobinScheduler, FifoScheduler
from runtime.scheduler import SchedulerError
from runtime.step_edf import StepEdfScheduler
from tests.server.conftest import make_client


@pytest.mark.parametrize(
    ("name", "policy"),
    [("step-edf", StepEdfScheduler), ("chunk-rr", ChunkRoundRobinScheduler),
     ("fifo", FifoScheduler)],
)
def test_engine_is_composed_with_the_configured_policy(
    tmp_path: Path, name: str, policy: type
) -> None:
    with make_client(tmp_path, scheduler=name, max_batch=3) as client:
        ctx = client.app.state.ctx
        assert type(ctx.engine.scheduler) is policy
        assert ctx.metrics in ctx.engine.listeners
        if policy is StepEdfScheduler:
            assert ctx.engine.scheduler.batching.max_batch == 3


def test_an_unknown_policy_fails_startup_naming_the_known_ones(tmp_path: Path) -> None:
    with pytest.raises(SchedulerError, match="step-edf, chunk-rr, fifo"):
        with make_client(tmp_path, scheduler="round-robin"):
            pass
