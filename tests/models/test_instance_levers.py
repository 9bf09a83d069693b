"""WanInstance.configure / compile: the serving levers reach the modules and ops they name, and
the exact ones leave a session's frames bit-identical (on the CPU the lossy attention kernels
and CUDA graphs fall back to the eager SDPA path, logged)."""

from __future__ import annotations

import asyncio
import logging

import pytest
import torch

from models.instance import InstanceError, load_instance
from models.loops.requests import SessionRequest
from models.registry import get
from models.wan.dit.attention import WanSelfAttention
from models.wan.dit.cuda_graphs import ChunkGraphs
from models.wan.kernels import attention as attention_kernels
from runtime.driver import run_inline


@pytest.fixture(scope="module")
def instance():
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield load_instance(get("wan-tiny-random"), device="cpu")
    torch.set_num_threads(threads)


def frames(instance, chunks: int = 3) -> tuple[list[torch.Tensor], list[str]]:
    request = SessionRequest(prompt="a red ball", seed=5, max_chunks=chunks)
    _, emissions = asyncio.run(run_inline(instance.loop("chunk_rollout"), request, instance))
    media = [e.output for e in emissions if e.spec.stream == "media"]
    return media, [e.spec.stream for e in emissions]


def test_unknown_levers_are_refused_with_the_known_values(instance) -> None:
    with pytest.raises(InstanceError, match=r"attention 'int4' is not one of \['auto'"):
        instance.configure(attention="int4")
    with pytest.raises(InstanceError, match="fp8 'int8'"):
        instance.configure(fp8="int8")
    with pytest.raises(InstanceError, match="kv_update 'sometimes'"):
        instance.configure(kv_update="sometimes")
    assert instance.levers["attention"] == "auto"


def test_exact_levers_and_cpu_fallbacks_keep_the_frames_bit_identical(
    instance, caplog, monkeypatch
) -> None:
    monkeypatch.setattr(attention_kernels, "_LOGGED", set())  # logged once per process
    reference, _ = frames(instance)
    try:
        with caplog.at_level(logging.WARNING, logger="models.wan.kernels.attention"):
            instance.configure(attention="fp8qk-triton", cuda_graphs=True)
            kernels = {
                m.kernel.name for m in instance.dit.modules() if isinstance(m, WanSelfAttention)
            }
            assert kernels == {"fp8qk-triton"}
            assert isinstance(instance.dit.chunk_graphs, ChunkGraphs)
            assert instance.levers["attention"] == "fp8qk-triton" and instance.levers["cuda_graphs"]
            again, _ = frames(instance)
        assert len(again) == len(reference)
        assert all(torch.equal(a, b) for a, b in zip(again, reference, strict=True))
        assert instance.dit.chunk_graphs.stats["replays"] == 0  # no CUDA here: all eager
        assert any(
            "'fp8qk-triton' falls back to SDPA: device cpu" in r.message for r in caplog.records
        )
    finally:
        instance.configure(attention="auto", cuda_graphs=False)
    assert instance.dit.chunk_graphs is None


def test_fold_moves_the_kv_update_into_the_last_step(instance) -> None:
    clean, _ = frames(instance)
    try:
        instance.configure(kv_update="last_step")
        assert instance.levers["kv_update"] == "last_step"
        assert instance.card.loops["chunk_rollout"].kv_update.value == "last_step"
        folded, _ = frames(instance)
    finally:
        instance.configure(kv_update="clean")
    assert len(folded) == len(clean)
    assert torch.equal(folded[0], clean[0])  # the first chunk attends to nothing cached
    assert not torch.equal(folded[-1], clean[-1])  # later chunks see other cached K/V


def test_warm_up_covers_every_ring_position_once_graphs_are_on(instance) -> None:
    profile = instance.card.default_profile  # 3-frame chunks, 3 sink + 3 ring frames
    assert instance.warmup_chunks(profile) == 2 + 2  # fill, then two steady chunks
    wide = instance.card.default_profile.__class__(
        fps=8, width=64, height=64, chunk_latent_frames=2, steps=4
    )  # 3 sink + 4 ring frames in 2-frame chunks: 4 chunks to fill, 2 ring positions
    assert instance.kv_geometry(2) == (3, 4)
    try:
        instance.configure(cuda_graphs=True)
        assert instance.warmup_chunks(wide) == 4 + 2 + 1  # + a last chunk (no KV update)
    finally:
        instance.configure(cuda_graphs=False)
    assert instance.warmup_chunks(wide) == 4 + 2
