"""SessionHost with the real engine and the real tiny model (no viewer: loops stay paused)."""

from __future__ import annotations

import asyncio

import pytest

from models.card import ProfileError
from runtime.admission import AdmissionConfig, AdmissionController, Reject
from runtime.cost import CostModel, DeviceConstants
from runtime.engine import Engine
from sessions.host import SessionHost, chunk_gpu_seconds
from sessions.served_models import HostError, ServedModels
from sessions.store import Store
from tests.sessions.conftest import TINY_MODEL

MODEL = TINY_MODEL


@pytest.fixture
async def host(instance, tmp_path):
    admission = AdmissionController(AdmissionConfig(peak_capacity_bytes=1 << 40))
    engine = Engine(cost=CostModel(DeviceConstants.cpu()), admission=admission)
    await engine.start()
    store = Store(tmp_path / "db.sqlite3")
    session_host = SessionHost(
        engine=engine,
        models=ServedModels({MODEL: instance}, default=MODEL),
        store=store,
        slabs_per_geometry=2,
    )
    session_host.preallocate()
    yield session_host
    await session_host.close()
    await engine.close()
    store.close()
    assert engine.stats().running_loops == 0


async def test_sessions_take_a_slab_and_a_reservation_and_give_both_back(host: SessionHost) -> None:
    first = host.create_session(prompt="a", seed=1)
    second = host.create_session(prompt="b", seed=2, priority_class="batch")
    refused = host.create_session(prompt="c")
    assert isinstance(refused, Reject) and refused.reason == "kv_slabs"
    assert host.slab_counts() == (0, 2) and host.engine.admission.usage().reservations == 2
    buffer = host.models[MODEL].slab_buffer(
        host.models[MODEL].slab_geometry(host.models[MODEL].card.default_profile)
    )
    assert buffer is not None and buffer.num_slabs == 2  # one tensor for both sessions' slabs
    assert host.counts()["rejections"] == {"kv_slabs": 1}
    assert first.config.record_template["timesteps"] == [1000, 750, 500, 250]
    assert first.config.record_template["loop_id"] == "chunk_rollout"
    assert {s.id for s in host.sessions()} == {first.id, second.id}
    assert await host.close_session(first.id)
    assert not await host.close_session(first.id)
    assert host.session(first.id) is None and first.state.value == "closed"
    assert host.slab_counts() == (1, 2) and host.engine.admission.usage().reservations == 1
    third = host.create_session(prompt="c")
    assert not isinstance(third, Reject)


async def test_an_admission_reject_takes_no_slab(host: SessionHost) -> None:
    host.engine.admission.config = AdmissionConfig(peak_capacity_bytes=1)
    refused = host.create_session(prompt="a")
    assert isinstance(refused, Reject) and refused.reason == "peak_bytes" and refused.permanent
    assert host.slab_counts() == (2, 2)


async def test_requests_the_model_cannot_serve_are_typed_errors(host: SessionHost) -> None:
    with pytest.raises(KeyError, match="not served"):
        host.create_session(prompt="a", model="wan2.1-1.3b-causal")
    with pytest.raises(ProfileError) as info:
        host.create_session(prompt="a", width=70)
    assert info.value.field == "width"
    with pytest.raises(HostError, match="not among the served"):
        ServedModels({MODEL: host.models[MODEL]}, default="no-such")
    assert host.slab_counts() == (2, 2)  # a refused request holds nothing


async def test_a_closed_host_refuses_new_work(host: SessionHost) -> None:
    await host.close()
    with pytest.raises(HostError, match="closed"):
        host.create_session(prompt="a")


async def test_sessions_nobody_watches_are_closed_and_their_slabs_return(host: SessionHost) -> None:
    abandoned = host.create_session(prompt="a")
    watched = host.create_session(prompt="b")
    watched.begin_negotiation()  # an offer is being answered: not abandoned
    await asyncio.sleep(0.05)
    assert await host.close_unwatched(10.0) == []
    assert await host.close_unwatched(0.01) == [abandoned.id]
    assert abandoned.state.value == "closed" and watched.state.value == "negotiating"
    assert host.slab_counts()[0] == 1
    watched.viewer_left()
    host.start_reaper(0.01, interval_s=0.02)
    await asyncio.wait_for(watched.wait_finished(), 5)
    assert watched.state.value == "closed" and host.slab_counts()[0] == 2


async def test_start_now_runs_the_first_chunk_before_any_viewer(host: SessionHost) -> None:
    waiting = host.create_session(prompt="a", seed=1)
    early = host.create_session(prompt="b", seed=2, start="now")
    deadline = asyncio.get_running_loop().time() + 30.0
    while early.chunks_generated == 0 and asyncio.get_running_loop().time() < deadline:
        await asyncio.sleep(0.01)
    assert early.chunks_generated == 1 and len(early.media) > 0  # frames ready for the viewer
    await asyncio.sleep(0.2)
    assert early.chunks_generated == 1  # then it waits: nobody watches yet
    assert waiting.chunks_generated == 0 and len(waiting.media) == 0  # spawned paused
    assert host.engine.stats().paused_loops == 2


def test_admission_prices_a_session_from_measurements_once_every_plan_has_one(instance) -> None:
    cost = CostModel(DeviceConstants.cpu())
    profile = instance.card.default_profile
    prior = cost.prior(instance.chunk_flops(profile), 0.0)
    assert chunk_gpu_seconds(cost, instance, profile) == prior  # nothing measured yet
    plans = instance.steady_chunk_plans(profile)
    for kind, sig, _ in plans[:-1]:
        cost.observe(kind, sig, 0.010)
    assert chunk_gpu_seconds(cost, instance, profile) == prior  # one plan still unmeasured
    kind, sig, _ = plans[-1]
    cost.observe(kind, sig, 0.002)
    cost.observe_async(kind, sig, 0.030)  # the decode's second-stream time counts too
    want = sum(n * 0.010 for _, _, n in plans[:-1]) + 0.002 + 0.030
    assert chunk_gpu_seconds(cost, instance, profile) == pytest.approx(want)
