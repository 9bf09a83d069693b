"""ComfyUI workflows run as jobs: compiled to a program for the served model, then queued.

``submit_workflow`` compiles the API-format graph (``models.programs.comfyui``: a pure
function; a graph with anything it does not cover is a ``WorkflowCoverageError`` listing it,
before a job exists) and queues the program as a job of the ``JobHost``. The workflow's id is
its job's: ``view`` shows the compiled program and where each ComfyUI node went, read from the
job's stored parameters, so it outlives the process like the job does.
"""

from __future__ import annotations

from typing import Any

from models.programs.comfyui import compile_workflow
from sessions.job_host import JobHost
from sessions.store_rows import JobParams

__all__ = ["submit_workflow", "workflow_view"]


def _adapters(served: Any) -> tuple[str, ...]:
    """The LoRA adapters registered for ``served`` (none when it has no adapter registry)."""
    registry = getattr(served, "adapters", None)
    return tuple(sorted(getattr(registry, "adapters", None) or ()))


def submit_workflow(jobs: JobHost, workflow: Any, *, model: str | None = None) -> dict[str, Any]:
    """Compiles ``workflow`` for ``model`` (None: the default) and queues it; returns its view.
    Raises ``WorkflowCoverageError`` (422) and whatever ``JobHost.submit_job`` raises."""
    served = jobs.models.resolve(model)
    compiled = compile_workflow(workflow, served.card, adapters=_adapters(served))
    job = compiled.job
    submitted = jobs.submit_job(
        task=job["task"],
        prompt=job.get("prompt") or "",
        model=served.card.model_id,
        num_frames=job.get("num_frames"),
        width=job.get("width"),
        height=job.get("height"),
        seed=job.get("seed"),
        program=compiled.program.to_dict(),
        origin={"workflow": compiled.mapping},
    )
    view = workflow_view(submitted.id, submitted.config.model_id, submitted.config.params)
    assert view is not None  # submitted with its workflow mapping just above
    return view


def workflow_view(job_id: str, model_id: str, params: JobParams) -> dict[str, object] | None:
    """The body of ``GET /v1/workflows/{id}`` from a job's parameters; None for a job that
    did not come from a workflow."""
    mapping = params.get("workflow")
    if mapping is None:
        return None
    return {
        "id": job_id,
        "job": job_id,
        "model": model_id,
        "program": params.get("program"),
        "nodes": mapping,
    }
