"""When a new input restarts the chunk in flight instead of waiting for the next one.

``chunk_rollout`` asks its ``RestartPolicy`` at ``absorb`` (a step boundary) whether an input
that changes the picture - a prompt ``switch``, a ``cut``, a changed key (``action``) - should
restart the chunk being generated: it then starts again at the same stream position with the
input latched (a switch re-caches first, a cut starts a new segment) and its finished steps
are dropped. Otherwise the input waits for the next chunk boundary.

The trade, in DiT-forward units (one denoising step = 1), for a chunk of ``n`` steps of which
``j`` are done and ``r = n - j`` remain::

    finish      the input waits for the chunk in flight: r steps, its decode (d) and its KV
                update (u; 0 when the card caches K/V in its last step), then its own chunk
    regenerate  the in-flight chunk restarts now; the j finished steps run again

Both paths then generate the same chunk under the input (re-cache, n steps, decode), so
regenerating shows the input ``r + d + u`` sooner, and it costs the ``j`` forwards already spent,
which the device (every session on it) pays again. ``RegenerateWhenSooner`` restarts when the
work thrown away is less than the wait it saves (``j < r + d + u``: with 4 steps, up to 2 done)
and at most ``max_restarts`` times per chunk position (a flood of prompts cannot starve the
stream). No policy may restart a chunk whose frames are already decoded (they may be on
screen) or whose K/V is already in the cache (a folded card's last step): that chunk is
finished, and the input takes the next.

``RestartCutsOnly`` is the plain policy (a cut always restarts, a switch or a key
never), kept to be measured against.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal, Protocol

__all__ = [
    "ChunkProgress",
    "RegenerateWhenSooner",
    "RestartCutsOnly",
    "RestartKind",
    "RestartPolicy",
    "restart_policy",
]

RestartKind = Literal["switch", "cut", "action"]


@dataclass(frozen=True, slots=True)
class ChunkProgress:
    """Where the in-flight chunk stands. ``kv_update_units``: 1 if a separate KV update pass
    follows the chunk's decode, 0 if the last step writes it; ``restarts``: how often this
    chunk position has restarted already."""

    steps_done: int
    steps_total: int
    decoded: bool
    kv_written: bool
    kv_update_units: int
    restarts: int

    @property
    def finished(self) -> bool:
        """Frames out or K/V cached: the chunk can no longer be replaced."""
        return self.decoded or self.kv_written


class RestartPolicy(Protocol):
    name: str

    def restart(self, kind: RestartKind, progress: ChunkProgress) -> bool: ...


class RegenerateWhenSooner:
    """Restart iff the work dropped is less than the wait saved (see module docstring)."""

    name = "regenerate-when-sooner"

    def __init__(self, *, decode_units: float = 1.0, max_restarts: int = 1) -> None:
        if decode_units < 0 or max_restarts < 0:
            raise ValueError(
                f"decode_units={decode_units} and max_restarts={max_restarts} must be >= 0"
            )
        self.decode_units = decode_units
        self.max_restarts = max_restarts

    def restart(self, kind: RestartKind, progress: ChunkProgress) -> bool:
        if progress.finished or progress.restarts >= self.max_restarts:
            return False
        remaining = progress.steps_total - progress.steps_done
        saved = remaining + self.decode_units + progress.kv_update_units
        return progress.steps_done < saved


class RestartCutsOnly:
    """The plain policy: a cut restarts the chunk unless it is finished; nothing else does."""

    name = "cuts-only"

    def restart(self, kind: RestartKind, progress: ChunkProgress) -> bool:
        return kind == "cut" and not progress.finished


def restart_policy(name: str) -> RestartPolicy:
    """The policy a chunk's capture names (``restart_policy``), with the parameters the server
    serves it with, so a replay latches inputs where the live run did."""
    policies: dict[str, type[RestartPolicy]] = {
        RegenerateWhenSooner.name: RegenerateWhenSooner,
        RestartCutsOnly.name: RestartCutsOnly,
    }
    if name not in policies:
        raise ValueError(f"restart policy {name!r} is not one of {sorted(policies)}")
    return policies[name]()
