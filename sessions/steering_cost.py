"""What steering costs admission: the generated frames a session's inputs throw away.

An input that changes the picture (a prompt switch, a cut, a changed key) flushes the queued
backlog when its first frame exists, so the viewer sees it at once (``sessions.chunk_stream``);
those frames were generated and are never shown, so a steered session generates more than it
shows. With ``f`` the fraction of its generated frames that were flushed, its GPU load is its
chunk price times generated / shown = ``1 / (1 - f)``: ``f / (1 - f)`` of its share on top
(``overhead``). Measured on the CPU with a viewer switching prompts every 3.5 s, ``f`` is about
6 % with the 10-s steer hold; on the H200 one 832x480 session switching every 3.5 s stalled
25 times a minute, which its flushed backlog would explain (inferred, not yet measured there:
infra/bench/RESULTS.md, "what a prompt switch costs").

``SteeringCost`` prices it (``dreamrt serve --steering-cost measured``, the default):

- each live session's reservation with its own ``f`` (``AdmissionRequest.steering_gpu_s_per_s``)
  once it has generated ``MIN_FRAMES`` frames, refreshed whenever admission decides
  (``refresh``; ``AdmissionController.reprice``);
- a new session with the fraction the server has seen: flushed over generated frames of its
  sessions, live and ended (0 on a fresh server, or with ``none``). The ended sessions' counts
  halve each time they pass ``HISTORY_FRAMES``, so the recent viewers weigh the most.

``f`` is capped at ``MAX_FRACTION``. What a session flushed is its own history, not a forecast:
a viewer who stops steering keeps a price that falls as its unflushed frames add up.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import replace
from typing import Protocol

from runtime.admission import AdmissionController, AdmissionRequest

__all__ = [
    "HISTORY_FRAMES",
    "MAX_FRACTION",
    "MIN_FRAMES",
    "STEERING_COSTS",
    "SteeringCost",
    "overhead",
]

STEERING_COSTS = ("measured", "none")
MIN_FRAMES = 48  # a session's own fraction counts from this many generated frames (3 s at 16)
MAX_FRACTION = 0.5
HISTORY_FRAMES = 9600  # ten minutes of 16-fps video: the ended sessions' counts then halve


class _Media(Protocol):
    frames_in: int
    dropped_flush: int


def overhead(share: float, fraction: float) -> float:
    """GPU-s/s a session of ``share`` adds by regenerating what steering flushed: the fraction
    ``fraction`` of its generated frames (capped at ``MAX_FRACTION``) never shown."""
    f = min(max(fraction, 0.0), MAX_FRACTION)
    return share * f / (1.0 - f)


class SteeringCost:
    """See the module docstring. ``enabled`` False (``none``): every price is 0."""

    def __init__(self, enabled: bool = True) -> None:
        self.enabled = enabled
        self._ended_in = 0.0  # frames generated / flushed by sessions that ended (decayed)
        self._ended_flushed = 0.0

    def ended(self, media: _Media) -> None:
        """A session ended: its frames join the server's history."""
        self._ended_in += media.frames_in
        self._ended_flushed += media.dropped_flush
        while self._ended_in > HISTORY_FRAMES:
            self._ended_in /= 2
            self._ended_flushed /= 2

    def fraction(self, live: Iterable[_Media] = ()) -> float:
        """Flushed over generated frames of every session this server ran (``live`` and the
        ended ones); 0 before any frame."""
        media = list(live)
        generated = self._ended_in + sum(m.frames_in for m in media)
        flushed = self._ended_flushed + sum(m.dropped_flush for m in media)
        return flushed / generated if generated else 0.0

    def price(self, request: AdmissionRequest, fraction: float) -> AdmissionRequest:
        """``request`` with the steering share of a session whose flushed fraction is
        ``fraction`` (a new session: ``fraction()``)."""
        steering = overhead(request.compute_gpu_s_per_s, fraction) if self.enabled else 0.0
        return replace(request, steering_gpu_s_per_s=steering)

    def session_fraction(self, media: _Media, server: float) -> float:
        """A live session's own fraction once it generated ``MIN_FRAMES``, else ``server``."""
        if media.frames_in < MIN_FRAMES:
            return server
        return media.dropped_flush / media.frames_in

    def refresh(
        self,
        admission: AdmissionController,
        live: Iterable[tuple[str, AdmissionRequest, _Media]],
    ) -> None:
        """Reprice every live session's reservation (its id, the request it was admitted with
        and its media queue) with its own fraction (0 while not ``enabled``)."""
        held = list(live)
        server = self.fraction(media for _, _, media in held)
        for reservation_id, request, media in held:
            fraction = self.session_fraction(media, server) if self.enabled else 0.0
            share = overhead(request.compute_gpu_s_per_s, fraction)
            admission.reprice(reservation_id, steering_gpu_s_per_s=share)
