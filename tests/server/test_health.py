import asyncio
import gc
import logging
import threading
import time

import pytest
from fastapi.testclient import TestClient

from models.compiled_set import compiled_set
from server import app as app_module
from server.app import DEFAULT_MODEL, create_app
from server.config.serve import ServerConfig
from server.lifespan import starts_listening_first
from tests.server.conftest import make_client


def wait_ready(client: TestClient, timeout_s: float = 120.0) -> None:
    """Poll ``/readyz`` until the server is ready (a warming server listens first)."""
    deadline = time.monotonic() + timeout_s
    while (ready := client.get("/readyz")).status_code == 503:
        assert time.monotonic() < deadline, ready.json()
        time.sleep(0.05)


def test_healthz_and_readyz_answer_ok_with_the_served_model_and_device(
    client: TestClient,
) -> None:
    response = client.get("/healthz")
    assert response.status_code == 200
    assert response.json() == {
        "status": "ok",
        "ready": True,
        "model": DEFAULT_MODEL,
        "device": "cpu",
    }
    ready = client.get("/readyz")
    assert ready.status_code == 200
    assert ready.json()["status"] == "ready" and ready.json()["model"] == DEFAULT_MODEL


def test_before_the_lifespan_ran_the_server_is_alive_but_not_ready(tmp_path) -> None:
    bare = TestClient(create_app(data_dir=tmp_path, device="cpu"))  # no `with`: no lifespan
    alive = bare.get("/healthz")  # liveness: a starting server is not to be restarted
    assert alive.status_code == 200
    assert alive.json()["status"] == "starting" and alive.json()["ready"] is False
    starting = bare.get("/readyz")  # readiness: keep it out of the load balancer
    assert starting.status_code == 503 and starting.json()["status"] == "starting"
    assert starting.headers["retry-after"] == "1"
    assert starting.json()["progress"]["phase"] == "loading"
    assert bare.get("/v1/models").status_code == 503


def test_a_warm_up_session_runs_before_serving_on_its_own_engine(tmp_path, caplog) -> None:
    caplog.set_level(logging.INFO, logger="server.app")
    with make_client(tmp_path, warmup=True) as client:
        wait_ready(client)
        assert client.get("/healthz").json()["status"] == "ok"
        stats = client.app.state.ctx.engine.stats()
    messages = [r.getMessage() for r in caplog.records if r.name == "server.app"]
    warm = [m for m in messages if m.startswith("warm-up done in")]
    ready = [i for i, m in enumerate(messages) if m.startswith("dreamrt ready")]
    assert len(warm) == 1 and ready and messages.index(warm[0]) < ready[0]
    # the serving engine (and the cost model it calibrates) never saw the warm-up's plans
    assert stats.plans_executed == 0 and stats.loops_succeeded == 0


def test_the_warm_up_calibrates_the_serving_cost_model(tmp_path) -> None:
    """The first user's session is priced by measurement: every plan of a steady chunk of
    every profile of the compiled set, with every decoder, is measured before ready."""
    with make_client(tmp_path, warmup=True) as client:
        wait_ready(client)
        ctx = client.app.state.ctx
        cost, served = ctx.engine.cost, ctx.host.models.resolve(None)
        decoders = (None, *getattr(served, "decoder_options", tuple)())
        steady = {
            (kind, sig)
            for profile in compiled_set(served.card).profiles
            for decoder in decoders
            for kind, sig, _ in (
                served.steady_chunk_plans(profile, decoder)
                if decoder
                else served.steady_chunk_plans(profile)
            )
        }
        assert steady
        assert {key: cost.samples(*key) >= cost.min_samples for key in steady} == dict.fromkeys(
            steady, True
        )
        assert ctx.engine.stats().plans_executed == 0  # on engines of their own


def test_a_restart_that_loaded_the_calibration_does_not_calibrate_again(tmp_path, caplog) -> None:
    caplog.set_level(logging.INFO, logger="runtime.loop_handle")

    def calibration_loops() -> int:
        return sum("loop calibration-" in r.getMessage() for r in caplog.records)

    with make_client(tmp_path, warmup=True) as client:
        wait_ready(client)
    assert calibration_loops() > 0  # the first start measured
    caplog.clear()
    with make_client(tmp_path, warmup=True) as client:  # the same data dir: DATA_DIR/cost
        wait_ready(client)
        assert client.app.state.ctx.engine.cost.snapshot()["entries"]  # loaded
    assert calibration_loops() == 0


def test_what_the_server_holds_at_ready_is_frozen_until_shutdown(tmp_path) -> None:
    with make_client(tmp_path, warmup=True) as client:
        wait_ready(client)
        assert gc.get_freeze_count() > 0  # the model and the warm-up's graphs
    assert gc.get_freeze_count() == 0  # shutdown hands them back to the collector


def test_no_warm_up_unless_compiled_or_asked(tmp_path, caplog) -> None:
    caplog.set_level(logging.INFO, logger="server.app")
    with make_client(tmp_path) as client:
        assert client.get("/healthz").json()["status"] == "ok"
    messages = [r.getMessage() for r in caplog.records if r.name == "server.app"]
    assert any(m.startswith("dreamrt ready") for m in messages)  # the log was captured
    assert not any("warm" in m for m in messages)


def test_a_warming_server_listens_and_says_starting_until_ready(
    tmp_path, monkeypatch: pytest.MonkeyPatch
) -> None:
    release = threading.Event()
    build = app_module._build

    async def held_build(config: ServerConfig, progress):  # the warm-up holds until released
        await asyncio.to_thread(release.wait, 60)
        return await build(config, progress)

    monkeypatch.setattr(app_module, "_build", held_build)
    with make_client(tmp_path, warmup=True) as client:
        starting = client.get("/readyz")
        assert starting.status_code == 503 and starting.json()["status"] == "starting"
        assert client.get("/healthz").json()["status"] == "starting"
        models = client.get("/v1/models")
        assert models.status_code == 503 and models.headers["retry-after"] == "1"
        release.set()
        wait_ready(client)
        assert client.get("/healthz").json()["status"] == "ok"
        assert client.get("/v1/models").status_code == 200


def test_readyz_shows_the_warm_up_progress_and_the_console_its_bar(tmp_path, caplog) -> None:
    """Every stage of the warm-up (per profile its sessions, job and other decoder; then the
    calibration) is counted on ``/readyz`` and drawn on the console as it begins."""
    caplog.set_level(logging.INFO, logger="server.app")
    with make_client(tmp_path, warmup=True) as client:
        wait_ready(client)
        progress = client.get("/readyz").json()["progress"]
        card = client.app.state.ctx.host.models.resolve(None).card
    profiles = compiled_set(card).profiles
    parts = 1 + ("text_to_video" in card.capabilities)  # tiny-world: one decoder
    assert progress["stages_total"] == len(profiles) * parts + 1
    assert progress["stages_done"] == progress["stages_total"]
    assert progress["phase"] == "ready" and progress["stage"] == "done"
    bars = [r.getMessage() for r in caplog.records if r.getMessage().startswith("warm-up [")]
    total = progress["stages_total"]
    assert bars[0].startswith(f"warm-up [{'-' * 24}] 0/{total} ")
    assert bars[-1].startswith(f"warm-up [{'#' * 24}] {total}/{total} done")
    assert any("calibration" in bar for bar in bars)


def test_a_build_that_fails_after_listening_stops_the_server(
    tmp_path, monkeypatch: pytest.MonkeyPatch
) -> None:
    async def failing_build(config: ServerConfig, progress):
        raise RuntimeError("the checkpoint is not there")

    monkeypatch.setattr(app_module, "_build", failing_build)
    app = create_app(data_dir=tmp_path / "data", device="cpu", warmup=True)
    stopped = threading.Event()
    app.state.stop_serving = stopped.set  # what `dreamrt serve` sets: uvicorn's should_exit
    with TestClient(app) as client:
        assert stopped.wait(30), "the server was not told to stop"
        assert str(app.state.start_error) == "the checkpoint is not there"
        for probe in ("/healthz", "/readyz"):
            failed = client.get(probe)
            assert failed.status_code == 503 and failed.json()["status"] == "failed"


def test_only_a_warming_server_listens_first() -> None:
    assert starts_listening_first(ServerConfig.of(compile=True))
    assert starts_listening_first(ServerConfig.of(warmup=True))
    assert not starts_listening_first(ServerConfig.of(compile=True, warmup=False))
    assert not starts_listening_first(ServerConfig.of())
