import av
import numpy as np

from runtime.contract import Emission, EmitSpec, ProgressMeta, Stream
from sessions.job import Job, JobConfig
from sessions.store import Store
from tests.sessions.fakes import FakeHandle


def make_job(tmp_path, task: str = "t2v", store=None) -> Job:
    config = JobConfig(
        job_id="j1", task=task, model_id="tiny", prompt="p", fps=8, params={"num_frames": 5}
    )
    return Job(config, artifact_dir=tmp_path / "artifacts", store=store)


def progress(done: int, total: int) -> Emission:
    return Emission(EmitSpec(Stream.PROGRESS, ProgressMeta(done=done, total=total)), None)


def tags(job: Job) -> list[str]:
    return [type(e).__struct_config__.tag for e in job.events.history()]


async def test_progress_then_mp4_artifact(tmp_path) -> None:
    store = Store(tmp_path / "db.sqlite3")
    store.add_job(job_id="j1", task="t2v", model_id="tiny", prompt="p", params={}, state="queued")
    job = make_job(tmp_path, store=store)
    handle = FakeHandle()
    job.attach(handle)
    assert job.state.value == "queued"
    for done in (1, 2, 2, 1, 4):
        job.on_emission(progress(done, 4))
    assert job.state.value == "running" and job.progress == 1.0
    handle.finish({"frames": np.zeros((5, 16, 16, 3), np.uint8)})
    await job.wait_finished()
    assert job.state.value == "succeeded"
    assert [
        (e.done, e.progress)
        for e in job.events.history()
        if type(e).__struct_config__.tag == "job.progress"
    ] == [(1, 0.25), (2, 0.5), (4, 1.0)]
    assert tags(job)[-2:] == ["job.artifact", "job.state"]
    with av.open(str(job.artifact.path)) as container:
        assert sum(1 for _ in container.decode(video=0)) == 5
    await store.run(lambda: None)
    row = store.get_job("j1")
    assert (row["state"], row["media_type"], row["artifact_path"]) == (
        "succeeded",
        "video/mp4",
        str(job.artifact.path),
    )
    assert [e["type"] for e in store.events("j1")][-1] == "job.state"
    store.close()


async def test_t2i_writes_png(tmp_path) -> None:
    job = make_job(tmp_path, task="t2i")
    handle = FakeHandle()
    job.attach(handle)
    handle.finish({"frames": np.zeros((1, 16, 16, 3), np.uint8)})
    await job.wait_finished()
    assert job.state.value == "succeeded" and job.artifact.media_type == "image/png"
    assert [
        e.state for e in job.events.history() if type(e).__struct_config__.tag == "job.state"
    ] == ["queued", "running", "succeeded"]


async def test_cancel_and_failure(tmp_path) -> None:
    job = make_job(tmp_path)
    handle = FakeHandle()
    job.attach(handle)
    job.on_emission(progress(1, 4))
    await job.cancel()
    await job.cancel()
    assert job.state.value == "cancelled" and ("cancel", "deleted") in handle.calls
    failing = make_job(tmp_path)
    handle = FakeHandle()
    failing.attach(handle)
    handle.fail("step_exception", "boom")
    await failing.wait_finished()
    assert failing.state.value == "failed" and failing.snapshot()["error"] == "step_exception: boom"


async def test_missing_frames_output_fails_the_job(tmp_path) -> None:
    job = make_job(tmp_path)
    handle = FakeHandle()
    job.attach(handle)
    handle.finish({"latents": 1})
    await job.wait_finished()
    assert job.state.value == "failed" and "frames" in job.error


async def test_a_finished_job_keeps_nothing_of_its_loop(tmp_path) -> None:
    # JobHost keeps the newest finished jobs listed: the loop's result (every frame) must not
    # stay with each of them
    import gc
    import weakref

    job = make_job(tmp_path)
    handle = FakeHandle()
    job.attach(handle)
    frames = np.zeros((5, 16, 16, 3), np.uint8)
    gone = weakref.ref(frames)
    handle.finish({"frames": frames})
    del frames
    await job.wait_finished()
    assert job.state.value == "succeeded" and job.handle is None
    del handle
    gc.collect()
    assert gone() is None, [type(r).__name__ for r in gc.get_referrers(gone())]
    await job.cancel()  # a finished job without its handle still answers
    assert job.state.value == "succeeded"
