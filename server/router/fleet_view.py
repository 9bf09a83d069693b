"""The router's view of a fleet: the engines Dynamo's discovery lists now, their last
DeploymentCards, and the failover of the sessions of an engine that disappeared.

Nothing here outlives the process on purpose: the instance list is discovery's, each card is
re-read from its engine (``NS.engine.card``) every ``poll_s`` and right after a placement, so a
restarted router knows the fleet again after its first refresh. Which sessions an engine holds
is in its card; when an engine's instance leaves discovery (it unregistered, or was killed and
its lease expired) the sessions of its last card are re-placed with ``resume`` on the engines
with room (``server.router.placement``), one at a time, until each is resumed or no engine can take
it (retried on the next refresh). A session whose engine died while no router was running is not
known to a router started later (its manifest and snapshots stay on shared storage).

    discovery ──instance ids──► refresh ──card──► cards {instance id: card}
                                   │ ids gone: their cards' sessions
                                   ▼
                           orphans ──place resume──► engine with room
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Mapping
from typing import Any

from server.fleet.dynamo_runtime import DynamoClient, DynamoRuntime
from server.router.placement import Candidate, HeadroomPlacement, PlacementRequest

__all__ = ["FleetView"]

log = logging.getLogger(__name__)

_CALL_TIMEOUT_S = 30.0


class FleetView:
    """See the module docstring. Event-loop thread only; ``start()`` / idempotent ``close()``."""

    def __init__(
        self,
        runtime: DynamoRuntime,
        namespace: str,
        *,
        placement: HeadroomPlacement | None = None,
        poll_s: float = 1.0,
    ) -> None:
        self._runtime = runtime
        self.namespace = namespace
        self.placement = placement or HeadroomPlacement()
        self.poll_s = poll_s
        self._clients: dict[str, DynamoClient] = {}
        self.cards: dict[int, dict[str, Any]] = {}
        self.orphans: dict[str, str] = {}  # session id -> engine id it was lost with
        self.resumed: dict[str, str] = {}  # session id -> engine id it was resumed on
        self._task: asyncio.Task[None] | None = None
        self._lock = asyncio.Lock()  # one refresh or failover pass at a time

    async def start(self) -> None:
        for name in ("card", "place"):
            endpoint = self._runtime.endpoint(f"{self.namespace}.engine.{name}")
            self._clients[name] = await endpoint.client()
        await self.refresh()
        self._task = asyncio.create_task(self._poll(), name="dreamrt-fleet-view")

    async def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
            self._task = None

    # ------------------------------------------------------------------ discovery and cards

    def instance_ids(self) -> list[int]:
        return sorted(self._clients["card"].instance_ids())

    async def call(self, endpoint: str, instance_id: int, request: object) -> dict[str, object]:
        """One request to one engine's endpoint; its single answer."""

        async def one() -> dict[str, object]:
            stream = await self._clients[endpoint].direct(request, instance_id, annotated=False)
            async for answer in stream:
                return answer
            raise RuntimeError(f"engine {instance_id:x} answered nothing on {endpoint}")

        return await asyncio.wait_for(one(), _CALL_TIMEOUT_S)

    async def refresh_card(self, instance_id: int) -> None:
        try:
            self.cards[instance_id] = await self.call("card", instance_id, {})
        except Exception as exc:  # gone meanwhile, or not answering: discovery decides
            log.info("card of engine %x not read: %s", instance_id, exc)

    async def refresh(self) -> None:
        async with self._lock:
            live = set(self.instance_ids())
            for gone in set(self.cards) - live:
                card = self.cards.pop(gone)
                lost = [s for s in card.get("sessions", ()) if s not in self.orphans]
                log.warning(
                    "engine %s (%x) left the fleet with %d sessions: %s",
                    card.get("engine_id"),
                    gone,
                    len(lost),
                    lost,
                )
                for session_id in lost:
                    self.orphans[session_id] = str(card.get("engine_id"))
            await asyncio.gather(*(self.refresh_card(i) for i in sorted(live)))
            if self.orphans:
                await self._fail_over()

    async def _poll(self) -> None:
        while True:
            await asyncio.sleep(self.poll_s)
            try:
                await self.refresh()
            except asyncio.CancelledError:
                raise
            except Exception:
                log.exception("fleet refresh failed")

    # ------------------------------------------------------------------ placement

    async def place(self, kind: str, body: Mapping[str, Any]) -> tuple[dict[str, Any], int]:
        """Places a session or job: tries the ranked engines in turn until one admits it (with
        no engine ranked, every card is read again first: a 503 never rests on a stale card).
        -> (the admitting engine's answer, its instance id), or (the last refusal, -1)."""
        request = PlacementRequest.of(kind, body)
        refusal: dict[str, Any] = {"status": 503, "body": _no_room(request), "retry_after_s": 1.0}
        candidates = self.placement.rank(self.cards, request)
        if not candidates:  # the cards may be a poll old: read them again before a 503
            await asyncio.gather(*(self.refresh_card(i) for i in list(self.cards)))
            candidates = self.placement.rank(self.cards, request)
        for candidate in candidates:
            answer = await self._try(candidate, {"kind": kind, "body": dict(body)})
            if answer is None:
                continue
            if answer["status"] < 300:
                return answer, candidate.instance_id
            if answer["status"] != 503:  # the request itself is wrong: the engine says why
                return answer, -1
            refusal = answer  # admission refused after all (the card was stale): next one
        return refusal, -1

    async def _try(self, candidate: Candidate, request: dict[str, Any]) -> dict[str, Any] | None:
        try:
            answer = await self.call("place", candidate.instance_id, request)
        except Exception as exc:
            log.info("engine %s did not answer a place: %s", candidate.engine_id, exc)
            return None
        await self.refresh_card(candidate.instance_id)  # its load changed
        return answer

    async def _fail_over(self) -> None:
        request = PlacementRequest(kind="session")
        for session_id, lost_on in list(self.orphans.items()):
            for candidate in self.placement.rank(self.cards, request):
                answer = await self._try(candidate, {"kind": "resume", "session_id": session_id})
                if answer is not None and answer["status"] < 300:
                    del self.orphans[session_id]
                    self.resumed[session_id] = candidate.engine_id
                    log.info(
                        "session %s (lost with %s) resumed on %s",
                        session_id,
                        lost_on,
                        candidate.engine_id,
                    )
                    break
                if answer is not None and answer["status"] == 404:  # nothing to resume from
                    log.error("session %s cannot be resumed: %s", session_id, answer["body"])
                    del self.orphans[session_id]
                    break

    def locate(self, session_id: str) -> dict[str, Any] | None:
        """The engine a live session is on now (from the cards), or None."""
        for instance_id, card in self.cards.items():
            if session_id in card.get("sessions", ()):
                return {
                    "id": session_id,
                    "engine_id": card["engine_id"],
                    "url": card["url"],
                    "instance_id": instance_id,
                }
        return None


def _no_room(request: PlacementRequest) -> dict[str, object]:
    what = request.model or "the default model"
    return {
        "detail": f"no engine of the fleet has room for a {request.kind} of {what}",
        "code": "capacity",
        "reason": "fleet",
    }
