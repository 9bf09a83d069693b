"""step-edf on plain tickets with a FakeClock and a FakeExecutor (no torch, no asyncio)."""

from __future__ import annotations

import math
import random
from dataclasses import dataclass

import pytest

from runtime.contract import Priority
from runtime.scheduler import Batch, PickReason, SchedulerError, Ticket
from runtime.step_edf import StepEdfScheduler
from tests.runtime.tickets import KEY, FakeClock, FakeExecutor, ticket

RT = Priority.REALTIME
BATCH = Priority.BATCH


def make_scheduler(**overrides: object) -> StepEdfScheduler:
    params: dict[str, object] = {"max_batch": 1, "max_batch_wait_s": 10.0}
    params.update(overrides)
    return StepEdfScheduler(**params)  # type: ignore[arg-type]


class Checked:
    """Wraps a scheduler; checks postconditions after every pick."""

    def __init__(self, scheduler: StepEdfScheduler) -> None:
        self.s = scheduler
        self.picked: set[int] = set()
        self.history: list[Batch] = []

    def submit(self, t: Ticket) -> None:
        self.s.submit(t)

    def pick(self, now_s: float) -> Batch | None:
        before = {t.plan_id: t for t in self.s.tickets()}
        slack_before = self.s.slack.slack_s(
            [t for t in before.values() if t.priority is RT and not self.s.is_paused(t.loop_id)],
            now_s,
        )
        batch = self.s.pick(now_s)
        after = {t.plan_id for t in self.s.tickets()}
        if batch is None:
            assert after == set(before), "pick returning None must not change the queue"
            return None
        members = [before[pid] for pid in batch.plan_ids]  # KeyError = picked a non-queued plan
        assert not (set(batch.plan_ids) & self.picked), "a ticket was picked twice"
        assert len(set(batch.plan_ids)) == len(batch.plan_ids)
        assert 1 <= len(members) <= self.s.batching.max_batch
        assert all(not self.s.is_paused(t.loop_id) for t in members), "picked a paused loop"
        assert all(t.batch_key == members[0].batch_key for t in members)
        if len(members) > 1:
            assert all(t.batchable for t in members)
        for t in members:
            if t.priority is RT:
                assert t.eligible_s <= now_s, "realtime ticket picked before eligible_s"
        if batch.reason is PickReason.SLACK:
            assert slack_before > batch.cost_gpu_s, "batch work picked without enough slack"
        assert after == set(before) - set(batch.plan_ids)
        assert batch.loop_ids == tuple(t.loop_id for t in members)
        assert math.isclose(batch.cost_gpu_s, sum(t.cost_gpu_s for t in members))
        self.picked.update(batch.plan_ids)
        self.history.append(batch)
        return batch


def drain(sched: Checked, clock: FakeClock, executor: FakeExecutor) -> list[Batch]:
    out = []
    while (batch := sched.pick(clock.now_s)) is not None:
        executor.run(batch)
        sched.s.complete(batch.batch_id)
        out.append(batch)
    return out


# --------------------------------------------------------------------------------------------


def test_edf_picks_earliest_deadline_first_whole_sequence() -> None:
    sched = Checked(make_scheduler())
    clock = FakeClock()
    for pid, (loop, deadline) in enumerate([("a", 3.0), ("b", 1.0), ("c", 2.0), ("d", 0.5)]):
        sched.submit(ticket(pid, loop, deadline_s=deadline))
    batches = drain(sched, clock, FakeExecutor(clock))
    assert [b.loop_ids for b in batches] == [("d",), ("b",), ("c",), ("a",)]
    assert all(b.reason is PickReason.DEADLINE for b in batches)
    assert sched.s.depth() == 0


def test_realtime_without_deadline_ranks_after_deadlines_but_before_batch() -> None:
    sched = Checked(make_scheduler())
    sched.submit(ticket(0, "job", BATCH))
    sched.submit(ticket(1, "free", RT, deadline_s=None))
    sched.submit(ticket(2, "timed", RT, deadline_s=50.0))
    clock = FakeClock()
    assert [b.loop_ids[0] for b in drain(sched, clock, FakeExecutor(clock))] == [
        "timed",
        "free",
        "job",
    ]


def test_running_loop_beats_new_loop_at_equal_deadline() -> None:
    sched = Checked(make_scheduler())
    sched.submit(ticket(0, "a", deadline_s=1.0))
    assert sched.pick(0.0).loop_ids == ("a",)  # type: ignore[union-attr]
    sched.s.complete(0)
    # b enqueued earlier than a's second plan, same deadline: a has run, so a goes first.
    sched.submit(ticket(1, "b", deadline_s=2.0, enqueued_s=0.1))
    sched.submit(ticket(2, "a", deadline_s=2.0, enqueued_s=0.2))
    assert sched.pick(0.3).loop_ids == ("a",)  # type: ignore[union-attr]
    sched.s.complete(1)
    # ...but urgency decides first: an earlier deadline of a new loop wins.
    sched.submit(ticket(3, "a", deadline_s=3.0, enqueued_s=0.4))
    sched.submit(ticket(4, "c", deadline_s=2.5, enqueued_s=0.5))
    assert sched.pick(0.6).loop_ids == ("b",)  # type: ignore[union-attr]
    sched.s.complete(2)
    assert sched.pick(0.7).loop_ids == ("c",)  # type: ignore[union-attr]


def test_batch_work_runs_running_jobs_first_then_fifo() -> None:
    sched = Checked(make_scheduler())
    sched.submit(ticket(0, "old", BATCH, enqueued_s=0.0))
    assert sched.pick(0.0).loop_ids == ("old",)  # type: ignore[union-attr]
    sched.s.complete(0)
    sched.submit(ticket(1, "new1", BATCH, enqueued_s=0.1))
    sched.submit(ticket(2, "new2", BATCH, enqueued_s=0.2))
    sched.submit(ticket(3, "old", BATCH, enqueued_s=0.3))
    clock = FakeClock(0.4)
    order = [b.loop_ids[0] for b in drain(sched, clock, FakeExecutor(clock))]
    assert order == ["old", "new1", "new2"]


def test_batch_runs_only_when_slack_exceeds_its_cost() -> None:
    # One realtime ticket held back by the lead limit: deadline 6.0, cost 0.5 -> slack at 0 is 5.5.
    sched = Checked(make_scheduler())
    sched.submit(ticket(0, "rt", deadline_s=6.0, cost_gpu_s=0.5, eligible_s=5.0))
    sched.submit(ticket(1, "big", BATCH, cost_gpu_s=6.0))
    assert sched.pick(0.0) is None  # 6.0 > 5.5: the big job must wait
    sched.submit(ticket(2, "small", BATCH, cost_gpu_s=1.0, enqueued_s=0.01))
    batch = sched.pick(0.01)  # backfill: the small one fits
    assert batch is not None and batch.loop_ids == ("small",) and batch.reason is PickReason.SLACK
    sched.s.complete(batch.batch_id)
    sched.submit(ticket(3, "small", BATCH, cost_gpu_s=1.0, enqueued_s=4.0))
    assert sched.pick(4.6) is None  # slack 6.0 - 4.6 - 0.5 = 0.9 < 1.0
    assert sched.pick(5.0).loop_ids == ("rt",)  # type: ignore[union-attr]


def test_slack_accounts_for_all_queued_realtime_work_edf() -> None:
    sched = make_scheduler()
    waiting = [
        ticket(0, "a", deadline_s=2.0, cost_gpu_s=0.5, eligible_s=1.5),
        ticket(1, "b", deadline_s=2.2, cost_gpu_s=0.5, eligible_s=1.5),
        ticket(2, "c", deadline_s=9.0, cost_gpu_s=0.5, eligible_s=8.0),
    ]
    # EDF from t=0: a ends 0.5 (slack 1.5), b ends 1.0 (slack 1.2), c ends 1.5 (slack 7.5)
    assert sched.slack.slack_s(waiting, 0.0) == pytest.approx(1.2)
    assert sched.slack.slack_s([], 0.0) == math.inf
    for t in waiting:
        sched.submit(t)
    sched.submit(ticket(3, "job", BATCH, cost_gpu_s=1.3))
    assert sched.pick(0.0) is None
    sched.submit(ticket(4, "job2", BATCH, cost_gpu_s=1.1))
    assert sched.pick(0.0).loop_ids == ("job2",)  # type: ignore[union-attr]


def test_aging_promotes_starved_batch_ticket() -> None:
    sched = Checked(make_scheduler(max_batch_wait_s=2.0))
    sched.submit(ticket(0, "job", BATCH, cost_gpu_s=5.0, enqueued_s=0.0))
    sched.submit(ticket(1, "rt", deadline_s=3.0, cost_gpu_s=0.5, eligible_s=2.5))
    assert sched.pick(1.0) is None  # no slack for 5.0
    assert sched.s.next_event_s(1.0) == 2.0  # promotion time comes before eligibility
    batch = sched.pick(2.0)
    assert batch is not None and batch.loop_ids == ("job",) and batch.reason is PickReason.AGED


def test_aged_batch_competes_by_virtual_deadline() -> None:
    sched = make_scheduler(max_batch_wait_s=2.0)
    sched.submit(ticket(0, "job", BATCH, enqueued_s=0.0))  # virtual deadline 2.0
    sched.submit(ticket(1, "late_rt", deadline_s=1.5))
    sched.submit(ticket(2, "later_rt", deadline_s=4.0))
    order = []
    while (b := sched.pick(2.5)) is not None:
        order.append(b.loop_ids[0])
        sched.complete(b.batch_id)
    assert order == ["late_rt", "job", "later_rt"]


def test_preemption_only_at_step_boundaries() -> None:
    sched = Checked(make_scheduler())
    clock = FakeClock()
    executor = FakeExecutor(clock)
    sched.submit(ticket(0, "job", BATCH, cost_gpu_s=2.0))
    batch = sched.pick(clock.now_s)
    assert batch is not None
    # An urgent realtime plan arrives while the batch step runs: no pick until it completes.
    sched.submit(ticket(1, "rt", deadline_s=0.5, enqueued_s=0.1))
    with pytest.raises(SchedulerError, match="in flight"):
        sched.pick(0.1)
    executor.run(batch)
    sched.s.complete(batch.batch_id)
    nxt = sched.pick(clock.now_s)
    assert nxt is not None and nxt.loop_ids == ("rt",)
    ((first, start, end),) = executor.runs
    assert (first.loop_ids, start, end) == (("job",), 0.0, 2.0)  # ran whole, uninterrupted
    with pytest.raises(SchedulerError, match="complete"):
        sched.s.complete(first.batch_id)


def test_batching_groups_compatible_tickets_in_policy_order() -> None:
    sched = Checked(make_scheduler(max_batch=3))
    other_key = ("inst", "vae_decode", "8x16", "fp32")
    sched.submit(ticket(0, "a", deadline_s=1.0))
    sched.submit(ticket(1, "b", deadline_s=4.0))
    sched.submit(ticket(2, "c", deadline_s=2.0, batch_key=other_key))
    sched.submit(ticket(3, "d", deadline_s=3.0))
    sched.submit(ticket(4, "e", deadline_s=2.5, batchable=False))
    sched.submit(ticket(5, "f", deadline_s=3.5))
    first = sched.pick(0.0)
    assert first is not None and first.loop_ids == ("a", "d", "f")  # max 3, EDF order, same key
    sched.s.complete(first.batch_id)
    second = sched.pick(0.0)
    assert second is not None and second.loop_ids == ("c",)
    sched.s.complete(second.batch_id)
    third = sched.pick(0.0)
    assert third is not None and third.loop_ids == ("e",)  # not batchable: alone
    sched.s.complete(third.batch_id)
    assert sched.pick(0.0).loop_ids == ("b",)  # type: ignore[union-attr]


def test_batching_skips_paused_and_ineligible_and_respects_slack() -> None:
    sched = Checked(make_scheduler(max_batch=8))
    sched.submit(ticket(0, "a", deadline_s=1.0))
    sched.submit(ticket(1, "paused", deadline_s=1.0))
    sched.submit(ticket(2, "future", deadline_s=1.0, eligible_s=5.0))
    sched.s.pause_loop("paused")
    batch = sched.pick(0.0)
    assert batch is not None and batch.loop_ids == ("a",)
    sched.s.complete(batch.batch_id)
    # Slack group: jobs of cost 1.0 each, slack 2.5 -> only two fit in one batch.
    s2 = Checked(make_scheduler(max_batch=8))
    s2.submit(ticket(0, "rt", deadline_s=3.0, cost_gpu_s=0.5, eligible_s=2.0))
    for i in range(4):
        s2.submit(ticket(1 + i, f"job{i}", BATCH, cost_gpu_s=1.0, enqueued_s=0.01 * i))
    b = s2.pick(0.0)
    assert b is not None and b.loop_ids == ("job0", "job1") and b.reason is PickReason.SLACK


def test_lead_limit_holds_realtime_until_eligible() -> None:
    sched = Checked(make_scheduler())
    sched.submit(ticket(0, "rt", deadline_s=2.0, eligible_s=1.0))
    assert sched.pick(0.5) is None
    assert sched.s.next_event_s(0.5) == 1.0
    assert sched.pick(1.0).loop_ids == ("rt",)  # type: ignore[union-attr]
    assert sched.s.next_event_s(1.0) is None


def test_paused_loop_keeps_tickets_but_is_never_picked() -> None:
    sched = Checked(make_scheduler())
    sched.submit(ticket(0, "p", deadline_s=0.1))
    sched.submit(ticket(1, "q", deadline_s=0.2))
    sched.s.pause_loop("p")
    b = sched.pick(0.0)
    assert b is not None and b.loop_ids == ("q",)
    sched.s.complete(b.batch_id)
    assert sched.pick(0.0) is None and sched.s.depth() == 1 and sched.s.queued("p") == (0,)
    assert sched.s.next_event_s(0.0) is None
    sched.s.resume_loop("p")
    assert sched.pick(0.0).loop_ids == ("p",)  # type: ignore[union-attr]


def test_drop_loop_removes_its_queued_tickets_only() -> None:
    sched = make_scheduler()
    sched.submit(ticket(0, "a", deadline_s=1.0))
    sched.submit(ticket(1, "b", deadline_s=2.0))
    sched.submit(ticket(2, "a", deadline_s=3.0))
    assert sched.drop_loop("a") == [0, 2]
    assert sched.depth() == 1 and sched.drop_loop("a") == []
    assert sched.pick(0.0).loop_ids == ("b",)  # type: ignore[union-attr]


def test_update_retimes_a_queued_ticket() -> None:
    sched = make_scheduler()
    sched.submit(ticket(0, "a", deadline_s=1.0))
    sched.submit(ticket(1, "b", deadline_s=2.0))
    sched.update(0, deadline_s=5.0, eligible_s=0.0)
    assert sched.pick(0.0).loop_ids == ("b",)  # type: ignore[union-attr]
    with pytest.raises(SchedulerError, match="not queued"):
        sched.update(1, deadline_s=1.0, eligible_s=0.0)


def test_protocol_misuse_raises() -> None:
    sched = make_scheduler()
    sched.submit(ticket(0, "a"))
    with pytest.raises(SchedulerError, match="already queued"):
        sched.submit(ticket(0, "a"))
    with pytest.raises(SchedulerError, match="cost_gpu_s"):
        sched.submit(ticket(1, "a", cost_gpu_s=-1.0))
    with pytest.raises(SchedulerError, match="max_batch"):
        StepEdfScheduler(max_batch=0)


@dataclass
class SimLoop:
    loop_id: str
    priority: Priority
    steps: int
    period_s: float
    cost_s: float
    batch_key: tuple[str, ...] = KEY
    done_steps: int = 0
    max_lead_s: float = 0.5
    finished_s: float | None = None

    def next_ticket(self, plan_id: int, now_s: float) -> Ticket:
        if self.priority is RT:
            deadline = (self.done_steps + 1) * self.period_s
            return ticket(
                plan_id,
                self.loop_id,
                RT,
                deadline_s=deadline,
                cost_gpu_s=self.cost_s,
                enqueued_s=now_s,
                eligible_s=deadline - self.max_lead_s,
                batch_key=self.batch_key,
            )
        return ticket(
            plan_id,
            self.loop_id,
            BATCH,
            cost_gpu_s=self.cost_s,
            enqueued_s=now_s,
            batch_key=self.batch_key,
        )


@pytest.mark.parametrize("max_batch", [1, 4])
def test_simulation_postconditions_every_pick_and_no_starvation(max_batch: int) -> None:
    """Realtime loops keep the device ~80% busy; batch jobs still finish (slack + aging)."""
    rng = random.Random(7)
    sched = Checked(make_scheduler(max_batch=max_batch, max_batch_wait_s=1.0))
    clock = FakeClock()
    executor = FakeExecutor(clock)
    keys = [KEY, ("inst", "chunk_step", "big", "fp32")]
    loops = [
        SimLoop(f"rt{i}", RT, steps=40, period_s=0.1, cost_s=0.02, batch_key=keys[i % 2])
        for i in range(4)
    ]
    loops += [SimLoop(f"job{i}", BATCH, steps=10, period_s=0.0, cost_s=0.05) for i in range(3)]
    by_id = {lp.loop_id: lp for lp in loops}
    next_id = 0
    for lp in loops:
        sched.submit(lp.next_ticket(next_id, 0.0))
        next_id += 1
    for _ in range(10_000):
        batch = sched.pick(clock.now_s)
        if batch is None:
            nxt = sched.s.next_event_s(clock.now_s)
            if nxt is None:
                break
            clock.now_s = nxt
            continue
        executor.run(batch)
        sched.s.complete(batch.batch_id)
        if rng.random() < 0.05:  # occasional pause/resume churn
            victim = rng.choice(loops).loop_id
            sched.s.pause_loop(victim)
            sched.s.resume_loop(victim)
        for loop_id in batch.loop_ids:
            lp = by_id[loop_id]
            lp.done_steps += 1
            if lp.done_steps < lp.steps:
                sched.submit(lp.next_ticket(next_id, clock.now_s))
                next_id += 1
            else:
                lp.finished_s = clock.now_s
    assert all(lp.done_steps == lp.steps for lp in loops), [
        (lp.loop_id, lp.done_steps) for lp in loops
    ]
    assert sched.s.depth() == 0
    jobs_done = [by_id[f"job{i}"].finished_s for i in range(3)]
    rt_done = max(by_id[f"rt{i}"].finished_s for i in range(4))  # type: ignore[type-var]
    assert all(t is not None for t in jobs_done)
    # Batch work made progress while realtime was active (not only after all realtime ended).
    first_job_pick = min(start for b, start, _ in executor.runs if b.priority is BATCH)
    assert first_job_pick < rt_done
    if max_batch > 1:
        assert max(len(b.plan_ids) for b in sched.history) > 1
