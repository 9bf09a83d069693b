"""What every route depends on: the live ``ServerContext`` (``ctx_of``), the ``authorize``
dependency and its grant (``AuthGrant``), the general-scope check and the prompt limit.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Annotated

from fastapi import Depends, Request

from server.edge.auth import AuthError, Grant
from server.edge.errors import ApiError, field_error

if TYPE_CHECKING:
    from server.context import ServerContext

__all__ = ["AuthGrant", "authorize", "check_prompt", "ctx_of", "require_general"]


def check_prompt(request: Request, field: str, text: str | None) -> None:
    """422 naming ``field`` when ``text`` is longer than the configured prompt limit."""
    limit = ctx_of(request).config.limits.max_prompt_chars
    if text is not None and len(text) > limit:
        raise field_error(
            field,
            f"prompt is {len(text)} characters; the limit is {limit}",
            code="prompt_too_long",
        )


def ctx_of(request: Request) -> ServerContext:
    ctx = getattr(request.app.state, "ctx", None)
    if ctx is None:
        raise ApiError(503, "starting", "the server is starting", headers={"Retry-After": "1"})
    return ctx


async def authorize(request: Request) -> Grant:
    """FastAPI dependency: the request's grant, or 401. On the event loop (no worker thread
    per request); a token not cached yet is looked up on the store's thread."""
    ctx = ctx_of(request)
    header = request.headers.get("authorization")
    try:
        grant = ctx.auth.authenticate(header, lookup=False)
        if grant is None:
            grant = await ctx.store.run(ctx.auth.authenticate, header)
        assert grant is not None  # with the store's lookup: a grant, or AuthError
        return grant
    except AuthError as exc:
        raise ApiError(
            exc.status, "unauthorized", str(exc), headers={"WWW-Authenticate": "Bearer"}
        ) from None


AuthGrant = Annotated[Grant, Depends(authorize)]


def require_general(grant: Grant) -> None:
    if not grant.allows_general():
        raise ApiError(403, "forbidden", f"a token of scope {grant.scope!r} cannot use this route")
