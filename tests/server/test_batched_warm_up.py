"""A server that batches sessions' steps warms them up and calibrates them before ready
(``server.ops.warm_up``): per profile a stage of sessions side by side whose steady steps
really run as one forward, and a calibration of that batch size, so admission prices a
session by what it adds to the batch it joins (``sessions.session_pricing.batch_pricing``)."""

from __future__ import annotations

import logging

from fastapi.testclient import TestClient

from models.compiled_set import compiled_set
from runtime.admission import BatchPricing
from sessions.session_pricing import batch_measured, batch_pricing
from tests.server.conftest import make_client
from tests.server.test_health import wait_ready


def _warmed(client: TestClient) -> tuple[object, object]:
    wait_ready(client)
    ctx = client.app.state.ctx
    return ctx, ctx.host.models.resolve(None)


def test_a_batching_server_warms_and_calibrates_sessions_side_by_side(tmp_path, caplog) -> None:
    caplog.set_level(logging.INFO, logger="server.app")
    overrides = {"warmup": True, "batch_sessions": "on", "max_sessions": 3, "max_batch": 3}
    with make_client(tmp_path, **overrides) as client:
        ctx, served = _warmed(client)
        progress = client.get("/readyz").json()["progress"]
        forwards = dict(served.chunk_step_op.batch_forwards)
        cost, max_batch = ctx.engine.cost, ctx.host.max_batch
        profiles = compiled_set(served.card, 3).profiles
    # the warm-up's two sessions side by side ran batched, and so did the calibration's three
    assert forwards.get(2, 0) >= 1 and forwards.get(3, 0) >= 1, forwards
    bars = [r.getMessage() for r in caplog.records if r.getMessage().startswith("warm-up [")]
    assert any("batched sessions" in bar for bar in bars)
    parts = 2 + ("text_to_video" in served.card.capabilities)  # sessions, batched, job
    assert progress["stages_total"] == len(profiles) * parts + 1
    assert max_batch == 3 and served.batched_plan_kinds() == {"chunk_step"}
    for profile in profiles:
        # a batch of three measured, and a session alone: admission has the line between
        assert batch_measured(cost, served, profile, 3)
        pricing = batch_pricing(cost, served, profile, max_batch=3)
        assert isinstance(pricing, BatchPricing) and len(pricing.shares) == 3
        sig = next(
            sig for kind, sig, _ in served.steady_chunk_plans(profile) if kind == "chunk_step"
        )
        assert cost.samples("chunk_step", sig, 1) >= 1 and cost.samples("chunk_step", sig, 3) >= 1


def test_a_restart_with_the_batch_measured_does_not_calibrate_it_again(tmp_path, caplog) -> None:
    caplog.set_level(logging.INFO, logger="runtime.loop_handle")
    overrides = {"warmup": True, "batch_sessions": "on", "max_sessions": 2, "max_batch": 2}

    def calibration_loops() -> int:
        return sum("loop calibration-" in r.getMessage() for r in caplog.records)

    with make_client(tmp_path, **overrides) as client:
        _warmed(client)
    assert calibration_loops() > 0
    caplog.clear()
    with make_client(tmp_path, **overrides) as client:  # DATA_DIR/cost holds both sizes
        _warmed(client)
    assert calibration_loops() == 0


def test_a_server_that_does_not_batch_warms_no_batches(tmp_path) -> None:
    with make_client(tmp_path, warmup=True, max_sessions=3) as client:
        ctx, served = _warmed(client)
        progress = client.get("/readyz").json()["progress"]
        assert not served.chunk_step_op.batch_forwards and ctx.host.max_batch == 1
    parts = 1 + ("text_to_video" in served.card.capabilities)
    assert progress["stages_total"] == len(compiled_set(served.card).profiles) * parts + 1
