"""Metrics: engine-fed Counters and the step-latency Histogram, session totals advanced at
scrape time, one private registry per app."""

from __future__ import annotations

import asyncio

import pytest
import torch

from runtime.contract import Priority
from runtime.cost import CostModel
from runtime.engine import Engine
from runtime.observers import BatchReport
from server.ops.metrics import STEP_LATENCY_BUCKETS_S, MetricsSnapshot, ServerMetrics
from tests.e2e.test_sessions_e2e import parse_metrics
from tests.runtime.toy_loops import ToyDenoiseLoop, ToyDenoiser, ToyModel, ToyRequest


def report(kind: str, *step_wall_s: float, failed: int = 0, missed: int = 0) -> BatchReport:
    return BatchReport(
        batch_id=0,
        kind=kind,
        wall_s=sum(step_wall_s),
        step_wall_s=step_wall_s,
        failed=failed,
        deadlines_missed=missed,
    )


def test_batch_reports_feed_counters_and_the_latency_histogram() -> None:
    metrics = ServerMetrics(MetricsSnapshot)
    metrics.batch_done(report("chunk_step", 0.0004, 0.03))  # a batch of two plans
    metrics.batch_done(report("chunk_step", 1.5, missed=1))
    metrics.batch_done(report("vae_decode", 3.0))
    metrics.batch_done(report("vae_decode", failed=1))  # its one plan failed
    m = parse_metrics(metrics.render().decode())
    assert m['dreamrt_steps_total{kind="chunk_step"}'] == 3
    assert m['dreamrt_steps_total{kind="vae_decode"}'] == 1
    assert m["dreamrt_engine_plans_executed_total"] == 4
    assert m["dreamrt_engine_plan_failures_total"] == 1
    assert m["dreamrt_engine_deadline_misses_total"] == 1
    # the executor's calls and their wall time, each batch once (not once per plan)
    assert m['dreamrt_engine_batches_total{kind="chunk_step"}'] == 2
    assert m['dreamrt_engine_batches_total{kind="vae_decode"}'] == 2
    assert m['dreamrt_engine_batch_seconds_total{kind="chunk_step"}'] == pytest.approx(1.5304)
    assert m['dreamrt_engine_batch_seconds_total{kind="vae_decode"}'] == pytest.approx(3.0)
    step = 'dreamrt_step_latency_seconds_bucket{kind="chunk_step",le="%s"}'
    assert m[step % "0.001"] == 1 and m[step % "0.02"] == 1 and m[step % "0.05"] == 2
    assert m[step % "1.0"] == 2 and m[step % "2.0"] == 3 and m[step % "+Inf"] == 3
    assert m['dreamrt_step_latency_seconds_count{kind="chunk_step"}'] == 3
    assert m['dreamrt_step_latency_seconds_sum{kind="chunk_step"}'] == pytest.approx(1.5304)
    decode = 'dreamrt_step_latency_seconds_bucket{kind="vae_decode",le="%s"}'
    assert m[decode % "2.0"] == 0 and m[decode % "+Inf"] == 1  # 3 s: beyond the last bucket
    assert STEP_LATENCY_BUCKETS_S[0] == 0.001 and STEP_LATENCY_BUCKETS_S[-2] == 2.0


def test_session_totals_are_counters_advanced_at_each_scrape() -> None:
    snapshots = [
        MetricsSnapshot(frames_sent=10, stalls=1, admission_rejections={"kv_slabs": 1}),
        MetricsSnapshot(
            frames_sent=25,
            stalls=1,
            media_flushed=7,
            admission_rejections={"kv_slabs": 2, "compute": 1},
        ),
        MetricsSnapshot(frames_sent=20, stalls=2),  # a total going down is ignored (logged)
    ]
    metrics = ServerMetrics(lambda: snapshots[0])
    first = parse_metrics(metrics.render().decode())
    assert (first["dreamrt_frames_sent_total"], first["dreamrt_stalls_total"]) == (10, 1)
    snapshots.pop(0)
    second = parse_metrics(metrics.render().decode())
    assert second["dreamrt_frames_sent_total"] == 25
    assert second["dreamrt_media_flushed_frames_total"] == 7
    assert second['dreamrt_admission_rejections_total{reason="kv_slabs"}'] == 2
    assert second['dreamrt_admission_rejections_total{reason="compute"}'] == 1
    snapshots.pop(0)
    third = parse_metrics(metrics.render().decode())
    assert (third["dreamrt_frames_sent_total"], third["dreamrt_stalls_total"]) == (25, 2)
    assert third['dreamrt_admission_rejections_total{reason="kv_slabs"}'] == 2


def test_live_state_gauges_come_from_the_snapshot() -> None:
    snapshot = MetricsSnapshot(
        sessions_by_state={"live": 1, "paused": 2},
        queue_depth=4,
        executing=True,
        kv_slabs_free=1,
        kv_slabs_capacity=3,
    )
    m = parse_metrics(ServerMetrics(lambda: snapshot).render().decode())
    assert m['dreamrt_sessions{state="live"}'] == 1 and m['dreamrt_sessions{state="paused"}'] == 2
    assert m["dreamrt_scheduler_queue_depth"] == 4 and m["dreamrt_engine_executing"] == 1
    assert (m["dreamrt_kv_slabs_free"], m["dreamrt_kv_slabs_capacity"]) == (1, 3)


def test_each_app_has_its_own_registry() -> None:
    one, two = ServerMetrics(MetricsSnapshot), ServerMetrics(MetricsSnapshot)
    one.batch_done(report("chunk_step", 0.01))
    assert one.registry.get_sample_value("dreamrt_steps_total", {"kind": "chunk_step"}) == 1
    assert two.registry.get_sample_value("dreamrt_steps_total", {"kind": "chunk_step"}) is None


async def test_an_engine_run_of_600_plans_counts_every_plan() -> None:
    # Past the engine's 512-sample latency window: totals must not be capped by it.
    model = ToyModel(ToyDenoiser(seed=3))
    metrics = ServerMetrics(MetricsSnapshot)
    engine = Engine(cost=CostModel(), max_lead_s=1e6, listeners=[metrics])
    await engine.start()
    try:
        handles = [
            engine.spawn(
                ToyDenoiseLoop(model),
                ToyRequest(seed=i, num_steps=200),
                model,
                loop_id=f"toy{i}",
                priority=Priority.BATCH,
                on_emit=lambda e: None,
            )
            for i in range(3)
        ]
        results = await asyncio.wait_for(asyncio.gather(*(h.result() for h in handles)), 120)
    finally:
        await engine.close()
    assert [r.outputs["steps"] for r in results] == [200, 200, 200]
    assert all(torch.isfinite(r.outputs["x"]).all() for r in results)
    stats = engine.stats()
    assert stats.plans_executed == 600
    kind = {"kind": "diffusion_step"}
    registry = metrics.registry
    assert registry.get_sample_value("dreamrt_steps_total", kind) == 600
    assert registry.get_sample_value("dreamrt_step_latency_seconds_count", kind) == 600
    assert registry.get_sample_value("dreamrt_engine_plans_executed_total") == 600
    m = parse_metrics(metrics.render().decode())
    assert m['dreamrt_steps_total{kind="diffusion_step"}'] == 600
    assert m['dreamrt_step_latency_seconds_bucket{kind="diffusion_step",le="+Inf"}'] == 600


def test_time_to_steer_histograms_come_from_the_watched_sessions_events() -> None:
    from sessions.events import (
        EventStream,
        InputLatency,
        InputShown,
        StartLatency,
        ViewerFirstFrame,
    )

    class Watched:
        events = EventStream()

    metrics = ServerMetrics(MetricsSnapshot)
    session = Watched()
    metrics.watch(session)
    full = InputLatency(
        latched_s=0.004, started_s=0.005, generated_s=0.2, decoded_s=0.21, enqueued_s=0.21,
        sent_s=0.22,
    )  # fmt: skip
    session.events.publish(InputShown(seq=1, kind="prompt", chunk=3, pts=0, latency=full))
    repeat = InputLatency(enqueued_s=0.3, sent_s=0.4)  # no runtime stages: not observed
    session.events.publish(InputShown(seq=2, kind="action", chunk=4, pts=0, latency=repeat))
    start = StartLatency(offer_s=0.02, answered_s=0.05, connected_s=0.1, sent_s=0.3)
    session.events.publish(ViewerFirstFrame(pts=0, latency=start))
    m = parse_metrics(metrics.render().decode())
    count = 'dreamrt_input_latency_seconds_count{kind="%s",stage="%s"}'
    assert m[count % ("prompt", "latched")] == 1 and m[count % ("prompt", "sent")] == 1
    assert m['dreamrt_input_latency_seconds_sum{kind="prompt",stage="sent"}'] == pytest.approx(0.22)
    assert m[count % ("action", "sent")] == 1 and count % ("action", "latched") not in m
    assert m['dreamrt_first_frame_seconds_count{stage="connected"}'] == 1
    assert 'dreamrt_first_frame_seconds_count{stage="generated"}' not in m
    bucket = 'dreamrt_input_latency_seconds_bucket{kind="prompt",le="%s",stage="sent"}'
    assert (m[bucket % "0.2"], m[bucket % "0.3"]) == (0, 1)
