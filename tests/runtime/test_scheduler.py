"""The scheduler seam: ``ends_chunk`` (how a ticket learns that its plan ends a chunk) and the
shared ``TicketQueue`` bookkeeping. Pure: no torch, no asyncio."""

from __future__ import annotations

import msgspec
import pytest

from runtime.contract import EmitSpec
from runtime.scheduler import SchedulerError, TicketQueue, ends_chunk
from tests.runtime.tickets import ticket


class MediaMeta(msgspec.Struct, frozen=True):
    """A typed emission meta, as loops may declare instead of a dict."""

    chunk: int
    final: bool


def test_ends_chunk_reads_final_from_a_mapping_or_a_typed_meta() -> None:
    assert ends_chunk([EmitSpec("media", {"chunk": 0, "final": True})])
    assert not ends_chunk([EmitSpec("media", {"chunk": 0, "final": False})])
    assert ends_chunk([EmitSpec("media", MediaMeta(0, True))])  # type: ignore[arg-type]
    assert not ends_chunk([EmitSpec("media", MediaMeta(0, False))])  # type: ignore[arg-type]


def test_ends_chunk_needs_media_and_treats_unmarked_media_as_a_whole_chunk() -> None:
    assert not ends_chunk([])
    assert not ends_chunk([EmitSpec("progress", {"done": 3, "total": 3})])
    assert not ends_chunk([EmitSpec("applied", {"final": True})])
    assert ends_chunk([EmitSpec("progress", {"done": 1}), EmitSpec("media", {"chunk": 2})])


def test_ticket_queue_bookkeeping_is_shared_by_every_policy() -> None:
    queue = TicketQueue()
    queue.submit(ticket(0, "a"))
    queue.submit(ticket(1, "b"))
    queue.submit(ticket(2, "a"))
    assert queue.depth() == 3 and queue.queued("a") == (0, 2)
    queue.update(2, deadline_s=4.0, eligible_s=3.0)
    updated = queue.ticket(2)
    assert updated is not None and (updated.deadline_s, updated.eligible_s) == (4.0, 3.0)
    queue.pause_loop("a")
    assert queue.is_paused("a")
    assert queue.drop_loop("a") == [0, 2]
    assert not queue.is_paused("a") and [t.plan_id for t in queue.tickets()] == [1]
    with pytest.raises(SchedulerError, match="already queued"):
        queue.submit(ticket(1, "b"))
    with pytest.raises(SchedulerError, match="cost_gpu_s"):
        queue.submit(ticket(5, "b", cost_gpu_s=float("nan")))
    with pytest.raises(SchedulerError, match="not queued"):
        queue.update(9, deadline_s=None, eligible_s=0.0)
    with pytest.raises(SchedulerError, match="in flight is None"):
        queue.complete(0)
