"""A job as OpenAI's video object, and the checks before a video's job is queued
(server.openai.videos), on hand-built rows and stand-in jobs: no server."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest

from models import registry
from server.openai.errors import OpenAIError
from server.openai.videos import check_queue, frames_for, parse_size, poll_after_ms, video_object

CARD = registry.get("tiny-world")  # 96x96 at 12 fps, sizes in multiples of 16


def row(state: str, **fields: Any) -> dict[str, Any]:
    return {
        "id": "job_1",
        "task": "t2v",
        "model_id": "tiny-world",
        "prompt": "a kite",
        "params": {"num_frames": 24, "width": 96, "height": 64},
        "state": state,
        "progress": 0.5,
        "error": None,
        "created_at": 100.4,
        "updated_at": 130.9,
        **fields,
    }


def job(state: str = "running", progress: float = 0.25, created_at: float = 0.0) -> Any:
    return SimpleNamespace(
        state=SimpleNamespace(value=state),
        progress=progress,
        error=None,
        created_at=created_at,
        terminal=state in ("succeeded", "failed", "cancelled"),
    )


def ctx_with(jobs: list[Any], limit: int) -> Any:
    return SimpleNamespace(
        config=SimpleNamespace(limits=SimpleNamespace(max_queued_jobs=limit)),
        jobs=SimpleNamespace(jobs=lambda: jobs),
    )


def test_job_states_map_to_video_statuses_and_errors() -> None:
    cases = {
        "queued": ("queued", None, None),
        "running": ("in_progress", None, None),
        "succeeded": ("completed", None, 130),
        "failed": ("failed", {"code": "nan", "message": "NaN in step 3"}, 130),
        "cancelled": ("failed", {"code": "cancelled", "message": "server shutdown"}, 130),
    }
    errors = {"failed": "nan: NaN in step 3", "cancelled": "server shutdown"}
    for state, (status, error, completed_at) in cases.items():
        video = video_object(row(state, error=errors.get(state)), None, 12)
        assert (video["status"], video["error"], video["completed_at"]) == (
            status,
            error,
            completed_at,
        ), state
        assert video["progress"] == (100 if state == "succeeded" else 50)
    video = video_object(row("running"), job("running", progress=0.75), 12)
    assert video["progress"] == 75  # the live job's progress, not the row's
    assert (video["size"], video["seconds"], video["created_at"]) == ("96x64", "2", 100)
    assert video_object(row("queued", params={"num_frames": 18}), None, 12)["seconds"] == "1.5"


def test_seconds_and_size_are_checked_against_the_card() -> None:
    assert (
        frames_for(CARD, "2") == 24 and frames_for(CARD, 3) == 36 and frames_for(CARD, None) == 48
    )
    for bad in ("0", "-1", "1.5", "four", "86"):  # 86 s at 12 fps is over 1024 frames
        with pytest.raises(OpenAIError) as refused:
            frames_for(CARD, bad)
        assert (refused.value.status, refused.value.param) == (400, "seconds")
    assert parse_size(CARD, "128x64") == (128, 64) and parse_size(CARD, None) == (None, None)
    for bad in ("96", "97x96", "96x96x3", "0x96", "8192x96"):
        with pytest.raises(OpenAIError) as refused:
            parse_size(CARD, bad)
        assert (refused.value.status, refused.value.param) == (400, "size")


def test_a_full_queue_answers_429_with_the_soonest_end() -> None:
    halfway = job(progress=0.5, created_at=90.0)  # half done in 10 s: 10 s left at that pace
    check_queue(ctx_with([halfway], limit=2), now_s=100.0)  # room for one more
    with pytest.raises(OpenAIError) as full:
        check_queue(ctx_with([halfway, job(progress=0.0, created_at=99.0)], limit=2), now_s=100.0)
    assert (full.value.status, full.value.code) == (429, "queue_full")
    assert full.value.headers == {"Retry-After": "10", "retry-after-ms": "10000"}
    slow = job(progress=0.01, created_at=0.0)  # 1 % in 100 s: 9 900 s at that pace
    with pytest.raises(OpenAIError) as capped:
        check_queue(ctx_with([slow], limit=1), now_s=100.0)
    assert capped.value.headers == {"Retry-After": "10", "retry-after-ms": "10000"}
    with pytest.raises(OpenAIError) as never:
        check_queue(ctx_with([], limit=2), needed=3)
    assert (never.value.status, never.value.param) == (400, "n")


def test_the_poll_interval_follows_the_remaining_time() -> None:
    assert poll_after_ms(job(progress=0.5, created_at=0.0), now_s=2.0) == 2000
    assert poll_after_ms(job(progress=0.5, created_at=0.0), now_s=0.01) == 200  # at least
    assert poll_after_ms(job(progress=0.1, created_at=0.0), now_s=100.0) == 5000  # at most
    assert poll_after_ms(job(progress=0.0)) == 500  # not started: no pace yet
