"""dreamrt as the avatar of a LiveKit Agents voice agent, in one call (README "dreamrt as a
LiveKit Agents avatar")::

    from clients.livekit.avatar import DreamrtAvatar

    async def entrypoint(ctx: JobContext):
        await ctx.connect()
        session = AgentSession(...)                      # stt / llm / tts of your choice
        avatar = DreamrtAvatar(url="http://dreamrt:8000", prompt="a friendly robot face")
        await avatar.start(session, room=ctx.room)
        await session.start(agent=..., room=ctx.room)

Shaped like the avatar plugins of livekit-agents (an ``AvatarSession`` whose ``start(agent_session,
room=...)`` sets the agent's audio output): ``start`` creates a dreamrt session whose
``livekit`` block has ``avatar_of`` = the agent's identity (so the worker joins with
``lk.publish_on_behalf``), sets ``agent_session.output.audio`` to livekit-agents'
``DataStreamAudioOutput`` towards the worker (the agent's speech then goes to dreamrt, which
publishes it with the video), waits until the worker's video track is in the room, and ends the
dreamrt session when the room disconnects (or on ``aclose()``). livekit-agents >= 1.0 is
needed on the agent side only; dreamrt itself does not depend on it.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
from collections.abc import Callable
from typing import Any

from clients.python.api import DreamrtClient

__all__ = ["DreamrtAvatar", "DreamrtAvatarError"]

log = logging.getLogger(__name__)


class DreamrtAvatarError(RuntimeError):
    """The avatar could not start (no LiveKit URL, the session refused, no video in time)."""


def _data_stream_output(room: Any, destination_identity: str) -> Any:
    from livekit import rtc
    from livekit.agents.voice.avatar import DataStreamAudioOutput

    return DataStreamAudioOutput(
        room,
        destination_identity=destination_identity,
        wait_remote_track=rtc.TrackKind.KIND_VIDEO,
    )


def _is_video(publication: Any) -> bool:
    from livekit import rtc

    return publication.kind == rtc.TrackKind.KIND_VIDEO


class DreamrtAvatar:
    """One dreamrt avatar session for one agent (module doc). ``start`` once, then
    ``aclose()`` (or let the room's disconnect end it)."""

    def __init__(
        self,
        *,
        url: str,
        prompt: str,
        model: str | None = None,
        token: str | None = None,
        livekit_url: str | None = None,
        seed: int | None = None,
        video_timeout_s: float = 30.0,
        audio_output: Callable[[Any, str], Any] = _data_stream_output,
        client: DreamrtClient | None = None,
    ) -> None:
        self.url = url
        self.prompt = prompt
        self.model = model
        self.livekit_url = livekit_url
        self.seed = seed
        self.video_timeout_s = video_timeout_s
        self._audio_output = audio_output
        self._client = client or DreamrtClient(url, token=token)
        self.session_id: str | None = None
        self.identity: str | None = None  # the worker's participant identity
        self._closed = False
        self._tasks: set[asyncio.Task[None]] = set()

    async def start(self, agent_session: Any, *, room: Any, livekit_url: str | None = None) -> None:
        """Creates the session, routes the agent's speech to it, waits for its video."""
        url = livekit_url or self.livekit_url or os.environ.get("LIVEKIT_URL")
        if not url:
            raise DreamrtAvatarError(
                "no LiveKit URL: pass livekit_url= or set LIVEKIT_URL (the worker joins there)"
            )
        agent = room.local_participant.identity
        params: dict[str, Any] = {"livekit": {"url": url, "room": room.name, "avatar_of": agent}}
        if self.model is not None:
            params["model"] = self.model
        if self.seed is not None:
            params["seed"] = self.seed
        video = asyncio.get_running_loop().create_future()

        def on_published(publication: Any, participant: Any) -> None:
            if participant.identity == self.identity and _is_video(publication):
                if not video.done():
                    video.set_result(None)

        room.on("track_published", on_published)
        room.on("disconnected", self._on_room_disconnected)
        try:
            created = await self._client.create_session(self.prompt, **params)
        except Exception as exc:
            raise DreamrtAvatarError(f"dreamrt at {self.url} refused the session: {exc}") from exc
        self.session_id = created["id"]
        self.identity = f"dreamrt-{self.session_id}"
        agent_session.output.audio = self._audio_output(room, self.identity)
        worker = room.remote_participants.get(self.identity)
        if worker is not None and any(_is_video(p) for p in worker.track_publications.values()):
            video.set_result(None)
        try:
            await asyncio.wait_for(video, self.video_timeout_s)
        except TimeoutError:
            await self.aclose()
            raise DreamrtAvatarError(
                f"{self.identity} published no video in room {room.name!r} within "
                f"{self.video_timeout_s:g} s (see the session's events: livekit.state, error)"
            ) from None
        log.info("dreamrt avatar %s is in room %r", self.identity, room.name)

    def _on_room_disconnected(self, *_: Any) -> None:
        task = asyncio.get_running_loop().create_task(self.aclose())
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def aclose(self) -> None:
        """Ends the dreamrt session (idempotent; the worker then leaves the room)."""
        if self._closed:
            return
        self._closed = True
        if self.session_id is not None:
            with contextlib.suppress(Exception):  # it may have ended with the room already
                await self._client.delete_session(self.session_id)
        await self._client.aclose()
