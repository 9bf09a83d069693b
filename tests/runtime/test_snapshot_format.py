"""The snapshot file layout (version 2): streamed a piece at a time, bit-exact, version 1 still
read, a truncated or foreign file refused."""

from __future__ import annotations

import io

import msgspec
import pytest
import safetensors.torch
import torch

from runtime import snapshot
from runtime.contract import LoopState
from runtime.snapshot import (
    SnapshotError,
    restore_state,
    snapshot_nbytes,
    snapshot_state,
    write_snapshot,
)


class State(LoopState, kw_only=True):
    kv: torch.Tensor
    latents: torch.Tensor | None = None
    extra: dict[str, torch.Tensor] = {}
    note: str = ""


def _state() -> State:
    g = torch.Generator().manual_seed(0)
    kv = torch.randn(3, 70, 33, generator=g).to(torch.bfloat16)  # an odd size: padding between
    latents = torch.randn(5, 4, generator=g)
    return State(
        step=7,
        kv=kv,
        latents=latents.t(),  # not contiguous
        extra={"mask": torch.rand(9, generator=g) > 0.5, "ids": torch.arange(4), "none": kv[:0]},
        note="after chunk 3",
    )


def _same(a: State, b: State) -> None:
    assert (a.step, a.note) == (b.step, b.note)
    for x, y in [(a.kv, b.kv), (a.latents, b.latents), *zip(a.extra.values(), b.extra.values())]:
        assert x.dtype == y.dtype and x.shape == y.shape and torch.equal(x, y)


def test_a_streamed_snapshot_is_bit_exact_and_equals_the_bytes_form(monkeypatch) -> None:
    state = _state()
    whole = snapshot_state(state)
    monkeypatch.setattr(snapshot, "PIECE_BYTES", 1000)  # many pieces per tensor
    writes: list[int] = []

    class Recorder(io.BytesIO):
        def write(self, data) -> int:
            writes.append(len(memoryview(data)))
            return super().write(data)

    fh = Recorder()
    n = write_snapshot(state, fh)
    assert n == len(fh.getvalue()) and fh.getvalue() == whole
    assert max(writes) <= max(1000, n - state.kv.numel() * 2)  # no write holds a whole tensor
    _same(restore_state(whole, State), state)
    assert snapshot_nbytes(state) == 3 * 70 * 33 * 2 + 5 * 4 * 4 + 9 + 4 * 8


def test_restored_tensors_own_writable_memory() -> None:
    back = restore_state(snapshot_state(_state()), State)
    back.kv.add_(1)  # a view of the read-only blob would refuse this
    assert back.kv.is_contiguous()


def test_version_1_snapshots_are_still_read() -> None:
    state = _state()
    structure, tensors = snapshot._encode_structure(state)
    named = {f"t{i}": t.contiguous().clone() for i, t in enumerate(tensors)}
    v1 = msgspec.msgpack.encode(
        snapshot._Envelope(
            format="dreamrt.loopstate",
            version=1,
            state_type=snapshot._type_name(State),
            structure=structure,
            tensors=safetensors.torch.save(named),
        )
    )
    _same(restore_state(v1, State), state)


def test_a_truncated_or_foreign_snapshot_is_refused() -> None:
    blob = snapshot_state(_state())
    with pytest.raises(SnapshotError, match="truncated"):
        restore_state(blob[:-10], State)
    with pytest.raises(SnapshotError, match="not a loop-state snapshot"):
        restore_state(b"garbage" * 10, State)

    class Other(LoopState, kw_only=True):
        x: int = 0

    with pytest.raises(SnapshotError, match="asked to restore"):
        restore_state(blob, Other)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_a_cuda_state_streams_through_the_pinned_buffer(monkeypatch) -> None:
    monkeypatch.setattr(snapshot, "PIECE_BYTES", 4096)
    state = _state()
    on_gpu = State(step=state.step, kv=state.kv.cuda(), latents=state.latents.cuda())
    back = restore_state(snapshot_state(on_gpu), State, device="cuda")
    assert back.kv.is_cuda and torch.equal(back.kv.cpu(), state.kv)
