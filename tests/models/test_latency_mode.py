"""The latency mode: 1-latent-frame chunks on the Wan architecture."""

from __future__ import annotations

import asyncio

import pytest

from models.card import CardError
from models.instance import load_instance
from models.loops.requests import SessionRequest
from models.registry import get
from runtime.driver import run_inline


def test_one_latent_frame_chunks_keep_the_cards_attention_window() -> None:
    card = get("wan2.1-1.3b-causal")
    fast = card.with_chunk_frames(1)
    assert fast.default_profile.chunk_latent_frames == 1
    assert card.default_profile.chunk_latent_frames == 3  # the registry's card is unchanged
    # window 9 counts the chunk being generated: 3 sink + 8 ring cached + 1 new = 12 frames,
    # the same 12 latent frames of keys as 3 sink + 6 ring + 3 new by default
    contract = fast.caches["chunk_kv"]
    ring = contract.window_latent_frames - 1
    assert (contract.sink_latent_frames, ring) == (3, 8)
    assert contract.sink_latent_frames + ring + 1 == 3 + (9 - 3) + 3
    with pytest.raises(CardError, match="cannot hold one chunk of 10 latent frames"):
        card.with_chunk_frames(10)


def test_a_session_in_the_latency_mode_streams_four_frames_per_chunk() -> None:
    instance = load_instance(get("wan-tiny-random").with_chunk_frames(1), device="cpu")
    assert instance.kv_geometry(1) == (3, 5)
    # 1 latent frame = 4 video frames at 8 fps: half a second of media per chunk
    assert instance.chunk_seconds(instance.card.default_profile) == pytest.approx(0.5)
    loop = instance.loop("chunk_rollout")
    _, emissions = asyncio.run(
        run_inline(loop, SessionRequest(prompt="a red ball", seed=1, max_chunks=4), instance)
    )
    media = [e for e in emissions if e.spec.stream == "media"]
    # the stream's first latent frame decodes to one picture, every later one to four
    assert [e.output.shape[0] for e in media] == [1, 4, 4, 4]
    assert all(e.spec.meta.final for e in media)  # one part per chunk
    assert [e.spec.meta.pts_90k for e in media] == [0, 11250, 56250, 101250]
