import logging

from fastapi.testclient import TestClient

from server.app import DEFAULT_MODEL, create_app
from tests.server.conftest import make_client


def test_healthz_answers_ok_with_the_served_model_and_device(client: TestClient) -> None:
    response = client.get("/healthz")
    assert response.status_code == 200
    assert response.json() == {"status": "ok", "model": DEFAULT_MODEL, "device": "cpu"}


def test_healthz_says_starting_before_the_lifespan_ran(tmp_path) -> None:
    bare = TestClient(create_app(data_dir=tmp_path, device="cpu"))  # no `with`: no lifespan
    assert bare.get("/healthz").json()["status"] == "starting"
    assert bare.get("/v1/models").status_code == 503


def test_a_warm_up_session_runs_before_serving_on_its_own_engine(tmp_path, caplog) -> None:
    caplog.set_level(logging.INFO, logger="server.app")
    with make_client(tmp_path, warmup=True) as client:
        assert client.get("/healthz").json()["status"] == "ok"
        stats = client.app.state.ctx.engine.stats()
    messages = [r.getMessage() for r in caplog.records if r.name == "server.app"]
    warm = [m for m in messages if m.startswith("warm-up done in")]
    ready = [i for i, m in enumerate(messages) if m.startswith("dreamrt ready")]
    assert len(warm) == 1 and ready and messages.index(warm[0]) < ready[0]
    # the serving engine (and the cost model it calibrates) never saw the warm-up's plans
    assert stats.plans_executed == 0 and stats.loops_succeeded == 0


def test_no_warm_up_unless_compiled_or_asked(tmp_path, caplog) -> None:
    caplog.set_level(logging.INFO, logger="server.app")
    with make_client(tmp_path) as client:
        assert client.get("/healthz").json()["status"] == "ok"
    messages = [r.getMessage() for r in caplog.records if r.name == "server.app"]
    assert any(m.startswith("dreamrt ready") for m in messages)  # the log was captured
    assert not any("warm" in m for m in messages)
