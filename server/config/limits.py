"""Every bound on what a client can make the server hold or do (docs/api.md "Limits").

``Limits`` is one frozen value: the composition root gets it from ``dreamrt serve`` flags and
hands it to the edges that enforce it (``server.edge.request_guard`` for body sizes, REST rate and
draining; the routes for SDP, prompt, audio, queued jobs and SSE streams; the WebRTC peer and
the control inbox for the data channel, the inbound audio track and the connect timeout; the
session host's reaper for the idle and unwatched timeouts). A client over a limit gets a
status that says which one (413, 422, 429 + ``Retry-After``) or, on the data channel, an
``error`` event; nothing it sends can grow the server's memory without bound.

``RateLimiter`` holds one ``TokenBucket`` per key (the request's bearer token, or its client
address without one), at most ``max_keys`` of them: the least recently used key is forgotten
first, so a client that sprays tokens cannot grow the table either.
"""

from __future__ import annotations

import math
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass

from server.config.fields import setting
from server.live.control import MAX_MESSAGE_BYTES, TokenBucket

__all__ = ["Limits", "RateLimiter"]

# The schemas' hard caps (server.edge.schemas): a configured limit may be lower, never higher.
PROMPT_HARD_MAX_CHARS = 16_000
SDP_HARD_MAX_BYTES = 256 * 1024


@dataclass(frozen=True, slots=True)
class Limits:
    """The defaults are what docs/api.md "Limits" lists; 0 turns a timeout or a rate off.
    Each field is a ``dreamrt serve`` setting (``server.config.fields``): its flag, its
    ``DREAMRT_*`` variable, its key in the ``[limits]`` table of a config file."""

    max_queued_jobs: int = setting(
        16, "jobs queued or running; beyond: 429", flag="--max-queued-jobs", metavar="N"
    )
    max_body_bytes: int = setting(
        256 * 1024, "a request body other than audio (413)", flag="--max-body-bytes", metavar="N"
    )
    max_sdp_bytes: int = setting(
        64 * 1024, "an offer's SDP (413)", flag="--max-sdp-bytes", metavar="N"
    )
    max_prompt_chars: int = setting(
        4000, "a prompt on any path (422 / error event)", flag="--max-prompt-chars", metavar="N"
    )
    max_audio_bytes: int = setting(
        8 * 1024 * 1024, "one audio upload (413)", flag="--max-audio-bytes", metavar="N"
    )
    max_audio_seconds: float = setting(
        30.0, "one audio upload, decoded (413)", flag="--max-audio-seconds", metavar="N"
    )
    max_pending_inputs: int = setting(
        256, "inputs waiting for the loop (429)", flag="--max-pending-inputs", metavar="N"
    )
    control_max_bytes: int = setting(
        MAX_MESSAGE_BYTES, "one data-channel message", flag="--control-max-bytes", metavar="N"
    )
    control_rate_per_s: float = setting(
        30.0, "data-channel messages/s per peer", flag="--control-rate", metavar="N"
    )
    control_burst: int = setting(
        60, "data-channel burst per peer", flag="--control-burst", metavar="N"
    )
    control_buffer_bytes: int = setting(
        1024 * 1024,
        "events queued to a peer that does not read them",
        flag="--control-buffer-bytes",
        metavar="N",
    )
    rest_rate_per_s: float = setting(
        20.0, "/v1 requests/s per token (0: off)", flag="--rest-rate", metavar="N"
    )
    rest_burst: int = setting(40, "/v1 burst per token", flag="--rest-burst", metavar="N")
    max_sse_per_session: int = setting(
        4, "open event streams per session (429)", flag="--max-sse-per-session", metavar="N"
    )
    connect_timeout_s: float = setting(
        20.0, "seconds from answer to ICE+DTLS connected", flag="--connect-timeout", metavar="N"
    )
    idle_timeout_s: float = setting(
        3600.0,
        "close a session without input this long (0: never)",
        flag="--idle-timeout",
        metavar="N",
    )
    audio_buffer_s: float = setting(
        2.0,
        "seconds of viewer audio held for a session not live",
        flag="--audio-buffer",
        metavar="N",
    )

    def __post_init__(self) -> None:
        for name in (
            "max_queued_jobs",
            "max_body_bytes",
            "max_sdp_bytes",
            "max_prompt_chars",
            "max_audio_bytes",
            "max_pending_inputs",
            "control_max_bytes",
            "control_burst",
            "rest_burst",
            "max_sse_per_session",
            "control_buffer_bytes",
        ):
            if getattr(self, name) < 1:
                raise ValueError(f"limit {name} must be >= 1, got {getattr(self, name)}")
        for name in (
            "max_audio_seconds",
            "control_rate_per_s",
            "rest_rate_per_s",
            "connect_timeout_s",
            "idle_timeout_s",
            "audio_buffer_s",
        ):
            value = getattr(self, name)
            if not (value >= 0 and math.isfinite(value)):
                raise ValueError(f"limit {name} must be a finite number >= 0, got {value}")
        if self.control_rate_per_s == 0:
            raise ValueError("control_rate_per_s must be > 0 (the data channel is always limited)")
        if self.max_prompt_chars > PROMPT_HARD_MAX_CHARS:
            raise ValueError(f"max_prompt_chars is at most {PROMPT_HARD_MAX_CHARS}")
        if self.max_sdp_bytes > SDP_HARD_MAX_BYTES:
            raise ValueError(f"max_sdp_bytes is at most {SDP_HARD_MAX_BYTES}")


class RateLimiter:
    """``rate_per_s`` / ``burst`` per key, over at most ``max_keys`` keys (module docstring).
    ``rate_per_s == 0`` admits everything."""

    def __init__(
        self,
        rate_per_s: float,
        burst: int,
        *,
        max_keys: int = 10_000,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.rate_per_s = rate_per_s
        self.burst = burst
        self.max_keys = max_keys
        self._clock = clock
        self._buckets: OrderedDict[str, TokenBucket] = OrderedDict()
        self.refused = 0

    def __len__(self) -> int:
        return len(self._buckets)

    def take(self, key: str) -> float | None:
        """None when ``key`` may go ahead; else the seconds until it may (for Retry-After)."""
        if self.rate_per_s <= 0:
            return None
        bucket = self._buckets.get(key)
        if bucket is None:
            bucket = self._buckets[key] = TokenBucket(
                self.rate_per_s, self.burst, clock=self._clock
            )
            while len(self._buckets) > self.max_keys:
                self._buckets.popitem(last=False)
        else:
            self._buckets.move_to_end(key)
        if bucket.take():
            return None
        self.refused += 1
        return 1.0 / self.rate_per_s
