"""runtime/spmd.py's Channel and agreement on 2 gloo processes, with toy tensors (no model).

How arguments travel: a view of a rank-local buffer resolves to the follower's own buffer; a
tensor crosses once and then by key; one modified in place crosses again; one freed on the
leader is dropped on the follower. Agreement: an op error on one rank is every rank's error.
"""

from __future__ import annotations

import gc

import pytest
import torch

from tests.gloo_world import run_world

pytestmark = pytest.mark.slow


def _worker(rank: int, world: int) -> dict:
    from runtime.executor import _Attempt
    from runtime.observers import PlanFault
    from runtime.spmd import Channel

    local = torch.full((4, 3), float(rank))  # each rank's own buffer, same shape
    channel = Channel(local_buffers={"slab": local})
    out: dict = {}
    if rank == 0:
        shared = torch.arange(6.0)
        channel.publish({"view": local[1:3, 1], "t": shared, "n": 7})
        channel.publish({"again": shared})
        shared.add_(1)  # in place: must cross again
        channel.publish({"changed": shared})
        temp = torch.ones(2)
        channel.publish({"temp": temp})
        del temp
        gc.collect()
        channel.publish("probe")  # carries the drop of temp
    else:
        first = channel.receive()
        out["view_is_mine"] = bool((first["view"] == 1.0).all()) and first["view"].shape == (2,)
        out["view_shares_storage"] = (
            first["view"].untyped_storage().data_ptr() == local.untyped_storage().data_ptr()
        )
        out["n"] = first["n"]
        again = channel.receive()["again"]
        out["same_object"] = again is first["t"]
        out["changed"] = channel.receive()["changed"].tolist()
        channel.receive()  # temp
        held_with_temp = channel.held
        channel.receive()  # probe
        out["dropped"] = held_with_temp - channel.held
    # agreement: rank 1's op error and rank 0's fault on plan 1 of a 2-plan batch
    if rank == 1:
        attempt = _Attempt(None, ("step_exception", "boom"), {}, 0.0, None)
    else:
        attempt = _Attempt([1, 2], None, {1: PlanFault(1, "nan", "bad")}, 0.0, None)
    agreed = channel.agree(attempt, 2)
    out["agreed_error"] = agreed.error
    clean = _Attempt([1, 2], None, {}, 0.0, None)
    out["clean_kept"] = channel.agree(clean, 2) is clean
    fault = _Attempt([1, 2], None, {1: PlanFault(1, "nan", "bad")} if rank else {}, 0.0, None)
    got = channel.agree(fault, 2)
    out["fault"] = (got.error, {i: (f.code, f.message) for i, f in got.faults.items()})
    return out


@pytest.fixture(scope="module")
def world() -> list[dict]:
    return run_world(_worker, 2)


def test_views_of_local_buffers_resolve_to_the_followers_own(world: list[dict]) -> None:
    follower = world[1]
    assert follower["view_is_mine"] and follower["view_shares_storage"]
    assert follower["n"] == 7


def test_tensors_cross_once_again_when_changed_and_drop_when_freed(world: list[dict]) -> None:
    follower = world[1]
    assert follower["same_object"]
    assert follower["changed"] == [1.0, 2.0, 3.0, 4.0, 5.0, 6.0]
    assert follower["dropped"] == 1


def test_any_ranks_failure_is_every_ranks(world: list[dict]) -> None:
    for rank in world:
        assert rank["agreed_error"] == ("step_exception", "rank 1: boom")
        assert rank["clean_kept"]
        assert rank["fault"] == (None, {1: ("nan", "rank 1: bad")})
