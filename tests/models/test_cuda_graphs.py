"""ChunkGraphs: which calls replay graphs, and that each replay reads and writes the right memory.

On the CPU a ``ReplayRecorder`` stands in for CUDA: its "graph" re-runs the body on the static
call it was captured with (the same ops on the same buffers, which is what a CUDA graph replays).
A graph keyed too coarsely (by shape only, not by the session's slab; or not by the ring slots
a KV update writes) or a static input not refreshed (a new prompt's cross-attention K/V) makes
these streams differ from the eager ones.
"""

from __future__ import annotations

import logging

import pytest
import torch

from models.wan.dit.config import WanDiTConfig
from models.wan.dit.cuda_graphs import ChunkGraphs, ineligible
from models.wan.dit.transformer import ChunkCall, WanDiT
from models.wan.kv.slabs import KVSlabBuffer, SlabGeometry

GEOMETRY = SlabGeometry(sink_frames=1, window_frames=3, tokens_per_frame=6)  # 3 ring positions


@pytest.fixture(autouse=True, scope="module")
def _one_thread():
    # tiny tensors: one thread is ~8x faster than two on a loaded 2-core machine
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


class _Replay:
    def __init__(self, body, call) -> None:
        self.body, self.call = body, call

    def replay(self) -> torch.Tensor:
        return self.body(self.call)


class ReplayRecorder:
    """A graph recorder for the CPU: capture records (body, static call), replay re-runs it."""

    def __init__(self, fail: bool = False) -> None:
        self.fail = fail
        self.captured: list[ChunkCall] = []

    def supports(self, device: torch.device) -> bool:
        return True

    def warm(self, body, call):
        return body(call)

    def capture(self, body, call):
        if self.fail:
            raise RuntimeError("operation not permitted when stream is capturing")
        self.captured.append(call)
        return _Replay(body, call)


def make_model() -> WanDiT:
    cfg = WanDiTConfig(
        name="graph-test", dim=48, num_layers=2, num_heads=3, ffn_dim=64, freq_dim=16, text_dim=20
    )
    torch.manual_seed(1)
    return WanDiT(cfg).eval()


def prompt(model: WanDiT, seed: int):
    return model.cross_kv(torch.randn(1, 4, 20, generator=torch.Generator().manual_seed(seed)))


@torch.inference_mode()
def stream_two_sessions(model: WanDiT, buffer: KVSlabBuffer, chunks: int) -> list[torch.Tensor]:
    """Two sessions on slabs 0 and 2, chunk by chunk in turn (1 latent frame per chunk): two
    denoise steps, then the KV update; session 1 switches its prompt at chunk 6."""
    caches = [buffer.cache(0), buffer.cache(2)]
    crosses = [prompt(model, 10), prompt(model, 11)]
    outs = []
    for n in range(chunks):
        if n == 6:
            crosses[1] = prompt(model, 12)
        for s, (cache, cross) in enumerate(zip(caches, crosses)):
            g = torch.Generator().manual_seed(100 * n + s)
            x = torch.randn(1, 16, 1, 4, 6, generator=g)
            for t in (1000.0, 500.0):
                x = x - 0.5 * model.forward_chunk(x, torch.tensor([t]), cross, cache, n)
            outs.append(x)
            model.forward_chunk(x, torch.zeros(1), cross, cache, n, write_cache=True)
    return outs


def make_buffer(model: WanDiT) -> KVSlabBuffer:
    return KVSlabBuffer(model.config, GEOMETRY, num_slabs=3, device="cpu", dtype=torch.float32)


def test_alternating_sessions_replay_their_own_slabs_graphs_bit_identically() -> None:
    model = make_model()
    eager = stream_two_sessions(model, make_buffer(model), chunks=10)
    graphs = ChunkGraphs(ReplayRecorder())
    model.chunk_graphs = graphs
    graphed = stream_two_sessions(model, make_buffer(model), chunks=10)
    assert len(graphed) == len(eager) == 20
    for a, b in zip(graphed, eager, strict=True):
        assert torch.equal(a, b)
    # chunks 0-3 fill the cache (sink + 3 ring frames) and run eagerly; from chunk 4 on each
    # session's calls replay: its denoise graph and one KV-update graph per ring position
    assert graphs.num_graphs == 2 * (1 + 3)
    assert graphs.stats["warm"] == 1  # one shape signature, warmed by the first call
    assert graphs.stats["captures"] == 8
    # 6 steady chunks x 2 sessions x 3 calls, minus the warm-up call and the 8 captures' calls
    # (each capture is followed by its first replay)
    assert graphs.stats["replays"] == 6 * 2 * 3 - 1
    assert graphs.stats["eager"] == 4 * 2 * 3


def test_graphs_are_keyed_by_slab_and_by_the_ring_slots_a_kv_update_writes() -> None:
    model = make_model()
    recorder = ReplayRecorder()
    model.chunk_graphs = ChunkGraphs(recorder)
    buffer = make_buffer(model)
    stream_two_sessions(model, buffer, chunks=8)
    keys = {(c.cache.k.data_ptr(), c.runs) for c in recorder.captured}
    slabs = {c.cache.k.data_ptr() for c in recorder.captured}
    assert slabs == {buffer.view(0).k.data_ptr(), buffer.view(2).k.data_ptr()}
    writes = sorted({run.dst_slot for c in recorder.captured for run in c.runs})
    assert writes == [1, 2, 3]  # the three ring slots after the sink
    assert len(keys) == len(recorder.captured) == 8


def test_a_failed_capture_turns_graphs_off_and_the_call_still_runs(caplog) -> None:
    model = make_model()
    eager = stream_two_sessions(model, make_buffer(model), chunks=6)
    graphs = ChunkGraphs(ReplayRecorder(fail=True))
    model.chunk_graphs = graphs
    with caplog.at_level(logging.WARNING, logger="models.wan.dit.cuda_graphs"):
        graphed = stream_two_sessions(model, make_buffer(model), chunks=6)
    assert all(torch.equal(a, b) for a, b in zip(graphed, eager, strict=True))
    assert graphs.disabled is not None and "capture failed" in graphs.disabled
    assert graphs.num_graphs == 0
    assert any("CUDA graphs off" in r.getMessage() for r in caplog.records)


def test_what_runs_eagerly() -> None:
    model = make_model()
    cache = make_buffer(model).cache(0)
    cross = prompt(model, 1)
    x = torch.zeros(1, 16, 1, 4, 6)

    def call(past_tokens: int, mask=None) -> ChunkCall:
        cos, sin = model._rope((1, 2, 3), (0,), x.device)
        return ChunkCall(
            x, torch.zeros(1), cross, cos, sin, cache, past_tokens, mask, (), None, None
        )

    full = GEOMETRY.slots
    with torch.inference_mode():
        assert ineligible(call(full)) is None
        assert ineligible(call(full - 6)) == "cache not full"
        assert ineligible(call(full, mask=torch.ones(1, full + 6, dtype=torch.bool))) == (
            "masked attention"
        )
    assert ineligible(call(full)) == "grad mode"  # training never replays graphs


def test_the_cuda_recorder_leaves_cpu_tensors_to_the_eager_path() -> None:
    model = make_model()
    eager = stream_two_sessions(model, make_buffer(model), chunks=6)
    graphs = ChunkGraphs()  # the real CudaRecorder
    model.chunk_graphs = graphs
    again = stream_two_sessions(model, make_buffer(model), chunks=6)
    assert all(torch.equal(a, b) for a, b in zip(again, eager, strict=True))
    assert graphs.stats == {"eager": 36, "warm": 0, "captures": 0, "replays": 0, "unwarmed": 0}


@pytest.mark.parametrize("max_slots", [1])
def test_slots_beyond_the_bound_are_dropped_least_recently_used_first(max_slots) -> None:
    model = make_model()
    graphs = ChunkGraphs(ReplayRecorder(), max_slots=max_slots)
    model.chunk_graphs = graphs
    eager_model = make_model()
    eager = stream_two_sessions(eager_model, make_buffer(eager_model), chunks=8)
    graphed = stream_two_sessions(model, make_buffer(model), chunks=8)
    assert all(torch.equal(a, b) for a, b in zip(graphed, eager, strict=True))
    assert len(graphs._slots) == 1  # sessions alternate, so each call recaptures its slot


def test_sealed_graphs_capture_nothing_and_run_unwarmed_calls_eagerly(caplog) -> None:
    model = make_model()
    eager_model = make_model()
    eager = stream_two_sessions(eager_model, make_buffer(eager_model), chunks=8)
    graphs = ChunkGraphs(ReplayRecorder())
    model.chunk_graphs = graphs
    warmed = make_buffer(model)
    stream_two_sessions(model, warmed, chunks=8)  # the warm-up: every graph of slabs 0 and 2
    captured = graphs.stats["captures"]
    graphs.seal()
    again = stream_two_sessions(model, warmed, chunks=8)  # the warmed slabs replay
    assert graphs.stats["captures"] == captured and graphs.stats["unwarmed"] == 0
    with caplog.at_level(logging.WARNING, logger="models.wan.dit.cuda_graphs"):
        other = stream_two_sessions(model, make_buffer(model), chunks=8)  # other addresses
    assert all(torch.equal(a, b) for a, b in zip(again + other, eager + eager, strict=True))
    assert graphs.stats["captures"] == captured  # nothing captured after the seal
    # per slab one denoise graph and one KV update per ring position were missing, each once
    assert graphs.stats["unwarmed"] == 2 * (1 + 3)
    assert sum("no CUDA graph was captured" in r.getMessage() for r in caplog.records) == 8
    assert len(graphs._slots) == 2  # no slot made or dropped for the unwarmed calls
