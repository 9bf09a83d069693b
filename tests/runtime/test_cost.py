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
