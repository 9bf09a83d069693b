"""Per-session LoRA adapters on live sessions (real engine, tiny model): two sessions with
different adapters, same seed and prompt, differ; interleaved on one model each equals itself
alone; an unknown adapter is refused before admission."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest

from sessions.served_models import UnsupportedTaskError
from tests.models.test_lora import lora_tensors, write_diffusers, write_peft
from tests.sessions.test_weight_sync import PROMPT, digests, reference, served, start, until_chunk

__all__ = ["served"]  # the fixture, shared with the weight-sync tests

CHUNKS = 3
MODULES = [
    "blocks.0.self_attn.q",
    "blocks.0.cross_attn.k",
    "blocks.1.ffn.0",
    "blocks.1.self_attn.o",
]


async def test_sessions_with_different_adapters_interleave_and_each_equals_itself_alone(
    served: Any, tmp_path: Path
) -> None:
    host, _, instance, _ = served
    instance.adapters.register(
        "warm", write_peft(tmp_path / "warm", lora_tensors(instance.dit, MODULES, seed=1), 2.0)
    )
    instance.adapters.register(
        "cold", write_diffusers(tmp_path / "c.st", lora_tensors(instance.dit, MODULES, seed=2))
    )
    warm, cold = (("warm", 1.0),), (("cold", 0.8),)
    base = await reference(host, seed=3, chunks=CHUNKS)
    alone_warm = await reference(host, seed=3, chunks=CHUNKS, adapters=warm)
    alone_cold = await reference(host, seed=3, chunks=CHUNKS, adapters=cold)
    assert alone_warm[0] != alone_cold[0] != base[0] != alone_warm[0], "adapters change frames"
    a, b = start(host, 3, warm), start(host, 3, cold)  # side by side on one engine and model
    await asyncio.gather(until_chunk(a, CHUNKS), until_chunk(b, CHUNKS))
    got_a, got_b = digests(a), digests(b)
    assert all(got_a[c] == alone_warm[c] and got_b[c] == alone_cold[c] for c in range(CHUNKS + 1))
    await asyncio.gather(host.close_session(a.id), host.close_session(b.id))
    await asyncio.sleep(0.2)  # the store's writer thread
    [tagged] = {tuple(r["adapters"]) for r in served[3].records(a.id)}
    assert len(tagged) == 1 and tagged[0].startswith("warm@b2:") and tagged[0].endswith(":1")
    with pytest.raises(UnsupportedTaskError, match="not registered") as info:
        host.create_session(prompt=PROMPT, adapters=(("nobody", 1.0),))
    assert info.value.field == "adapters"
