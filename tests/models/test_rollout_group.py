"""A rollout group through the real engine: K=4 samples of one prompt whose denoising steps
run as one batched DiT forward equal 4 single samples with the same seeds, within the batched
tolerance (bit for bit in deterministic mode); the prompt is encoded once."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
import torch

from models import registry
from models.instance import load_instance
from models.loops.requests import JobRequest
from runtime.contract import Priority
from runtime.cost import CostModel
from runtime.engine import Engine

SEEDS = (11, 12, 13, 14)
# uint8 frames of batched vs solo float32 steps: rounding may flip a level here and there
MAX_LEVELS, MAX_MEAN_LEVELS = 3, 0.05


@pytest.fixture(scope="module")
def tiny() -> Any:
    return load_instance(registry.get("wan-tiny-random"), device="cpu", seed=0)


async def _run(instance: Any, *, group: bool, deterministic: bool = False) -> list[torch.Tensor]:
    engine = Engine(cost=CostModel(), deterministic=deterministic, max_lead_s=100.0)
    await engine.start()
    try:
        handles = [
            engine.spawn(
                instance.group_loop("text_to_video") if group else instance.loop("chunk_rollout"),
                JobRequest(task="t2v", prompt="a red ball", num_frames=21, seed=seed),
                instance,
                loop_id=f"{'g' if group else 's'}{seed}",
                priority=Priority.BATCH,
                on_emit=lambda e: None,
            )
            for seed in SEEDS
        ]
        results = await asyncio.wait_for(asyncio.gather(*(h.result() for h in handles)), 120)
    finally:
        await engine.close()
    return [r.outputs["frames"] for r in results]


def _count_batched(instance: Any, monkeypatch: pytest.MonkeyPatch) -> list[int]:
    sizes: list[int] = []
    real = instance.dit.forward_chunks

    def counted(x: torch.Tensor, *args: Any, **kwargs: Any) -> torch.Tensor:
        sizes.append(x.shape[0])
        return real(x, *args, **kwargs)

    monkeypatch.setattr(instance.dit, "forward_chunks", counted)
    return sizes


async def test_a_group_of_four_equals_four_single_samples_within_the_batched_tolerance(
    tiny: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    solo = await _run(tiny, group=False)
    misses = tiny.text.misses
    sizes = _count_batched(tiny, monkeypatch)
    grouped = await _run(tiny, group=True)
    assert sizes.count(len(SEEDS)) == 8, f"every denoising step ran batched: {sizes}"
    assert tiny.text.misses == misses, "the group's prompt was encoded before: no miss"
    for a, b in zip(solo, grouped, strict=True):
        diff = (a.float() - b.float()).abs()
        assert a.shape == b.shape and diff.max() <= MAX_LEVELS and diff.mean() <= MAX_MEAN_LEVELS
    apart = (solo[0].float() - solo[1].float()).abs().mean()
    assert apart > 10 * MAX_MEAN_LEVELS, "different seeds give different samples"


async def test_a_deterministic_group_is_bit_identical_and_encodes_its_prompt_once() -> None:
    instance = load_instance(registry.get("wan-tiny-random"), device="cpu", seed=0)
    grouped = await _run(instance, group=True, deterministic=True)
    assert instance.text.misses == 1, "one prompt, K samples: the encoder ran once"
    solo = await _run(instance, group=False, deterministic=True)
    assert all(torch.equal(a, b) for a, b in zip(solo, grouped, strict=True))
