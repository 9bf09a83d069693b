"""Program jobs through the job host, on the real engine and the tiny card with both decoders:
previews as job events while the final MP4 is made, a program checked before the job exists,
and a half-run program job resumed from its snapshot by the next process."""

from __future__ import annotations

import asyncio
import base64
from typing import Any

import pytest

from models.instance import load_instance
from models.programs.graph import ProgramError
from models.registry import get
from runtime.cost import CostModel, DeviceConstants
from runtime.engine import Engine
from sessions.events import JobArtifact, JobPreview, JobProgress
from sessions.job_host import JobHost
from sessions.recording import Recording
from sessions.served_models import ServedModels
from sessions.store import Store

MODEL = "wan-tiny-taehv-random"


@pytest.fixture(scope="module")
def taehv() -> Any:
    return load_instance(get(MODEL), device="cpu")


async def make_host(instance: Any, tmp_path: Any, recording: Recording | None = None) -> JobHost:
    engine = Engine(cost=CostModel(DeviceConstants.cpu()))
    await engine.start()
    return JobHost(
        engine=engine,
        models=ServedModels({MODEL: instance}, default=MODEL),
        store=Store(tmp_path / "db.sqlite3"),
        artifact_dir=tmp_path / "artifacts",
        recording=recording,
    )


async def close_host(host: JobHost) -> None:
    await host.close()
    await host.engine.close()
    host.store.close()


async def test_a_program_job_streams_previews_and_writes_the_final_mp4(taehv, tmp_path) -> None:
    host = await make_host(taehv, tmp_path)
    try:
        job = host.submit_job(
            task="t2v", prompt="a kite", num_frames=17, seed=5, program="preview_and_final"
        )
        await asyncio.wait_for(job.wait_finished(), 120)
        assert job.state.value == "succeeded" and job.artifact.media_type == "video/mp4"
        assert job.artifact.num_frames == 17
        events = [e for e in job.events.history() if isinstance(e, JobPreview)]
        assert [(e.frame_start, e.num_frames, e.stream) for e in events] == [
            (0, 1, "preview"),  # the stream's first frame alone, as a session's
            (1, 8, "preview"),
            (9, 12, "preview"),
        ]
        assert base64.b64decode(events[0].jpeg_b64)[:2] == b"\xff\xd8"  # a JPEG
        # the previews came before the artifact, progress ended at 1
        types = [type(e) for e in job.events.history()]
        assert types.index(JobPreview) < types.index(JobArtifact)
        assert job.progress == 1.0 and job.snapshot()["program"] == "preview_and_final"
        assert job.snapshot()["price_gpu_s"] > 0  # its nodes' plans, by the engine's cost model
        await host.store.run(lambda: None)
        row = host.store.get_job(job.id)
        assert row["params"]["program"]["name"] == "preview_and_final"
    finally:
        await close_host(host)


async def test_a_program_the_card_cannot_run_is_refused_before_the_job_exists(tmp_path) -> None:
    plain = load_instance(get("wan2.1-t2v-tiny-random"), device="cpu")
    engine = Engine(cost=CostModel(DeviceConstants.cpu()))
    await engine.start()
    model = plain.card.model_id
    host = JobHost(
        engine=engine,
        models=ServedModels({model: plain}, default=model),
        store=Store(tmp_path / "db.sqlite3"),
        artifact_dir=tmp_path / "artifacts",
    )
    try:
        with pytest.raises(ProgramError) as err:
            host.submit_job(task="t2v", prompt="a", program="preview_and_final")
        assert err.value.field == "program" and err.value.status == 422
        assert err.value.problems == [
            f"node 'preview': decoder 'tiny' is not served by model {model!r} "
            "(its decoders: ['full'])"
        ]
        with pytest.raises(ProgramError, match="unknown program 'nope'"):
            host.submit_job(task="t2v", prompt="a", program="nope")
        assert host.jobs() == []
    finally:
        await close_host(host)


async def test_a_half_run_program_job_resumes_after_a_restart(taehv, tmp_path) -> None:
    recording = Recording(tmp_path / "rec", snapshot_every=0, media=False)
    first = await make_host(taehv, tmp_path, recording)
    job = first.submit_job(
        task="t2v", prompt="a kite", num_frames=17, seed=5, program="preview_and_final"
    )
    while job.progress < 0.3:  # into the second chunk: the first one's previews are out
        await asyncio.sleep(0.01)
    assert await first.suspend(timeout_s=60) == 1
    assert not job.terminal
    await first.engine.close()
    first.store.close()
    recording.close()  # the process ends: its snapshot writes are done

    recording = Recording(tmp_path / "rec", snapshot_every=0, media=False)
    second = await make_host(taehv, tmp_path, recording)
    try:
        rows = await second.store.run(second.store.recover)
        (resumed,) = second.resume_jobs(rows)
        assert resumed.id == job.id
        await asyncio.wait_for(resumed.wait_finished(), 120)
        assert resumed.state.value == "succeeded" and resumed.artifact.num_frames == 17
        progress = [e for e in resumed.events.history() if isinstance(e, JobProgress)]
        assert progress[0].done > 1  # it went on from its snapshot, not from the start
        previews = [e.frame_start for e in resumed.events.history() if isinstance(e, JobPreview)]
        assert 0 not in previews  # chunk 0's preview went out before the restart
    finally:
        await close_host(second)
        recording.close()


async def test_a_program_job_cancels_like_any_job(taehv, tmp_path) -> None:
    host = await make_host(taehv, tmp_path)
    try:
        job = host.submit_job(
            task="t2v", prompt="a kite", num_frames=41, seed=5, program="preview_and_final"
        )
        while job.progress == 0:  # running: its plans are in the engine's queue
            await asyncio.sleep(0.01)
        assert await host.cancel_job(job.id)
        assert job.state.value == "cancelled" and job.artifact is None
        assert host.engine.stats().running_loops == 0  # every node's plans went with it
    finally:
        await close_host(host)


async def test_a_weight_sync_holds_a_program_job_between_chunks(taehv, tmp_path) -> None:
    """The hold of a weight sync (chunk boundaries) reaches a program job mid-run, as it reaches
    a plain job: the rollout marks its chunk ends though it does not decode."""
    from sessions.model_hold import ModelHold

    host = await make_host(taehv, tmp_path)
    try:
        job = host.submit_job(
            task="t2v", prompt="a kite", num_frames=41, seed=5, program="preview_and_final"
        )
        while job.progress == 0:
            await asyncio.sleep(0.01)
        hold = ModelHold(host.models, lambda model_id: [(job, host.engine.handle(job.id))])
        held = await hold.hold(
            MODEL, reason="weights_sync", retry_after_s=1.0, after_chunk=True, timeout_s=30.0
        )
        assert [h.owner for h in held] == [job] and not job.terminal
        at = job.progress
        await asyncio.sleep(0.2)
        assert job.progress == at  # held: nothing of it runs
        hold.release(MODEL, held)
        await asyncio.wait_for(job.wait_finished(), 120)
        assert job.state.value == "succeeded"
    finally:
        await close_host(host)
