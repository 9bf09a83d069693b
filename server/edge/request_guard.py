"""The ASGI middleware in front of every route: draining, REST rate per token, body sizes.

In order, for each HTTP request:

1. **Draining** (graceful shutdown began, ``server.ops.shutdown``): a ``/v1`` request answers 503
   ``shutting_down`` with ``Retry-After`` at once; ``/healthz`` says ``"draining"``.
2. **Rate** (``/v1`` only): one ``server.config.limits.RateLimiter`` bucket per bearer token
(hashed),
   or per client address for a request without one; over it, 429 ``rate_limited`` with
   ``Retry-After``. Counted before authentication, so a flood of bad tokens is limited too.
3. **Body size**: a declared ``Content-Length`` over the route's limit answers 413 before the
   body is read; a body sent without one (chunked) is counted as it arrives and cut off with
   413 at the limit. The limit is ``max_audio_bytes`` for ``POST .../audio`` and
   ``max_body_bytes`` for everything else.

Pure ASGI (no ``BaseHTTPMiddleware``): streaming responses (SSE) pass through untouched.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Awaitable, Callable

from starlette.types import Message, Receive, Scope, Send

from server.config.limits import Limits, RateLimiter

__all__ = ["RequestGuard"]


class RequestGuard:
    """See the module docstring. ``draining()`` says whether the server stopped admitting."""

    def __init__(
        self,
        app: Callable[[Scope, Receive, Send], Awaitable[None]],
        *,
        limits: Limits,
        draining: Callable[[], bool],
        retry_after_s: int = 10,
    ) -> None:
        self.app = app
        self.limits = limits
        self.draining = draining
        self.retry_after_s = retry_after_s
        self.rate = RateLimiter(limits.rest_rate_per_s, limits.rest_burst)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        path: str = scope.get("path", "")
        if path.startswith("/v1"):
            if self.draining():
                await _answer(
                    send,
                    503,
                    "shutting_down",
                    "the server is shutting down; retry on its successor",
                    retry_after=self.retry_after_s,
                )
                return
            wait_s = self.rate.take(_rate_key(scope))
            if wait_s is not None:
                await _answer(
                    send,
                    429,
                    "rate_limited",
                    f"more than {self.limits.rest_rate_per_s:g} requests per second for this token",
                    retry_after=max(1, round(wait_s + 0.5)),
                )
                return
        limit = self._body_limit(scope)
        declared = _content_length(scope)
        if declared is not None and declared > limit:
            await _answer(
                send, 413, "too_large", f"request body is {declared} bytes; the limit is {limit}"
            )
            return
        seen = 0
        started = answered = False

        async def counted_receive() -> Message:
            nonlocal seen, answered
            message = await receive()
            if message["type"] == "http.request":
                seen += len(message.get("body", b""))
                if seen > limit:
                    if not started and not answered:
                        answered = True
                        await _answer(send, 413, "too_large", f"request body exceeds {limit} bytes")
                    return {
                        "type": "http.disconnect"
                    }  # the app stops reading; its answer is dropped
            return message

        async def tracked_send(message: Message) -> None:
            nonlocal started
            if answered:
                return
            if message["type"] == "http.response.start":
                started = True
            await send(message)

        try:
            await self.app(scope, counted_receive, tracked_send)
        except Exception:
            if not answered:  # the route saw the cut-off body as a disconnect: already answered
                raise

    def _body_limit(self, scope: Scope) -> int:
        path: str = scope.get("path", "")
        if scope.get("method") == "POST" and path.endswith("/audio"):
            return self.limits.max_audio_bytes
        return self.limits.max_body_bytes


def _headers(scope: Scope) -> dict[bytes, bytes]:
    return {k.lower(): v for k, v in scope.get("headers", ())}


def _content_length(scope: Scope) -> int | None:
    raw = _headers(scope).get(b"content-length")
    if raw is None:
        return None
    try:
        return int(raw)
    except ValueError:
        return None


def _rate_key(scope: Scope) -> str:
    authorization = _headers(scope).get(b"authorization")
    if authorization:
        return "token:" + hashlib.sha256(authorization).hexdigest()
    client = scope.get("client") or ("", 0)
    return f"addr:{client[0]}"


async def _answer(
    send: Send, status: int, code: str, message: str, *, retry_after: int | None = None
) -> None:
    body = json.dumps({"detail": message, "code": code}).encode()
    headers = [(b"content-type", b"application/json"), (b"content-length", b"%d" % len(body))]
    if retry_after is not None:
        headers.append((b"retry-after", str(retry_after).encode()))
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body})
