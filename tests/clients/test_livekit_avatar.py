"""``DreamrtAvatar``: the agent-side helper, against a recorded dreamrt REST API and an
in-process stand-in for the agent's ``rtc.Room`` (the real room path is in
tests/e2e/test_livekit_e2e.py, which needs a LiveKit server)."""

from __future__ import annotations

import asyncio
import json
from types import SimpleNamespace
from typing import Any

import httpx
import pytest
from livekit import rtc

from clients.livekit.avatar import DreamrtAvatar, DreamrtAvatarError
from clients.python.api import DreamrtClient


class AgentRoom:
    """What the helper uses of ``rtc.Room``: name, local identity, participants, events."""

    def __init__(self) -> None:
        self.name = "support-42"
        self.local_participant = SimpleNamespace(identity="agent-7")
        self.remote_participants: dict[str, Any] = {}
        self.handlers: dict[str, list] = {}

    def on(self, event: str, handler) -> None:
        self.handlers.setdefault(event, []).append(handler)

    def emit(self, event: str, *args: Any) -> None:
        for handler in self.handlers.get(event, []):
            handler(*args)


def recorded_api() -> tuple[DreamrtClient, list[tuple[str, str, Any]]]:
    calls: list[tuple[str, str, Any]] = []

    def handle(request: httpx.Request) -> httpx.Response:
        body = json.loads(request.content) if request.content else None
        calls.append((request.method, request.url.path, body))
        if request.method == "POST":
            return httpx.Response(201, json={"id": "ses_1", "token": "tok", "state": "created"})
        return httpx.Response(204)

    client = DreamrtClient("http://dreamrt")
    client._http = httpx.AsyncClient(
        base_url="http://dreamrt", transport=httpx.MockTransport(handle)
    )
    return client, calls


def video_publication() -> Any:
    return SimpleNamespace(kind=rtc.TrackKind.KIND_VIDEO)


async def test_start_creates_the_avatar_session_routes_the_speech_and_waits_for_video() -> None:
    client, calls = recorded_api()
    room = AgentRoom()
    outputs: list[tuple[Any, str]] = []
    agent_session = SimpleNamespace(output=SimpleNamespace(audio=None))
    avatar = DreamrtAvatar(
        url="http://dreamrt",
        prompt="a friendly robot face",
        livekit_url="ws://lk:7880",
        seed=5,
        client=client,
        audio_output=lambda r, identity: outputs.append((r, identity)) or "data-stream-out",
    )
    starting = asyncio.ensure_future(avatar.start(agent_session, room=room))
    for _ in range(50):
        await asyncio.sleep(0)
    assert not starting.done()  # no video yet
    worker = SimpleNamespace(identity="dreamrt-ses_1")
    room.emit("track_published", SimpleNamespace(kind=rtc.TrackKind.KIND_AUDIO), worker)
    room.emit("track_published", video_publication(), SimpleNamespace(identity="someone-else"))
    for _ in range(20):
        await asyncio.sleep(0)
    assert not starting.done()
    room.emit("track_published", video_publication(), worker)
    await asyncio.wait_for(starting, 5)
    assert calls[0] == (
        "POST",
        "/v1/sessions",
        {
            "prompt": "a friendly robot face",
            "seed": 5,
            "livekit": {"url": "ws://lk:7880", "room": "support-42", "avatar_of": "agent-7"},
        },
    )
    assert outputs == [(room, "dreamrt-ses_1")] and agent_session.output.audio == "data-stream-out"
    room.emit("disconnected", "ROOM_DELETED")  # the room closed: the dreamrt session ends
    for _ in range(50):
        await asyncio.sleep(0)
    assert calls[-1][:2] == ("DELETE", "/v1/sessions/ses_1")
    await avatar.aclose()
    assert sum(1 for c in calls if c[0] == "DELETE") == 1


async def test_no_video_in_time_ends_the_session_and_says_so() -> None:
    client, calls = recorded_api()
    avatar = DreamrtAvatar(
        url="http://dreamrt",
        prompt="p",
        livekit_url="ws://lk",
        video_timeout_s=0.01,
        client=client,
        audio_output=lambda r, identity: None,
    )
    agent_session = SimpleNamespace(output=SimpleNamespace(audio=None))
    with pytest.raises(DreamrtAvatarError, match="published no video"):
        await avatar.start(agent_session, room=AgentRoom())
    assert [c[:2] for c in calls] == [("POST", "/v1/sessions"), ("DELETE", "/v1/sessions/ses_1")]


async def test_without_a_livekit_url_it_refuses_before_creating_anything(monkeypatch) -> None:
    monkeypatch.delenv("LIVEKIT_URL", raising=False)
    client, calls = recorded_api()
    avatar = DreamrtAvatar(url="http://dreamrt", prompt="p", client=client)
    with pytest.raises(DreamrtAvatarError, match="LIVEKIT_URL"):
        await avatar.start(SimpleNamespace(output=SimpleNamespace()), room=AgentRoom())
    assert calls == []
    await avatar.aclose()
