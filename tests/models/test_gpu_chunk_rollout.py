"""GPU smoke (CUDA only): the Wan2.1-1.3B preset runs a chunk through chunk_rollout in bf16."""

from __future__ import annotations

import asyncio

import pytest
import torch

from models.instance import load_instance
from models.loops.requests import SessionRequest
from models.registry import get
from runtime.driver import run_inline


@pytest.mark.gpu
@pytest.mark.slow
def test_wan13b_one_chunk_on_cuda() -> None:
    instance = load_instance(get("wan2.1-1.3b-causal"), device="cuda", precision="bf16",
                             random_weights=True)
    loop = instance.loop("chunk_rollout")
    result, emissions = asyncio.run(run_inline(
        loop, SessionRequest(prompt="a red ball on grass", seed=0, max_chunks=2), instance))
    media = [e for e in emissions if e.spec.stream == "media"]
    assert [m.output.shape for m in media] == [(9, 480, 832, 3), (12, 480, 832, 3)]
    assert all(m.output.dtype == torch.uint8 for m in media)
    assert result.outputs["chunks"] == 2
