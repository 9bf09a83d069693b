"""Shared fixtures of the model tests: the tiny 50-step T2V card with both residual caches
enabled at deploy scope (off unless a request turns one on)."""

from __future__ import annotations

import asyncio
from collections.abc import Mapping, Sequence
from typing import Any

import pytest

from models.instance import load_instance
from models.loops.extensions import deploy_extensions
from models.registry import get
from runtime.contract import Priority
from runtime.cost import CostModel
from runtime.engine import Engine

# a request's extensions with both caches off (each test turns one on)
CACHES_OFF = {"fbcache": {"enabled": False}, "teacache": {"enabled": False}}


@pytest.fixture(scope="module")
def t2v_instance() -> Any:
    inst = load_instance(get("wan2.1-t2v-tiny-random"), device="cpu")
    inst.extensions = deploy_extensions([("fbcache", {}), ("teacache", {})])
    return inst


async def run_jobs(
    instance: Any,
    requests: Mapping[str, Any],
    *,
    observers: Sequence[Any] = (),
    scheduler: Any = None,
) -> dict[str, Any]:
    """Every request as a ``diffusion_denoise`` job (loop id -> request) through one real
    engine with ``observers`` -> loop id -> the result's outputs."""
    engine = Engine(cost=CostModel(), scheduler=scheduler, observers=list(observers))
    await engine.start()
    try:
        handles = {
            loop_id: engine.spawn(
                instance.loop("diffusion_denoise"),
                request,
                instance,
                loop_id=loop_id,
                priority=Priority.BATCH,
                on_emit=lambda e: None,
            )
            for loop_id, request in requests.items()
        }
        return {k: (await asyncio.wait_for(h.result(), 120)).outputs for k, h in handles.items()}
    finally:
        await engine.close()
