"""OpenAI's error shape on the OpenAI-compatible routes (docs/api.md "OpenAI-compatible API").

Those routes answer an error as ``{"error": {"message", "type", "param", "code"}}`` with the
statuses the official ``openai`` clients map to their exception classes: 400 an invalid
parameter (``param`` names it; FastAPI's 422 becomes 400 here), 401 / 403 auth, 404 an unknown
id or model, 409 content asked for before the video completed, 429 with ``Retry-After`` (the
clients retry it), 5xx. Two places produce the shape:

- ``OpenAIRoute``, the routes' ``APIRoute`` class: an ``OpenAIError`` or a validation error
  raised by a route or its dependencies answers at once;
- ``OpenAIErrorBodies``, ASGI middleware outermost: any other JSON error answer on these paths
  in dreamrt's ``{"detail", "code"}`` shape is rewritten, its status (422 -> 400) and headers
  (``Retry-After``, ``WWW-Authenticate``) kept: the shared ``ApiError`` of auth and job
  creation, the request guard's 429 / 413 / 503 before routing, an unknown path's 404.

Imports FastAPI only: the fleet router (``server.router.app``) uses it too.

``x-should-retry: false`` goes with answers a retry cannot change (409 before completion, a
504 wait): the clients would otherwise retry 409 and 5xx on their own.
"""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable, Coroutine, Sequence
from typing import Any

from fastapi import Request, Response
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from fastapi.routing import APIRoute
from starlette.types import Message, Receive, Scope, Send

__all__ = [
    "OPENAI_PATHS",
    "OpenAIError",
    "OpenAIErrorBodies",
    "OpenAIRoute",
    "error_body",
    "from_validation",
    "invalid",
]

# the path prefixes whose errors take OpenAI's shape
OPENAI_PATHS = ("/v1/videos", "/v1/images", "/v1/models")

_TYPES = {
    401: "authentication_error",
    403: "permission_error",
    429: "rate_limit_error",
}


def _type_for(status: int) -> str:
    if status in _TYPES:
        return _TYPES[status]
    return "server_error" if status >= 500 else "invalid_request_error"


def error_body(
    status: int, message: str, *, param: str | None = None, code: str | None = None
) -> dict[str, object]:
    """The OpenAI error body of an answer with ``status``."""
    return {"error": {"message": message, "type": _type_for(status), "param": param, "code": code}}


class OpenAIError(Exception):
    """An error answer of an OpenAI-compatible route: status, message, the parameter at
    fault (or None), a machine-readable code, extra headers."""

    def __init__(
        self,
        status: int,
        message: str,
        *,
        param: str | None = None,
        code: str | None = None,
        headers: dict[str, str] | None = None,
    ) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.param = param
        self.code = code
        self.headers = dict(headers or {})

    def response(self) -> JSONResponse:
        body = error_body(self.status, self.message, param=self.param, code=self.code)
        return JSONResponse(body, status_code=self.status, headers=self.headers)


def invalid(param: str, message: str, code: str = "invalid_value") -> OpenAIError:
    """400 naming ``param``."""
    return OpenAIError(400, message, param=param, code=code)


def _field_of(loc: Any) -> str | None:
    """The parameter a validation error's ``loc`` names: its first part after where it was
    (``["body", "n"]`` -> ``"n"``; ``["body", "seconds", "int"]``, a member of a union, ->
    ``"seconds"``)."""
    parts = [str(p) for p in (loc or ()) if p not in ("body", "query", "path", "header")]
    return parts[0] if parts else None


def from_validation(errors: Sequence[Any]) -> OpenAIError:
    """The 400 of pydantic's or FastAPI's validation ``errors`` (the first names ``param``)."""
    return _from_detail(422, list(errors), "invalid_value", None)


def _from_detail(status: int, detail: Any, code: str | None, headers: Any) -> OpenAIError:
    """An OpenAI error from a dreamrt-shaped answer: ``detail`` is a message or FastAPI's list
    of field errors (whose first names ``param``); a 422 is a 400 here."""
    param = None
    if isinstance(detail, list) and detail:
        first = detail[0] if isinstance(detail[0], dict) else {}
        param = _field_of(first.get("loc"))
        message = "; ".join(
            f"{_field_of(d.get('loc')) or 'body'}: {d.get('msg')}"
            for d in detail
            if isinstance(d, dict)
        )
    else:
        message = str(detail) if detail else "error"
    status = 400 if status == 422 else status
    return OpenAIError(status, message, param=param, code=code, headers=headers)


class OpenAIRoute(APIRoute):
    """See the module docstring: an ``OpenAIError`` or a validation error raised by the route
    or its dependencies answers in OpenAI's shape (the rest goes to the app's handlers and
    through ``OpenAIErrorBodies``)."""

    def get_route_handler(self) -> Callable[[Request], Coroutine[Any, Any, Response]]:
        handler = super().get_route_handler()

        async def route(request: Request) -> Response:
            try:
                return await handler(request)
            except OpenAIError as exc:
                return exc.response()
            except RequestValidationError as exc:
                return from_validation(exc.errors()).response()

        return route


class OpenAIErrorBodies:
    """See the module docstring: JSON error answers on ``OPENAI_PATHS`` that are not in
    OpenAI's shape yet are rewritten into it. Everything else passes through untouched."""

    def __init__(self, app: Callable[[Scope, Receive, Send], Awaitable[None]]) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        path = str(scope.get("path", ""))
        if scope["type"] != "http" or not any(
            path == p or path.startswith(p + "/") for p in OPENAI_PATHS
        ):
            await self.app(scope, receive, send)
            return
        held: Message | None = None
        chunks: list[bytes] = []

        async def rewriting_send(message: Message) -> None:
            nonlocal held
            if message["type"] == "http.response.start":
                headers = {k.lower(): v for k, v in message.get("headers", ())}
                json_error = message["status"] >= 400 and headers.get(
                    b"content-type", b""
                ).startswith(b"application/json")
                if json_error:
                    held = message  # the body decides: wait for it
                    return
                await send(message)
                return
            if held is None or message["type"] != "http.response.body":
                await send(message)
                return
            chunks.append(message.get("body", b""))
            if message.get("more_body", False):
                return
            start, body = _rewritten(held, b"".join(chunks))
            await send(start)
            await send({"type": "http.response.body", "body": body})

        await self.app(scope, receive, rewriting_send)


def _rewritten(start: Message, raw: bytes) -> tuple[Message, bytes]:
    try:
        body = json.loads(raw)
    except ValueError:
        return start, raw
    if not isinstance(body, dict) or "error" in body:
        return start, raw
    error = _from_detail(int(start["status"]), body.get("detail"), body.get("code"), None)
    new = json.dumps(
        error_body(error.status, error.message, param=error.param, code=error.code)
    ).encode()
    headers = [
        (k, v)
        for k, v in start.get("headers", ())
        if k.lower() not in (b"content-length", b"content-type")
    ]
    headers += [(b"content-type", b"application/json"), (b"content-length", b"%d" % len(new))]
    return {**start, "status": error.status, "headers": headers}, new
