"""Cost model: analytic prior, EWMA calibration per (kind, shape_sig), publishable snapshot."""

from __future__ import annotations

import random

import msgspec
import pytest

from runtime.contract import PlanKind
from runtime.cost import CostModel, CostModelError, DeviceConstants

DEV = DeviceConstants(
    name="test", sustained_flops=1e12, bandwidth_bytes_per_s=1e11, overhead_s=1e-4
)


def test_prior_is_overhead_plus_flops_plus_bytes() -> None:
    cost = CostModel(DEV)
    assert cost.prior(2e12, 5e10) == pytest.approx(1e-4 + 2.0 + 0.5)
    assert cost.predict(PlanKind.CHUNK_STEP, "a", 2e12, 5e10) == pytest.approx(2.5001)


def test_calibration_replaces_prior_and_converges() -> None:
    rng = random.Random(0)
    cost = CostModel(DEV, alpha=0.2)
    prior = cost.predict("chunk_step", "480p", 1e12, 0.0)
    assert prior == pytest.approx(1.0001)
    for _ in range(60):
        cost.observe("chunk_step", "480p", 0.25 * (1 + rng.uniform(-0.05, 0.05)))
    assert cost.predict("chunk_step", "480p", 1e12, 0.0) == pytest.approx(0.25, rel=0.03)
    assert cost.samples("chunk_step", "480p") == 60
    # Other keys keep their prior; PlanKind and its value name the same key.
    assert cost.predict("chunk_step", "720p", 1e12, 0.0) == pytest.approx(prior)
    assert cost.predict(PlanKind.CHUNK_STEP, "480p") == cost.predict("chunk_step", "480p")


def test_calibration_tracks_drift_and_divides_batches() -> None:
    cost = CostModel(DEV, alpha=0.5)
    cost.observe("vae_decode", "s", 0.4, batch_size=4)  # 0.1 per plan
    assert cost.predict("vae_decode", "s") == pytest.approx(0.1)
    for _ in range(20):
        cost.observe("vae_decode", "s", 0.3)
    assert cost.predict("vae_decode", "s") == pytest.approx(0.3, rel=1e-4)


def test_min_samples_keeps_prior_until_enough_observations() -> None:
    cost = CostModel(DEV, min_samples=3)
    cost.observe("k", "s", 5.0)
    cost.observe("k", "s", 5.0)
    assert cost.predict("k", "s") == pytest.approx(1e-4)
    cost.observe("k", "s", 5.0)
    assert cost.predict("k", "s") == pytest.approx(5.0)


def test_snapshot_is_plain_data_sorted_by_key() -> None:
    cost = CostModel(DEV)
    cost.observe("vae_decode", "b", 0.2)
    cost.observe("chunk_step", "a", 0.1)
    snap = cost.snapshot()
    decoded = msgspec.json.decode(msgspec.json.encode(snap))
    assert decoded["method"] == "ewma" and decoded["device"]["name"] == "test"
    assert [(e["kind"], e["shape_sig"], e["gpu_s"], e["samples"]) for e in decoded["entries"]] == [
        ("chunk_step", "a", 0.1, 1),
        ("vae_decode", "b", 0.2, 1),
    ]


def test_bad_inputs_raise() -> None:
    cost = CostModel(DEV)
    with pytest.raises(CostModelError, match="measured_s"):
        cost.observe("k", "s", float("inf"))
    with pytest.raises(CostModelError, match="batch_size"):
        cost.observe("k", "s", 1.0, batch_size=0)
    with pytest.raises(CostModelError, match="flops"):
        cost.predict("k", "s", -1.0)
    with pytest.raises(CostModelError, match="alpha"):
        CostModel(DEV, alpha=0.0)
    with pytest.raises(CostModelError, match="sustained_flops"):
        DeviceConstants("x", 0.0, 1.0)


def test_load_restores_a_snapshot_through_json() -> None:
    cost = CostModel(DEV, alpha=0.5)
    for seconds in (0.2, 0.4, 0.3):
        cost.observe("chunk_step", "c3x60x104", seconds)
    cost.observe("vae_decode", "decode:0:3:c3x60x104", 0.14)
    wire = msgspec.json.encode(cost.snapshot())

    restarted = CostModel(DEV, alpha=0.5)
    assert restarted.predict("chunk_step", "c3x60x104", 1e12) == pytest.approx(1.0001)  # prior
    assert restarted.load(msgspec.json.decode(wire)) == 2
    for kind, sig in (("chunk_step", "c3x60x104"), ("vae_decode", "decode:0:3:c3x60x104")):
        assert restarted.predict(kind, sig, 1e12) == pytest.approx(cost.predict(kind, sig))
        assert restarted.samples(kind, sig) == cost.samples(kind, sig)
    # calibration goes on from the loaded state, as if the process had never stopped
    cost.observe("chunk_step", "c3x60x104", 0.5)
    restarted.observe("chunk_step", "c3x60x104", 0.5)
    assert restarted.predict("chunk_step", "c3x60x104") == pytest.approx(
        cost.predict("chunk_step", "c3x60x104")
    )
    assert restarted.snapshot() == cost.snapshot()


def test_load_refuses_another_device_and_malformed_entries() -> None:
    cost = CostModel(DEV)
    cost.observe("chunk_step", "a", 0.1)
    other = CostModel(DeviceConstants.cpu())
    with pytest.raises(CostModelError, match="device 'test'"):
        other.load(cost.snapshot())
    snap = cost.snapshot()
    fresh = CostModel(DEV)
    bad = {
        **snap,
        "entries": [*snap["entries"], {"kind": "x", "shape_sig": "y", "gpu_s": -1, "samples": 1}],
    }
    with pytest.raises(CostModelError, match="gpu_s"):
        fresh.load(bad)
    with pytest.raises(CostModelError, match="malformed"):
        fresh.load({**snap, "entries": [{"kind": "x"}]})
    assert fresh.samples("chunk_step", "a") == 0  # a refused snapshot loads nothing


def test_asynchronous_time_is_kept_apart_and_survives_a_snapshot() -> None:
    cm = CostModel(DeviceConstants("d", 1e12, 1e11, 0.0), alpha=1.0)
    cm.observe("vae_decode", "c3", 0.008)
    assert cm.predict_async("vae_decode", "c3") == 0.0  # nothing asynchronous seen yet
    cm.observe_async("vae_decode", "c3", 0.280, batch_size=2)
    assert cm.predict("vae_decode", "c3") == 0.008  # the executor's occupancy is unchanged
    assert cm.gpu_seconds("vae_decode", "c3") == pytest.approx(0.008 + 0.140)
    restored = CostModel(DeviceConstants("d", 1e12, 1e11, 0.0))
    restored.load(msgspec.json.decode(msgspec.json.encode(cm.snapshot())))
    assert restored.gpu_seconds("vae_decode", "c3") == pytest.approx(0.148)


# --------------------------------------------------------------------------------------------
# batches of k plans of one shape: each size its own calibration, a fitted line between


def test_a_batch_is_calibrated_per_size_not_as_k_times_one() -> None:
    cost = CostModel(DEV, alpha=1.0)
    cost.observe("chunk_step", "c3x34x60", 0.032)
    cost.observe("chunk_step", "c3x34x60", 0.047, batch_size=2)  # one forward for two steps
    assert cost.predict("chunk_step", "c3x34x60") == pytest.approx(0.032)  # one plan, alone
    assert cost.predict_batch("chunk_step", "c3x34x60", 2) == pytest.approx(0.047)
    # unmeasured sizes: the line through the measured ones, a + b k = 0.017 + 0.015 k
    assert cost.predict_batch("chunk_step", "c3x34x60", 3) == pytest.approx(0.062)
    assert cost.predict_batch("chunk_step", "c3x34x60", 4) == pytest.approx(0.077)
    assert (cost.samples("chunk_step", "c3x34x60", 2), cost.samples("chunk_step", "c3x34x60")) == (
        1,
        2,
    )
    # a third size refits the line by least squares over all three
    cost.observe("chunk_step", "c3x34x60", 0.080, batch_size=4)
    want = 0.032 + (0.080 - 0.032) / 3 * (3 - 1)  # the three points lie on one line here
    cost.observe("chunk_step", "c3x34x60", 0.048, batch_size=2)
    points = {1: 0.032, 2: 0.048, 4: 0.080}
    mean_k, mean_c = 7 / 3, sum(points.values()) / 3
    slope = sum((k - mean_k) * (c - mean_c) for k, c in points.items()) / sum(
        (k - mean_k) ** 2 for k in points
    )
    fitted = mean_c + slope * (3 - mean_k)
    assert cost.predict_batch("chunk_step", "c3x34x60", 3) == pytest.approx(fitted)
    assert fitted == pytest.approx(want, rel=0.02)


def test_unmeasured_sizes_are_clamped_and_fall_back_without_evidence() -> None:
    cost = CostModel(DEV, alpha=1.0)
    assert cost.predict_batch("k", "s", 3, 1e12) == pytest.approx(3 * cost.prior(1e12, 0.0))
    cost.observe("k", "s", 0.10, batch_size=2)  # one size: scaled per plan, no batching gain
    assert cost.predict("k", "s") == pytest.approx(0.05)
    assert cost.predict_batch("k", "s", 4) == pytest.approx(0.20)
    # superlinear measurements: the line would price 3 above 3 plans alone; capped there
    cost.observe("k", "s", 0.10)
    cost.observe("k", "s", 0.25, batch_size=2)
    assert cost.predict_batch("k", "s", 3) == pytest.approx(0.30)
    # a line that falls: never cheaper than the larger batch already measured below
    cost.observe("k", "s", 0.20, batch_size=2)
    cost.observe("k", "s", 0.15, batch_size=4)
    assert cost.predict_batch("k", "s", 5) >= 0.15 - 1e-12
    with pytest.raises(CostModelError, match="batch_size"):
        cost.predict_batch("k", "s", 0)


def test_asynchronous_time_of_a_batch_and_gpu_seconds_per_size() -> None:
    cost = CostModel(DEV, alpha=1.0)
    cost.observe("vae_decode", "d", 0.008)
    cost.observe_async("vae_decode", "d", 0.046)
    cost.observe_async("vae_decode", "d", 0.080, batch_size=2)
    assert cost.gpu_seconds("vae_decode", "d") == pytest.approx(0.054)
    # two decodes: the main-stream part has one size measured (scaled), the async part two
    assert cost.gpu_seconds("vae_decode", "d", batch_size=2) == pytest.approx(0.016 + 0.080)


def test_batch_sizes_survive_a_snapshot_and_old_entries_are_batches_of_one() -> None:
    cost = CostModel(DEV, alpha=1.0)
    cost.observe("chunk_step", "c", 0.032)
    cost.observe("chunk_step", "c", 0.047, batch_size=2)
    snap = msgspec.json.decode(msgspec.json.encode(cost.snapshot()))
    assert [(e["batch"], e["gpu_s"]) for e in snap["entries"]] == [(1, 0.032), (2, 0.047)]
    restored = CostModel(DEV)
    assert restored.load(snap) == 2
    assert restored.predict_batch("chunk_step", "c", 3) == pytest.approx(0.062)
    old = {
        **snap,
        "entries": [{"kind": "kv_update", "shape_sig": "c", "gpu_s": 0.04, "samples": 9}],
    }
    assert restored.load(old) == 1
    assert restored.samples("kv_update", "c", 1) == 9
    with pytest.raises(CostModelError, match="batch"):
        restored.load({**snap, "entries": [{**snap["entries"][0], "batch": 0}]})


def test_the_profiler_feeds_each_batch_under_its_size() -> None:
    from runtime.observers import BatchInfo, Profiler

    cost = CostModel(DEV, alpha=1.0)
    profiler = Profiler(cost, use_cuda_events=False)
    info = BatchInfo(7, "chunk_step", "c", "inst", "chunk_step", (1, 2), ("a", "b"))
    profiler.after_batch(info, [None, None], 0.047)
    assert cost.samples("chunk_step", "c", 2) == 1 and cost.samples("chunk_step", "c", 1) == 0
    assert cost.predict_batch("chunk_step", "c", 2) == pytest.approx(0.047)
