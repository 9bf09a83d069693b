"""``/v1/workflows`` routes (docs/api.md "ComfyUI workflows"): a ComfyUI API-format graph
compiled to a program and run as a job; the compiled program shown back.

``POST`` takes the body ComfyUI's ``/prompt`` takes (``{"prompt": {graph}, "client_id"?}``)
plus an optional ``model``; a graph with nodes or parameters the compiler does not cover is a
422 ``workflow_not_covered`` listing every one, before a job exists. The workflow's id is its
job's (``GET /v1/jobs/{id}``, its events and artifact).
"""

from __future__ import annotations

from fastapi import APIRouter, Request

from server.api.deps import AuthGrant, ctx_of, require_general
from server.edge.errors import ApiError, creation_errors
from server.edge.schemas import WorkflowBody
from sessions.workflows import submit_workflow, workflow_view

__all__ = ["router"]

router = APIRouter(prefix="/v1/workflows")


@router.post("", status_code=202)
async def submit(body: WorkflowBody, request: Request, grant: AuthGrant) -> dict[str, object]:
    require_general(grant)
    ctx = ctx_of(request)
    limit = ctx.config.limits.max_queued_jobs
    waiting = [job for job in ctx.jobs.jobs() if not job.terminal]
    if len(waiting) >= limit:
        raise ApiError(
            429,
            "queue_full",
            f"{len(waiting)} jobs are queued or running; the limit is {limit}",
            headers={"Retry-After": "5"},
            retry_after_s=5,
        )
    with creation_errors():
        return submit_workflow(ctx.jobs, body.prompt, model=body.model)


@router.get("/{workflow_id}")
async def get_workflow(workflow_id: str, request: Request, grant: AuthGrant) -> dict[str, object]:
    require_general(grant)
    ctx = ctx_of(request)
    job = ctx.jobs.job(workflow_id)
    view = None
    if job is not None:
        view = workflow_view(job.id, job.config.model_id, job.config.params)
        if view is not None:
            view["state"] = job.state.value
    else:
        row = await ctx.store.run(ctx.store.get_job, workflow_id)
        if row is not None:
            view = workflow_view(row["id"], row["model_id"], row["params"])
            if view is not None:
                view["state"] = row["state"]
    if view is None:
        raise ApiError(404, "not_found", f"no workflow {workflow_id!r}")
    return view
