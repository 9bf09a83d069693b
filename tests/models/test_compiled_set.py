"""The compiled set of a card: its default profile and ``compiled_sizes`` at its chunk size."""

from __future__ import annotations

from dataclasses import replace

import pytest

from models.card import CardError
from models.compiled_set import compiled_set
from models.wan.card import WAN21_13B_CAUSAL, WAN_TINY_RANDOM


def test_the_wan_causal_card_serves_its_default_and_the_small_profile_compiled() -> None:
    served = compiled_set(WAN21_13B_CAUSAL)
    assert served.describe() == ["832x480/3", "480x272/3"]
    assert served.covers(480, 272, 3) and served.covers(832, 480, 3)
    assert not served.covers(640, 352, 3)  # allowed by the card, but served eagerly
    assert WAN21_13B_CAUSAL.to_public()["compiled_sizes"] == [[480, 272]]


def test_the_latency_mode_moves_every_profile_to_its_chunk_size() -> None:
    served = compiled_set(WAN21_13B_CAUSAL.with_chunk_frames(1))
    assert served.describe() == ["832x480/1", "480x272/1"]
    assert not served.covers(832, 480, 3)


def test_a_tiny_card_serves_its_default_only_and_duplicates_collapse() -> None:
    assert compiled_set(WAN_TINY_RANDOM).describe() == ["64x64/3"]
    card = replace(WAN_TINY_RANDOM, compiled_sizes=((64, 64), (32, 32), (32, 32)))
    assert compiled_set(card).describe() == ["64x64/3", "32x32/3"]


def test_a_compiled_size_off_the_pixel_multiple_is_a_card_error() -> None:
    with pytest.raises(CardError, match="compiled_sizes entry 40x32"):
        replace(WAN_TINY_RANDOM, compiled_sizes=((40, 32),)).validate()


def test_a_batching_server_serves_every_batch_size_of_each_profile_up_to_its_max_batch() -> None:
    served = compiled_set(WAN21_13B_CAUSAL, max_batch=5)
    assert served.describe() == ["832x480/3 x1-5", "480x272/3 x1-5"]
    assert all(served.covers(480, 272, 3, batch=k) for k in range(1, 6))
    assert not served.covers(480, 272, 3, batch=6)  # the engine forms no bigger batch
    assert not served.covers(640, 352, 3, batch=2)
    alone = compiled_set(WAN21_13B_CAUSAL)  # no batching: batch 1 only
    assert alone.covers(832, 480, 3) and not alone.covers(832, 480, 3, batch=2)
    with pytest.raises(ValueError, match="max_batch=0"):
        compiled_set(WAN21_13B_CAUSAL, max_batch=0)
