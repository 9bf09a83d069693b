"""Routes a co-located trainer drives: weight sync, sleep and wake, group rollouts
(docs/api.md "REST", its trainer paragraph).

Weights, sleep and wake need the admin key or an admin token: they change what every session
sees, and ``POST /v1/weights`` reads a path on the server's disk. Rollouts are jobs: any
general token may queue and read them. 422 names what does not fit (a file the
DiT cannot take, an unknown component: nothing changed), 409 a sync while a component sleeps,
503 + ``Retry-After`` a loop that did not reach its boundary in time (nothing changed).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
from collections.abc import Awaitable, Iterator
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import FileResponse

from runtime.errors import DreamrtError
from server.api.deps import AuthGrant, ctx_of, require_general
from server.edge.auth import Grant
from server.edge.errors import ApiError, creation_errors
from server.edge.schemas import ComponentsBody, RolloutBody, WeightsBody
from sessions.trainer_controls import TrainerControls

__all__ = ["router"]

router = APIRouter(prefix="/v1")


def _trainer(request: Request, grant: Grant) -> TrainerControls:
    if not grant.is_admin:
        raise ApiError(403, "forbidden", "trainer routes need the admin key or an admin token")
    return ctx_of(request).trainer


@contextlib.contextmanager
def _refusals() -> Iterator[None]:
    """An unknown model (``KeyError``) or component (``ValueError``) is a 422; the trainer's
    own refusals (invalid weights 422, a sync while asleep 409, a hold timeout 503) are
    ``DreamrtError``s the app's handler answers."""
    try:
        yield
    except DreamrtError:
        raise
    except KeyError as exc:
        raise ApiError(422, "invalid_field", str(exc.args[0])) from None
    except ValueError as exc:
        raise ApiError(422, "invalid", str(exc)) from None


@router.get("/weights")
def weights_info(request: Request, grant: AuthGrant, model: str | None = None) -> dict[str, object]:
    trainer = _trainer(request, grant)
    with _refusals():
        return {
            "weights_version": trainer.weights.version(model),
            "asleep": list(trainer.sleep.asleep(model)),
        }


async def _answer(call: Awaitable[Any]) -> dict[str, object]:
    with _refusals():
        result = await call
    return dataclasses.asdict(result)


@router.post("/weights")
async def sync_weights(body: WeightsBody, request: Request, grant: AuthGrant) -> dict[str, object]:
    trainer = _trainer(request, grant)
    return await _answer(trainer.weights.sync(body.path, mode=body.mode, model=body.model))


@router.post("/sleep")
async def sleep(body: ComponentsBody, request: Request, grant: AuthGrant) -> dict[str, object]:
    trainer = _trainer(request, grant)
    return await _answer(trainer.sleep.sleep(body.components, model=body.model))


@router.post("/wake")
async def wake(body: ComponentsBody, request: Request, grant: AuthGrant) -> dict[str, object]:
    trainer = _trainer(request, grant)
    return await _answer(trainer.sleep.wake(body.components, model=body.model))


@router.post("/rollouts", status_code=202)
async def submit_rollouts(
    body: RolloutBody, request: Request, grant: AuthGrant
) -> dict[str, object]:
    require_general(grant)
    groups = ctx_of(request).trainer.rollouts
    with creation_errors():
        group = groups.submit(
            prompt=body.prompt,
            k=body.k,
            seeds=body.seeds,
            steps=body.steps,
            num_frames=body.num_frames,
            width=body.width,
            height=body.height,
            model=body.model,
            latents=body.latents,
        )
    return {"id": group.group_id, "samples": [j.id for j in group.jobs], "seeds": group.seeds}


@router.get("/rollouts/{group_id}")
async def rollout_group(group_id: str, request: Request, grant: AuthGrant) -> dict[str, object]:
    """The group, its samples (jobs: state, artifact) and the records written so far (all of
    them once ``state`` is not ``running``)."""
    require_general(grant)
    ctx = ctx_of(request)
    group = ctx.trainer.rollouts.group(group_id)
    if group is None:
        raise ApiError(404, "not_found", f"no rollout group {group_id!r} in this process")
    if group.state != "running":
        await asyncio.wait_for(group.finished.wait(), 30.0)
    records = await ctx.store.run(ctx.trainer.rollouts.records, group)
    return {**group.view(), "records": records}


@router.get("/rollouts/{group_id}/latents/{sample_id}/{chunk}")
async def rollout_latents(
    group_id: str, sample_id: str, chunk: int, request: Request, grant: AuthGrant
) -> FileResponse:
    """One chunk's per-step latents of a sample of a group queued with ``"latents": true``:
    an ``.npz`` of ``step_0`` ... (float32 ``[1, C, f, h, w]``, after each denoising step)."""
    require_general(grant)
    group = ctx_of(request).trainer.rollouts.group(group_id)
    if group is None or (path := group.latents.get((sample_id, chunk))) is None:
        raise ApiError(404, "not_found", f"no latents of {sample_id}@{chunk} in group {group_id!r}")
    await asyncio.wait_for(group.finished.wait(), 30.0)  # every file of the group written
    return FileResponse(path, media_type="application/octet-stream", filename=path.name)
