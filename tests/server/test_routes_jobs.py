import io
import time

import av
import numpy as np
from fastapi.testclient import TestClient
from PIL import Image

from models.registry import get
from server.app import DEFAULT_MODEL


def wait_done(client: TestClient, job_id: str, timeout_s: float = 60.0) -> dict:
    deadline = time.monotonic() + timeout_s
    while True:
        view = client.get(f"/v1/jobs/{job_id}").json()
        if view["state"] in ("succeeded", "failed", "cancelled"):
            return view
        assert time.monotonic() < deadline, view
        time.sleep(0.05)


def test_t2i_job_succeeds_and_serves_a_png(client: TestClient) -> None:
    response = client.post("/v1/jobs", json={"task": "t2i", "prompt": "a cat", "seed": 1})
    assert response.status_code == 202
    job_id = response.json()["id"]
    view = wait_done(client, job_id)
    assert view["state"] == "succeeded" and view["progress"] == 1.0 and "error" not in view
    artifact = client.get(f"/v1/jobs/{job_id}/artifact")
    assert artifact.status_code == 200 and artifact.headers["content-type"] == "image/png"
    profile = get(DEFAULT_MODEL).default_profile  # the served card's
    assert np.asarray(Image.open(io.BytesIO(artifact.content))).shape == (
        profile.height,
        profile.width,
        3,
    )


def test_t2v_job_mp4_has_the_requested_frame_count(client: TestClient, tmp_path) -> None:
    job_id = client.post(
        "/v1/jobs", json={"task": "t2v", "prompt": "waves", "num_frames": 12}
    ).json()["id"]
    assert wait_done(client, job_id)["state"] == "succeeded"
    artifact = client.get(f"/v1/jobs/{job_id}/artifact")
    assert artifact.headers["content-type"] == "video/mp4"
    (tmp_path / "a.mp4").write_bytes(artifact.content)
    with av.open(str(tmp_path / "a.mp4")) as container:
        assert sum(1 for _ in container.decode(video=0)) == 12


def test_job_errors(client: TestClient) -> None:
    assert client.get("/v1/jobs/job_nope").status_code == 404
    assert client.delete("/v1/jobs/job_nope").status_code == 404
    steps = client.post("/v1/jobs", json={"task": "t2v", "prompt": "x", "steps": 50})
    assert steps.status_code == 422 and steps.json()["detail"][0]["loc"] == ["body", "steps"]
    assert "4 steps" in steps.json()["detail"][0]["msg"]
    frames = client.post("/v1/jobs", json={"task": "t2i", "prompt": "x", "num_frames": 3})
    assert frames.status_code == 422 and frames.json()["detail"][0]["loc"] == ["body", "num_frames"]
    assert client.post("/v1/jobs", json={"task": "t2a", "prompt": "x"}).status_code == 422


def test_cancelled_job_has_no_artifact(client: TestClient) -> None:
    job_id = client.post(
        "/v1/jobs", json={"task": "t2v", "prompt": "long", "num_frames": 200}
    ).json()["id"]
    assert client.delete(f"/v1/jobs/{job_id}").status_code == 204
    view = wait_done(client, job_id)
    assert view["state"] == "cancelled"
    missing = client.get(f"/v1/jobs/{job_id}/artifact")
    assert missing.status_code == 409 and "cancelled" in missing.json()["detail"]
    assert client.delete(f"/v1/jobs/{job_id}").status_code == 204
