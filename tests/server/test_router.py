"""``dreamrt router``'s routes with a stand-in fleet view (the fleet itself, on Dynamo, runs in
tests/e2e/test_fleet_e2e.py): ``POST /v1/videos`` as the official client sends it is placed
like a text-to-video job, and the engine's ``place`` endpoint posts it to its own
``/v1/videos``."""

from __future__ import annotations

import json
from typing import Any

import httpx
import openai
import pytest
from fastapi.testclient import TestClient

from server.fleet.worker import FleetWorker
from server.router.app import RouterConfig, create_router_app

VIDEO = {
    "id": "job_0123456789abcdef",
    "object": "video",
    "model": "tiny-world",
    "status": "queued",
    "progress": 0,
    "created_at": 1,
    "size": "96x96",
    "seconds": "4",
}


class PlacingView:
    """What the router asks of its fleet view here: ``place``, answered as an engine would."""

    def __init__(self) -> None:
        self.placed: list[tuple[str, dict[str, Any]]] = []

    async def place(self, kind: str, body: dict[str, Any]) -> tuple[dict[str, Any], int]:
        self.placed.append((kind, body))
        answer = {"status": 200, "body": VIDEO, "engine_id": "engine-a", "url": "http://a:1"}
        return answer, 7


@pytest.fixture
def router() -> tuple[TestClient, PlacingView]:
    app = create_router_app(RouterConfig(fleet="test"))
    app.state.view = PlacingView()  # no lifespan: nothing joins a Dynamo runtime
    return TestClient(app), app.state.view


@pytest.mark.filterwarnings("ignore:The Sora API:DeprecationWarning")
def test_the_clients_multipart_video_is_placed_as_a_video(router) -> None:
    client, view = router
    sdk = openai.OpenAI(base_url="http://testserver/v1", api_key="k", http_client=client)
    video = sdk.videos.create(prompt="a red ball on grass", seconds="4", size="96x96")
    assert view.placed == [
        ("video", {"prompt": "a red ball on grass", "seconds": "4", "size": "96x96"})
    ]
    assert video.id == VIDEO["id"]
    assert (video.engine_id, video.url) == ("engine-a", "http://a:1")  # where to poll it
    with pytest.raises(openai.BadRequestError) as refused:
        sdk.videos.create(prompt="x", input_reference=("a.png", b"\x89PNG", "image/png"))
    assert refused.value.param == "input_reference" and len(view.placed) == 1
    with pytest.raises(openai.BadRequestError) as bad:
        sdk.videos.create(prompt="x", extra_body={"promt": "typo"})
    assert bad.value.param == "promt"
    no_prompt = client.post("/v1/videos", files={"input_reference": ("a.png", b"\x89PNG")})
    assert no_prompt.status_code == 400 and no_prompt.json()["error"]["param"] == "prompt"


async def test_the_engine_place_endpoint_posts_a_video_to_its_own_rest_api() -> None:
    posted: list[tuple[str, dict[str, Any]]] = []

    def engine(request: httpx.Request) -> httpx.Response:
        posted.append((request.url.path, json.loads(request.content)))
        return httpx.Response(200, json=VIDEO)

    class Ctx:
        draining = False

    worker = FleetWorker(Ctx())
    worker._http = httpx.AsyncClient(transport=httpx.MockTransport(engine), base_url="http://e")
    answer = await worker.place({"kind": "video", "body": {"prompt": "a kite", "seconds": "1"}})
    await worker._http.aclose()
    assert answer == {"status": 200, "body": VIDEO}
    assert posted == [("/v1/videos", {"prompt": "a kite", "seconds": "1"})]
    refused = await worker.place({"kind": "audio"})
    assert refused["status"] == 422 and "video" in refused["body"]["detail"]
