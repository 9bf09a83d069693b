"""Schemathesis against a running server's ``/openapi.json``: N generated requests, 0 answers 5xx.

Every ``/v1`` operation of the served schema gets its share of the requests, drawn by
schemathesis (Hypothesis underneath) in both of its modes: positive (bodies and parameters the
schema allows) and negative (ones it forbids). Session routes also get the id of a real live
session, so the fuzz reaches the handlers rather than stopping at 404; the event stream of a
live session never ends by design, so that route keeps generated ids. Each answer is recorded;
any status >= 500, and any request the server did not answer (a reset, a timeout), is a
failure with the case that caused it, except admission's documented 503 ``capacity`` with
``Retry-After`` (a generated profile too large for the node, more fork candidates than it has
slabs), which is counted apart.

    python -m infra.load.schema_fuzz http://127.0.0.1:8000 --requests 2000 [--token T]

is the full count (``infra/bench/RESULTS.md``); ``tests/e2e/test_schema_fuzz_e2e.py`` runs
300+. What a generated request creates (a session, a job) is deleted at once, so the server
never fills up: a full server's 503 / 429 answers are by design and checked by the limit tests.
"""

from __future__ import annotations

import argparse
import collections
import json
import math
import sys
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import httpx
import requests

if TYPE_CHECKING:
    import schemathesis

__all__ = ["FuzzSummary", "main", "run_schema_fuzz"]


@dataclass
class FuzzSummary:
    requests: int = 0
    by_status: collections.Counter[int] = field(default_factory=collections.Counter)
    by_operation: collections.Counter[str] = field(default_factory=collections.Counter)
    failures: list[str] = field(default_factory=list)  # "METHOD path -> status: body"
    capacity: list[str] = field(default_factory=list)  # admission's 503 + Retry-After (by design)

    def table(self) -> str:
        rows = [f"requests   {self.requests}", f"operations {len(self.by_operation)}"]
        rows += [f"status {code}  {n}" for code, n in sorted(self.by_status.items())]
        rows.append(
            f"of the 503s, admission refusing (capacity, Retry-After)  {len(self.capacity)}"
        )
        rows.append(f"5xx or unanswered  {len(self.failures)}")
        return "\n".join(rows)


def _admission_refused(response: Any) -> bool:
    """503 ``capacity`` + ``Retry-After``: admission's documented answer to a request that does
    not fit (docs/api.md "REST": a huge profile, more fork candidates than slabs), not a fault."""
    if response.status_code != 503 or "retry-after" not in response.headers:
        return False
    try:
        return response.json().get("code") == "capacity"
    except ValueError:
        return False


def run_schema_fuzz(base_url: str, *, requests_total: int, token: str | None = None) -> FuzzSummary:
    """Sends at least ``requests_total`` generated requests to ``base_url`` (module docstring)."""
    import schemathesis
    from schemathesis.core.result import Err

    headers = {"Authorization": f"Bearer {token}"} if token else {}
    schema = schemathesis.openapi.from_url(f"{base_url}/openapi.json", headers=headers)
    operations = []
    for result in schema.get_all_operations():
        if isinstance(result, Err):
            raise result.err()  # the served schema is broken: nothing to fuzz
        if result.ok().path.startswith("/v1"):
            operations.append(result.ok())
    job = httpx.post(
        f"{base_url}/v1/jobs", json={"task": "t2i", "prompt": "fuzz"}, headers=headers, timeout=10
    )
    job_id = job.json()["id"] if job.status_code == 202 else None
    per_operation = max(1, math.ceil(requests_total / len(operations)))
    summary = FuzzSummary()
    http = requests.Session()
    rounds = 0
    while summary.requests < requests_total:  # an operation with few inputs ends its run early
        for operation in operations:
            _fuzz_operation(
                operation, base_url, headers, http, summary, per_operation, job_id, rounds
            )
        rounds += 1
        per_operation = max(1, math.ceil((requests_total - summary.requests) / len(operations)))
    return summary


def _fuzz_operation(
    operation: Any,
    base_url: str,
    headers: dict[str, str],
    http: requests.Session,
    summary: FuzzSummary,
    examples: int,
    job_id: str | None,
    round_index: int,
) -> None:
    """``examples`` generated requests to one operation (a fresh live session for its run:
    an earlier run's DELETE must not turn everything after it into 404s)."""
    from hypothesis import HealthCheck, Phase, given, settings
    from hypothesis import strategies as st
    from schemathesis import GenerationMode

    strategies = [
        operation.as_strategy(GenerationMode.POSITIVE),
        operation.as_strategy(GenerationMode.NEGATIVE),
    ]
    live_id = None
    if "{session_id}" in operation.path and not operation.path.endswith("events"):
        live = httpx.post(
            f"{base_url}/v1/sessions", json={"prompt": "schema fuzz"}, headers=headers, timeout=10
        )
        if live.status_code == 201:
            live_id = live.json()["id"]
            fixed = {"session_id": live_id}
            strategies.append(operation.as_strategy(GenerationMode.POSITIVE, path_parameters=fixed))
    if job_id and "{job_id}" in operation.path:
        fixed = {"job_id": job_id}
        strategies.append(operation.as_strategy(GenerationMode.POSITIVE, path_parameters=fixed))
    label = f"{operation.method.upper()} {operation.path}"

    @settings(
        max_examples=examples,
        deadline=None,
        database=None,
        derandomize=round_index == 0,  # the first round is reproducible, later ones explore
        phases=[Phase.explicit, Phase.generate],
        suppress_health_check=list(HealthCheck),
    )
    @given(case=st.one_of(strategies))
    def send(case: schemathesis.Case) -> None:
        summary.requests += 1
        summary.by_operation[label] += 1
        try:
            response = case.call(base_url=base_url, session=http, headers=headers, timeout=15)
        except requests.RequestException as exc:
            summary.failures.append(f"{label} -> no answer ({type(exc).__name__}): {case!r}")
            return
        summary.by_status[response.status_code] += 1
        _clean_up(base_url, headers, operation, response)
        if _admission_refused(response):
            summary.capacity.append(f"{label}: {response.text[:200]} (case {case!r})")
        elif response.status_code >= 500:
            summary.failures.append(
                f"{label} -> {response.status_code}: {response.text[:300]} (case {case!r})"
            )

    try:
        send()
    finally:
        if live_id:
            httpx.delete(f"{base_url}/v1/sessions/{live_id}", headers=headers, timeout=10)


def _clean_up(
    base_url: str, headers: dict[str, str], operation: Any, response: schemathesis.Response
) -> None:
    """Ends what a generated request created, so slabs and the job queue stay free (a full
    server answers 503/429 by design; that is what the limit tests check, not this fuzz)."""
    if operation.method.upper() != "POST" or response.status_code not in (200, 201, 202):
        return
    created = response.json()
    if operation.path == "/v1/sessions":
        httpx.delete(f"{base_url}/v1/sessions/{created['id']}", headers=headers, timeout=10)
    elif operation.path in ("/v1/jobs", "/v1/workflows", "/v1/sessions/{session_id}/render"):
        # a job (a workflow's id is its job's; a render is a job continuing a session)
        httpx.delete(f"{base_url}/v1/jobs/{created['id']}", headers=headers, timeout=10)
    elif operation.path == "/v1/videos":  # a t2v job too (the OpenAI-compatible API)
        httpx.delete(f"{base_url}/v1/videos/{created['id']}", headers=headers, timeout=10)
    elif operation.path == "/v1/rollouts":  # up to 64 sample jobs, none under --max-queued-jobs
        for sample in created.get("samples", ()):
            httpx.delete(f"{base_url}/v1/jobs/{sample}", headers=headers, timeout=10)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m infra.load.schema_fuzz", description=__doc__)
    parser.add_argument("url")
    parser.add_argument("--requests", type=int, default=2000)
    parser.add_argument("--token", default=None)
    parser.add_argument("--json", default=None, help="also write the summary here")
    args = parser.parse_args(argv)
    summary = run_schema_fuzz(args.url, requests_total=args.requests, token=args.token)
    alive = httpx.get(f"{args.url}/healthz", timeout=10).status_code == 200
    print(summary.table())
    print(f"server alive after: {alive}")
    for failure in summary.failures[:20]:
        print("FAIL", failure)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(
                {
                    "requests": summary.requests,
                    "by_status": dict(summary.by_status),
                    "failures": summary.failures,
                    "alive": alive,
                },
                f,
                indent=1,
            )
    return 0 if alive and not summary.failures else 1


if __name__ == "__main__":
    sys.exit(main())
