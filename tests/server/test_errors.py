"""One error root (runtime.errors): every client-facing domain error is a ``DreamrtError`` whose
code docs/api.md documents, and ``error_response`` gives its documented body and headers."""

from __future__ import annotations

import json
import re
from pathlib import Path

from runtime.errors import DreamrtError
from server.edge.errors import ApiError, error_response, field_error

API_DOC = Path(__file__).resolve().parents[2] / "docs" / "api.md"


def _subclasses(cls: type) -> list[type]:
    out = []
    for sub in cls.__subclasses__():
        out += [sub, *_subclasses(sub)]
    return out


def test_every_domain_error_has_a_documented_code_and_a_status() -> None:
    # the modules whose errors a route lets through to the app's handler
    import models.card.errors  # noqa: F401
    import server.livekit.token  # noqa: F401
    import server.media.webrtc  # noqa: F401
    import sessions.audio  # noqa: F401
    import sessions.forks  # noqa: F401
    import sessions.input_ledger  # noqa: F401
    import sessions.model_hold  # noqa: F401
    import sessions.served_models  # noqa: F401
    import sessions.states  # noqa: F401
    import sessions.weight_sync  # noqa: F401

    documented = set(re.findall(r"`([a-z_]+)`", API_DOC.read_text()))
    errors = [cls for cls in _subclasses(DreamrtError) if cls is not ApiError]
    names = {cls.__name__ for cls in errors}
    assert {"SessionStateError", "ForkError", "OfferError", "ProfileError"} <= names
    for cls in errors:
        assert cls.code in documented, (cls.__name__, cls.code)
        assert 400 <= cls.status < 600, cls.__name__


def _body(response) -> dict:
    return json.loads(response.body)


def test_the_body_names_the_field_and_the_retry() -> None:
    from sessions.input_ledger import InputBacklogError, UnsupportedInputError
    from sessions.served_models import ModelUnavailableError
    from sessions.states import SessionStateError

    answer = error_response(UnsupportedInputError("no cut", field="mode"))
    assert answer.status_code == 422
    assert _body(answer) == {
        "detail": [{"loc": ["body", "mode"], "msg": "no cut", "type": "unsupported_input"}],
        "code": "unsupported_input",
    }
    assert _body(error_response(field_error("keys", "bad"))) == _body(
        error_response(ApiError(422, "invalid_field", "bad", field="keys"))
    )
    conflict = error_response(SessionStateError("session is closed"))
    assert (conflict.status_code, _body(conflict)) == (
        409,
        {"detail": "session is closed", "code": "conflict"},
    )
    backlog = error_response(InputBacklogError("256 wait"))
    assert (backlog.status_code, backlog.headers["retry-after"]) == (429, "1")
    busy = error_response(ModelUnavailableError("syncing", retry_after_s=2.5))
    assert (busy.status_code, busy.headers["retry-after"]) == (503, "3")
    capacity = ApiError(503, "capacity", "full", headers={"Retry-After": "4"}, retry_after_s=4)
    answer = error_response(capacity)
    assert _body(answer) == {"detail": "full", "code": "capacity", "retry_after_s": 4}
    assert answer.headers["retry-after"] == "4"
