"""The scheduling policies side by side on hand-built plans: two sessions and a job, a
FakeClock and a FakeExecutor, loops that submit their next plan when the last one finished
(as the engine's drivers do). No torch, no asyncio."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import pytest

from runtime.baseline_schedulers import ChunkRoundRobinScheduler, FifoScheduler
from runtime.contract import Priority
from runtime.policies import SCHEDULER_POLICIES, make_scheduler
from runtime.scheduler import PickReason, Scheduler, SchedulerError, TicketQueue
from runtime.step_edf import StepEdfScheduler
from tests.runtime.tickets import FakeClock, FakeExecutor, ticket

RT = Priority.REALTIME
BATCH = Priority.BATCH
COST_S = 0.1


@dataclass
class PlanSpec:
    """One hand-built plan of a scripted loop."""

    ends_chunk: bool = False
    deadline_s: float | None = None
    eligible_s: float | None = None  # None: eligible when submitted


def session(chunks: int, steps: int, *, first_deadline_s: float) -> list[PlanSpec]:
    """A session's plans: per chunk ``steps`` denoise steps, then a decode that emits the
    chunk's final media (ends_chunk), then (before the next chunk) a KV update; deadlines
    grow by one plan cost per plan."""
    plans: list[PlanSpec] = []
    for c in range(chunks):
        if c:
            plans.append(PlanSpec())  # kv_update of the previous chunk
        plans += [PlanSpec() for _ in range(steps)]
        plans.append(PlanSpec(ends_chunk=True))  # vae_decode, final media
    return [PlanSpec(p.ends_chunk, first_deadline_s + i * 2 * COST_S) for i, p in enumerate(plans)]


def job(steps: int) -> list[PlanSpec]:
    return [PlanSpec() for _ in range(steps)]


class ScriptedLoops:
    """Drives scripted loops against a scheduler: a loop's first plan is submitted in arrival
    order, its next one as soon as its last one completed; a loop without plans left ends
    (``drop_loop``). Records which loop's plan ran, as ``"A0"`` etc."""

    def __init__(
        self, scheduler: Scheduler, loops: dict[str, tuple[Priority, Sequence[PlanSpec]]]
    ) -> None:
        self.s = scheduler
        self.clock = FakeClock()
        self.executor = FakeExecutor(self.clock)
        self.loops = loops
        self.next_index = dict.fromkeys(loops, 0)
        self.plan_names: dict[int, str] = {}
        self.next_plan_id = 0
        self.order: list[str] = []
        self.reasons: list[PickReason] = []
        for loop_id in loops:
            self.submit_next(loop_id)

    def submit_next(self, loop_id: str) -> None:
        priority, plans = self.loops[loop_id]
        index = self.next_index[loop_id]
        if index == len(plans):
            self.s.drop_loop(loop_id)
            return
        spec = plans[index]
        self.next_index[loop_id] = index + 1
        plan_id = self.next_plan_id
        self.next_plan_id += 1
        self.plan_names[plan_id] = f"{loop_id}{index}"
        self.s.submit(
            ticket(
                plan_id,
                loop_id,
                priority,
                deadline_s=spec.deadline_s,
                cost_gpu_s=COST_S,
                enqueued_s=self.clock.now_s,
                eligible_s=spec.eligible_s,
                ends_chunk=spec.ends_chunk,
            )
        )

    def step(self) -> bool:
        """Run one pick (advancing the clock to the next event if nothing may run now)."""
        batch = self.s.pick(self.clock.now_s)
        if batch is None:
            next_s = self.s.next_event_s(self.clock.now_s)
            if next_s is None:
                return False
            self.clock.now_s = next_s
            return True
        self.executor.run(batch)
        self.s.complete(batch.batch_id)
        self.order += [self.plan_names[pid] for pid in batch.plan_ids]
        self.reasons.append(batch.reason)
        for loop_id in batch.loop_ids:
            self.submit_next(loop_id)
        return True

    def run(self) -> list[str]:
        while self.step():
            pass
        assert self.s.depth() == 0, "every plan ran"
        return self.order


def two_sessions_and_a_job() -> dict[str, tuple[Priority, Sequence[PlanSpec]]]:
    # A: chunk 0 = A0 A1 A2(final); chunk 1 = A3(kv update) A4 A5 A6(final). B likewise with
    # later deadlines. J: a four-step batch job with no media.
    return {
        "A": (RT, session(2, 2, first_deadline_s=1.0)),
        "B": (RT, session(2, 2, first_deadline_s=1.1)),
        "J": (BATCH, job(4)),
    }


def names(loop_id: str, indices: range) -> list[str]:
    return [f"{loop_id}{i}" for i in indices]


# --------------------------------------------------------------------------------------------


def test_step_edf_interleaves_sessions_step_by_step_and_runs_the_job_in_slack() -> None:
    sched = StepEdfScheduler(max_batch=1, max_batch_wait_s=100.0)
    order = ScriptedLoops(sched, two_sessions_and_a_job()).run()
    sessions = [name for pair in zip(names("A", range(7)), names("B", range(7))) for name in pair]
    assert order == [*sessions, *names("J", range(4))]


def test_step_edf_aging_gives_the_job_a_step_whenever_it_waited_max_batch_wait_s() -> None:
    sched = StepEdfScheduler(max_batch=1, max_batch_wait_s=0.35)
    loops = ScriptedLoops(sched, two_sessions_and_a_job())
    order = loops.run()
    # each J step is promoted 0.35 s after it was submitted, with that virtual deadline
    # (earlier than every session deadline), so it runs at the next step boundary
    assert order == [
        "A0", "B0", "A1", "B1", "J0",
        "A2", "B2", "A3", "B3", "J1",
        "A4", "B4", "A5", "B5", "J2",
        "A6", "B6", "J3",
    ]  # fmt: skip
    aged = [i for i, reason in enumerate(loops.reasons) if reason is PickReason.AGED]
    assert aged == [4, 9, 14] and loops.reasons[-1] is PickReason.SLACK


def test_chunk_rr_runs_whole_chunks_and_passes_the_turn_round_robin() -> None:
    sched = ChunkRoundRobinScheduler()
    loops = ScriptedLoops(sched, two_sessions_and_a_job())
    order = loops.run()
    assert order == [
        *names("A", range(3)),  # A's chunk 0 ends with its final-media decode
        *names("B", range(3)),
        *names("J", range(4)),  # a job emits no media: its turn is its whole run
        *names("A", range(3, 7)),  # KV update of chunk 0, then chunk 1
        *names("B", range(3, 7)),
    ]
    assert set(loops.reasons) == {PickReason.TURN}


def test_fifo_runs_each_loop_to_completion_in_arrival_order() -> None:
    order = ScriptedLoops(FifoScheduler(), two_sessions_and_a_job()).run()
    assert order == [*names("A", range(7)), *names("B", range(7)), *names("J", range(4))]


def test_fifo_a_job_that_arrived_first_blocks_both_sessions_until_it_ends() -> None:
    loops = two_sessions_and_a_job()
    first_job = {"J": loops["J"], "A": loops["A"], "B": loops["B"]}
    order = ScriptedLoops(FifoScheduler(), first_job).run()
    assert order == [*names("J", range(4)), *names("A", range(7)), *names("B", range(7))]


def test_fifo_session_ahead_of_playout_lets_later_loops_run_then_takes_the_executor_back() -> None:
    # A's third plan may not start before t=0.5 s (lead limit): meanwhile J (which arrived
    # later) runs; at the first step boundary after 0.5 s, A (earlier arrival) goes on.
    loops = {
        "A": (RT, [PlanSpec(), PlanSpec(), PlanSpec(eligible_s=0.5), PlanSpec()]),
        "J": (BATCH, job(6)),
    }
    order = ScriptedLoops(FifoScheduler(), loops).run()
    assert order == ["A0", "A1", "J0", "J1", "J2", "A2", "A3", "J3", "J4", "J5"]


def test_chunk_rr_lead_limit_gates_the_start_of_a_turn_only() -> None:
    # B's first plan is not eligible before 0.45 s: A's turns go on meanwhile. Inside A's
    # second turn a not-yet-eligible plan still runs (a chunk is one unit of work).
    a = [
        PlanSpec(),
        PlanSpec(ends_chunk=True),
        PlanSpec(),
        PlanSpec(eligible_s=5.0),
        PlanSpec(ends_chunk=True),
    ]
    loops = {"A": (RT, a), "B": (RT, [PlanSpec(eligible_s=0.45), PlanSpec(ends_chunk=True)])}
    scripted = ScriptedLoops(ChunkRoundRobinScheduler(), loops)
    order = scripted.run()
    assert order == ["A0", "A1", "A2", "A3", "A4", "B0", "B1"]
    assert scripted.clock.now_s == pytest.approx(0.7)


def test_chunk_rr_holder_between_plans_blocks_everyone_until_it_submits() -> None:
    sched = ChunkRoundRobinScheduler()
    sched.submit(ticket(0, "A", cost_gpu_s=COST_S))
    sched.submit(ticket(1, "B", cost_gpu_s=COST_S, ends_chunk=True))
    first = sched.pick(0.0)
    assert first is not None and first.loop_ids == ("A",) and sched.holder == "A"
    sched.complete(first.batch_id)
    # A's driver has not submitted its next plan yet: B is ready, but it is A's turn
    assert sched.pick(0.1) is None and sched.next_event_s(0.1) is None
    sched.submit(ticket(2, "A", cost_gpu_s=COST_S, enqueued_s=0.1, ends_chunk=True))
    second = sched.pick(0.1)
    assert second is not None and second.plan_ids == (2,)
    sched.complete(second.batch_id)
    assert sched.holder is None
    third = sched.pick(0.2)
    assert third is not None and third.loop_ids == ("B",)


@pytest.mark.parametrize("policy", [ChunkRoundRobinScheduler, FifoScheduler])
def test_pausing_or_dropping_the_holder_passes_the_executor_on(policy: type) -> None:
    sched = policy()
    sched.submit(ticket(0, "A"))
    sched.submit(ticket(1, "B"))
    sched.submit(ticket(2, "C"))
    first = sched.pick(0.0)
    assert first is not None and first.loop_ids == ("A",)
    sched.complete(first.batch_id)
    assert sched.pick(0.1) is None  # A is between plans
    sched.pause_loop("A")
    second = sched.pick(0.1)
    assert second is not None and second.loop_ids == ("B",) and sched.holder == "B"
    sched.complete(second.batch_id)
    sched.drop_loop("B")
    third = sched.pick(0.2)
    assert third is not None and third.loop_ids == ("C",)
    sched.complete(third.batch_id)
    sched.drop_loop("C")
    sched.submit(ticket(3, "A"))
    assert sched.pick(0.3) is None  # A is paused: nothing may run
    sched.resume_loop("A")
    fourth = sched.pick(0.3)
    assert fourth is not None and fourth.plan_ids == (3,)


@pytest.mark.parametrize("policy", [ChunkRoundRobinScheduler, FifoScheduler])
def test_baselines_never_batch_and_keep_step_boundaries(policy: type) -> None:
    sched = policy()
    for pid, loop_id in enumerate("ABC"):
        sched.submit(ticket(pid, loop_id))  # same batch key, all batchable
    batch = sched.pick(0.0)
    assert batch is not None and len(batch.plan_ids) == 1
    with pytest.raises(SchedulerError, match="in flight"):
        sched.pick(0.0)
    with pytest.raises(SchedulerError, match="complete"):
        sched.complete(batch.batch_id + 1)


def test_policies_by_name() -> None:
    assert SCHEDULER_POLICIES == ("step-edf", "chunk-rr", "fifo")
    built = {name: make_scheduler(name, max_batch=3) for name in SCHEDULER_POLICIES}
    assert isinstance(built["step-edf"], StepEdfScheduler)
    assert built["step-edf"].batching.max_batch == 3
    assert isinstance(built["chunk-rr"], ChunkRoundRobinScheduler)
    assert isinstance(built["fifo"], FifoScheduler)
    assert all(isinstance(s, TicketQueue) and s.name == n for n, s in built.items())
    assert make_scheduler() is not make_scheduler()  # a scheduler serves one engine
    with pytest.raises(SchedulerError, match="step-edf, chunk-rr, fifo"):
        make_scheduler("round-robin")
