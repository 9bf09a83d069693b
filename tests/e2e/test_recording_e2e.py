"""Behaviour recording end to end: a scripted tiny-world session on a real ``dreamrt serve``
subprocess (real aiortc viewer, real SQLite file), then ``dreamrt replay`` and
``dreamrt export`` on its data directory, and a SIGKILL right after feedback, fork and choose
were answered (then a restart: nothing acknowledged lost, the job resumes from its newest
snapshot, the session from its own, and its SSE stream goes on after the client's
``Last-Event-ID`` with no event missed or repeated).

The session: a prompt, then a prompt switch, held keys and an audio clip as it streams; it is
closed after chunk 5, so the server writes its records, input log, replay snapshots (every 2
chunks here) and chunk MP4s. Replay must regenerate chunks bit-identically (digest of the raw
uint8 frames) from their replay keys, across the chunks that reflect the switch, the keys and
the audio.
"""

from __future__ import annotations

import asyncio
import contextlib
import io
import itertools
import os
import re
import signal
import subprocess
import sys
import time
import wave
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import av
import httpx
import numpy as np
import pytest

from clients.python.api import DreamrtClient
from clients.python.viewer import Viewer
from infra.browser_harness import ServerProcess
from sessions.persistence import EVENT_ID_RESERVE

pytestmark = pytest.mark.slow

REPO_ROOT = Path(__file__).resolve().parents[2]


def wav_tone(seconds: float, rate: int = 16_000) -> bytes:
    t = np.arange(int(rate * seconds)) / rate
    tone = (0.7 * np.sin(2 * np.pi * 220 * t) * 32767).astype("<i2")
    buf = io.BytesIO()
    with wave.open(buf, "wb") as w:
        w.setnchannels(1)
        w.setsampwidth(2)
        w.setframerate(rate)
        w.writeframes(tone.tobytes())
    return buf.getvalue()


async def read_sse(
    url: str,
    session_id: str,
    seen: list[tuple[int, str]],
    after: int | None = None,
    token: str | None = None,
) -> None:
    """Appends (id, type) of each event of the session's SSE stream to ``seen`` until it ends
    (or the server dies)."""
    headers = {} if after is None else {"Last-Event-ID": str(after)}
    if token is not None:
        headers["Authorization"] = f"Bearer {token}"
    event_id = None
    with contextlib.suppress(httpx.HTTPError):
        async with (
            httpx.AsyncClient(base_url=url, timeout=httpx.Timeout(10.0, read=None)) as http,
            http.stream("GET", f"/v1/sessions/{session_id}/events", headers=headers) as stream,
        ):
            async for line in stream.aiter_lines():
                if line.startswith("id:"):
                    event_id = int(line[3:])
                elif line.startswith("event:") and event_id is not None:
                    seen.append((event_id, line[6:].strip()))


def run_cli(*args: str, timeout_s: float = 240.0) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "server", *args],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=timeout_s,
        check=False,
    )


@pytest.fixture(scope="module")
def recorded(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    """The data directory of a server that recorded one scripted session (server stopped)."""
    root = tmp_path_factory.mktemp("recording")
    server = ServerProcess(
        root / "data", root / "server.log", extra_args=("--snapshot-every", "2")
    ).start()
    try:
        info = asyncio.run(_scripted_session(server.url))
    finally:
        server.stop(timeout_s=20.0)
    log = server.log_path.read_text(errors="replace")
    assert "dreamrt stopped" in log and "Traceback" not in log, log[-4000:]
    yield {"data": root / "data", **info}


async def _scripted_session(url: str) -> dict[str, Any]:
    async with DreamrtClient(url) as api:
        viewer = Viewer(api)
        try:
            await viewer.connect("a red ball on grass", seed=7)
            sid = viewer.session_id
            await viewer.wait_event(lambda e: e["type"] == "media.chunk" and e["chunk"] >= 0)
            viewer.send({"type": "prompt", "text": "a blue square on snow"})
            await viewer.wait_event(lambda e: e["type"] == "prompt.applied")
            viewer.send({"type": "action", "keys": ["d", "shift"]})
            await viewer.wait_event(lambda e: e["type"] == "action.applied")
            await api.audio(sid, wav_tone(0.8), "audio/wav")
            await viewer.wait_event(lambda e: e["type"] == "audio.applied", timeout_s=30)
            viewer.send({"type": "action", "keys": []})
            await viewer.wait_event(
                lambda e: e["type"] == "media.chunk" and e["chunk"] >= 5, timeout_s=60
            )
            feedback = await api.request(
                "POST", f"/v1/sessions/{sid}/feedback", json={"rating": 1, "chunk": 2}
            )
            assert feedback.status_code == 201
        finally:
            await viewer.close()
    applied: dict[str, int] = {}  # the first acknowledgement of each kind: the scripted inputs
    for e in viewer.events:  # (the keys released last may be applied before chunk 5 too)
        if e["type"].endswith(".applied"):
            applied.setdefault(e["type"], e["chunk"])
    digests = {e["chunk"]: e["digest"] for e in viewer.events if e["type"] == "media.chunk"}
    return {"session": sid, "applied": applied, "digests": digests}


def test_records_hold_what_the_loop_used(recorded: dict[str, Any]) -> None:
    from sessions.store import Store

    store = Store(recorded["data"] / "dreamrt.sqlite3")
    try:
        rows = store.records(recorded["session"])
    finally:
        store.close()
    assert [r["chunk"] for r in rows][:6] == list(range(6))
    assert {r["chunk"]: r["digest"] for r in rows} == recorded["digests"]
    first, switched = rows[0], rows[recorded["applied"]["prompt.applied"]]
    assert (
        first["prompt"] == "a red ball on grass" and switched["prompt"] == "a blue square on snow"
    )
    assert first["prompt_digest"] != switched["prompt_digest"] and len(first["prompt_digest"]) == 16
    acted = rows[recorded["applied"]["action.applied"]]
    assert acted["actions"]["action"]["keys"] == ["d", "shift"] and acted["action_digest"]
    assert rows[recorded["applied"]["audio.applied"]]["audio_digest"]
    assert first["action_digest"] == "" and first["audio_digest"] == ""
    for r in rows:
        assert r["weights_version"].startswith("b2:") and r["weights_label"] == "tinyworld-v2"
        assert r["recipe_id"] and r["loop_ref"] == recorded["session"] and r["seed"] == 7
        assert len(r["noise_seeds"]) == r["steps"] + 1 and len(r["sigmas"]) == r["steps"] + 1
        assert r["kv_window"]["window_frames"] >= 1 and r["precision"] == "fp32"
        assert (recorded["data"] / r["media_ref"]).stat().st_size > 0
    keys = [r["replay_key"] for r in rows]
    assert keys[0] == f"{recorded['session']}@0" and keys[0] == keys[1]
    assert keys[2] != keys[1] and keys[2] == keys[3], keys  # every 2 chunks


def test_replay_regenerates_three_chunks_bit_identically(
    recorded: dict[str, Any], tmp_path: Path
) -> None:
    """Chunks from a snapshot before the switch, keys and audio, through those inputs."""
    from models import registry
    from models.instance import load_instance
    from server.data.replay import replay_chunk

    instance = load_instance(registry.get("tiny-world"), device="cpu")
    applied = recorded["applied"]
    # the prompt's and the audio's chunks (one chunk when the audio restarted the chunk that
    # showed the prompt first) and the chunks after them: at least three distinct chunks
    chunks = sorted({applied["prompt.applied"], applied["audio.applied"], 4, 5})
    last = applied["audio.applied"]
    results = [
        replay_chunk(recorded["data"], recorded["session"], k, instance=instance) for k in chunks
    ]
    assert len(chunks) >= 3 and {r.replay_key for r in results} != {results[0].replay_key}
    for result in results:
        assert result.matches, (result.chunk, result.recorded, result.replayed)
        assert result.frames.dtype == np.uint8 and result.frames.shape[1:] == (96, 96, 3)
    # the CLI says the same, and its exit code tells it
    out = tmp_path / "chunk.mp4"
    cli = run_cli(
        "replay",
        "--data-dir",
        str(recorded["data"]),
        "--session",
        recorded["session"],
        "--chunk",
        str(last),
        "--out",
        str(out),
    )
    assert cli.returncode == 0, cli.stderr[-3000:]
    assert "match: bit-identical" in cli.stdout and out.stat().st_size > 0
    missing = run_cli(
        "replay", "--data-dir", str(recorded["data"]), "--session", "nope", "--chunk", "0"
    )
    assert missing.returncode == 3 and "no record" in missing.stderr


def test_export_round_trip_reads_back_with_pandas_and_datasets(
    recorded: dict[str, Any], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import datasets
    import pandas as pd

    out = tmp_path / "dataset"
    first = run_cli("export", "--data-dir", str(recorded["data"]), "--out", str(out))
    assert first.returncode == 0, first.stderr[-3000:]
    assert "export records [" in first.stderr  # the progress bar
    records = pd.read_parquet(out / "records")
    prefs = pd.read_parquet(out / "preferences")
    assert len(records) == len(recorded["digests"]) and len(prefs) == 1
    mine = records[records.session_id == recorded["session"]].sort_values("chunk")
    assert list(mine.chunk) == sorted(recorded["digests"])
    assert list(mine.digest) == [recorded["digests"][c] for c in sorted(recorded["digests"])]
    assert str(mine.created_at.dtype).startswith("datetime64") and mine.seed.dtype == "int64"
    row = mine.iloc[recorded["applied"]["action.applied"]]
    assert list(row.action_keys) == ["d", "shift"] and row.prompt == "a blue square on snow"
    assert all((out / m).stat().st_size > 0 for m in mine.media)
    rating = prefs.iloc[0]
    assert (rating.source, rating.rating, rating.chosen_ref) == (
        "rating",
        1,
        f"{recorded['session']}@2",
    )
    assert rating.weights_version == mine.iloc[2].weights_version
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    monkeypatch.setenv("HF_DATASETS_CACHE", str(tmp_path / "hf-cache"))
    ds = datasets.load_dataset(
        "parquet", data_dir=str(out / "records"), cache_dir=str(tmp_path / "hf")
    )["train"]
    assert ds.num_rows == len(records) and ds.features["noise_seeds"].feature.dtype == "int64"
    by_config = datasets.load_dataset(str(out), "preferences", cache_dir=str(tmp_path / "hf"))
    assert by_config["train"].num_rows == 1
    readme = (out / "README.md").read_text()
    assert "| `replay_key` |" in readme and "config_name: records" in readme
    # incremental: nothing new since the first export -> a new, empty part; the first unchanged
    part0 = (out / "records" / "part-00000.parquet").read_bytes()
    again = run_cli("export", "--data-dir", str(recorded["data"]), "--out", str(out))
    assert again.returncode == 2 and "--since" in again.stderr
    since = run_cli(
        "export", "--data-dir", str(recorded["data"]), "--out", str(out), "--since", "2000-01-01"
    )
    assert since.returncode == 0, since.stderr[-3000:]
    assert (out / "records" / "part-00000.parquet").read_bytes() == part0
    assert len(pd.read_parquet(out / "records" / "part-00001.parquet")) == len(records)


async def test_acknowledged_rows_survive_sigkill_and_the_work_resumes(tmp_path: Path) -> None:
    """201 means committed: the server is killed (SIGKILL) right after feedback, fork and
    choose were answered, while a job runs and a session streams. After the restart no
    acknowledged row is lost, the job goes on from its newest periodic snapshot (step > 0) to
    a complete artifact, and the session's client resumes it with its old id: it goes on from
    its last periodic snapshot (chunk > 0; the chosen candidate's, if it was written before
    the kill), and an SSE client reconnecting with its ``Last-Event-ID`` gets every new event
    once: ids above the last it saw (none reused), one apart."""
    import sqlite3

    data = tmp_path / "data"
    args = ("--snapshot-every", "2", "--deterministic", "--max-sessions", "4")
    server = ServerProcess(data, tmp_path / "server.log", extra_args=args).start()
    try:
        async with DreamrtClient(server.url) as api:
            viewer = Viewer(api)
            await viewer.connect("a red ball", seed=5)
            sid = viewer.session_id
            before: list[tuple[int, str]] = []
            sse = asyncio.create_task(read_sse(server.url, sid, before))
            job = await api.submit_job("t2v", "a slow pan", num_frames=120, seed=3)
            await viewer.wait_event(lambda e: e["type"] == "media.chunk" and e["chunk"] >= 3, 60)
            deadline = time.monotonic() + 60
            while not list((data / "snapshots" / job).glob("*.snap")):  # a periodic one
                assert time.monotonic() < deadline, await api.job(job)
                await asyncio.sleep(0.05)
            feedback = await api.request(
                "POST",
                f"/v1/sessions/{sid}/feedback",
                json={"rating": -1, "chunk": 0, "note": "too dark"},
            )
            forked = await api.request("POST", f"/v1/sessions/{sid}/fork", json={"n": 2})
            chosen = forked.json()["candidates"][1]
            choose = await api.request(
                "POST", f"/v1/sessions/{sid}/choose", json={"candidate": chosen}
            )
            job_at_kill = await api.job(job)
            os.killpg(server._proc.pid, signal.SIGKILL)  # noqa: SLF001 - the real process
            last = max(e["chunk"] for e in viewer.events if e["type"] == "media.chunk")
            await asyncio.wait_for(sse, 10)  # the stream broke with the process
            await viewer.close(delete=False)
    finally:
        server.stop()
    assert [feedback.status_code, forked.status_code, choose.status_code] == [201] * 3
    assert choose.json() == {"chosen": chosen, "preferences": 1}
    restarted = ServerProcess(data, tmp_path / "server2.log", extra_args=args).start()
    try:
        async with DreamrtClient(restarted.url) as api:
            resumed = Viewer(api)
            await resumed.connect(session_id=sid)  # the old id (auth none: no token needed)
            last_seen = before[-1][0]
            after: list[tuple[int, str]] = []
            sse = asyncio.create_task(read_sse(restarted.url, sid, after, after=last_seen))
            first = await resumed.wait_event(lambda e: e["type"] == "media.chunk", 60)
            deadline = time.monotonic() + 120
            while (state := await api.job(job))["state"] not in ("succeeded", "failed"):
                assert state["state"] in ("queued", "running") and time.monotonic() < deadline
                await asyncio.sleep(0.2)
            while not any(kind == "media.chunk" for _, kind in after):
                assert time.monotonic() < deadline, after
                await asyncio.sleep(0.05)
            media_type, _ = await api.download_artifact(job, tmp_path / "job.mp4")
            await resumed.close(delete=False)
            await api.delete_session(sid)
            await asyncio.wait_for(sse, 10)  # the stream ends with the session
    finally:
        restarted.stop(timeout_s=20.0)
    log = (tmp_path / "server2.log").read_text(errors="replace")
    assert "Traceback" not in log, log[-6000:]
    # the job went on from a periodic snapshot, not from its request, to a complete artifact
    assert job_at_kill["state"] == "running" and job_at_kill["progress"] < 1.0, job_at_kill
    restored = re.search(rf"job {job} restored from its snapshot at step (\d+)", log)
    assert restored is not None and int(restored.group(1)) > 0, log[-3000:]
    assert state["state"] == "succeeded", state
    assert media_type == "video/mp4"
    with av.open(str(tmp_path / "job.mp4")) as container:
        assert sum(1 for _ in container.decode(video=0)) == 120
    assert not (data / "snapshots" / job).exists()  # a finished job's snapshots are gone
    assert 0 < first["chunk"] <= last + 1, (first, last)
    # SSE: every id above the one the client saw last (none reused), one apart, but for one
    # jump: where the old process's events (stored before the kill, some perhaps unseen by the
    # client) end and the new process's begin, at most the ids the old process reserved ahead
    ids = [event_id for event_id, _ in after]
    steps = [b - a for a, b in itertools.pairwise([last_seen, *ids])]
    jumps = [step for step in steps if step != 1]
    assert ids and min(steps) >= 1 and len(jumps) <= 1, (last_seen, ids)
    assert all(jump <= 1 + EVENT_ID_RESERVE for jump in jumps), (last_seen, ids)
    assert len({i for i, _ in before}) == len(before)
    db = sqlite3.connect(data / "dreamrt.sqlite3")
    forks = db.execute("SELECT chosen FROM forks WHERE session_id = ?", (sid,)).fetchall()
    pairs = db.execute("SELECT chosen_ref, rejected_ref FROM preferences").fetchall()
    db.close()
    assert forks == [(chosen,)] and len(pairs) == 1 and pairs[0][0].startswith(chosen)
    out = tmp_path / "dataset"
    exported = run_cli("export", "--data-dir", str(data), "--out", str(out))
    assert exported.returncode == 0, exported.stderr[-3000:]
    import pandas as pd

    prefs = pd.read_parquet(out / "preferences")
    rated = prefs[prefs.rating.notna()]
    assert list(zip(rated.context_ref, rated.rating, rated.note, strict=True)) == [
        (f"{sid}@0", -1, "too dark")
    ]
    assert rated.rejected_ref.iloc[0] == f"{sid}@0"


def test_export_latents_regenerates_each_chunks_final_latents(
    recorded: dict[str, Any], tmp_path: Path
) -> None:
    from safetensors.torch import load_file

    from server.data.export import export

    out = tmp_path / "latents"
    summary = export(recorded["data"], out, latents=True, progress=_Quiet())
    import pandas as pd

    records = pd.read_parquet(out / "records")
    assert summary["media"] == len(records) == len(recorded["digests"])
    latents = load_file(str(out / records.media.iloc[1]))["latents"]
    # [1, C, f, h, w]: tiny-world's latents are its pixels (one latent frame per frame)
    assert latents.shape[:2] == (1, 3) and latents.shape[3:] == (96, 96)
    assert latents.shape[2] == records.num_frames.iloc[1]
    assert not (out / "media").exists()


class _Quiet:
    def update(self, done: int) -> None:
        pass

    def close(self) -> None:
        pass
