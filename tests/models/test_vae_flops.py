"""The VAE decode's analytic FLOPs (the cost prior's share for it) against torch's own count,
and ``WanInstance.chunk_flops`` = denoise steps + one KV update + the decode."""

from __future__ import annotations

import dataclasses

import pytest
import torch
from torch.utils.flop_counter import FlopCounterMode

from models.card import KVUpdate
from models.instance import load_instance
from models.registry import get
from models.wan.dit.flops import dit_flops
from models.wan.vae.autoencoder import WanVAE
from models.wan.vae.config import WanVAEConfig


@pytest.mark.parametrize(("first", "frames"), [(True, 1), (True, 3), (False, 3), (False, 2)])
def test_decode_flops_equal_torch_flop_counter(first: bool, frames: int) -> None:
    vae = WanVAE(WanVAEConfig.preset("tiny")).eval()
    cache = vae.new_decoder_cache(1, 6, 10)
    with torch.no_grad():
        if not first:  # mid-stream: the cache has seen a first chunk
            vae.decode_chunk(torch.randn(1, 16, 1, 6, 10), cache)
        with FlopCounterMode(display=False) as counter:
            vae.decode_chunk(torch.randn(1, 16, frames, 6, 10), cache)
    assert vae.decode_flops(frames, 6, 10, first=first) == counter.get_total_flops()


def test_chunk_flops_count_steps_kv_update_once_and_decode() -> None:
    card = get("wan-tiny-random")
    instance = load_instance(card, device="cpu")
    profile = card.default_profile
    lh, lw = (
        profile.height // card.latent.spatial_stride,
        profile.width // card.latent.spatial_stride,
    )
    sink, ring = instance.kv_geometry(profile.chunk_latent_frames)
    t = instance.tokens_per_frame(lh, lw)
    q = profile.chunk_latent_frames * t
    step = dit_flops(instance.dit.config, q, (sink + ring) * t + q, instance.text_len)
    decode = instance.vae.decode_flops(profile.chunk_latent_frames, lh, lw)
    assert instance.decode_flops(profile) == decode > 0
    assert instance.chunk_flops(profile) == pytest.approx(step * (profile.steps + 1) + decode)
    # a card whose last denoise step writes the cache has no separate KV pass
    spec = dataclasses.replace(card.loops["chunk_rollout"], kv_update=KVUpdate.LAST_STEP)
    instance.card = dataclasses.replace(card, loops={**card.loops, "chunk_rollout": spec})
    assert instance.chunk_flops(profile) == pytest.approx(step * profile.steps + decode)
