import msgspec
import numpy as np

from runtime.contract import InputKind
from sessions.records import ChunkRecorder, frames_digest
from sessions.store import Store
from tests.sessions.fakes import FakeHandle as FakeHandleBase


class _State(msgspec.Struct):
    """What a boundary call of the snapshot keeper sees (a loop state with a ``step``)."""

    step: int


TEMPLATE = {
    "weights_version": "w0",
    "loop_id": "chunk_rollout",
    "sampler": "euler",
    "steps": 4,
    "timesteps": [1000, 750, 500, 250],
    "precision": "fp32",
}


def test_digest_is_content_addressed() -> None:
    a = np.zeros((2, 4, 4, 3), np.uint8)
    b = a.copy()
    assert frames_digest(a) == frames_digest(b) and len(frames_digest(a)) == 16
    b[1, 2, 3, 0] = 1
    assert frames_digest(a) != frames_digest(b)
    assert frames_digest(np.asfortranarray(a)) == frames_digest(a)  # layout-independent


def test_records_are_completed_by_the_acks_that_follow_their_media(tmp_path) -> None:
    store = Store(tmp_path / "db.sqlite3")
    recorder = ChunkRecorder(store, session_id="s1", model_id="m", seed=5, template=TEMPLATE)
    recorder.media(
        chunk=0,
        segment=0,
        pts_start=0,
        pts_end=90000,
        num_frames=9,
        digest="d0",
        prompt="a",
        prompt_seq=0,
    )
    recorder.media(
        chunk=1,
        segment=0,
        pts_start=101250,
        pts_end=225000,
        num_frames=12,
        digest="d1",
        prompt="a",
        prompt_seq=0,
    )
    recorder.applied(InputKind.PROMPT, 1, 1, {"text": "b"})
    recorder.applied(InputKind.ACTION, 2, 1, {"keys": ["w"], "mouse": [1.0, 0.0]})
    recorder.applied(InputKind.AUDIO, 3, 1, {"seconds": 0.5})
    recorder.applied(
        InputKind.ACTION, 4, 7, {"keys": ["s"], "mouse": [0.0, 0.0]}
    )  # not this chunk: ignored
    recorder.flush()
    recorder.flush()
    store.close()
    rows = Store(tmp_path / "db.sqlite3").records("s1")
    assert [(r["chunk"], r["prompt"], r["prompt_seq"], r["digest"]) for r in rows] == [
        (0, "a", 0, "d0"),
        (1, "b", 1, "d1"),
    ]
    assert rows[0]["actions"] == {"action": None, "audio_seqs": []}
    assert rows[1]["actions"] == {
        "action": {"seq": 2, "keys": ["w"], "mouse": [1.0, 0.0]},
        "audio_seqs": [3],
    }
    assert rows[1]["replay_key"] == "" and rows[1]["timesteps"] == [1000, 750, 500, 250]
    assert recorder.written == 2


def test_acks_that_come_before_their_chunks_record_still_land_in_it(tmp_path) -> None:
    """A chunk that shows a changing input decodes in parts; its acks ride on the first part,
    so they reach the recorder before the record opens with the last part."""
    store = Store(tmp_path / "db.sqlite3")
    recorder = ChunkRecorder(store, session_id="s1", model_id="m", seed=5, template=TEMPLATE)
    common = {"segment": 0, "pts_start": 0, "pts_end": 1, "num_frames": 12, "prompt_seq": 0}
    recorder.media(chunk=0, digest="d0", prompt="a", **common)
    recorder.applied(InputKind.ACTION, 2, 1, {"keys": ["d", "shift"], "mouse": [0.0, 0.0]})
    recorder.applied(InputKind.PROMPT, 3, 1, {"text": "b"})
    recorder.media(chunk=1, digest="d1", prompt="a", **common)
    recorder.applied(InputKind.AUDIO, 4, 1, {"seconds": 0.5})  # after the record opened
    recorder.applied(InputKind.ACTION, 5, 3, {"keys": ["w"], "mouse": [0.0, 0.0]})
    recorder.media(chunk=2, digest="d2", prompt="b", **common)
    recorder.media(chunk=3, digest="d3", prompt="b", **common)
    recorder.flush()
    store.close()
    rows = Store(tmp_path / "db.sqlite3").records("s1")
    assert rows[0]["actions"] == {"action": None, "audio_seqs": []}
    assert (rows[1]["prompt"], rows[1]["prompt_seq"]) == ("b", 3)
    assert rows[1]["actions"] == {
        "action": {"seq": 2, "keys": ["d", "shift"], "mouse": [0.0, 0.0]},
        "audio_seqs": [4],
    }
    assert rows[2]["actions"]["action"] is None  # chunk 3's ack waited past chunk 2
    assert rows[3]["actions"]["action"]["seq"] == 5


class _Handle(FakeHandleBase):
    pass


async def test_captured_facts_replay_keys_media_and_input_log(tmp_path) -> None:
    """What the loop captured becomes columns; the key is the newest snapshot at or before the
    chunk's decode step; the frames go to an MP4; inputs are logged by loop and step."""
    import av

    from runtime.contract import ActionInput, AudioInput, InputEvent, InputKind, PromptInput
    from sessions.input_log import decode_input
    from sessions.recording import Recording

    store = Store(tmp_path / "db.sqlite3")
    recording = Recording(tmp_path, snapshot_every=2, snapshot_keep=1)
    recorder = ChunkRecorder(
        store, session_id="s1", model_id="m", seed=5, template=TEMPLATE, recording=recording
    )
    handle = _Handle("loop-a")
    handle.boundary_state = _State(step=0)  # the first boundary: a snapshot before chunk 0
    recorder.bind(handle)
    assert recorder.keeper is not None
    frames = np.zeros((3, 16, 16, 3), np.uint8)
    for chunk, step in ((0, 3), (1, 7), (2, 11)):
        handle.boundary_state = _State(step=step + 1)  # the boundary after its final media
        capture = {"step": step, "seed": 9, "noise_seeds": [1, 2], "prompt": "p", "sigmas": [1.0]}
        recorder.chunk_emitted()
        recorder.media(
            chunk=chunk,
            segment=0,
            pts_start=0,
            pts_end=1,
            num_frames=3,
            digest=frames_digest(frames),
            prompt="ignored: the loop's prompt wins",
            prompt_seq=0,
            capture=capture,
            frames=frames,
            fps=12,
        )
    recorder.flush()
    events = [
        InputEvent(InputKind.PROMPT, 1, PromptInput(text="q"), 1.0),
        InputEvent(InputKind.ACTION, 2, ActionInput(keys=("w",), mouse=(1.0, 2.0)), 2.0),
        InputEvent(InputKind.AUDIO, 3, AudioInput(samples=np.arange(4, dtype=np.float32)), 3.0),
    ]
    handle.input_log(6, events)
    recording.close()
    store.close()
    store = Store(tmp_path / "db.sqlite3")
    rows = store.records("s1")
    logged = [decode_input(r) for r in store.inputs("loop-a", from_step=6)]
    store.close()
    assert [r["replay_key"] for r in rows] == ["loop-a@0", "loop-a@0", "loop-a@8"]
    assert rows[0]["seed"] == 9 and rows[0]["prompt"] == "p" and rows[0]["noise_seeds"] == [1, 2]
    assert rows[0]["loop_ref"] == "loop-a" and rows[0]["media_ref"] == "media/s1/0_0.mp4"
    with av.open(str(tmp_path / rows[2]["media_ref"])) as container:
        assert sum(1 for _ in container.decode(video=0)) == 3
    snaps = sorted(p.name for p in (tmp_path / "snapshots" / "loop-a").glob("*.snap"))
    assert snaps == ["000000000008.snap"]  # the retention limit keeps the newest one
    assert [(e.kind, e.seq) for e in logged] == [(e.kind, e.seq) for e in events]
    assert logged[1].payload == events[1].payload and logged[0].payload == events[0].payload
    assert np.array_equal(logged[2].payload.samples, events[2].payload.samples)


def test_store_migrates_a_version_1_file_and_commits_feedback_with_full_sync(tmp_path) -> None:
    import sqlite3

    path = tmp_path / "old.sqlite3"
    old = sqlite3.connect(path)
    old.executescript(
        "CREATE TABLE records (session_id TEXT NOT NULL, segment INTEGER NOT NULL,"
        " chunk INTEGER NOT NULL, seed INTEGER NOT NULL, model_id TEXT NOT NULL,"
        " weights_version TEXT NOT NULL, loop_id TEXT NOT NULL, sampler TEXT NOT NULL,"
        " steps INTEGER NOT NULL, timesteps TEXT NOT NULL, precision TEXT NOT NULL,"
        " prompt TEXT NOT NULL, prompt_seq INTEGER NOT NULL, actions TEXT NOT NULL,"
        " pts_start INTEGER NOT NULL, pts_end INTEGER NOT NULL, num_frames INTEGER NOT NULL,"
        " digest TEXT NOT NULL, replay_key TEXT NOT NULL, created_at REAL NOT NULL,"
        " PRIMARY KEY (session_id, segment, chunk));"
    )
    old.close()
    store = Store(path)
    try:
        columns = {r["name"] for r in store._query("PRAGMA table_info(records)")}
        assert {"loop_ref", "media_ref", "noise_seeds", "prompt_digest"} <= columns
        assert store.synchronous() == 1  # NORMAL for the deferred writes
        store.add_feedback(session_id="s", rating=1, chunk=0, note=None)
        assert store.synchronous() == 1  # FULL only around the durable write
    finally:
        store.close()


def test_media_beyond_the_writer_backlog_are_not_kept_and_the_record_says_so(tmp_path) -> None:
    from sessions.recording import Recording

    store = Store(tmp_path / "db.sqlite3")
    recording = Recording(tmp_path, snapshot_every=0, max_pending_media=0)
    recorder = ChunkRecorder(
        store, session_id="s2", model_id="m", seed=1, template=TEMPLATE, recording=recording
    )
    frames = np.zeros((2, 8, 8, 3), np.uint8)
    recorder.media(
        chunk=0,
        segment=0,
        pts_start=0,
        pts_end=1,
        num_frames=2,
        digest=frames_digest(frames),
        prompt="p",
        prompt_seq=0,
        frames=frames,
        fps=8,
    )
    recorder.flush()
    recording.close()
    store.close()
    rows = Store(tmp_path / "db.sqlite3").records("s2")
    assert rows[0]["media_ref"] is None and recording.media_dropped == 1
    assert not (tmp_path / "media").exists()


async def test_a_chunk_asks_for_its_replay_snapshot_as_it_is_emitted(tmp_path) -> None:
    """Recording x emission order: a chunk's record waits for its digest (hashed off the event
    loop), but the snapshot it is due asks for the loop's very next boundary at once, so with
    ``snapshot_every=1`` every chunk's replay key is the snapshot right before it."""
    from runtime.contract import Emission, EmitSpec, MediaMeta, Stream
    from sessions.recording import Recording
    from tests.sessions.test_session import make_session

    store = Store(tmp_path / "db.sqlite3")
    recording = Recording(tmp_path, snapshot_every=1, snapshot_keep=8, media=False)
    session = make_session(store=store, recording=recording)
    handle = _Handle("loop-a")
    handle.boundary_state = _State(step=0)
    session.attach(handle)
    asks = [c for c in handle.calls if c[0] == "at_boundary"]
    for chunk in range(3):
        step = 6 * chunk + 5  # the step its decode was described at
        handle.boundary_state = _State(step=step + 1)  # the boundary right after its media
        meta = MediaMeta(
            chunk=chunk,
            segment=0,
            frame_start=4 * chunk,
            pts_90k=11250 * 4 * chunk,
            num_frames=4,
            fps=8,
            capture={"step": step},
        )
        session.on_emission(Emission(EmitSpec(Stream.MEDIA, meta), np.zeros((4, 8, 8, 3), "u1")))
        # asked before the digest ran (nothing was awaited since the emission)
        assert len([c for c in handle.calls if c[0] == "at_boundary"]) == len(asks) + chunk + 1
    await session.settle()
    await session.close()
    recording.close()
    store.close()
    rows = Store(tmp_path / "db.sqlite3").records("s1")
    assert [r["replay_key"] for r in rows] == ["loop-a@0", "loop-a@6", "loop-a@12"]
