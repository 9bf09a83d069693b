"""docs/api.md's REST route table agrees with the routes the app serves (its OpenAPI schema).

Every documented (method, route) is served, and every served ``/v1`` and ``/whep`` route,
``/healthz``, ``/readyz`` and ``/metrics`` is documented. Path parameters compare by position only
(``{id}`` in the docs, ``{session_id}`` in the code).
"""

from __future__ import annotations

import re
from pathlib import Path

from fastapi.testclient import TestClient

API_DOC = Path(__file__).resolve().parents[2] / "docs" / "api.md"
ROW = re.compile(r"^\|\s*(GET|POST|PUT|PATCH|DELETE)\s*\|\s*`([^`]+)`\s*\|")
METHODS = ("get", "post", "put", "patch", "delete")


def _normalize(path: str) -> str:
    return re.sub(r"\{[^}]+\}", "{}", path)


def documented_routes(text: str) -> list[tuple[str, str]]:
    return [
        (m.group(1), _normalize(m.group(2)))
        for line in text.splitlines()
        if (m := ROW.match(line.strip()))
    ]


def served_routes(client: TestClient) -> set[tuple[str, str]]:
    paths = client.get("/openapi.json").json()["paths"]
    return {
        (method.upper(), _normalize(path))
        for path, operations in paths.items()
        for method in operations
        if method in METHODS
        and (path.startswith(("/v1/", "/whep/")) or path in ("/healthz", "/readyz", "/metrics"))
    }


def test_the_parser_reads_route_rows_and_skips_everything_else() -> None:
    text = (
        "| method | route | body |\n| --- | --- | --- |\n"
        "| GET | `/v1/things/{thing_id}` | `{...}` |\n"
        "| `dreamrt serve` | runs |\n"
        "| POST | `/v1/things` | → 201 |\n"
    )
    assert documented_routes(text) == [("GET", "/v1/things/{}"), ("POST", "/v1/things")]


def test_api_doc_route_table_matches_the_served_routes(client: TestClient) -> None:
    documented = documented_routes(API_DOC.read_text(encoding="utf-8"))
    assert len(documented) == len(set(documented)), "a route is documented twice"
    served = served_routes(client)
    assert ("POST", "/v1/sessions") in served and ("GET", "/healthz") in served
    missing = sorted(served - set(documented))
    unserved = sorted(set(documented) - served)
    assert missing == [], f"served but not in docs/api.md: {missing}"
    assert unserved == [], f"in docs/api.md but not served: {unserved}"
