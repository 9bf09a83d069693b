"""``GET /v1/deployment`` (this engine's DeploymentCard, ``server.fleet.deployment``) and
``POST /v1/deployment/drain`` (docs/api.md "Fleet").
"""

from __future__ import annotations

from fastapi import APIRouter, Request

from server.api.deps import AuthGrant, ctx_of, require_general
from server.edge.errors import ApiError
from server.fleet.deployment import deployment_card

__all__ = ["router"]

router = APIRouter()


@router.get("/v1/deployment")
def get_deployment(request: Request, grant: AuthGrant) -> dict[str, object]:
    """This engine's DeploymentCard (the same data the fleet's ``card`` endpoint serves)."""
    require_general(grant)
    return deployment_card(ctx_of(request))


@router.post("/v1/deployment/drain", status_code=202)
async def drain(request: Request, grant: AuthGrant) -> dict[str, object]:
    """Stop taking placements: the card says ``draining``; with ``--fleet`` the engine leaves
    the fleet once its last session has ended. Admin only; idempotent."""
    if not grant.is_admin:
        raise ApiError(403, "forbidden", "draining needs the admin key or an admin token")
    ctx = ctx_of(request)
    ctx.draining = True
    if ctx.fleet is not None:
        ctx.fleet.drain()
    live = [s.id for s in ctx.host.sessions() if not s.terminal]
    return {"health": "draining", "sessions": len(live)}
