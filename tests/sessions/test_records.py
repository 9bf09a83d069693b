import numpy as np

from runtime.contract import InputKind
from sessions.records import ChunkRecorder, frames_digest
from sessions.store import Store

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
    assert rows[1]["replay_key"] == "s1/0/1/5" and rows[1]["timesteps"] == [1000, 750, 500, 250]
    assert recorder.written == 2
