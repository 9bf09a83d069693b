"""``POST /v1/profile``: a torch-profiler trace of the executor's batches while a job runs,
written under ``DATA_DIR/traces/``, with where the time went (server.ops.trace)."""

from __future__ import annotations

import json
import threading
from pathlib import Path

from tests.server.conftest import make_client


def test_a_profile_traces_the_batches_that_run_and_says_where_the_time_went(tmp_path) -> None:
    with make_client(tmp_path) as client:
        job = client.post("/v1/jobs", json={"task": "t2v", "prompt": "a kite", "num_frames": 200})
        assert job.status_code == 202, job.text
        got = client.post("/v1/profile", json={"seconds": 0.5})
        assert got.status_code == 200, got.text
        body = got.json()
        client.delete(f"/v1/jobs/{job.json()['id']}")
    assert body["batches"] > 0 and body["window_s"] >= 0.5
    assert 0 < body["executor_busy_fraction"] <= 1.0
    kinds = body["by_kind"]
    assert "chunk_step" in kinds and kinds["chunk_step"]["plans"] >= kinds["chunk_step"]["batches"]
    assert sum(k["batches"] for k in kinds.values()) == body["batches"]
    assert body["device"] is None  # a CPU server: no device kernels
    trace = Path(body["trace"])
    assert trace.parent == tmp_path / "data" / "traces"
    events = json.loads(trace.read_text())["traceEvents"]
    labels = {e.get("name") for e in events}
    assert any(str(name).startswith("chunk_step x") for name in labels)  # each batch labelled


def test_a_profile_is_refused_while_another_runs_and_on_an_idle_server(
    tmp_path, monkeypatch
) -> None:
    from server.ops import trace

    monkeypatch.setattr(trace, "IDLE_WAIT_S", 0.5)
    with make_client(tmp_path) as client:
        assert client.post("/v1/profile", json={"seconds": 31}).status_code == 422
        idle = client.post("/v1/profile", json={"seconds": 0.2})  # nothing runs: nothing to trace
        assert idle.status_code == 409 and "ran nothing" in idle.json()["detail"]
        monkeypatch.setattr(trace, "IDLE_WAIT_S", 30.0)  # a loaded machine starts the job late
        job = client.post("/v1/jobs", json={"task": "t2v", "prompt": "a kite", "num_frames": 200})
        assert job.status_code == 202, job.text
        results: list[int] = []

        def first() -> None:
            results.append(client.post("/v1/profile", json={"seconds": 1.5}).status_code)

        runner = threading.Thread(target=first)
        runner.start()
        ctx = client.app.state.ctx
        while ctx.trace._window is None:  # noqa: SLF001 - armed: the next request is refused
            pass
        second = client.post("/v1/profile", json={"seconds": 0.5})
        runner.join(30)
        assert second.status_code == 409 and second.json()["code"] == "conflict"
        assert results == [200]
        client.delete(f"/v1/jobs/{job.json()['id']}")


def test_profiling_needs_the_admin_key(tmp_path) -> None:
    with make_client(tmp_path, auth="token", admin_key="k" * 32) as client:
        user = client.post(
            "/v1/tokens",
            json={"scope": "user", "ttl_s": 60},
            headers={"Authorization": f"Bearer {'k' * 32}"},
        ).json()["token"]
        refused = client.post(
            "/v1/profile", json={"seconds": 0.1}, headers={"Authorization": f"Bearer {user}"}
        )
    assert refused.status_code == 403
