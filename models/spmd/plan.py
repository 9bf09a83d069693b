"""The plan a card runs under on a world of ``world_size`` processes, checked before any weight
loads against its DiT's config (the family's preset table).

Above the card (``models/card/parallel.py`` holds the plan as card data) and the families'
configs it reads, so neither imports the other.
"""

from __future__ import annotations

from typing import Any

from models.card import ModelCard, ParallelPlan, ParallelPlanError
from models.tinyworld.config import dit_preset
from models.wan.dit.config import WanDiTConfig

__all__ = ["dit_config", "plan_for"]


def dit_config(card: ModelCard) -> Any:
    """``card``'s DiT config (a ``WanDiTConfig``) from its family's preset table - pure data:
    nothing is built, so a plan is checked before any weight loads."""
    preset = card.components["dit"].preset
    if card.family == "tinyworld":
        return dit_preset(preset)
    return WanDiTConfig.preset(preset)


def plan_for(card: ModelCard, world_size: int) -> ParallelPlan:
    """The plan ``card`` runs under on ``world_size`` processes: its own ``parallel`` when that
    spans the world, else ``sp`` over all of them. Checked before load (``ParallelPlanError``):
    the world, the heads, and that a latent frame's tokens at the default profile split by
    ``sp`` (every chunk and re-cache is whole frames)."""
    plan = card.parallel if card.parallel.world_size == world_size else ParallelPlan(sp=world_size)
    config = dit_config(card)
    found = plan.problems(world_size=world_size, num_heads=config.num_heads)
    profile, stride = card.default_profile, card.latent.spatial_stride
    tokens = config.tokens_per_frame(profile.height // stride, profile.width // stride)
    if tokens % plan.sp:
        found.append(
            f"sp={plan.sp} does not divide the {tokens} tokens of a latent frame at "
            f"{profile.width}x{profile.height}"
        )
    if found:
        raise ParallelPlanError(found, card.model_id)
    return plan.check(world_size=world_size, num_heads=config.num_heads, model_id=card.model_id)
