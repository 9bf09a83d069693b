"""Schemathesis against a real ``dreamrt serve``: 300+ generated requests from its served
``/openapi.json`` (positive and negative cases of every ``/v1`` operation, session routes also
with a live session's id), no answer 5xx, and the server alive and idle after. The full count
(2,000) runs from ``infra/load/schema_fuzz.py``."""

from __future__ import annotations

from collections.abc import Iterator

import httpx
import pytest

from infra.browser_harness import ServerProcess
from infra.load.schema_fuzz import run_schema_fuzz
from tests.e2e.test_sessions_e2e import start_server, stop_server, wait_idle

pytestmark = pytest.mark.slow


@pytest.fixture
def server(tmp_path) -> Iterator[ServerProcess]:
    # the REST rate limit off: the fuzz is about what handlers answer, not about the limiter
    srv = start_server(tmp_path, "fuzz", "--rest-rate", "0", "--max-queued-jobs", "4")
    yield srv
    stop_server(srv)  # a clean shutdown, no traceback in the log


def test_generated_requests_never_get_a_5xx_and_the_server_survives(server: ServerProcess) -> None:
    summary = run_schema_fuzz(server.url, requests_total=300)
    assert summary.requests >= 300
    assert len(summary.by_operation) >= 19  # every /v1 operation got requests
    assert summary.failures == [], "\n".join(summary.failures[:10])
    assert sum(n for code, n in summary.by_status.items() if 200 <= code < 300) >= 20
    assert summary.by_status[422] >= 50  # the negative cases reached validation
    created = httpx.post(f"{server.url}/v1/sessions", json={"prompt": "after"}, timeout=10)
    assert created.status_code == 201
    httpx.delete(f"{server.url}/v1/sessions/{created.json()['id']}", timeout=10)
    wait_idle(server.url, timeout_s=30)
