"""The OpenAI-compatible routes in process (the official client's own calls run against a live
server in tests/e2e/test_openai_e2e.py): JSON bodies, OpenAI's error shape on answers given
before routing, and the image wait's 504."""

from __future__ import annotations

import time
from collections.abc import Iterator

import pytest
from fastapi.testclient import TestClient

from server.config.limits import Limits
from server.openai import image_routes as routes_openai_images
from tests.server.conftest import make_client


@pytest.fixture(scope="module")
def client(tmp_path_factory: pytest.TempPathFactory) -> Iterator[TestClient]:
    # a slow refill and a burst the other tests stay under (their requests carry no token)
    limits = Limits(rest_rate_per_s=1, rest_burst=100, max_body_bytes=4096)
    with make_client(tmp_path_factory.mktemp("openai"), limits=limits) as test_client:
        yield test_client


def wait_job(client: TestClient, job_id: str, timeout_s: float = 60.0) -> dict:
    deadline = time.monotonic() + timeout_s
    while (view := client.get(f"/v1/jobs/{job_id}").json())["state"] in ("queued", "running"):
        assert time.monotonic() < deadline, view
        time.sleep(0.05)
    return view


def error_of(response) -> dict:
    body = response.json()
    assert set(body) == {"error"}, body
    assert set(body["error"]) == {"message", "type", "param", "code"}, body
    return body["error"]


def test_a_json_body_makes_a_video_too(client: TestClient) -> None:
    created = client.post("/v1/videos", json={"prompt": "a red ball on grass", "seconds": 1})
    assert created.status_code == 200, created.text
    video = created.json()
    assert video["object"] == "video" and video["seconds"] == "1"
    # the job may start before the answer is written: queued or already running
    assert video["status"] in ("queued", "in_progress"), video
    assert wait_job(client, video["id"])["state"] == "succeeded"
    assert client.get(f"/v1/videos/{video['id']}").json()["status"] == "completed"
    for body, param in [
        ({"prompt": "x", "seed": 3}, "seed"),  # not a parameter of OpenAI's video API
        ({"seconds": "1"}, "prompt"),
        ({"prompt": "x", "seconds": "two"}, "seconds"),
        ({"prompt": "x", "seconds": [1]}, "seconds"),  # neither member of its union
        ({"prompt": "x", "size": "96"}, "size"),
    ]:
        refused = client.post("/v1/videos", json=body)
        assert refused.status_code == 400 and error_of(refused)["param"] == param, refused.text
    not_an_object = client.post("/v1/videos", content=b"[1, 2]")
    assert not_an_object.status_code == 400 and error_of(not_an_object)["param"] == "body"
    twice = client.post("/v1/videos", data={"prompt": ["a", "b"]})
    assert twice.status_code == 400 and error_of(twice)["param"] == "prompt"


def test_answers_before_routing_take_the_openai_shape(client: TestClient) -> None:
    unknown = client.get("/v1/videos/job_x/elsewhere")
    assert unknown.status_code == 404 and error_of(unknown)["type"] == "invalid_request_error"
    too_big = client.post("/v1/videos", json={"prompt": "x" * 5000})
    assert too_big.status_code == 413 and error_of(too_big)["code"] == "too_large"
    # the REST rate limit is per token: this one's bucket empties, nobody else's does
    junk = {"Authorization": "Bearer a-token-of-its-own"}
    for _ in range(150):
        limited = client.get("/v1/videos", headers=junk)
        if limited.status_code != 200:
            break
    assert limited.status_code == 429 and int(limited.headers["retry-after"]) >= 1
    error = error_of(limited)
    assert error["code"] == "rate_limited" and error["type"] == "rate_limit_error"
    # the other routes keep dreamrt's shape
    assert set(client.get("/v1/jobs/job_nope").json()) == {"detail", "code"}


def test_an_image_wait_past_its_bound_is_a_504_naming_the_job(
    client: TestClient, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(routes_openai_images, "IMAGE_WAIT_S", 0.0)  # no job finishes in 0 s
    late = client.post("/v1/images/generations", json={"prompt": "a blue square"})
    assert late.status_code == 504 and late.headers["x-should-retry"] == "false"
    error = error_of(late)
    assert error["code"] == "timeout" and error["type"] == "server_error"
    job_id = error["message"].split("'")[1]
    assert job_id.startswith("job_") and job_id in error["message"]
    # the job goes on, and its artifact is there once it is done
    assert wait_job(client, job_id)["state"] == "succeeded"
    assert client.get(f"/v1/jobs/{job_id}/artifact").headers["content-type"] == "image/png"


def test_an_unknown_model_and_an_unsupported_output_format(client: TestClient) -> None:
    missing = client.post("/v1/images/generations", json={"prompt": "x", "model": "nope"})
    assert missing.status_code == 404 and error_of(missing)["code"] == "model_not_found"
    webp = client.post("/v1/images/generations", json={"prompt": "x", "output_format": "webp"})
    assert webp.status_code == 400 and error_of(webp)["param"] == "output_format"
