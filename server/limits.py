"""Every bound on what a client can make the server hold or do (docs/api.md "Limits").

``Limits`` is one frozen value: the composition root gets it from ``dreamrt serve`` flags and
hands it to the edges that enforce it (``server.request_guard`` for body sizes, REST rate and
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

import argparse
import math
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, fields

from server.control import MAX_MESSAGE_BYTES, TokenBucket

__all__ = ["Limits", "RateLimiter", "add_limit_arguments", "limits_from_args"]

# The schemas' hard caps (server.schemas): a configured limit may be lower, never higher.
PROMPT_HARD_MAX_CHARS = 16_000
SDP_HARD_MAX_BYTES = 256 * 1024


@dataclass(frozen=True, slots=True)
class Limits:
    """The defaults are what docs/api.md "Limits" lists; 0 turns a timeout or a rate off."""

    max_queued_jobs: int = 16  # jobs queued or running; beyond: 429 + Retry-After
    max_body_bytes: int = 256 * 1024  # any request body but audio (413)
    max_sdp_bytes: int = 64 * 1024  # an offer's SDP (413)
    max_prompt_chars: int = 4000  # a prompt, on every path (422 / error event)
    max_audio_bytes: int = 8 * 1024 * 1024  # one audio upload (413)
    max_audio_seconds: float = 30.0  # one audio upload, decoded (413)
    max_pending_inputs: int = 256  # inputs waiting for a paused or busy loop (429)
    control_max_bytes: int = MAX_MESSAGE_BYTES  # one data-channel message
    control_rate_per_s: float = 30.0  # data-channel messages per peer, sustained
    control_burst: int = 60
    control_buffer_bytes: int = 1024 * 1024  # events queued to a peer that does not read
    rest_rate_per_s: float = 20.0  # /v1 requests per token (or client address without one)
    rest_burst: int = 40
    max_sse_per_session: int = 4  # concurrent event streams of one session (429)
    connect_timeout_s: float = 20.0  # offer answered -> ICE + DTLS connected, else closed
    idle_timeout_s: float = 3600.0  # close a session that got no input for this long
    audio_buffer_s: float = 2.0  # viewer audio held for a session that is not live

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


# ``dreamrt serve`` flag -> (Limits field, help); the default is the field's.
_FLAGS = {
    "--max-queued-jobs": ("max_queued_jobs", "jobs queued or running; beyond: 429"),
    "--max-body-bytes": ("max_body_bytes", "a request body other than audio (413)"),
    "--max-sdp-bytes": ("max_sdp_bytes", "an offer's SDP (413)"),
    "--max-prompt-chars": ("max_prompt_chars", "a prompt on any path (422 / error event)"),
    "--max-audio-bytes": ("max_audio_bytes", "one audio upload (413)"),
    "--max-audio-seconds": ("max_audio_seconds", "one audio upload, decoded (413)"),
    "--max-pending-inputs": ("max_pending_inputs", "inputs waiting for the loop (429)"),
    "--control-max-bytes": ("control_max_bytes", "one data-channel message"),
    "--control-rate": ("control_rate_per_s", "data-channel messages/s per peer"),
    "--control-burst": ("control_burst", "data-channel burst per peer"),
    "--rest-rate": ("rest_rate_per_s", "/v1 requests/s per token (0: off)"),
    "--rest-burst": ("rest_burst", "/v1 burst per token"),
    "--max-sse-per-session": ("max_sse_per_session", "open event streams per session (429)"),
    "--connect-timeout": ("connect_timeout_s", "seconds from answer to ICE+DTLS connected"),
    "--idle-timeout": ("idle_timeout_s", "close a session without input this long (0: never)"),
}


def add_limit_arguments(parser: argparse.ArgumentParser) -> None:
    """The ``dreamrt serve`` flags of every limit (defaults: ``Limits()``)."""
    defaults = Limits()
    types = {f.name: f.type for f in fields(Limits)}
    for flag, (name, help_text) in _FLAGS.items():
        kind = float if types[name] in (float, "float") else int
        parser.add_argument(
            flag,
            dest=f"limit_{name}",
            type=kind,
            default=getattr(defaults, name),
            metavar="N",
            help=f"{help_text} (default %(default)s)",
        )


def limits_from_args(args: argparse.Namespace) -> Limits:
    """``Limits`` from parsed flags; ``ValueError`` names a limit out of range."""
    return Limits(**{name: getattr(args, f"limit_{name}") for name, _ in _FLAGS.values()})


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
