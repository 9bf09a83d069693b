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
    [
        ("step-edf", StepEdfScheduler),
        ("chunk-rr", ChunkRoundRobinScheduler),
        ("fifo", FifoScheduler),
    ],
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


def test_cost_calibration_survives_a_restart(tmp_path: Path) -> None:
    with make_client(tmp_path) as client:
        ctx = client.app.state.ctx
        cost = ctx.engine.cost
        assert cost.samples("chunk_step", "c4x96x96") == 0  # nothing saved yet: priors
        for seconds in (0.02, 0.03):  # what the profiler does after each batch
            cost.observe("chunk_step", "c4x96x96", seconds)
        measured = cost.predict("chunk_step", "c4x96x96")
        model_id, device = ctx.model_id, ctx.device
    path = tmp_path / "data" / "cost" / f"{model_id}@{device}.json"
    assert path.exists()
    with make_client(tmp_path) as client:
        cost = client.app.state.ctx.engine.cost
        assert cost.samples("chunk_step", "c4x96x96") == 2
        assert cost.predict("chunk_step", "c4x96x96", 1e15) == pytest.approx(measured)


def test_an_unreadable_cost_file_is_ignored(tmp_path: Path) -> None:
    with make_client(tmp_path) as client:
        ctx = client.app.state.ctx
        path = tmp_path / "data" / "cost" / f"{ctx.model_id}@{ctx.device}.json"
    path.write_text("{not json")
    with make_client(tmp_path) as client:  # starts on priors, and saves a good file again
        assert client.app.state.ctx.engine.cost.snapshot()["entries"] == []
    assert path.read_text().startswith("{\n")


@pytest.mark.parametrize(
    ("steering", "lead", "restart", "withdraw"),
    [
        ("fast", "adaptive", "regenerate-when-sooner", True),
        ("baseline", "fixed", "cuts-only", False),
    ],
)
def test_the_latency_mode_and_the_steering_path_are_composed(
    tmp_path: Path, steering: str, lead: str, restart: str, withdraw: bool
) -> None:
    with make_client(
        tmp_path, model="wan-tiny-random", chunk_frames=1, steering=steering
    ) as client:
        ctx = client.app.state.ctx
        assert ctx.engine.timing.lead.name == lead and ctx.engine.withdraw_on_input is withdraw
        instance = ctx.host.models["wan-tiny-random"]
        assert instance.chunk_restart.name == restart
        served = next(c for c in client.get("/v1/models").json()["data"] if c["served"])
        assert served["default_profile"]["chunk_latent_frames"] == 1  # as served
