"""The static facts of one session, fixed at admission (re-exported from ``sessions.session``)."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

__all__ = ["SessionConfig"]


@dataclass(frozen=True, slots=True)
class SessionConfig:
    """Static facts of one session, fixed at admission."""

    session_id: str
    model_id: str
    prompt: str
    seed: int
    fps: int
    width: int
    height: int
    priority_class: Literal["realtime", "batch"]
    capabilities: frozenset[str]
    # static fields of every behaviour record (weights version, loop, sampler, steps, ...)
    record_template: Mapping[str, Any] = field(default_factory=dict)
    # The model's check of an action (keys, (dx, dy)) -> canonical keys; raises ValueError.
    action_validator: Callable[[list[str], tuple[float, float]], list[str]] | None = None
    max_pending_inputs: int = 256  # inputs the loop has not taken yet; beyond: refused
    max_prompt_chars: int = 4000  # a live prompt's limit (the server's --max-prompt-chars)
    decoder: str = "full"  # how its latents become frames: "full" (the VAE) | "tiny"
