"""A running job's periodic snapshots (``JobSnapshots``): every ``snapshot_every`` progress
steps at the next step boundary, paced by their size on an injected clock, restorable, and
deleted when the job ends."""

from __future__ import annotations

import torch

from runtime.snapshot import restore_state
from sessions.job_snapshots import JobSnapshots
from sessions.recording import Recording
from tests.sessions.fakes import FakeHandle
from tests.sessions.test_snapshot_limits import Big


async def test_snapshots_every_n_steps_paced_by_size_and_deleted_at_the_end(tmp_path) -> None:
    recording = Recording(tmp_path, snapshot_every=2, snapshot_mbps=2.0)  # 2 MB/s
    handle = FakeHandle("job_a")
    now_s = [10.0]
    snapshots = JobSnapshots(recording, handle, clock=lambda: now_s[0])
    for step in range(1, 5):  # 400 bytes each: a 0.2-ms pause, over by the next step
        now_s[0] += 0.01
        handle.boundary_state = Big(step=step, kv=torch.full((100,), float(step)))
        snapshots.step_done()
    assert snapshots.steps == [2, 4]
    now_s[0] += 0.01
    handle.boundary_state = Big(step=6, kv=torch.zeros(250_000))  # 1 MB: a 0.5-s pause after it
    snapshots.step_done()
    snapshots.step_done()
    for step in (7, 8):
        handle.boundary_state = Big(step=step, kv=torch.zeros(10))
        snapshots.step_done()  # due by steps, but within the pause: none
    now_s[0] += 0.49
    snapshots.step_done()  # still within it
    now_s[0] += 0.01
    handle.boundary_state = Big(step=9, kv=torch.full((10,), 9.0))
    snapshots.step_done()
    assert snapshots.steps == [2, 4, 6, 9]
    recording.close()  # the writes are done
    folder = tmp_path / "snapshots" / "job_a"
    assert sorted(int(p.stem) for p in folder.glob("*.snap")) == [2, 4, 6, 9]
    newest = restore_state((folder / f"{9:012d}.snap").read_bytes(), Big)
    assert newest.step == 9 and torch.equal(newest.kv, torch.full((10,), 9.0))


async def test_the_end_of_the_job_deletes_its_snapshots_after_the_queued_writes(tmp_path) -> None:
    recording = Recording(tmp_path, snapshot_every=1, snapshot_mbps=0)
    handle = FakeHandle("job_b")
    snapshots = JobSnapshots(recording, handle)
    handle.boundary_state = Big(step=3, kv=torch.zeros(10))
    snapshots.step_done()
    snapshots.discard()  # queued behind the write of step 3
    handle.boundary_state = Big(step=4, kv=torch.zeros(10))
    snapshots.step_done()  # ended: no more
    snapshots.discard()  # idempotent
    recording.close()
    assert snapshots.steps == [3]
    assert not (tmp_path / "snapshots" / "job_b").exists()


async def test_no_snapshots_when_recording_says_none(tmp_path) -> None:
    recording = Recording(tmp_path, snapshot_every=0)
    handle = FakeHandle("job_c")
    snapshots = JobSnapshots(recording, handle)
    handle.boundary_state = Big(step=5, kv=torch.zeros(10))
    for _ in range(3):
        snapshots.step_done()
    recording.close()
    assert snapshots.steps == [] and handle.calls == []
