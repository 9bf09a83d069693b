"""SessionHost with the real engine and the real tiny model (no viewer: loops stay paused)."""

from __future__ import annotations

import asyncio

import numpy as np
import pytest

from models.card import ProfileError
from runtime.admission import AdmissionConfig, AdmissionController, Reject
from runtime.cost import CostModel, DeviceConstants
from runtime.engine import Engine
from sessions.events import SessionStateChanged
from sessions.host import SessionHost
from sessions.served_models import HostError, ServedModels
from sessions.session_pricing import chunk_gpu_seconds
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


async def test_sessions_without_input_close_on_the_idle_timeout(host: SessionHost) -> None:
    quiet, busy = host.create_session(prompt="a"), host.create_session(prompt="b")
    quiet.begin_negotiation()  # both are being watched: only the idle timeout applies
    busy.begin_negotiation()
    await asyncio.sleep(0.06)
    busy.push_prompt("c")
    assert await host.close_unwatched(0.0, max_idle_s=0.05) == [quiet.id]
    history = [e.reason for e in quiet.events.history() if isinstance(e, SessionStateChanged)]
    assert "idle timeout" in history and busy.state.value == "negotiating"
    await host.close_session(busy.id)


async def test_inputs_beyond_the_backlog_limit_are_refused(host: SessionHost) -> None:
    from sessions.input_ledger import InputBacklogError

    host.max_pending_inputs = 3
    paused = host.create_session(prompt="a")  # its loop is paused: it takes no input
    seqs = [paused.push_action(["w"]), paused.push_prompt("b")[0], paused.push_action(["a"])]
    with pytest.raises(InputBacklogError):
        paused.push_prompt("refused")
    assert seqs == [1, 2, 3] and len(paused.prompts.history()) == 2  # memory did not take it
    await host.close_session(paused.id)


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
    assert chunk_gpu_seconds(cost, instance, profile, measured=False) == prior


async def test_admission_prices_from_measurements_on_an_accelerator_by_default(host) -> None:
    assert not host.measured_admission  # a CPU's chunk times follow its other load
    gpu = Engine(cost=CostModel(DeviceConstants.h200()))
    models, store = host.models, host.store
    assert SessionHost(engine=gpu, models=models, store=store).measured_admission
    forced = SessionHost(engine=host.engine, models=models, store=store, admission_cost="measured")
    assert forced.measured_admission
    with pytest.raises(ValueError, match="admission_cost"):
        SessionHost(engine=gpu, models=models, store=store, admission_cost="fast")


async def test_batching_admits_a_session_that_per_plan_pricing_refuses(instance, tmp_path) -> None:
    """Measured costs shaped like a 480x272@16 session on an H200 (0.31 GPU-s per media second:
    four 35-ms steps, a 38-ms KV update, an 8-ms decode launch and 46 ms on the second stream
    per 0.75-s chunk), with two sessions' steps batched at 1.47x one: priced one by one two fit
    under 0.9, priced by the batch they run in three do, and a fourth does not."""
    # a geometry of its own: the other tests' sessions hold the default one's two slabs
    size = {"width": 80, "height": 64}
    profile = instance.card.resolve_profile(**size)
    scale = instance.chunk_seconds(profile) / 0.75  # the tiny card's chunk, the same shares
    cost = CostModel(DeviceConstants.cpu(), alpha=1.0)
    for kind, sig, _ in instance.steady_chunk_plans(profile):
        seconds = {"chunk_step": 0.0352, "kv_update": 0.0382, "vae_decode": 0.0077}[kind]
        cost.observe(kind, sig, seconds * scale)
        if kind == "chunk_step":
            cost.observe(kind, sig, 1.47 * seconds * scale, batch_size=2)
        if kind == "vae_decode":
            cost.observe_async(kind, sig, 0.046 * scale)
    admission = AdmissionController(AdmissionConfig(peak_capacity_bytes=1 << 40))
    engine = Engine(cost=cost, admission=admission)
    await engine.start()
    store = Store(tmp_path / "db.sqlite3")
    served = ServedModels({MODEL: instance}, default=MODEL)

    async def admitted(batching: bool) -> int:
        instance.batch_sessions(batching)
        host = SessionHost(
            engine=engine,
            models=served,
            store=store,
            slabs_per_geometry=6,
            admission_cost="measured",
            max_batch=4,
        )
        try:
            sessions = [host.create_session(prompt=f"p{i}", seed=i, **size) for i in range(5)]
            refused = [s for s in sessions if isinstance(s, Reject)]
            assert refused and {r.reason for r in refused} == {"compute"}
            return len(sessions) - len(refused)
        finally:
            await host.close()
            instance.batch_sessions(False)

    try:
        assert host_share(cost, instance, profile) == pytest.approx(0.3096, abs=1e-3)
        assert await admitted(batching=False) == 2
        assert await admitted(batching=True) == 3
    finally:
        await engine.close()
        store.close()


def host_share(cost: CostModel, instance, profile) -> float:
    return chunk_gpu_seconds(cost, instance, profile) / instance.chunk_seconds(profile)


async def test_admission_prices_the_frames_a_sessions_steering_flushed(host: SessionHost) -> None:
    served = host.models[MODEL]
    share = host.compute_share(served)
    assert share > 0
    first = host.create_session(prompt="a", seed=1)
    assert not isinstance(first, Reject)
    # 5 chunks of 12 frames: the viewer is shown 8 of each, then a prompt switch flushes 4
    for chunk in range(5):
        pts = list(range(12 * chunk + 1, 12 * chunk + 13))
        first.media.put_chunk(np.zeros((12, 4, 4, 3), np.uint8), pts, chunk=chunk, segment=0)
        for _ in range(8):
            assert first.media.pop() is not None
        assert first.media.flush_before(pts[-1] + 1) == 4
    host.refresh_steering()
    admission = host.engine.admission
    assert admission.usage().steering_gpu_s_per_s == pytest.approx(share * 0.5)
    assert host.compute_share(served) == pytest.approx(share * 1.5)  # the server's fraction
    # two shares fit, two steered ones do not
    admission.config = AdmissionConfig(peak_capacity_bytes=1 << 40, compute_capacity=2.5 * share)
    refused = host.create_session(prompt="b")
    assert isinstance(refused, Reject) and refused.reason == "compute" and not refused.permanent
    host.steering.enabled = False  # --steering-cost none: the first is repriced at 0
    second = host.create_session(prompt="b")
    assert not isinstance(second, Reject)
    host.steering.enabled = True
    await host.close_session(first.id)  # its frames stay in the server's history
    assert host.compute_share(served) == pytest.approx(share * 1.5)
