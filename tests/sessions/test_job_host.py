"""JobHost with the real engine and the real tiny model: jobs run without a viewer."""

from __future__ import annotations

import asyncio

import pytest

from runtime.cost import CostModel, DeviceConstants
from runtime.engine import Engine
from sessions.job_host import JobHost
from sessions.served_models import HostError, ServedModels, UnsupportedTaskError
from sessions.store import Store
from tests.sessions.conftest import TINY_MODEL

MODEL = TINY_MODEL


@pytest.fixture
async def jobs(instance, tmp_path):
    engine = Engine(cost=CostModel(DeviceConstants.cpu()))
    await engine.start()
    store = Store(tmp_path / "db.sqlite3")
    host = JobHost(
        engine=engine,
        models=ServedModels({MODEL: instance}, default=MODEL),
        store=store,
        artifact_dir=tmp_path / "artifacts",
    )
    yield host
    await host.close()
    await engine.close()
    store.close()
    assert engine.stats().running_loops == 0


async def test_requests_the_recipe_does_not_fit_are_typed_errors(jobs: JobHost) -> None:
    with pytest.raises(KeyError, match="not served"):
        jobs.submit_job(task="t2v", prompt="a", model="wan2.1-1.3b-causal")
    with pytest.raises(UnsupportedTaskError) as steps:
        jobs.submit_job(task="t2v", prompt="a", steps=7)
    assert steps.value.field == "steps"
    with pytest.raises(UnsupportedTaskError) as frames:
        jobs.submit_job(task="t2i", prompt="a", num_frames=2)
    assert frames.value.field == "num_frames"
    assert jobs.jobs() == [] and jobs.counts() == {}


async def test_jobs_run_without_a_viewer_and_resume_after_a_restart(jobs: JobHost) -> None:
    job = jobs.submit_job(task="t2i", prompt="a cat", seed=4)
    await asyncio.wait_for(job.wait_finished(), 60)
    assert job.state.value == "succeeded" and job.artifact.path.exists()
    row = await jobs.store.run(jobs.store.get_job, job.id)
    assert row["state"] == "succeeded" and row["params"]["seed"] == 4
    # the previous process stored five events of job_old: its resumed stream goes on at 6
    await jobs.store.run(jobs.store.add_event, "job_old", 5, "job.progress", "{}", 0.0)
    resumed = jobs.resume_jobs(
        [
            {
                "id": "job_old",
                "task": "t2i",
                "prompt": "p",
                "model_id": MODEL,
                "params": {"seed": 1},
            },
            {"id": "job_gone", "task": "t2i", "prompt": "p", "model_id": "no-such", "params": {}},
        ]
    )
    assert [j.id for j in resumed] == ["job_old"]
    assert resumed[0].events.history()[0].event_id == 6
    await asyncio.wait_for(resumed[0].wait_finished(), 60)
    assert resumed[0].state.value == "succeeded"
    assert jobs.counts() == {"succeeded": 2}
    await jobs.store.run(lambda: None)
    assert jobs.store.get_job("job_gone") is None  # never stored: it had no row to mark


async def test_finished_jobs_beyond_the_memory_bound_are_read_from_the_store(
    jobs: JobHost,
) -> None:
    jobs.max_finished_jobs = 1
    first = jobs.submit_job(task="t2i", prompt="a", seed=1)
    await asyncio.wait_for(first.wait_finished(), 60)
    second = jobs.submit_job(task="t2i", prompt="b", seed=2)
    await asyncio.wait_for(second.wait_finished(), 60)
    assert jobs.job(first.id) is None and jobs.job(second.id) is second
    row = await jobs.store.run(jobs.store.get_job, first.id)
    assert row["state"] == "succeeded" and row["artifact_path"] == str(first.artifact.path)


async def test_close_cancels_unfinished_jobs_and_refuses_new_ones(jobs: JobHost) -> None:
    job = jobs.submit_job(task="t2v", prompt="a kite", seed=3)
    await jobs.close()
    assert job.state.value == "cancelled" and not await jobs.cancel_job("job_none")
    with pytest.raises(HostError, match="closed"):
        jobs.submit_job(task="t2i", prompt="a")


async def test_job_extensions_are_checked_before_the_job_exists(tmp_path) -> None:
    from models.instance import load_instance
    from models.loops.extensions import deploy_extensions
    from models.registry import get

    instance = load_instance(get("wan2.1-t2v-tiny-random"), device="cpu")
    instance.extensions = deploy_extensions([("fbcache", {"threshold": 0.1})])
    engine = Engine(cost=CostModel(DeviceConstants.cpu()))
    await engine.start()
    store = Store(tmp_path / "db.sqlite3")
    model = instance.card.model_id
    host = JobHost(
        engine=engine,
        models=ServedModels({model: instance}, default=model),
        store=store,
        artifact_dir=tmp_path / "artifacts",
    )
    try:
        with pytest.raises(UnsupportedTaskError) as off:
            host.submit_job(task="t2i", prompt="a", extensions={"teacache": {}}, job_id="job_x")
        assert off.value.field == "extensions" and "'teacache' is not enabled" in str(off.value)
        with pytest.raises(UnsupportedTaskError, match="exact request refuses fbcache"):
            host.submit_job(task="t2i", prompt="a", exact=True)
        assert host.jobs() == []
        assert await store.run(store.get_job, "job_x") is None  # no row either
        job = host.submit_job(task="t2i", prompt="a cat", extensions={"fbcache": {}})
        await asyncio.wait_for(job.wait_finished(), 60)
        assert job.state.value == "succeeded"
        row = await store.run(store.get_job, job.id)
        assert row["params"]["extensions"] == {"fbcache": {}}  # a resumed job asks the same
    finally:
        await host.close()
        await engine.close()
        store.close()
