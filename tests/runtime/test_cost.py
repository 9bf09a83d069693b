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
