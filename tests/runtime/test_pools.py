"""KV slab pool bookkeeping."""

from __future__ import annotations

import pytest

from runtime.pools import KVSlabPool, SlabOwnershipError


def test_allocate_until_exhausted_then_none_and_free_restores() -> None:
    pool = KVSlabPool(num_slabs=3, slab_bytes=1024)
    slabs = [pool.allocate(f"s{i}") for i in range(3)]
    assert [s.slab_id for s in slabs if s] == [0, 1, 2]
    assert pool.allocate("s3") is None and pool.free_count == 0 and pool.used_count == 3
    pool.free(slabs[1])  # type: ignore[arg-type]
    assert pool.free_count == 1 and pool.owner_of(1) is None
    again = pool.allocate("s3")
    assert (
        again is not None
        and again.slab_id == 1
        and again.generation == 2
        and pool.owner_of(1) == "s3"
    )
    assert pool.capacity == 3 and pool.capacity_bytes == 3072


def test_free_is_idempotent_but_stale_handles_raise() -> None:
    pool = KVSlabPool(num_slabs=1, slab_bytes=8)
    a = pool.allocate("a")
    assert a is not None
    pool.free(a)
    pool.free(a)  # already free: no-op
    assert pool.free_count == 1
    b = pool.allocate("b")
    assert b is not None and b.slab_id == a.slab_id
    with pytest.raises(SlabOwnershipError, match="held by 'b'"):
        pool.free(a)  # a's handle is stale: the slab is b's now
    assert pool.owner_of(0) == "b"


def test_fork_allocates_a_child_and_records_parentage() -> None:
    pool = KVSlabPool(num_slabs=3, slab_bytes=8)
    parent = pool.allocate("sess")
    assert parent is not None
    kids = [pool.fork(parent, f"sess/fork{i}") for i in range(2)]
    assert [k.parent_id for k in kids if k] == [parent.slab_id] * 2
    assert pool.parent_of(kids[0].slab_id) == parent.slab_id  # type: ignore[union-attr]
    assert pool.fork(parent, "sess/fork2") is None  # exhausted: a value, not an exception
    pool.free(parent)
    with pytest.raises(SlabOwnershipError, match="free"):
        pool.fork(parent, "late")
    assert [s.owner for s in pool.slabs_of("sess/fork1")] == ["sess/fork1"]
