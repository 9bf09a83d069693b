"""A server whose model serves jobs only (the bidirectional wan2.1-t2v card at tiny dimensions):
``POST /v1/jobs`` runs ``diffusion_denoise`` to an artifact, ``POST /v1/sessions`` is a 422."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from tests.server.conftest import make_client
from tests.server.test_routes_jobs import wait_done

MODEL = "wan2.1-t2v-tiny-random"


@pytest.fixture
def jobs_client(tmp_path: Path) -> Iterator[TestClient]:
    with make_client(tmp_path, model=MODEL) as client:
        yield client


def test_jobs_run_and_sessions_are_refused(jobs_client: TestClient) -> None:
    created = jobs_client.post(
        "/v1/jobs", json={"task": "t2i", "prompt": "a cat", "seed": 1, "model": MODEL}
    )
    assert created.status_code == 202, created.text
    view = wait_done(jobs_client, created.json()["id"], timeout_s=120.0)
    assert view["state"] == "succeeded", view
    artifact = jobs_client.get(f"/v1/jobs/{created.json()['id']}/artifact")
    assert artifact.headers["content-type"] == "image/png"

    session = jobs_client.post("/v1/sessions", json={"prompt": "a cat", "model": MODEL})
    assert session.status_code == 422, session.text
    assert "cannot stream sessions" in session.text


def test_jobs_parameterize_only_the_extensions_the_server_enabled(tmp_path: Path) -> None:
    with make_client(tmp_path, model=MODEL, extensions=("fbcache:threshold=0.1",)) as client:
        off = client.post(
            "/v1/jobs", json={"task": "t2i", "prompt": "a", "extensions": {"teacache": {}}}
        )
        assert off.status_code == 422, off.text
        assert off.json()["detail"][0]["loc"][-1] == "extensions"
        assert "'teacache' is not enabled" in off.text
        bad = client.post(
            "/v1/jobs",
            json={"task": "t2i", "prompt": "a", "extensions": {"fbcache": {"threshold": "x"}}},
        )
        assert bad.status_code == 422 and "fbcache" in bad.text
        exact = client.post("/v1/jobs", json={"task": "t2i", "prompt": "a", "exact": True})
        assert exact.status_code == 422 and "exact request refuses fbcache" in exact.text
        created = client.post(
            "/v1/jobs",
            json={"task": "t2i", "prompt": "a cat", "extensions": {"fbcache": {"threshold": 0}}},
        )
        assert created.status_code == 202, created.text
        assert wait_done(client, created.json()["id"], timeout_s=120.0)["state"] == "succeeded"
