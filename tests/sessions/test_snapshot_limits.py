"""Snapshots' size limits: a big state is snapshotted less often (``--snapshot-mbps``) and fewer
of them are kept (``--snapshot-keep-gb``); a write that fails leaves no partial file."""

from __future__ import annotations

import pytest
import torch

from runtime.contract import LoopState
from runtime.snapshot import restore_state, write_snapshot
from sessions.recording import Recording, snapshot_path
from sessions.snapshot_keeper import SnapshotKeeper
from tests.sessions.fakes import FakeHandle


class Big(LoopState, kw_only=True):
    kv: torch.Tensor


def _write(recording: Recording, key: str, state: LoopState) -> None:
    recording.write_snapshot(key, lambda fh: write_snapshot(state, fh))


def test_retention_keeps_fewer_snapshots_when_they_are_big(tmp_path) -> None:
    recording = Recording(tmp_path, snapshot_keep=4, snapshot_keep_gb=250e3 / 1e9)  # 250 kB
    for step in range(5):
        _write(recording, f"loop@{step}", Big(step=step, kv=torch.full((100_000,), step)))
    recording.close()
    kept = sorted(p.name for p in (tmp_path / "snapshots" / "loop").iterdir())
    # 100,000 float32 = 400 kB each: over the 250-kB budget, only the newest is kept
    assert kept == [snapshot_path(tmp_path, "loop@4").name]
    back = restore_state(snapshot_path(tmp_path, "loop@4").read_bytes(), Big)
    assert torch.equal(back.kv, torch.full((100_000,), 4))

    small = Recording(tmp_path / "small", snapshot_keep=3)
    for step in range(5):
        _write(small, f"loop@{step}", Big(step=step, kv=torch.zeros(10)))
    small.close()
    assert len(list((tmp_path / "small" / "snapshots" / "loop").iterdir())) == 3  # the count


def test_a_failed_write_leaves_no_partial_file(tmp_path, caplog) -> None:
    recording = Recording(tmp_path)

    def fails(fh) -> int:
        fh.write(b"half a snapshot")
        raise OSError("disk full")

    recording.write_snapshot("loop@3", fails)
    recording.close()
    folder = tmp_path / "snapshots" / "loop"
    assert list(folder.iterdir()) == []
    assert "disk full" in caplog.text


async def test_the_next_snapshot_waits_for_the_size_of_the_last(tmp_path) -> None:
    recording = Recording(tmp_path, snapshot_every=1, snapshot_mbps=2.0)  # 2 MB/s
    handle = FakeHandle("loop-a")
    now_s = [100.0]
    keeper = SnapshotKeeper(recording, handle, clock=lambda: now_s[0])
    handle.boundary_state = Big(step=0, kv=torch.zeros(250_000))  # 1 MB: a 0.5-s pause
    keeper.start()
    handle.boundary_state = Big(step=5, kv=torch.zeros(10))
    now_s[0] += 0.45
    keeper.chunk_done()  # 1 chunk since (= snapshot_every), but within the pause: none
    assert keeper.key_for(5) == "loop-a@0"
    now_s[0] += 0.1
    keeper.chunk_done()
    assert keeper.key_for(5) == "loop-a@5"
    recording.close()
    assert recording.snapshot_pause_s(64_000_000) == pytest.approx(32.0)
    assert Recording(tmp_path, snapshot_mbps=0).snapshot_pause_s(10**12) == 0.0
