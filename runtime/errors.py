"""``DreamrtError``: the root of the errors a client can be told about.

Each layer's domain errors derive from it (models/ through ``runtime.contract``, which re-exports
it) with the error ``code`` and HTTP-style ``status`` docs/api.md documents for them, so the
server answers every one of them through one exception handler (``server.app``) with the
documented body ``{"detail", "code", ...}`` instead of a ladder of ``except`` clauses per route.
An error that concerns one field of the request says which (``field``: the body then has
FastAPI's ``detail`` list naming it); one that passes says when to retry (``retry_after_s``:
a ``Retry-After`` header). The module imports nothing: every layer may use it.
"""

from __future__ import annotations

from typing import Any

__all__ = ["DreamrtError"]


class DreamrtError(Exception):
    """An error with a machine-readable ``code`` and the ``status`` it answers with.

    Subclasses set ``code`` and ``status`` as class attributes; ``code``, ``status``,
    ``field`` and ``retry_after_s`` given to ``__init__`` override them for one instance.
    ``extra`` holds further members of the error body (e.g. an admission refusal's
    ``reason``)."""

    code: str = "internal"
    status: int = 500
    field: str | None = None
    retry_after_s: float | None = None

    def __init__(
        self,
        message: str = "",
        *args: Any,
        code: str | None = None,
        status: int | None = None,
        field: str | None = None,
        retry_after_s: float | None = None,
        **extra: Any,
    ) -> None:
        super().__init__(message, *args)
        if code is not None:
            self.code = code
        if status is not None:
            self.status = status
        if field is not None:
            self.field = field
        if retry_after_s is not None:
            self.retry_after_s = retry_after_s
        self.extra = extra
