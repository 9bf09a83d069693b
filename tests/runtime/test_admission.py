"""Admission as reservation: compute share, KV slabs, peak bytes; retry_after; miss feedback."""

from __future__ import annotations

import pytest

from runtime.admission import (
    SLO_COMPUTE_CAPACITY,
    AdmissionConfig,
    AdmissionController,
    AdmissionError,
    AdmissionRequest,
    Admit,
    BatchPricing,
    Reject,
)
from runtime.pools import KVSlabPool

GIB = 1 << 30


class FakeClock:
    def __init__(self) -> None:
        self.now_s = 100.0

    def __call__(self) -> float:
        return self.now_s


def make_controller(
    clock: FakeClock | None = None, slabs: int = 8, **overrides: object
) -> AdmissionController:
    params: dict[str, object] = {"peak_capacity_bytes": 4 * GIB}
    params.update(overrides)
    ctl = AdmissionController(AdmissionConfig(**params), clock=clock or FakeClock())  # type: ignore[arg-type]
    ctl.add_pool("g", KVSlabPool(slabs, 1024))
    return ctl


def req(
    owner: str,
    share: float = 0.1,
    kv: bool = True,
    peak: int = GIB,
    duration_s: float | None = None,
) -> AdmissionRequest:
    return AdmissionRequest(
        owner,
        compute_gpu_s_per_s=share,
        kv_pool="g" if kv else None,
        peak_bytes=peak,
        expected_duration_s=duration_s,
    )


def test_for_stream_share_is_chunk_cost_over_chunk_duration() -> None:
    r = AdmissionRequest.for_stream("s", chunk_cost_gpu_s=0.125, frames_per_chunk=4, fps=16)
    assert r.compute_gpu_s_per_s == pytest.approx(0.5)  # 0.125 GPU-s per 0.25 s of media
    with pytest.raises(AdmissionError, match="fps"):
        AdmissionRequest.for_stream("s", chunk_cost_gpu_s=0.1, frames_per_chunk=4, fps=0)


def test_admits_until_full_then_names_compute() -> None:
    ctl = make_controller()
    ids = []
    for i in range(3):
        verdict = ctl.admit(req(f"s{i}", share=0.3, kv=False, peak=0))
        assert isinstance(verdict, Admit)
        ids.append(verdict.reservation_id)
    assert len(set(ids)) == 3
    verdict = ctl.admit(req("s3", share=0.05, kv=False, peak=0))
    assert isinstance(verdict, Reject)
    assert (verdict.reason, verdict.short, verdict.permanent) == ("compute", ("compute",), False)
    assert "s3" in verdict.detail and "GPU-s/s" in verdict.detail


@pytest.mark.parametrize(
    ("request_", "short"),
    [
        (req("x", share=0.5, kv=False, peak=0), "compute"),
        (req("x", share=0.0, kv=True, peak=0), "kv_slabs"),
        (req("x", share=0.0, kv=False, peak=3 * GIB + 1), "peak_bytes"),
    ],
)
def test_rejects_when_any_single_resource_is_short(request_: AdmissionRequest, short: str) -> None:
    ctl = make_controller(slabs=1, peak_concurrency=2)
    assert isinstance(ctl.admit(req("held", share=0.5, kv=True, peak=GIB)), Admit)
    verdict = ctl.admit(request_)
    assert isinstance(verdict, Reject)
    assert verdict.reason == short and verdict.short == (short,)
    # Everything else was fine: shrinking just the short resource admits it.
    fixed = {
        "compute": req("x", share=0.3, kv=False, peak=0),
        "kv_slabs": req("x", share=0.0, kv=False, peak=0),
        "peak_bytes": req("x", share=0.0, kv=False, peak=3 * GIB),
    }[short]
    assert isinstance(ctl.admit(fixed), Admit)


def test_reason_is_first_short_resource_and_short_lists_all() -> None:
    ctl = make_controller(slabs=1)
    assert isinstance(ctl.admit(req("a", share=0.8, kv=True, peak=GIB)), Admit)
    verdict = ctl.admit(req("b", share=0.2, kv=True, peak=GIB))
    assert isinstance(verdict, Reject)
    assert verdict.reason == "compute" and verdict.short == ("compute", "kv_slabs")
    assert "all 1 chunk-KV slabs of g are in use" in verdict.detail


def test_peak_bytes_counts_the_largest_concurrent_peaks_only() -> None:
    single = make_controller(peak_capacity_bytes=4 * GIB, peak_concurrency=1)
    for i in range(5):  # one batch of one plan at a time: peaks do not add up
        assert isinstance(single.admit(req(f"s{i}", share=0.0, kv=False, peak=3 * GIB)), Admit)
    assert single.usage().peak_bytes == 3 * GIB
    pair = make_controller(peak_capacity_bytes=4 * GIB, peak_concurrency=2)
    assert isinstance(pair.admit(req("a", share=0.0, kv=False, peak=3 * GIB)), Admit)
    verdict = pair.admit(req("b", share=0.0, kv=False, peak=2 * GIB))
    assert isinstance(verdict, Reject) and verdict.reason == "peak_bytes"
    assert isinstance(pair.admit(req("c", share=0.0, kv=False, peak=GIB)), Admit)


def test_release_is_idempotent_and_frees_capacity() -> None:
    ctl = make_controller()
    verdict = ctl.admit(req("a", share=0.9, kv=False, peak=0))
    assert isinstance(verdict, Admit)
    assert isinstance(ctl.admit(req("b", share=0.1, kv=False, peak=0)), Reject)
    assert ctl.release(verdict.reservation_id) is True
    assert ctl.release(verdict.reservation_id) is False
    assert ctl.release("never-issued") is False
    assert ctl.usage().reservations == 0 and ctl.usage().compute_gpu_s_per_s == 0.0
    assert isinstance(ctl.admit(req("b", share=0.1, kv=False, peak=0)), Admit)


def test_retry_after_is_the_earliest_release_that_makes_room() -> None:
    clock = FakeClock()
    ctl = make_controller(clock, default_retry_after_s=7.0, min_retry_after_s=1.0)
    assert isinstance(ctl.admit(req("forever", share=0.3, kv=False, peak=0)), Admit)
    assert isinstance(ctl.admit(req("job30", share=0.3, kv=False, peak=0, duration_s=30.0)), Admit)
    assert isinstance(ctl.admit(req("job12", share=0.3, kv=False, peak=0, duration_s=12.0)), Admit)
    clock.now_s += 2.0
    small = ctl.admit(req("s", share=0.2, kv=False, peak=0))
    assert isinstance(small, Reject) and small.retry_after_s == pytest.approx(
        10.0
    )  # job12 ends at +12
    big = ctl.admit(req("b", share=0.5, kv=False, peak=0))
    assert isinstance(big, Reject) and big.retry_after_s == pytest.approx(28.0)  # needs job30 too
    huge = ctl.admit(req("h", share=0.7, kv=False, peak=0))
    assert isinstance(huge, Reject) and huge.retry_after_s == 7.0  # "forever" never declared an end
    clock.now_s += 11.5
    soon = ctl.admit(req("s", share=0.2, kv=False, peak=0))
    assert isinstance(soon, Reject) and soon.retry_after_s == 1.0  # floored at min_retry_after_s


def test_request_larger_than_capacity_is_permanent() -> None:
    ctl = make_controller(slabs=0)
    verdict = ctl.admit(req("whale", share=0.1, kv=True, peak=0))
    assert isinstance(verdict, Reject)
    assert verdict.permanent and verdict.reason == "kv_slabs" and "alone exceeds" in verdict.detail


def test_deadline_misses_tighten_compute_capacity_and_recover() -> None:
    ctl = make_controller(
        miss_window=20, min_outcomes=10, miss_ratio_threshold=0.1, tighten_factor=0.5
    )
    assert ctl.effective_compute_capacity() == pytest.approx(0.9)
    for _ in range(9):
        ctl.record_deadline(missed=True)
    assert not ctl.tightened()  # fewer than min_outcomes
    ctl.record_deadline(missed=True)
    assert ctl.tightened() and ctl.effective_compute_capacity() == pytest.approx(0.45)
    verdict = ctl.admit(req("s", share=0.6, kv=False, peak=0))
    assert isinstance(verdict, Reject) and verdict.reason == "compute" and not verdict.permanent
    for _ in range(19):  # window of 20: 1 miss left -> 5% <= 10%
        ctl.record_deadline(missed=False)
    assert ctl.miss_ratio() == pytest.approx(0.05) and not ctl.tightened()
    assert isinstance(ctl.admit(req("s", share=0.6, kv=False, peak=0)), Admit)


def test_misses_older_than_the_horizon_stop_tightening() -> None:
    """The sessions that missed ended (a job ran beside the last one): no realtime outcome
    follows, and admission relaxes once their misses are older than the horizon."""
    clock = FakeClock()
    ctl = make_controller(clock, min_outcomes=10, miss_horizon_s=30.0, tighten_factor=0.8)
    for _ in range(20):
        ctl.record_deadline(missed=True)
        clock.now_s += 0.5
    assert ctl.tightened() and ctl.effective_compute_capacity() == pytest.approx(0.72)
    assert isinstance(ctl.admit(req("s", share=0.8, kv=False, peak=0)), Reject)
    clock.now_s += 20.0  # no outcome since: every miss still within the horizon
    assert ctl.tightened()
    clock.now_s += 10.0  # every miss older than 30 s
    assert ctl.miss_ratio() == 0.0 and not ctl.tightened()
    assert isinstance(ctl.admit(req("s", share=0.8, kv=False, peak=0)), Admit)


def test_invalid_requests_and_configs_raise() -> None:
    ctl = make_controller()
    with pytest.raises(AdmissionError, match="no slab pool 'nope'"):
        ctl.admit(AdmissionRequest("bad", kv_pool="nope"))
    with pytest.raises(AdmissionError, match="peak_bytes"):
        ctl.admit(req("bad", peak=-1))
    with pytest.raises(AdmissionError, match="already registered"):
        ctl.add_pool("g", KVSlabPool(1, 1))
    with pytest.raises(AdmissionError, match="compute_gpu_s_per_s"):
        ctl.admit(req("bad", share=float("nan")))
    with pytest.raises(AdmissionError, match="tighten_factor"):
        AdmissionConfig(peak_capacity_bytes=1, tighten_factor=0.0)
    with pytest.raises(AdmissionError, match="miss_horizon_s"):
        AdmissionConfig(peak_capacity_bytes=1, miss_horizon_s=0.0)


def test_the_slab_pool_is_the_one_kv_gate_and_release_returns_the_slab() -> None:
    clock = FakeClock()
    ctl = make_controller(clock, slabs=2, default_retry_after_s=9.0)
    pool = ctl.pool("g")
    first = ctl.admit(req("a", share=0.0, peak=0))
    second = ctl.admit(req("b", share=0.0, peak=0, duration_s=4.0))
    assert isinstance(first, Admit) and isinstance(second, Admit)
    assert (first.slab.slab_id, second.slab.slab_id) == (0, 1) and pool.free_count == 0
    assert first.slab.owner == "a" and ctl.usage().kv_slabs == 2
    full = ctl.admit(req("c", share=0.0, peak=0))
    assert isinstance(full, Reject) and full.reason == "kv_slabs" and not full.permanent
    assert full.retry_after_s == pytest.approx(4.0)  # b declared it ends in 4 s
    assert ctl.admit(req("job", share=0.0, kv=False, peak=0)).slab is None  # no KV, no slab
    assert ctl.release(second.reservation_id) and pool.free_count == 1
    assert not ctl.release(second.reservation_id) and pool.free_count == 1  # idempotent
    third = ctl.admit(req("c", share=0.0, peak=0))
    assert isinstance(third, Admit) and third.slab.slab_id == 1
    ctl.release(first.reservation_id)
    fork = pool.fork(third.slab, "c/fork")  # a slab taken outside admission still counts
    assert fork is not None and isinstance(ctl.admit(req("d", share=0.0, peak=0)), Reject)


# --------------------------------------------------------------------------------------------
# batch pricing: sessions whose steps run as one batch are priced as that batch


def batched(
    owner: str, alone: float, steps: tuple[float, ...], key: str = "m:c3"
) -> AdmissionRequest:
    return AdmissionRequest(
        owner,
        compute_gpu_s_per_s=alone,
        kv_pool="g",
        peak_bytes=1,
        batching=BatchPricing(key, steps),
    )


def test_a_batch_group_is_priced_as_its_batch_not_k_times_one() -> None:
    # steps of one session 0.188 GPU-s/s of a 0.310 share; two in one batch 1.47x one
    one = 0.188
    steps = (one, 1.47 * one, 1.94 * one, 2.41 * one)
    ctl = make_controller()
    for i in range(3):
        assert isinstance(ctl.admit(batched(f"s{i}", 0.310, steps)), Admit)
    rest = 0.310 - one
    assert ctl.usage().compute_gpu_s_per_s == pytest.approx(3 * rest + steps[2])
    assert ctl.marginal_compute(batched("s3", 0.310, steps)) == pytest.approx(
        rest + steps[3] - steps[2]
    )
    refused = ctl.admit(batched("s3", 0.310, steps))
    assert isinstance(refused, Reject) and refused.reason == "compute"
    assert f"+{rest + steps[3] - steps[2]:.3f} GPU-s/s" in refused.detail
    # priced one by one, the third would not have fitted
    alone = make_controller()
    assert [isinstance(alone.admit(req(f"s{i}", 0.310)), Admit) for i in range(3)] == [
        True,
        True,
        False,
    ]


def test_groups_are_apart_beyond_max_batch_form_new_batches_and_mix_with_others() -> None:
    steps = (0.2, 0.3)  # max_batch 2
    assert BatchPricing("k", steps).total(5) == pytest.approx(2 * 0.3 + 0.2)
    ctl = make_controller()
    ctl.admit(batched("a", 0.25, steps, key="x"))
    ctl.admit(batched("b", 0.25, steps, key="y"))  # another shape: its own batch
    ctl.admit(req("c", 0.1))
    assert ctl.usage().compute_gpu_s_per_s == pytest.approx(2 * 0.25 + 0.1)
    reservation = ctl.admit(batched("d", 0.25, steps, key="x"))
    assert ctl.usage().compute_gpu_s_per_s == pytest.approx(0.05 + 0.05 + 0.3 + 0.25 + 0.1)
    assert isinstance(reservation, Admit) and ctl.release(reservation.reservation_id)
    assert ctl.usage().compute_gpu_s_per_s == pytest.approx(2 * 0.25 + 0.1)


def test_batch_pricing_is_validated() -> None:
    ctl = make_controller()
    with pytest.raises(AdmissionError, match="finite shares"):
        ctl.admit(batched("a", 0.3, ()))
    with pytest.raises(AdmissionError, match="exceeds"):
        ctl.admit(batched("a", 0.1, (0.2, 0.3)))
    assert AdmissionConfig(peak_capacity_bytes=0).compute_capacity == SLO_COMPUTE_CAPACITY == 0.9


def steered(owner: str, share: float, steering: float) -> AdmissionRequest:
    return AdmissionRequest(owner, compute_gpu_s_per_s=share, steering_gpu_s_per_s=steering)


def test_steering_counts_against_the_shared_capacity_and_can_be_repriced() -> None:
    ctl = make_controller()
    first = ctl.admit(steered("a", 0.4, 0.1))
    assert isinstance(first, Admit)  # on an idle device without its estimate; measured later:
    assert ctl.reprice(first.reservation_id, steering_gpu_s_per_s=0.1)
    usage = ctl.usage()
    assert usage.compute_gpu_s_per_s == pytest.approx(0.5)
    assert usage.steering_gpu_s_per_s == pytest.approx(0.1)
    # 0.5 + 0.3 fits 0.9; with its own steering of 0.15 it does not
    assert ctl.marginal_compute(steered("b", 0.3, 0.15)) == pytest.approx(0.45)
    refused = ctl.admit(steered("b", 0.3, 0.15))
    assert isinstance(refused, Reject) and refused.reason == "compute"
    assert not refused.permanent and "0.500+0.450" in refused.detail
    # the first session stopped steering: its measured share falls, the second fits
    assert ctl.reprice(first.reservation_id, steering_gpu_s_per_s=0.0)
    assert ctl.usage().compute_gpu_s_per_s == pytest.approx(0.4)
    assert isinstance(ctl.admit(steered("b", 0.3, 0.15)), Admit)
    assert ctl.usage().compute_gpu_s_per_s == pytest.approx(0.85)
    assert not ctl.reprice("res-none", steering_gpu_s_per_s=0.1)
    with pytest.raises(AdmissionError, match="steering_gpu_s_per_s"):
        ctl.reprice(first.reservation_id, steering_gpu_s_per_s=float("nan"))


def test_an_estimate_of_steering_never_refuses_a_session_that_fits_alone() -> None:
    ctl = make_controller()
    # 0.8 alone fits 0.9; with 0.2 of expected steering it would not, yet an idle device takes it
    only = ctl.admit(steered("a", 0.8, 0.2))
    assert isinstance(only, Admit)
    assert ctl.usage().steering_gpu_s_per_s == 0.0  # admitted bare; its owner reprices it
    ctl.release(only.reservation_id)
    too_big = ctl.admit(steered("b", 0.95, 0.0))
    assert isinstance(too_big, Reject) and too_big.permanent
    with pytest.raises(AdmissionError, match="steering_gpu_s_per_s"):
        ctl.admit(steered("c", 0.1, -0.1))
