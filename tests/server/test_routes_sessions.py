import sqlite3
import struct

import numpy as np
import pytest
from fastapi.testclient import TestClient

from models.registry import get
from server.app import DEFAULT_MODEL


def create(client: TestClient, **body) -> dict:
    response = client.post("/v1/sessions", json={"prompt": "a forest", **body})
    assert response.status_code == 201, response.text
    return response.json()


def test_create_and_read_a_session(client: TestClient) -> None:
    created = create(client, seed=3, **{"class": "batch"})
    profile = get(DEFAULT_MODEL).default_profile  # the served card's
    assert created["state"] == "created" and created["profile"] == {
        "fps": profile.fps,
        "width": profile.width,
        "height": profile.height,
    }
    assert created["id"].startswith("ses_") and created["token"].startswith("drt_")
    view = client.get(f"/v1/sessions/{created['id']}").json()
    assert {
        k: view[k]
        for k in ("id", "state", "prompt", "segment", "frames_sent", "stalls", "fps_measured")
    } == {
        "id": created["id"],
        "state": "created",
        "prompt": "a forest",
        "segment": 0,
        "frames_sent": 0,
        "stalls": 0,
        "fps_measured": 0.0,
    }
    assert isinstance(view["created_at"], float)
    assert client.get("/v1/sessions/ses_nope").status_code == 404


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({}, "prompt"),
        ({"prompt": ""}, "prompt"),
        ({"prompt": "a", "promt": "typo"}, "promt"),
        ({"prompt": "a", "fps": 0}, "fps"),
        ({"prompt": "a", "width": 65}, "width"),
        ({"prompt": "a", "model": "no-such-model"}, "model"),
        ({"prompt": "a", "class": "urgent"}, "class"),
        ({"prompt": "a", "start": "later"}, "start"),
        ({"prompt": "a", "decoder": "huge"}, "decoder"),
        ({"prompt": "a", "decoder": "tiny"}, "decoder"),  # the served card has no tiny decoder
    ],
)
def test_invalid_session_bodies_are_422_naming_the_field(
    client: TestClient, body: dict, field: str
) -> None:
    response = client.post("/v1/sessions", json=body)
    assert response.status_code == 422, response.text
    assert field in [str(part) for part in response.json()["detail"][0]["loc"]]


def test_sessions_of_one_model_pick_their_decoder(tmp_path) -> None:
    """The tiny-decoder card with its full VAE beside: one resident instance serves a session
    of each; the answer, GET /v1/sessions/{id}, GET /v1/models and the chunk records say which
    decoder a session uses."""
    import time

    from tests.server.conftest import make_client

    with make_client(tmp_path, model="wan-tiny-taehv-random", max_sessions=2) as client:
        card = next(c for c in client.get("/v1/models").json()["data"] if c["served"])
        assert (card["decoders"], card["default_decoder"]) == (["full", "tiny"], "tiny")
        full = create(client, decoder="full", start="now", seed=1)
        tiny = create(client, seed=1)
        assert (full["decoder"], tiny["decoder"]) == ("full", "tiny")
        deadline = time.monotonic() + 60.0
        while client.get(f"/v1/sessions/{full['id']}").json()["chunks"] == 0:
            assert time.monotonic() < deadline, "the full-VAE session made no chunk"
            time.sleep(0.05)
        views = [client.get(f"/v1/sessions/{s['id']}").json() for s in (full, tiny)]
        assert [v["decoder"] for v in views] == ["full", "tiny"]
        assert client.delete(f"/v1/sessions/{full['id']}").status_code == 204
    rows = (
        sqlite3.connect(tmp_path / "data" / "dreamrt.sqlite3")
        .execute("SELECT decoder FROM records WHERE session_id = ?", (full["id"],))
        .fetchall()
    )
    assert rows and {r[0] for r in rows} == {"full"}


def test_start_now_generates_the_first_chunk_before_any_offer(client: TestClient) -> None:
    import time

    created = client.post("/v1/sessions", json={"prompt": "a red ball", "start": "now"})
    assert created.status_code == 201, created.text
    waiting = create(client)
    deadline = time.monotonic() + 30.0
    view = client.get(f"/v1/sessions/{created.json()['id']}").json()
    while view["chunks"] == 0 and time.monotonic() < deadline:
        time.sleep(0.02)
        view = client.get(f"/v1/sessions/{created.json()['id']}").json()
    assert view["chunks"] == 1 and view["state"] == "created"  # ready before the viewer
    assert client.get(f"/v1/sessions/{waiting['id']}").json()["chunks"] == 0


def test_inputs_are_accepted_with_sequence_numbers(client: TestClient) -> None:
    sid = create(client)["id"]
    prompt = client.post(f"/v1/sessions/{sid}/prompt", json={"text": "a desert"})
    assert prompt.status_code == 202 and prompt.json() == {"applies_at_chunk": 1, "seq": 1}
    cut = client.post(f"/v1/sessions/{sid}/prompt", json={"text": "a sea", "mode": "cut"})
    assert cut.status_code == 202 and cut.json() == {"applies_at_chunk": 0, "seq": 2}
    action = client.post(
        f"/v1/sessions/{sid}/actions", json={"keys": ["ArrowUp", "space"], "mouse": [3, 4]}
    )
    assert action.status_code == 202 and action.json() == {"seq": 3}
    pcm = (np.sin(np.arange(8000) / 5) * 10000).astype("<i2").tobytes()
    audio = client.post(
        f"/v1/sessions/{sid}/audio",
        content=pcm,
        headers={"Content-Type": "application/octet-stream"},
    )
    assert audio.status_code == 202 and audio.json() == {"seq": 4, "seconds": 0.5}
    assert client.get(f"/v1/sessions/{sid}").json()["audio_seconds_in"] == 0.5


def test_bad_inputs_name_the_problem(client: TestClient) -> None:
    sid = create(client)["id"]
    bad_key = client.post(f"/v1/sessions/{sid}/actions", json={"keys": ["w", "jump"]})
    assert bad_key.status_code == 422 and bad_key.json()["detail"][0]["loc"] == ["body", "keys"]
    assert "jump" in bad_key.json()["detail"][0]["msg"]
    bad_mode = client.post(f"/v1/sessions/{sid}/prompt", json={"text": "x", "mode": "fade"})
    assert bad_mode.status_code == 422 and bad_mode.json()["detail"][0]["loc"] == ["body", "mode"]
    odd = client.post(f"/v1/sessions/{sid}/audio", content=b"\x00\x01\x02")
    assert odd.status_code == 400 and "even byte count" in odd.json()["detail"]
    riff = client.post(
        f"/v1/sessions/{sid}/audio", content=b"RIFF" + struct.pack("<I", 4) + b"WAVE"
    )
    assert riff.status_code == 400 and "fmt" in riff.json()["detail"]
    assert client.post(f"/v1/sessions/{sid}/pause").status_code == 409  # not live
    resume = client.post(f"/v1/sessions/{sid}/resume")
    assert resume.status_code == 409 and "created" in resume.json()["detail"]


def test_feedback_is_durable_before_the_answer(client: TestClient, tmp_path) -> None:
    sid = create(client)["id"]
    response = client.post(
        f"/v1/sessions/{sid}/feedback", json={"rating": 1, "chunk": 2, "note": "nice"}
    )
    assert response.status_code == 201
    rows = (
        sqlite3.connect(tmp_path / "data" / "dreamrt.sqlite3")
        .execute("SELECT id, session_id, chunk, rating, note FROM feedback")
        .fetchall()
    )
    assert rows == [(response.json()["id"], sid, 2, 1, "nice")]
    assert client.post(f"/v1/sessions/{sid}/feedback", json={"rating": 5}).status_code == 422


def test_fork_and_choose_record_preference_pairs(tmp_path) -> None:
    """In process, no viewer: the candidates are real sessions admitted like any (all or
    nothing), the parent is held, choose commits one pair per rejected candidate."""
    from tests.server.conftest import make_client

    with make_client(tmp_path, max_sessions=4) as client:
        sid = create(client)["id"]
        refused = client.post(f"/v1/sessions/{sid}/fork", json={"n": 4})  # 3 slabs free
        assert refused.status_code == 503 and int(refused.headers["Retry-After"]) >= 1
        assert refused.json()["reason"] == "kv_slabs"
        fork = client.post(f"/v1/sessions/{sid}/fork", json={"n": 3, "prompt": "branch"})
        assert fork.status_code == 201, fork.text
        body = fork.json()
        candidates = body["candidates"]
        assert len(candidates) == 3 and len(set(candidates)) == 3
        assert [s["id"] for s in body["sessions"]] == candidates
        assert len({s["seed"] for s in body["sessions"]}) == 3  # derived, distinct
        assert all(client.get(f"/v1/sessions/{c}").json()["state"] == "created" for c in candidates)
        again = client.post(f"/v1/sessions/{sid}/fork", json={"n": 2})
        assert again.status_code == 409  # one fork at a time
        bad = client.post(f"/v1/sessions/{sid}/choose", json={"candidate": "other"})
        assert bad.status_code == 422
        chosen = client.post(f"/v1/sessions/{sid}/choose", json={"candidate": candidates[1]})
        assert chosen.status_code == 201 and chosen.json()["preferences"] == 2
        rows = (
            sqlite3.connect(tmp_path / "data" / "dreamrt.sqlite3")
            .execute("SELECT chosen_ref, rejected_ref, source, context_ref FROM preferences")
            .fetchall()
        )
        assert sorted(rows) == sorted(
            [
                (candidates[1], candidates[0], "fork-choice", body["context"]),
                (candidates[1], candidates[2], "fork-choice", body["context"]),
            ]
        )
        assert {client.get(f"/v1/sessions/{c}").json()["state"] for c in candidates} == {"closed"}
        assert client.get(f"/v1/sessions/{sid}").json()["state"] == "created"
        assert client.post(f"/v1/sessions/{sid}/fork", json={"n": 1}).status_code == 422
        seeds = client.post(f"/v1/sessions/{sid}/fork", json={"n": 2, "seeds": [1, 2, 3]})
        assert seeds.status_code == 422 and seeds.json()["detail"][0]["loc"] == ["body", "seeds"]


def test_delete_is_idempotent_and_the_closed_session_stays_readable(client: TestClient) -> None:
    sid = create(client)["id"]
    client.post(f"/v1/sessions/{sid}/prompt", json={"text": "a desert"})
    assert client.delete(f"/v1/sessions/{sid}").status_code == 204
    assert client.delete(f"/v1/sessions/{sid}").status_code == 204
    assert client.delete("/v1/sessions/ses_never").status_code == 404
    view = client.get(f"/v1/sessions/{sid}").json()
    assert view["state"] == "closed" and view["prompt"] == "a forest"
    assert client.post(f"/v1/sessions/{sid}/prompt", json={"text": "late"}).status_code == 404
    stream = client.get(f"/v1/sessions/{sid}/events")
    assert stream.headers["content-type"].startswith("text/event-stream")
    blocks = [b for b in stream.text.split("\n\n") if b]
    types = [
        line.split(": ", 1)[1]
        for b in blocks
        for line in b.splitlines()
        if line.startswith("event: ")
    ]
    ids = [
        int(line.split(": ", 1)[1])
        for b in blocks
        for line in b.splitlines()
        if line.startswith("id: ")
    ]
    assert types == ["session.state", "input.received", "session.state", "session.state"]
    assert ids == sorted(ids) and len(set(ids)) == len(ids)
    after = client.get(f"/v1/sessions/{sid}/events", headers={"Last-Event-ID": str(ids[1])}).text
    assert after.count("event: ") == 2


def test_capacity_answer_is_503_with_retry_after(client: TestClient) -> None:
    create(client)
    create(client)
    refused = client.post("/v1/sessions", json={"prompt": "third"})
    assert refused.status_code == 503
    assert int(refused.headers["retry-after"]) >= 1
    body = refused.json()
    assert (
        body["code"] == "capacity" and body["reason"] == "kv_slabs" and body["permanent"] is False
    )


def test_batching_on_request_prices_sessions_by_the_batch_and_the_capacity_is_configured(
    tmp_path,
) -> None:
    """``--batch-sessions`` on a CPU server: the model batches sessions' steps and the host
    prices up to the engine's max_batch; ``--compute-capacity`` is what admission divides by.
    (Off by default on a CPU, as the plain ``client`` fixture shows.)"""
    from tests.server.conftest import make_client

    with make_client(tmp_path, batch_sessions="on", compute_capacity=0.75, max_batch=3) as client:
        ctx = client.app.state.ctx
        assert ctx.engine.admission.config.compute_capacity == 0.75
        served = ctx.host.models[ctx.host.models.default]
        assert served.batched_plan_kinds() == {"chunk_step"} and ctx.host.max_batch == 3
        assert client.get("/v1/deployment").json()["load"]["compute_capacity"] == 0.75
    with make_client(tmp_path / "plain") as client:
        ctx = client.app.state.ctx
        served = ctx.host.models[ctx.host.models.default]
        assert served.batched_plan_kinds() == frozenset() and ctx.host.max_batch == 1
