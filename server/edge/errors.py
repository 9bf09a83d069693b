"""``ApiError``, the error the edge itself raises (a ``runtime.errors.DreamrtError`` like every
domain error), and ``error_response``: the documented body of any ``DreamrtError``
(``{"detail", "code", ...}``, a 422 naming the field in FastAPI's own ``detail`` shape;
``server.app``'s one handler answers with it).
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Iterator
from typing import Any

from fastapi.responses import JSONResponse

from runtime.errors import DreamrtError

__all__ = ["ApiError", "creation_errors", "error_response", "field_error"]


class ApiError(DreamrtError):
    """An error the edge raises: ``status``, a ``code`` and a human message, plus optional
    headers and further body members (``extra``, e.g. ``retry_after_s``)."""

    def __init__(
        self,
        status: int,
        code: str,
        message: str,
        *,
        headers: dict[str, str] | None = None,
        field: str | None = None,
        **extra: Any,
    ) -> None:
        super().__init__(message, code=code, status=status, field=field)
        self.headers = headers
        self.extra = extra  # body members, not DreamrtError's keywords (retry_after_s among them)


def field_error(field: str, message: str, *, code: str = "invalid_field") -> ApiError:
    """A 422 whose ``detail`` names ``field`` exactly like FastAPI's validation errors do."""
    return ApiError(422, code, message, field=field)


def error_response(exc: DreamrtError) -> JSONResponse:
    """The documented answer of ``exc`` (docs/api.md "REST", its errors paragraph): the body
    ``{"detail", "code", ...}``, ``detail`` FastAPI's list naming the field when ``exc``
    concerns one; ``Retry-After`` when it says when to retry."""
    message = str(exc.args[0]) if exc.args else exc.code
    detail: Any = message
    if exc.field is not None:
        detail = [{"loc": ["body", exc.field], "msg": message, "type": exc.code}]
    headers = dict(getattr(exc, "headers", None) or {})
    if exc.retry_after_s is not None:
        headers.setdefault("Retry-After", str(max(1, math.ceil(exc.retry_after_s))))
    body = {"detail": detail, "code": exc.code, **exc.extra}
    return JSONResponse(body, status_code=exc.status, headers=headers or None)


@contextlib.contextmanager
def creation_errors() -> Iterator[None]:
    """An unknown model (the registry's ``KeyError``) while creating a session or job is a
    422 naming ``model``; what else the host refuses is a ``DreamrtError`` already."""
    try:
        yield
    except KeyError as exc:
        raise field_error("model", str(exc.args[0])) from None
