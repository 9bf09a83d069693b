"""WHEP viewers: one standard-WebRTC playback resource per ``POST`` of an SDP offer.

WHEP (the IETF WebRTC-HTTP egress protocol, draft-ietf-wish-whep, built on the rules RFC 9725
sets for WHIP) lets any player that speaks it watch a session: it ``POST``s an
``application/sdp`` offer and gets ``201 Created`` with the answer and a ``Location``, the
*resource*, which it ``DELETE``s to stop watching. The server does not trickle ICE: aiortc
gathers its candidates before answering, so the answer is complete and ``PATCH`` on a resource
is answered 405 (the protocol's answer for a server without trickle ICE or ICE restarts).

A resource is a ``ViewerPeer`` of one session (the same peer as ``POST .../offer``: the same
video track and pacer, the ``control`` data channel when the offer has one, viewer audio) plus
whether the WHEP request created the session. Ending a resource closes its peer and, when it
owns its session, the session too; a peer whose connection fails or closes (the player went
away without a ``DELETE``) ends its resource the same way, so a vanished player never holds a
KV slab until the unwatched timeout. ``WhepResources`` is the registry of one server.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import secrets
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from server.media.webrtc import ViewerPeer
from sessions.session import Session

__all__ = ["HANDOVER_S", "WhepResource", "WhepResources", "etag_of"]

log = logging.getLogger(__name__)

HANDOVER_S = 0.5


def etag_of(answer_sdp: str) -> str:
    """A strong entity tag of the ICE session the answer describes (RFC 9110 quoting)."""
    ice = "\n".join(
        line for line in answer_sdp.splitlines() if line.startswith(("a=ice-ufrag", "a=ice-pwd"))
    )
    return '"' + hashlib.sha256(ice.encode()).hexdigest()[:20] + '"'


@dataclass(slots=True)
class WhepResource:
    id: str
    session: Session
    peer: ViewerPeer
    owns_session: bool  # created by the WHEP request: it ends with the resource
    etag: str


class WhepResources:
    """The WHEP resources of one server (event-loop thread only)."""

    def __init__(self, host: Any, viewer_of: Callable[[str], ViewerPeer | None]) -> None:
        self._host = host
        self._viewer_of = viewer_of  # the session's current WebRTC viewer
        self._by_id: dict[str, WhepResource] = {}
        self._tasks: set[asyncio.Task[None]] = set()

    def __len__(self) -> int:
        self._prune()
        return len(self._by_id)

    def add(
        self, session: Session, peer: ViewerPeer, *, owns_session: bool, answer_sdp: str
    ) -> WhepResource:
        self._prune()
        resource = WhepResource(
            id=secrets.token_urlsafe(18),  # the Location is the capability to end the viewer
            session=session,
            peer=peer,
            owns_session=owns_session,
            etag=etag_of(answer_sdp),
        )
        self._by_id[resource.id] = resource

        @peer.pc.on("connectionstatechange")
        def on_state() -> None:
            if peer.pc.connectionState in ("failed", "closed") and resource.id in self._by_id:
                self._spawn(self._left(resource))

        return resource

    def get(self, resource_id: str) -> WhepResource | None:
        self._prune()
        return self._by_id.get(resource_id)

    def of_session(self, session_id: str) -> list[WhepResource]:
        self._prune()
        return [r for r in self._by_id.values() if r.session.id == session_id]

    async def end(self, resource: WhepResource, *, reason: str = "deleted") -> None:
        """Ends the viewer, and its session when the resource owns it (idempotent). The session
        closes first, so the viewer's data channel still carries ``closing`` and ``closed``."""
        if self._by_id.pop(resource.id, None) is None:
            return
        if resource.owns_session and not resource.session.terminal:
            await self._host.close_session(resource.session.id, reason)
        await resource.peer.close()

    def hand_over(self, session_id: str) -> None:
        """A new viewer takes ``session_id`` over: its WHEP resources no longer end it."""
        for resource in self._by_id.values():
            if resource.session.id == session_id:
                resource.owns_session = False

    async def _left(self, resource: WhepResource) -> None:
        """The player went away without a DELETE. Its session ends with it unless another
        viewer has taken the session over: a new offer (``POST .../offer`` too) closes the old
        peer before it opens its own, so that one is given ``HANDOVER_S`` to appear."""
        if resource.owns_session:
            await asyncio.sleep(HANDOVER_S)
        current = self._viewer_of(resource.session.id)
        if current is not None and current is not resource.peer:
            resource.owns_session = False
        if resource.owns_session and resource.id in self._by_id:
            log.info(
                "session %s: its WHEP player left without a DELETE; closing it",
                resource.session.id,
            )
        await self.end(resource, reason="whep viewer left")

    async def close(self) -> None:
        """Server shutdown: the peers and sessions are closed by their owners; only the
        watchers spawned here are ended."""
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        self._by_id.clear()

    def _prune(self) -> None:
        for resource in list(self._by_id.values()):
            if resource.session.terminal or (resource.peer.closed and not resource.owns_session):
                del self._by_id[resource.id]
            elif resource.peer.closed:  # its watcher has not run yet: end the session too
                self._spawn(self._left(resource))

    def _spawn(self, coro: Any) -> None:
        task = asyncio.get_running_loop().create_task(coro, name="peer-whep-end")
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
