"""The engine as a participant of one LiveKit room, for one session: join, publish, listen,
leave.

``start()`` spawns the join in the background (``POST /v1/sessions`` has already answered 201):

1. ``livekit.state connecting``; ``room.connect`` (bounded in time by the room adapter). A join
   that fails (refused, bad URL, bad token, timeout) fails the session: ``error`` event with
   code ``livekit_connect`` naming the cause, state ``failed``, its loop cancelled, so the KV
   slab and the admission reservation go back; ``GET`` then shows ``failed``.
2. ``livekit.state connected``; the video track is published (profile size and fps, bitrate
   from ``video_bitrate_bps``), the session starts negotiating, the sink's first pull makes it
   live (``server.live.frame_pacer``); the input bridge (``server.livekit.inputs``) and, for an
   avatar session, ``server.livekit.avatar`` start (its speech published as an audio track,
   clocked by the frames the sink publishes).
3. The SDK's ``reconnecting`` / ``reconnected`` become ``livekit.state`` events. A
   ``disconnected`` we did not ask for (the room was deleted, the participant removed, the
   server went away after its own retries) closes the session with reason
   ``livekit: <SDK reason>``.
4. When the session ends for any reason, its last events are flushed to the room, then the
   participant leaves (``close()``, idempotent; ``on_closed`` is told).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator, Callable
from typing import TYPE_CHECKING

import numpy as np

from server.live.frame_pacer import FramePacer
from server.livekit.inputs import RoomInputs
from server.livekit.room import RoomConnectError, RoomConnection
from server.livekit.sink import LiveKitVideoSink, video_bitrate_bps
from sessions.events import RoomStateChanged
from sessions.session import Session, SessionStateError
from sessions.store import Store

if TYPE_CHECKING:
    from server.livekit.avatar import AvatarBridge

__all__ = ["LiveKitParticipant"]

log = logging.getLogger(__name__)


class LiveKitParticipant:
    """See the module docstring. Event-loop thread only."""

    def __init__(
        self,
        session: Session,
        room: RoomConnection,
        *,
        url: str,
        room_name: str,
        token: str,
        pacer: FramePacer,
        store: Store | None = None,
        control_rate_per_s: float = 30.0,
        audio_identity: str | None = None,
        avatar_of: str | None = None,
        on_closed: Callable[[LiveKitParticipant], None] | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.session = session
        self.room = room
        self.url = url
        self.room_name = room_name
        self._token = token
        self.sink = LiveKitVideoSink(pacer, room)
        self.inputs = RoomInputs(
            session,
            room,
            store=store,
            control_rate_per_s=control_rate_per_s,
            control_burst=int(2 * control_rate_per_s),
            audio_identity=audio_identity,
        )
        self.avatar: AvatarBridge | None = None
        if avatar_of is not None:
            from server.livekit.avatar import AvatarBridge

            self.avatar = AvatarBridge(session, room, agent_identity=avatar_of, clock=clock)
        self._on_closed = on_closed
        self._task: asyncio.Task[None] | None = None
        self._connected = False
        self._closing = False
        self._closed = asyncio.Event()

    # ---------------------------------------------------------------- RoomEvents

    def on_data(self, payload: bytes, sender: str) -> None:
        self.inputs.on_data(payload, sender)

    def wants_audio(self, identity: str) -> bool:
        if self.avatar is not None and identity == self.avatar.agent_identity:
            return False  # the agent's speech comes as lk.audio_stream, not its mic track
        return self.inputs.wants_audio(identity)

    def on_audio(self, identity: str, blocks: AsyncIterator[np.ndarray]) -> None:
        self.inputs.on_audio(identity, blocks)

    def on_state(self, state: str, reason: str) -> None:
        if self._closing:
            return
        session = self.session
        if not session.terminal:
            session.publish(RoomStateChanged(state=state, room=self.room_name, reason=reason))
        log.info("session %s: LiveKit room %r %s %s", session.id, self.room_name, state, reason)
        if state == "disconnected" and self._connected and session.accepts_inputs:
            asyncio.get_running_loop().create_task(
                session.close(f"livekit: {reason or 'disconnected'}"),
                name=f"session-{session.id}-livekit-left",
            )

    # ---------------------------------------------------------------- lifecycle

    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(
            self._run(), name=f"peer-{self.session.id}-livekit"
        )

    async def _run(self) -> None:
        session = self.session
        config = session.config
        session.publish(RoomStateChanged(state="connecting", room=self.room_name))
        if self.avatar is not None:
            self.avatar.register()  # RPC and byte-stream handlers exist before anyone calls
        try:
            await self.room.connect(self.url, self._token, self)
        except RoomConnectError as exc:
            where = f"LiveKit room {self.room_name!r} at {self.url}"
            session.fail("livekit_connect", f"cannot join {where}: {exc}")
            await self.close()
            return
        except Exception as exc:
            log.exception("session %s: LiveKit join raised", session.id)
            session.fail("livekit_connect", f"{type(exc).__name__}: {exc}")
            await self.close()
            return
        self._connected = True
        session.publish(RoomStateChanged(state="connected", room=self.room_name))
        try:
            await self.room.publish_video(
                config.width,
                config.height,
                fps=config.fps,
                bitrate_bps=video_bitrate_bps(config.width, config.height, config.fps),
            )
            if self.avatar is not None:  # the speech is this participant's audio track
                await self.room.publish_audio(self.avatar.speech.out_rate)
                self.sink.on_published = self.avatar.speech.frame_published
            session.begin_negotiation()
        except SessionStateError:
            log.info("session %s ended while joining its LiveKit room", session.id)
        except Exception as exc:
            log.exception("session %s: LiveKit publish failed", session.id)
            session.fail("livekit_publish", f"{type(exc).__name__}: {exc}")
        if session.accepts_inputs:
            self.inputs.start()
            self.sink.start()
            if self.avatar is not None:
                self.avatar.start()
            await session.wait_finished()
            await self.inputs.flush()
        await self.close()

    async def close(self) -> None:
        """Leaves the room (idempotent); the session goes on if it still has a viewer."""
        if self._closing:
            await self._closed.wait()
            return
        self._closing = True
        try:
            await self.sink.close()
            if self.avatar is not None:
                await self.avatar.close()
            await self.inputs.close()
            await self.room.disconnect()
            if not self.session.terminal:
                self.session.viewer_left("livekit participant left", viewer=self.sink)
            task = self._task
            if task is not None and task is not asyncio.current_task() and not task.done():
                task.cancel()
                await asyncio.gather(task, return_exceptions=True)
        finally:
            self._closed.set()
            if self._on_closed is not None:
                self._on_closed(self)

    async def wait_closed(self) -> None:
        await self._closed.wait()
