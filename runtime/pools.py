"""Pools with static budgets (ARCHITECTURE.md §5): which slots are used, never the tensors.

``KVSlabPool`` hands out fixed-size chunk-KV slabs. The model preallocates one tensor region
for the whole pool and writes a session's KV by slab index; the pool only tracks which index
belongs to whom::

    model-owned buffer, num_slabs x slab_bytes, preallocated once
    offset 0         slab_bytes        2*slab_bytes              (num_slabs-1)*slab_bytes
    +----------------+-----------------+-----------------+ ... +-----------------+
    | slab 0         | slab 1          | slab 2          |     | slab N-1        |
    | owner "sess-a" | free            | owner "sess-b"  |     | owner "sess-a/f1"|
    | gen 0          |                 | gen 3           |     | gen 1 parent 0  |
    +----------------+-----------------+-----------------+ ... +-----------------+
    inside one slab (model's layout): [layers, 2 (k,v), window_frames * tokens, heads, head_dim]

Allocation takes the lowest free index (deterministic). Every allocation of an index bumps its
*generation*, so a stale handle can be told from the live one. ``fork`` allocates a fresh slab
and records the parent; the model copies the parent's KV into it (copy-on-fork). A decoder
feature cache (causal VAE state per session) is a second ``KVSlabPool`` with its own budget.

``FeatureCache`` holds small model outputs (e.g. text embeddings) by ``CacheKey``,
ref-counted; only unreferenced entries are evicted, least recently used first.

Exhaustion is a value (``None`` / ``False``), misuse (freeing someone else's slab, releasing
an unacquired entry) raises. Pure: no torch, no asyncio. Not thread-safe (event loop only).
"""

from __future__ import annotations

import heapq
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any

from runtime.contract import CacheKey

__all__ = ["FeatureCache", "FeatureCacheError", "KVSlabPool", "Slab", "SlabOwnershipError"]


class SlabOwnershipError(RuntimeError):
    """A handle does not match the slab's current allocation (double free after reuse,
    freeing or forking a slab that belongs to another owner)."""


class FeatureCacheError(RuntimeError):
    """Releasing an entry that is not held (refcount would go negative)."""


@dataclass(frozen=True, slots=True)
class Slab:
    """Handle to one allocated slab. ``offset_bytes`` locates it in the model's buffer."""

    slab_id: int
    owner: str
    generation: int
    slab_bytes: int
    parent_id: int | None = None

    @property
    def offset_bytes(self) -> int:
        return self.slab_id * self.slab_bytes


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


@dataclass(slots=True)
class _Entry:
    value: Any
    refs: int = 0


class FeatureCache:
    """Up to ``max_entries`` values by ``CacheKey``; LRU eviction of unreferenced entries.

    ``get`` reads (and refreshes recency); ``acquire`` reads and pins (refcount + 1) so the
    entry cannot be evicted until ``release``. ``put`` returns ``False`` when the cache is full
    of pinned entries (the value is then simply not cached).
    """

    def __init__(self, max_entries: int) -> None:
        if max_entries < 0:
            raise ValueError(f"max_entries={max_entries} must be >= 0")
        self.max_entries = max_entries
        self._entries: OrderedDict[CacheKey, _Entry] = OrderedDict()
        self.hits = 0
        self.misses = 0
        self.evictions = 0

    def __len__(self) -> int:
        return len(self._entries)

    def __contains__(self, key: CacheKey) -> bool:
        return key in self._entries

    def get(self, key: CacheKey) -> Any | None:
        entry = self._entries.get(key)
        if entry is None:
            self.misses += 1
            return None
        self.hits += 1
        self._entries.move_to_end(key)
        return entry.value

    def put(self, key: CacheKey, value: Any) -> bool:
        """Insert or replace; evicts the least recently used unreferenced entry if full."""
        entry = self._entries.get(key)
        if entry is not None:
            entry.value = value
            self._entries.move_to_end(key)
            return True
        if len(self._entries) >= self.max_entries and not self._evict_one():
            return False
        self._entries[key] = _Entry(value)
        return True

    def acquire(self, key: CacheKey) -> Any | None:
        """The value, pinned; ``None`` (a miss) if absent."""
        entry = self._entries.get(key)
        if entry is None:
            self.misses += 1
            return None
        self.hits += 1
        entry.refs += 1
        self._entries.move_to_end(key)
        return entry.value

    def release(self, key: CacheKey) -> None:
        entry = self._entries.get(key)
        if entry is None or entry.refs == 0:
            raise FeatureCacheError(f"release of {key} which is not acquired")
        entry.refs -= 1

    def refs(self, key: CacheKey) -> int:
        entry = self._entries.get(key)
        return 0 if entry is None else entry.refs

    def _evict_one(self) -> bool:
        for key, entry in self._entries.items():
            if entry.refs == 0:
                del self._entries[key]
                self.evictions += 1
                return True
        return False
