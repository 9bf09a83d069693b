"""The chunk-KV slab pool (docs/architecture.md §4): which slab index belongs to whom, never
the tensors.

The model instance preallocates ONE K/V buffer per (card, geometry) with a slab axis
(``models/wan/kv/slabs.py``); a session's cache is a view of one slab. This pool is the
bookkeeping of that axis, and admission owns one pool per buffer (the one KV capacity gate)::

    model-owned k (v alike): [layers, N slabs, (S + W) * T tokens, heads, head_dim]
                 slab 0           slab 1           slab 2                slab N-1
    pool:      +----------------+----------------+----------------+ ... +----------------+
               | owner "ses_a"  | free           | owner "ses_b"  |     | owner "ses_a/f"|
               | gen 1          | gen 3          | gen 1          |     | gen 2, parent 0|
               +----------------+----------------+----------------+ ... +----------------+

Allocation takes the lowest free index (deterministic). Every allocation of an index bumps its
*generation*, so a stale handle can be told from the live one. ``fork`` allocates a fresh slab
and records the parent; the model copies the parent's slab into it (copy-on-fork).

Exhaustion is a value (``None``), misuse (freeing someone else's slab) raises. Pure: no torch,
no asyncio. Not thread-safe (event loop only). Small model outputs (text embeddings) are cached
by the model that makes them (``models.wan.text_encoder.TextEmbeddingCache``), not here.
"""

from __future__ import annotations

import heapq
from dataclasses import dataclass

__all__ = ["KVSlabPool", "Slab", "SlabOwnershipError"]


class SlabOwnershipError(RuntimeError):
    """A handle does not match the slab's current allocation (double free after reuse,
    freeing or forking a slab that belongs to another owner)."""


@dataclass(frozen=True, slots=True)
class Slab:
    """Handle to one allocated slab: ``slab_id`` is its index on the model buffer's slab axis."""

    slab_id: int
    owner: str
    generation: int
    slab_bytes: int
    parent_id: int | None = None


class KVSlabPool:
    """Fixed budget of ``num_slabs`` slabs of ``slab_bytes`` each."""

    def __init__(self, num_slabs: int, slab_bytes: int) -> None:
        if num_slabs < 0 or slab_bytes <= 0:
            raise ValueError(f"num_slabs={num_slabs} must be >= 0 and slab_bytes={slab_bytes} > 0")
        self.num_slabs = num_slabs
        self.slab_bytes = slab_bytes
        self._free: list[int] = list(range(num_slabs))
        heapq.heapify(self._free)
        self._live: dict[int, Slab] = {}
        self._generations = [0] * num_slabs

    @property
    def capacity(self) -> int:
        return self.num_slabs

    @property
    def capacity_bytes(self) -> int:
        return self.num_slabs * self.slab_bytes

    @property
    def free_count(self) -> int:
        return len(self._free)

    @property
    def used_count(self) -> int:
        return len(self._live)

    def allocate(self, owner: str) -> Slab | None:
        """The lowest free slab for ``owner``, or ``None`` when the pool is exhausted."""
        return self._take(owner, parent_id=None)

    def fork(self, slab: Slab, owner: str) -> Slab | None:
        """A fresh slab whose parent is ``slab`` (the model copies the KV into it);
        ``None`` when exhausted. ``slab`` must be live."""
        self._check_live(slab, "fork")
        return self._take(owner, parent_id=slab.slab_id)

    def free(self, slab: Slab) -> None:
        """Return a slab. Freeing an already free slab is a no-op; freeing a stale handle
        whose index was reallocated (to anyone) raises ``SlabOwnershipError``."""
        live = self._live.get(slab.slab_id)
        if live is None:
            if not 0 <= slab.slab_id < self.num_slabs:
                raise SlabOwnershipError(
                    f"slab {slab.slab_id} is not in a pool of {self.num_slabs}"
                )
            return
        if live != slab:
            raise SlabOwnershipError(
                f"free of slab {slab.slab_id} by {slab.owner!r} (generation {slab.generation}) but "
                f"it is held by {live.owner!r} (generation {live.generation})"
            )
        del self._live[slab.slab_id]
        heapq.heappush(self._free, slab.slab_id)

    def owner_of(self, slab_id: int) -> str | None:
        live = self._live.get(slab_id)
        return None if live is None else live.owner

    def parent_of(self, slab_id: int) -> int | None:
        live = self._live.get(slab_id)
        return None if live is None else live.parent_id

    def slabs_of(self, owner: str) -> list[Slab]:
        return sorted((s for s in self._live.values() if s.owner == owner), key=_slab_id)

    def _take(self, owner: str, parent_id: int | None) -> Slab | None:
        if not self._free:
            return None
        slab_id = heapq.heappop(self._free)
        self._generations[slab_id] += 1
        slab = Slab(slab_id, owner, self._generations[slab_id], self.slab_bytes, parent_id)
        self._live[slab_id] = slab
        return slab

    def _check_live(self, slab: Slab, action: str) -> None:
        live = self._live.get(slab.slab_id)
        if live != slab:
            held = (
                "free" if live is None else f"held by {live.owner!r} (generation {live.generation})"
            )
            raise SlabOwnershipError(
                f"{action} of slab {slab.slab_id} (owner {slab.owner!r}, generation "
                f"{slab.generation}) but it is {held}"
            )


def _slab_id(slab: Slab) -> int:
    return slab.slab_id
