"""Weight sync and sleep/wake on live sessions: the real engine, the real tiny model, a real
SQLite store (no WebRTC: the tests stand in for the viewer with ``viewer_started``).

Each test compares a session with a reference session of the same seed and prompt that ran
without the sync or the sleep: chunk digests are sha256 of the raw uint8 frames, so equal
means bit-identical.
"""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Any

import pytest
import torch
from safetensors.torch import save_file

from models import registry
from models.instance import load_instance
from runtime.admission import AdmissionConfig, AdmissionController, Reject
from runtime.cost import CostModel, DeviceConstants
from runtime.engine import Engine
from sessions.events import MediaChunk, ModelSleep, WeightsUpdated
from sessions.host import SessionHost
from sessions.job_host import JobHost
from sessions.served_models import ModelUnavailableError, ServedModels
from sessions.store import Store
from sessions.trainer_controls import TrainerControls
from sessions.weight_sync import InvalidWeightsError
from tests.sessions.conftest import TINY_MODEL

PROMPT = "a red ball on grass"


@pytest.fixture
async def served(tmp_path: Path) -> Any:
    """(host, trainer controls, instance, store) on a fresh tiny instance (syncs mutate it)."""
    instance = load_instance(registry.get(TINY_MODEL), device="cpu", seed=0)
    admission = AdmissionController(AdmissionConfig(peak_capacity_bytes=1 << 40))
    engine = Engine(cost=CostModel(DeviceConstants.cpu()), admission=admission)
    await engine.start()
    store = Store(tmp_path / "db.sqlite3")
    models = ServedModels({TINY_MODEL: instance}, default=TINY_MODEL)
    host = SessionHost(engine=engine, models=models, store=store, slabs_per_geometry=2)
    jobs = JobHost(engine=engine, models=models, store=store, artifact_dir=tmp_path / "art")
    yield host, TrainerControls.build(host, jobs, engine), instance, store
    await host.close()
    await jobs.close()
    await engine.close()
    store.close()


def start(host: SessionHost, seed: int, adapters: tuple = ()) -> Any:
    session = host.create_session(
        prompt=PROMPT, seed=seed, priority_class="batch", adapters=adapters
    )
    assert not isinstance(session, Reject), session
    session.begin_negotiation()
    session.viewer_started()
    return session


def digests(session: Any) -> dict[int, str]:
    return {e.chunk: e.digest for e in events_of(session, MediaChunk)}


async def until_chunk(session: Any, chunk: int, timeout_s: float = 60.0) -> None:
    deadline = time.monotonic() + timeout_s
    while max(digests(session), default=-1) < chunk:
        assert time.monotonic() < deadline, f"no chunk {chunk} in {timeout_s} s"
        await asyncio.sleep(0.02)


async def reference(
    host: SessionHost, seed: int, chunks: int, adapters: tuple = ()
) -> dict[int, str]:
    session = start(host, seed, adapters)
    await until_chunk(session, chunks)
    await host.close_session(session.id)
    return digests(session)


def events_of(session: Any, kind: type) -> list[Any]:
    return [e for e in session.events.history() if isinstance(e, kind)]


async def test_a_sync_changes_frames_from_the_next_chunk_and_records_carry_both_versions(
    served: Any, tmp_path: Path
) -> None:
    host, trainer, instance, store = served
    want = await reference(host, seed=3, chunks=5)
    hits, misses = instance.text.hits, instance.text.misses
    session = start(host, seed=3)
    await until_chunk(session, 0)
    assert (instance.text.hits, instance.text.misses) == (hits + 1, misses), "same prompt: a hit"
    # a corrupt file (truncated safetensors) changes nothing, and admission never closed
    good = {k: v.detach().clone() * 1.05 for k, v in instance.dit.state_dict().items()}
    path = tmp_path / "policy.safetensors"
    save_file(good, str(path))
    bad = tmp_path / "corrupt.safetensors"
    bad.write_bytes(path.read_bytes()[:4096])
    old = instance.weights_digest
    with pytest.raises(InvalidWeightsError):
        await trainer.weights.sync(bad)
    assert instance.weights_digest == old and not host.models.closed
    result = await trainer.weights.sync(path)
    assert result.previous == old != result.weights_version == instance.weights_digest
    assert result.loops_held == 1 and not host.models.closed
    [updated] = events_of(session, WeightsUpdated)
    k = updated.chunk
    await until_chunk(session, k + 1)
    await host.close_session(session.id)
    got = digests(session)
    assert k >= 1 and all(got[c] == want[c] for c in range(k)), "before the sync: unchanged"
    assert got[k] != want[k] and got[k + 1] != want[k + 1], (
        "from the sync's chunk on: the new weights"
    )
    assert instance.text.misses == misses + 1, "the prompt's embedding missed after the sync"
    await asyncio.sleep(0.2)  # the store's writer thread
    versions = {r["chunk"]: r["weights_version"] for r in store.records(session.id)}
    assert {versions[c] for c in range(k)} == {old}
    assert {versions[c] for c in versions if c >= k} == {result.weights_version}


async def test_sleep_holds_sessions_and_refuses_admission_and_wake_resumes_bit_identically(
    served: Any,
) -> None:
    host, trainer, instance, _ = served
    want = await reference(host, seed=4, chunks=4)
    session = start(host, seed=4)
    await until_chunk(session, 0)
    session.viewer_left("viewer disconnected")  # a paused session, possibly mid-chunk
    result = await trainer.sleep.sleep(["dit"])
    assert result.asleep == ("dit",) and result.loops_held == 1
    assert all(p.numel() == 0 for p in instance.dit.parameters()), "the DiT's memory is gone"
    refused = host.create_session(prompt=PROMPT)
    assert isinstance(refused, Reject) and refused.reason == "asleep"
    assert refused.retry_after_s > 0
    with pytest.raises(ModelUnavailableError):
        trainer.weights._models.check_open(TINY_MODEL)
    session.begin_negotiation()
    session.viewer_started()  # the viewer is back, but the model sleeps: nothing runs
    made = len(digests(session))
    await asyncio.sleep(0.3)
    assert len(digests(session)) == made and session.handle.held
    woke = await trainer.sleep.wake(["dit"])
    assert woke.asleep == () and not host.models.closed and not session.handle.held
    await until_chunk(session, 4)
    got = digests(session)
    assert all(got[c] == want[c] for c in range(5)), "resumed bit-identically"
    assert [e.asleep for e in events_of(session, ModelSleep)] == [True, False]
    assert torch.isfinite(next(instance.dit.parameters())).all()
