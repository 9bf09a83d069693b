"""The official ``openai`` client, sync and async, against a real ``dreamrt serve`` on
127.0.0.1 serving the embedded tiny-world card: only ``base_url`` differs from a call to any
OpenAI-compatible video server.

One server for the module, with ``--max-queued-jobs 2`` so that two long videos fill the queue
(the 429 test); every other test keeps at most one job of its own waiting. The server runs
without ``--auth token`` on loopback, so the client's ``api_key`` is any string. The last test
restarts it on the same data directory: the videos are the store's jobs and outlive the
process.
"""

from __future__ import annotations

import asyncio
import base64
import io
import time
from collections.abc import Iterator
from typing import Any

import av
import httpx
import numpy as np
import openai
import pytest
from PIL import Image

from clients.python.api import ApiCallError, DreamrtClient
from infra.browser_harness import ServerProcess
from server.app import DEFAULT_MODEL
from tests.e2e.test_sessions_e2e import stop_server

pytestmark = [
    pytest.mark.slow,
    # the client marks its video methods deprecated for OpenAI's own service; they are the API
    pytest.mark.filterwarnings("ignore:The Sora API:DeprecationWarning"),
]

ARGS = ("--max-queued-jobs", "2")


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    root = tmp_path_factory.mktemp("openai")
    srv = ServerProcess(root / "data", root / "server.log", extra_args=ARGS).start()
    yield srv
    stop_server(srv)


def client_for(server: ServerProcess, **options: Any) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{server.url}/v1", api_key="any-key-on-loopback", **options)


@pytest.fixture(scope="module")
def profile(server: ServerProcess) -> dict[str, int]:
    """The served card's default profile, as the client reads it from ``/v1/models``."""
    with client_for(server) as client:
        model = client.models.retrieve(DEFAULT_MODEL)
    assert model.id == DEFAULT_MODEL and model.object == "model" and model.owned_by == "dreamrt"
    return model.default_profile


def decode(mp4: bytes) -> list[np.ndarray]:
    with av.open(io.BytesIO(mp4)) as container:
        return [frame.to_ndarray(format="rgb24") for frame in container.decode(video=0)]


def wait_ended(client: openai.OpenAI, video_id: str, timeout_s: float = 120.0) -> Any:
    deadline = time.monotonic() + timeout_s
    while (video := client.videos.retrieve(video_id)).status in ("queued", "in_progress"):
        assert time.monotonic() < deadline, video
        time.sleep(0.2)  # well under the REST rate limit (20 per second per token)
    return video


def test_create_and_poll_download_thumbnail_and_list(server: ServerProcess, profile) -> None:
    with client_for(server) as client:
        assert DEFAULT_MODEL in [m.id for m in client.models.list().data]
        video = client.videos.create_and_poll(prompt="a red ball on grass", seconds="2")
        assert video.status == "completed" and video.progress == 100 and video.error is None
        assert video.model == DEFAULT_MODEL and video.seconds == "2"
        assert video.size == f"{profile['width']}x{profile['height']}"
        assert video.completed_at >= video.created_at
        frames = decode(client.videos.download_content(video.id).content)
        assert len(frames) == 2 * profile["fps"]
        assert frames[0].shape == (profile["height"], profile["width"], 3)
        thumbnail = client.videos.download_content(video.id, variant="thumbnail")
        assert thumbnail.response.headers["content-type"] == "image/png"
        first = np.asarray(Image.open(io.BytesIO(thumbnail.content)).convert("RGB"))
        assert np.array_equal(first, frames[0])  # the thumbnail is the MP4's first frame
        # another size the card allows, sent as multipart like every create
        wide = client.videos.create_and_poll(prompt="a blue square", seconds="1", size="128x64")
        assert wide.size == "128x64"
        assert decode(client.videos.download_content(wide.id).content)[0].shape == (64, 128, 3)
        # newest first; a page of one, then the next after it; oldest first
        newest = client.videos.list(limit=1)
        assert [v.id for v in newest.data] == [wide.id] and newest.has_more
        after = client.videos.list(limit=1, after=wide.id)
        assert [v.id for v in after.data] == [video.id]
        oldest = [v.id for v in client.videos.list(order="asc")]
        assert oldest.index(video.id) < oldest.index(wide.id)
        # the same job underneath: /v1/jobs reads it
        job = httpx.get(f"{server.url}/v1/jobs/{video.id}", timeout=10).json()
        assert job["task"] == "t2v" and job["state"] == "succeeded"


async def test_async_client_deletes_a_running_video_and_generates_images(
    server: ServerProcess, profile
) -> None:
    async with openai.AsyncOpenAI(base_url=f"{server.url}/v1", api_key="k") as client:
        long = await client.videos.create(prompt="a yellow triangle on sand", seconds="60")
        assert long.status in ("queued", "in_progress") and long.seconds == "60"
        deadline = time.monotonic() + 60
        while (await client.videos.retrieve(long.id)).progress == 0:
            assert time.monotonic() < deadline
            await asyncio.sleep(0.1)
        deleted = await client.videos.delete(long.id)
        assert deleted.id == long.id and deleted.deleted and deleted.object == "video.deleted"
        with pytest.raises(openai.NotFoundError):
            await client.videos.retrieve(long.id)
        assert long.id not in [v.id async for v in client.videos.list()]
        async with httpx.AsyncClient(base_url=server.url, timeout=10) as http:
            job = (await http.get(f"/v1/jobs/{long.id}")).json()
        assert job["state"] == "cancelled" and 0 < job["progress"] < 1  # stopped mid-way

        images = await client.images.generate(prompt="a white ball on water", n=2)
        pictures = [
            np.asarray(Image.open(io.BytesIO(base64.b64decode(d.b64_json)))) for d in images.data
        ]
        assert [p.shape for p in pictures] == [(profile["height"], profile["width"], 3)] * 2
        assert not np.array_equal(pictures[0], pictures[1])  # each image its own seed
        linked = await client.images.generate(prompt="a red ball", response_format="url")
        png = httpx.get(linked.data[0].url, timeout=10)
        assert png.headers["content-type"] == "image/png"
        assert Image.open(io.BytesIO(png.content)).size == (profile["width"], profile["height"])


def test_each_error_class(server: ServerProcess, profile) -> None:
    with client_for(server) as client:
        for kwargs, param in [
            ({"seconds": "0"}, "seconds"),
            ({"seconds": "1000"}, "seconds"),  # 12 000 frames: over the job limit
            ({"size": "97x96"}, "size"),
            ({"input_reference": ("ref.png", b"\x89PNG\r\n", "image/png")}, "input_reference"),
        ]:
            with pytest.raises(openai.BadRequestError) as bad:
                client.videos.create(prompt="a kite", **kwargs)
            assert bad.value.param == param and bad.value.type == "invalid_request_error"
        with pytest.raises(openai.BadRequestError) as bad:
            client.images.generate(prompt="a kite", n=5)
        assert bad.value.param == "n"
        with pytest.raises(openai.NotFoundError) as missing:
            client.videos.create(prompt="a kite", model="no-such-card")
        assert missing.value.code == "model_not_found" and missing.value.param == "model"
        with pytest.raises(openai.NotFoundError):
            client.videos.retrieve("job_0000000000000000")
        with pytest.raises(openai.NotFoundError):
            client.models.retrieve("no-such-card")
        running = client.videos.create(prompt="a green triangle", seconds="30")
        with pytest.raises(openai.ConflictError) as early:
            client.videos.download_content(running.id)
        assert early.value.code == "not_ready"
        assert early.value.response.headers["x-should-retry"] == "false"  # no pointless retry
        client.videos.delete(running.id)


def test_a_full_queue_is_a_429_the_clients_retries_get_past(server: ServerProcess) -> None:
    with client_for(server, max_retries=0) as once, client_for(server, max_retries=8) as patient:
        # two videos of 3 s (36 frames each: far longer than the next request takes) fill it
        fillers = [once.videos.create(prompt=f"filler {i}", seconds="3") for i in range(2)]
        with pytest.raises(openai.RateLimitError) as full:
            once.videos.create(prompt="one too many", seconds="1")
        assert full.value.code == "queue_full" and full.value.type == "rate_limit_error"
        headers = full.value.response.headers
        assert 1 <= int(headers["retry-after"]) <= 600 and int(headers["retry-after-ms"]) > 0
        raw = patient.videos.with_raw_response.create(prompt="waits its turn", seconds="1")
        assert raw.retries_taken >= 1  # refused at first, let in once a filler ended
        video = raw.parse()
        assert wait_ended(patient, video.id).status == "completed"
        assert all(wait_ended(once, f.id).status == "completed" for f in fillers)


async def test_dreamrt_python_client_reads_the_new_models_shape(server: ServerProcess) -> None:
    async with DreamrtClient(server.url) as api:
        cards = {card["id"]: card for card in await api.models()}
        assert cards[DEFAULT_MODEL]["served"] and cards[DEFAULT_MODEL]["examples"]
        with pytest.raises(ApiCallError) as missing:
            await api.request("GET", "/v1/videos/job_0000000000000000")
        assert (missing.value.status, missing.value.code) == (404, "not_found")
        assert "job_0000000000000000" in missing.value.message


def test_videos_outlive_a_restart(server: ServerProcess, profile) -> None:
    with client_for(server) as client:
        kept = client.videos.create_and_poll(prompt="a purple square on stone", seconds="1")
        gone = client.videos.create_and_poll(prompt="deleted before the restart", seconds="1")
        client.videos.delete(gone.id)
        before = [v.id for v in client.videos.list()]
    server.stop(timeout_s=20.0)
    server.start()  # the module fixture stops it again
    with client_for(server) as client:
        assert [v.id for v in client.videos.list()] == before
        again = client.videos.retrieve(kept.id)
        assert again.status == "completed" and again.created_at == kept.created_at
        assert len(decode(client.videos.download_content(kept.id).content)) == profile["fps"]
        with pytest.raises(openai.NotFoundError):
            client.videos.retrieve(gone.id)
