"""Scheduler overhead per plan at 1, 8 and 64 active loops (goal: <= 200 us at 64 loops).

Two measurements, both without tensor work:

- **scheduler**: the pure decision path the engine runs per plan: cost prediction and
  deadline arithmetic for the next plan, ``StepEdfScheduler.submit``, ``pick``,
  ``complete``. Realtime loops at 16 fps on a simulated clock that advances by each batch's
  predicted cost (the device is overloaded, so every ticket is eligible: the worst case for
  ``pick``). Reported as the median over rounds of (round time / plans in the round), for
  max_batch 1 and 8.
- **engine**: the same loops through the real ``Engine`` (asyncio driver coroutines, the
  scheduling task, the executor thread, ``call_soon_threadsafe``) with a no-op op; wall time
  per executed plan. This includes everything the runtime adds around an op.

Run: ``python -m infra.bench.scheduler_overhead [--json PATH] [--rounds N]``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import platform
import statistics
import time
from collections.abc import Sequence
from typing import Any

import msgspec

from runtime.contract import (
    Done,
    InputEvent,
    LoopResult,
    LoopState,
    PlanKind,
    Priority,
    StepResult,
    WorkPlan,
)
from runtime.cost import CostModel
from runtime.engine import Engine
from runtime.scheduler import Ticket
from runtime.step_edf import StepEdfScheduler

LOOP_COUNTS = (1, 8, 64)
FPS_PERIOD_S = 1.0 / 16
KEY = ("default", PlanKind.CHUNK_STEP.value, "480p", "bf16")


def scheduler_us_per_plan(
    num_loops: int, max_batch: int, *, rounds: int, plans_per_round: int
) -> float:
    cost = CostModel()
    sched = StepEdfScheduler(max_batch=max_batch)
    now_s = 0.0
    steps = [0] * num_loops
    loop_ids = [f"loop{i}" for i in range(num_loops)]
    index_of = {loop_id: i for i, loop_id in enumerate(loop_ids)}
    next_plan_id = 0

    def submit(i: int) -> None:
        nonlocal next_plan_id
        cost_s = cost.predict(PlanKind.CHUNK_STEP, "480p", 1e9, 1e6)
        followups_s = cost.predict(PlanKind.VAE_DECODE, "480p", 1e8)
        deadline_s = steps[i] * FPS_PERIOD_S + 0.25 - followups_s
        sched.submit(
            Ticket(
                next_plan_id,
                loop_ids[i],
                Priority.REALTIME,
                KEY,
                True,
                deadline_s,
                cost_s,
                now_s,
                deadline_s - 1.0,
            )
        )
        next_plan_id += 1

    for i in range(num_loops):
        submit(i)
    per_round = []
    for _ in range(rounds):
        done = 0
        start = time.perf_counter()
        while done < plans_per_round:
            batch = sched.pick(now_s)
            if batch is None:
                nxt = sched.next_event_s(now_s)
                now_s = now_s + 1e-3 if nxt is None else nxt
                continue
            sched.complete(batch.batch_id)
            now_s += batch.cost_gpu_s
            for loop_id in batch.loop_ids:
                i = index_of[loop_id]
                steps[i] += 1
                submit(i)
            done += len(batch.plan_ids)
        per_round.append((time.perf_counter() - start) / done * 1e6)
    return statistics.median(per_round)


class _NoOp:
    name = "noop"
    batchable = True
    spmd = "all"

    def __call__(self, args: Sequence[Any], *, deterministic: bool = False) -> list[Any]:
        return list(args)


class _Steps(LoopState, kw_only=True):
    limit: int


class _NoOpLoop:
    name = "noop_loop"

    def __init__(self) -> None:
        self.op = _NoOp()

    def init(self, request: int, model: Any, ctx: Any) -> _Steps:
        return _Steps(limit=request)

    def next(self, state: _Steps) -> WorkPlan | Done:
        if state.step >= state.limit:
            return Done()
        return WorkPlan(
            loop_id="", kind=PlanKind.CHUNK_STEP, op=self.op, args=state.step, shape_sig="480p"
        )

    def advance(self, state: _Steps, result: StepResult) -> _Steps:
        return msgspec.structs.replace(state, step=state.step + 1)

    def finalize(self, state: _Steps) -> LoopResult:
        return LoopResult({"steps": state.step})

    def absorb(self, state: _Steps, inputs: Sequence[InputEvent]) -> _Steps:
        return state  # no live inputs reach it


async def _engine_us_per_plan(num_loops: int, max_batch: int, steps: int) -> float:
    engine = Engine(cost=CostModel(), scheduler=StepEdfScheduler(max_batch=max_batch))
    await engine.start()
    loop = _NoOpLoop()
    try:
        start = time.perf_counter()
        handles = [
            engine.spawn(
                loop, steps, None, loop_id=f"l{i}", priority=Priority.BATCH, on_emit=lambda e: None
            )
            for i in range(num_loops)
        ]
        for handle in handles:
            await handle.result()
        elapsed = time.perf_counter() - start
        plans = engine.stats().plans_executed
    finally:
        await engine.close()
    return elapsed / plans * 1e6


def engine_us_per_plan(
    num_loops: int, max_batch: int, *, rounds: int, plans_per_round: int
) -> float:
    steps = max(4, plans_per_round // num_loops)
    return statistics.median(
        asyncio.run(_engine_us_per_plan(num_loops, max_batch, steps)) for _ in range(rounds)
    )


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", dest="json_path", help="also write the results as JSON here")
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--plans", type=int, default=2000, help="plans per round")
    args = parser.parse_args(argv)
    rows = []
    for n in LOOP_COUNTS:
        rows.append(
            {
                "loops": n,
                "scheduler_us_per_plan_batch1": scheduler_us_per_plan(
                    n, 1, rounds=args.rounds, plans_per_round=args.plans
                ),
                "scheduler_us_per_plan_batch8": scheduler_us_per_plan(
                    n, 8, rounds=args.rounds, plans_per_round=args.plans
                ),
                "engine_us_per_plan_batch1": engine_us_per_plan(
                    n, 1, rounds=3, plans_per_round=args.plans // 2
                ),
                "engine_us_per_plan_batch8": engine_us_per_plan(
                    n, 8, rounds=3, plans_per_round=args.plans // 2
                ),
            }
        )
    header = (
        "| loops | scheduler, max_batch=1 | scheduler, max_batch=8 "
        "| engine e2e, max_batch=1 | engine e2e, max_batch=8 |"
    )
    lines = [
        f"scheduler overhead, median microseconds per plan ({args.rounds} rounds x "
        f"{args.plans} plans; python {platform.python_version()}, {platform.machine()})",
        header,
        "|---:|---:|---:|---:|---:|",
    ]
    for row in rows:
        cells = [f"{row[name]:.1f}" for name in list(row)[1:]]
        lines.append(f"| {row['loops']} | " + " | ".join(cells) + " |")
    print("\n".join(lines))
    if args.json_path:
        with open(args.json_path, "w") as fh:
            json.dump(
                {"rounds": args.rounds, "plans_per_round": args.plans, "rows": rows}, fh, indent=2
            )


if __name__ == "__main__":
    main()
