"""The plans admission prices a session from are the plans a session really runs."""

from __future__ import annotations

from collections import Counter
from typing import Any

from models.instance import load_instance
from models.loops.requests import SessionRequest
from models.registry import get
from runtime.contract import WorkPlan
from runtime.driver import run_inline


class PlanLog:
    """Wraps a loop and records the (kind, shape signature) of every plan it describes."""

    def __init__(self, inner: Any) -> None:
        self._inner = inner
        self.name = inner.name
        self.plans: list[tuple[str, str]] = []

    def init(self, request: Any, model: Any, ctx: Any = None) -> Any:
        return self._inner.init(request, model, ctx)

    def absorb(self, state: Any, inputs: Any) -> Any:
        return self._inner.absorb(state, inputs)

    def next(self, state: Any) -> Any:
        plan = self._inner.next(state)
        if isinstance(plan, WorkPlan):
            self.plans.append((plan.kind.value, plan.shape_sig))
        return plan

    def advance(self, state: Any, result: Any) -> Any:
        return self._inner.advance(state, result)

    def finalize(self, state: Any) -> Any:
        return self._inner.finalize(state)


async def test_a_steady_chunk_runs_exactly_the_plans_admission_prices() -> None:
    instance = load_instance(get("wan-tiny-random"), device="cpu")
    profile = instance.card.default_profile
    chunks = 3
    log = PlanLog(instance.loop("chunk_rollout"))
    await run_inline(log, SessionRequest(prompt="a red ball", seed=3, max_chunks=chunks), instance)
    ran = Counter(log.plans)
    # the first chunk also encodes the prompt and decodes in two parts (first frame first);
    # the last one writes no K/V (the stream ends): every chunk between is the steady one
    edges = {"chunk_step": chunks, "kv_update": chunks - 1, "vae_decode": chunks - 1}
    steady = instance.steady_chunk_plans(profile)
    assert [kind for kind, _, _ in steady] == ["chunk_step", "kv_update", "vae_decode"]
    for kind, sig, n in steady:
        assert ran[(kind, sig)] == n * edges[kind], (kind, sig, ran)
    recurring = {key for key, count in ran.items() if count >= chunks - 1}
    assert recurring == {(kind, sig) for kind, sig, _ in steady}
