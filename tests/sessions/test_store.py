import sqlite3

import pytest

from sessions.store import Store


@pytest.fixture
def store(tmp_path):
    ticks = iter(float(t) for t in range(100, 10_000))
    s = Store(tmp_path / "dreamrt.sqlite3", clock=lambda: next(ticks))
    yield s
    s.close()


def add_session(store: Store, session_id: str = "s1", state: str = "created") -> None:
    store.add_session(
        session_id=session_id,
        model_id="m",
        prompt="p",
        seed=1,
        fps=8,
        width=64,
        height=64,
        priority_class="realtime",
        state=state,
    )


def test_uses_wal_and_sessions_round_trip(store: Store) -> None:
    assert store.journal_mode() == "wal"
    add_session(store)
    store.update_session("s1", state="live", frames_sent=12)
    row = store.get_session("s1")
    assert (row["state"], row["frames_sent"], row["created_at"], row["updated_at"]) == (
        "live",
        12,
        100.0,
        101.0,
    )
    assert store.get_session("missing") is None
    with pytest.raises(ValueError, match="unknown session fields"):
        store.update_session("s1", model_id="other")


def test_data_is_on_disk_for_another_connection(store: Store, tmp_path) -> None:
    add_session(store)
    fid = store.add_feedback(session_id="s1", rating=1, chunk=3, note="nice")
    other = sqlite3.connect(tmp_path / "dreamrt.sqlite3")
    assert other.execute("SELECT id, rating, chunk, note FROM feedback").fetchall() == [
        (fid, 1, 3, "nice")
    ]
    other.close()


def test_jobs_events_records(store: Store) -> None:
    store.add_job(
        job_id="j1", task="t2v", model_id="m", prompt="p", params={"steps": 2}, state="queued"
    )
    store.update_job(
        "j1", state="succeeded", progress=1.0, artifact_path="/x.mp4", media_type="video/mp4"
    )
    job = store.get_job("j1")
    assert (job["state"], job["progress"], job["params"]) == ("succeeded", 1.0, {"steps": 2})
    store.add_event("s1", 1, "session.state", b'{"type":"session.state"}', 5.0)
    store.add_event("s1", 2, "input.received", '{"type":"input.received"}', 6.0)
    assert [(e["event_id"], e["type"]) for e in store.events("s1")] == [
        (1, "session.state"),
        (2, "input.received"),
    ]
    record = {
        "session_id": "s1",
        "segment": 0,
        "chunk": 0,
        "seed": 1,
        "model_id": "m",
        "weights_version": "w",
        "loop_id": "chunk_rollout",
        "sampler": "euler",
        "steps": 4,
        "timesteps": [1000, 750],
        "precision": "fp32",
        "prompt": "p",
        "prompt_seq": 0,
        "actions": {"keys": ["w"]},
        "pts_start": 0,
        "pts_end": 33750,
        "num_frames": 4,
        "digest": "abc",
        "replay_key": "k",
    }
    store.add_record(record)
    (row,) = store.records("s1")
    assert (
        row["timesteps"] == [1000, 750]
        and row["actions"] == {"keys": ["w"]}
        and row["digest"] == "abc"
    )


def test_fork_choice_records_one_preference_per_rejected_candidate(store: Store) -> None:
    fork_id = store.add_fork(session_id="s1", n=3, prompt=None, candidates=["a", "b", "c"])
    fork = store.find_fork("s1", "b")
    assert fork["id"] == fork_id and fork["candidates"] == ["a", "b", "c"]
    assert store.find_fork("s1", "zzz") is None
    store.choose_fork(fork_id, "b", "s1@chunk4", ["a", "c"])
    prefs = [
        (p["context_ref"], p["chosen_ref"], p["rejected_ref"], p["source"])
        for p in store.preferences()
    ]
    assert prefs == [("s1@chunk4", "b", "a", "fork-choice"), ("s1@chunk4", "b", "c", "fork-choice")]


def test_recover_fails_live_sessions_and_returns_unfinished_jobs(tmp_path) -> None:
    first = Store(tmp_path / "db.sqlite3")
    add_session(first, "live1", "live")
    add_session(first, "done1", "closed")
    first.add_job(job_id="j1", task="t2i", model_id="m", prompt="p", params={}, state="running")
    first.add_job(job_id="j2", task="t2i", model_id="m", prompt="p", params={}, state="succeeded")
    first.close()
    second = Store(tmp_path / "db.sqlite3")
    jobs = second.recover()
    assert [j["id"] for j in jobs] == ["j1"]
    assert second.get_session("live1")["state"] == "failed"
    assert "restarted" in second.get_session("live1")["error"]
    assert second.get_session("done1")["state"] == "closed"
    second.close()


async def test_async_bridge_runs_on_the_writer_thread_in_order(store: Store) -> None:
    add_session(store)
    for n in range(5):
        store.defer(store.update_session, "s1", frames_sent=n)
    row = await store.run(store.get_session, "s1")
    assert row["frames_sent"] == 4
    fid = await store.run(store.add_feedback, session_id="s1", rating=-1, chunk=None, note=None)
    assert store.feedback("s1")[0]["id"] == fid
    store.close()
    store.close()
    store.defer(store.update_session, "s1", frames_sent=9)  # logged and dropped, no raise


def test_list_jobs_of_a_task_by_creation_time(tmp_path) -> None:
    now = iter([3.0, 3.0, 1.0, 1.0])  # add_job reads the clock once; "a" and "b" tie
    store = Store(tmp_path / "db.sqlite3", clock=lambda: next(now))
    for job_id, task in [("c", "t2v"), ("i", "t2i"), ("a", "t2v"), ("b", "t2v")]:
        store.add_job(
            job_id=job_id, task=task, model_id="m", prompt="p", params={"n": 1}, state="queued"
        )
    assert [r["id"] for r in store.list_jobs("t2v")] == ["c", "b", "a"]  # a tie: by id
    assert [r["id"] for r in store.list_jobs("t2v", newest_first=False)] == ["a", "b", "c"]
    assert store.list_jobs("t2i")[0]["params"] == {"n": 1}
    store.close()
