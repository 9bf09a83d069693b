"""``sessions.steering_cost``: what steering throws away, priced from real media queues."""

from __future__ import annotations

import numpy as np
import pytest

from runtime.admission import AdmissionConfig, AdmissionController, AdmissionRequest, Admit
from sessions.media_queue import MediaQueue
from sessions.steering_cost import (
    HISTORY_FRAMES,
    MAX_FRACTION,
    MIN_FRAMES,
    SteeringCost,
    overhead,
)


def queue(generated: int, flushed: int) -> MediaQueue:
    """A session's media queue after ``generated`` frames, the first ``flushed`` of them
    flushed by an applied input."""
    media = MediaQueue(capacity_frames=max(generated, 1))
    media.put_chunk(
        np.zeros((generated, 2, 2, 3), np.uint8), list(range(1, generated + 1)), chunk=0, segment=0
    )
    media.flush_before(flushed + 1)
    return media


def test_a_flushed_fraction_costs_what_regenerating_it_takes() -> None:
    # a third of the generated frames never shown: half a share more generation
    assert overhead(0.6, 1 / 3) == pytest.approx(0.3)
    assert overhead(0.6, 0.0) == 0.0
    assert overhead(0.6, 0.9) == pytest.approx(0.6 * MAX_FRACTION / (1 - MAX_FRACTION))


def test_the_servers_fraction_counts_live_and_ended_sessions_and_a_young_session_uses_it() -> None:
    cost = SteeringCost()
    assert cost.fraction() == 0.0
    ended = queue(100, 10)
    cost.ended(ended)
    live = queue(50, 15)
    assert cost.fraction([live]) == pytest.approx(25 / 150)
    assert cost.session_fraction(live, 0.05) == pytest.approx(15 / 50)
    young = queue(MIN_FRAMES - 1, 20)  # too few frames of its own yet
    assert cost.session_fraction(young, 0.05) == 0.05


def test_refresh_reprices_each_held_reservation_with_its_own_fraction() -> None:
    admission = AdmissionController(AdmissionConfig(peak_capacity_bytes=0))
    cost = SteeringCost()
    requests = [AdmissionRequest(f"s{i}", compute_gpu_s_per_s=0.3) for i in range(2)]
    held = []
    for request, media in zip(requests, (queue(60, 20), queue(60, 0)), strict=True):
        answer = admission.admit(request)
        assert isinstance(answer, Admit)
        held.append((answer.reservation_id, request, media))
    cost.refresh(admission, held)
    assert admission.usage().steering_gpu_s_per_s == pytest.approx(overhead(0.3, 1 / 3))
    assert admission.usage().compute_gpu_s_per_s == pytest.approx(0.6 + 0.15)
    off = SteeringCost(enabled=False)
    assert off.price(requests[0], 0.5).steering_gpu_s_per_s == 0.0
    assert cost.price(requests[0], 0.5).steering_gpu_s_per_s == pytest.approx(0.3)


def test_the_servers_history_weighs_recent_sessions_the_most() -> None:
    cost = SteeringCost()
    cost.ended(queue(1000, 500))  # an early viewer who switched all the time
    assert cost.fraction() == pytest.approx(0.5)
    calm = queue(1000, 0)
    for _ in range(3 * HISTORY_FRAMES // 1000):
        cost.ended(calm)  # then viewers who never switch
    # counted forever, the early half would still be 500 / 30,000 frames; halved as the
    # history passes HISTORY_FRAMES it is far less
    assert cost.fraction() < 500 / (3 * HISTORY_FRAMES) / 4
    assert cost.fraction() > 0
