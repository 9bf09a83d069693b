"""The router's placement policy (server.router.placement) on hand-built DeploymentCards."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

from server.router.placement import HeadroomPlacement, PlacementRequest

REPO = Path(__file__).resolve().parents[2]


def make_card(
    engine: str,
    *,
    headroom: float = 0.9,
    slabs_free: int = 2,
    share: float = 0.3,
    model: str = "tiny-world",
    capabilities: tuple[str, ...] = ("session.realtime", "text_to_video"),
    health: str = "ok",
    jobs_queued: int = 0,
) -> dict[str, Any]:
    return {
        "engine_id": engine,
        "url": f"http://{engine}",
        "health": health,
        "models": [
            {
                "id": model,
                "default": True,
                "capabilities": list(capabilities),
                "session_share": share,
            }
        ],
        "load": {"headroom": headroom, "kv_slabs_free": slabs_free, "jobs_queued": jobs_queued},
    }


def engines(cards: dict[int, dict[str, Any]], **request: Any) -> list[str]:
    ranked = HeadroomPlacement().rank(cards, PlacementRequest(**{"kind": "session", **request}))
    return [c.engine_id for c in ranked]


def test_sessions_go_to_the_most_headroom_left() -> None:
    cards = {1: make_card("a", headroom=0.4), 2: make_card("b", headroom=0.8), 3: make_card("c")}
    assert engines(cards) == ["c", "b", "a"]
    ranked = HeadroomPlacement().rank(cards, PlacementRequest(kind="session"))
    assert [round(c.headroom_after, 6) for c in ranked] == [0.6, 0.5, 0.1]


def test_no_engine_takes_a_session_beyond_its_compute_or_slabs() -> None:
    cards = {
        1: make_card("short-of-compute", headroom=0.29),
        2: make_card("no-slab", slabs_free=0),
        3: make_card("exactly-fits", headroom=0.3),
    }
    assert engines(cards) == ["exactly-fits"]
    assert engines({1: cards[1], 2: cards[2]}) == []  # no room: the router answers 503


def test_placement_respects_model_capabilities_and_health() -> None:
    cards = {
        1: make_card("draining", health="draining"),
        2: make_card("other-model", model="wan-tiny-random"),
        3: make_card("jobs-only", capabilities=("text_to_video",)),
        4: make_card("fits"),
    }
    assert engines(cards, model="tiny-world") == ["fits"]
    assert engines(cards, model="wan-tiny-random") == ["other-model"]
    assert engines(cards) == ["other-model", "fits"]  # no model named: each engine's default
    assert engines(cards, model="unknown") == []


def test_jobs_go_to_the_shortest_queue_then_the_most_headroom_and_need_the_task() -> None:
    cards = {
        1: make_card("busy", jobs_queued=3, headroom=0.9),
        2: make_card("idle-full", jobs_queued=0, headroom=0.0, slabs_free=0),
        3: make_card("idle", jobs_queued=0, headroom=0.5),
    }
    assert engines(cards, kind="job", task="t2v") == ["idle", "idle-full", "busy"]
    assert engines(cards, kind="job", task="t2i") == []  # none has text_to_image


def test_an_openai_video_is_placed_like_a_t2v_job() -> None:
    cards = {
        1: make_card("busy", jobs_queued=3),
        2: make_card("idle", jobs_queued=0),
        3: make_card("no-video", capabilities=("session.realtime", "text_to_image")),
    }
    video = PlacementRequest.of("video", {"prompt": "a kite", "seconds": "4"})
    assert video.task == "t2v"
    ranked = [c.engine_id for c in HeadroomPlacement().rank(cards, video)]
    assert ranked == engines(cards, kind="job", task="t2v") == ["idle", "busy"]


def test_the_router_side_imports_no_model_runtime_or_session_code() -> None:
    code = (
        "import sys\n"
        "import server.router.app, server.router.fleet_view, server.router.placement\n"
        "import server.fleet.dynamo_runtime, server.router.cli, server.cli\n"
        "bad = sorted(m for m in sys.modules if m.split('.')[0] in "
        "('runtime', 'models', 'sessions', 'torch', 'aiortc', 'av', 'dynamo'))\n"
        "print(bad)\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]"  # Dynamo itself loads only when the router starts
