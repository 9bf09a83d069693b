"""C1 parity of tiny-world's recipe: the trainer's one-pass pair forward equals what the loop
computes (KV update of the context chunk at t = 0, then the target chunk against the cache)."""

from __future__ import annotations

import pytest
import torch

from models.tinyworld.card import TINY_WORLD
from models.tinyworld.components import new_components
from models.tinyworld.training.teacher_forcing import (
    TeacherForcingShapeError,
    pair_mask,
    pair_prediction,
)
from models.wan.kv.cache import ChunkKVCache

TOLERANCE = TINY_WORLD.parity.tolerances["teacher_forced_vs_chunk_rollout"]


def _dit():
    dit, _, _ = new_components("tinyworld-test", seed=0)
    g = torch.Generator().manual_seed(1)
    for hook in (
        dit.action_embedding,
        dit.audio_embedding,
        dit.position_embedding,
        dit.frame_embedding,
    ):
        for p in hook.parameters():
            p.data.copy_(torch.randn(p.shape, generator=g) * 0.3)
    return dit.eval()


def _cache(dit, c: int, tokens: int) -> ChunkKVCache:
    return ChunkKVCache.allocate(
        dit.config,
        batch=1,
        sink_frames=0,
        window_frames=c,
        tokens_per_frame=tokens,
        device="cpu",
        dtype=torch.float32,
    )


def _served(
    dit, context, noisy, t, text, has_context, action, action_on, audio, audio_on, frame_start: int
):
    """The loop's computation for one sample: KV update of the context chunk (if any), then
    the denoise step of the target (``None`` where a hook is off)."""
    c = noisy.shape[2]
    cache = _cache(dit, c, dit.config.tokens_per_frame(noisy.shape[3], noisy.shape[4]))
    cross = dit.cross_kv(text)
    hooks = [
        (
            action[:, i] if action_on[0, i] else None,
            audio[:, i * c : (i + 1) * c] if audio_on[0, i] else None,
        )
        for i in range(2)
    ]
    if has_context:
        dit.forward_chunk(
            context,
            torch.zeros(1),
            cross,
            cache,
            frame_start,
            action=hooks[0][0],
            audio=hooks[0][1],
            write_cache=True,
        )
    return dit.predict_x0(
        noisy, t, cross, cache, frame_start + c, action=hooks[1][0], audio=hooks[1][1]
    )


@pytest.mark.parametrize("has_context", [1, 0])
@pytest.mark.parametrize("hooks_on", [(1.0, 1.0), (0.0, 1.0), (1.0, 0.0)])
def test_pair_forward_equals_the_loops_kv_update_then_denoise(has_context, hooks_on) -> None:
    dit = _dit()
    g = torch.Generator().manual_seed(2)
    c = 2
    dit.chunk_frames = c  # frame indices restart every chunk, in both paths
    context = torch.randn((2, 3, c, 32, 48), generator=g)
    noisy = torch.randn((2, 3, c, 32, 48), generator=g)
    t = torch.tensor([750.0, 321.0])
    text = torch.randn((2, 8, dit.config.text_dim), generator=g)
    action = torch.rand((2, 2, dit.config.action_dim), generator=g)
    audio = torch.rand((2, 2 * c, dit.config.audio_dim), generator=g) * 3
    action_on = torch.tensor([hooks_on, hooks_on[::-1]])
    audio_on = torch.tensor([hooks_on[::-1], hooks_on])
    flags = torch.tensor([has_context, 1 - has_context])
    with torch.no_grad():
        ours = pair_prediction(
            dit,
            context,
            noisy,
            t,
            text,
            flags,
            action=action,
            action_on=action_on,
            audio=audio,
            audio_on=audio_on,
        )
        for i in range(2):
            served = _served(
                dit,
                context[i : i + 1],
                noisy[i : i + 1],
                t[i : i + 1],
                text[i : i + 1],
                int(flags[i]),
                action[i : i + 1],
                action_on[i : i + 1],
                audio[i : i + 1],
                audio_on[i : i + 1],
                frame_start=6,
            )
            err = (ours[i : i + 1] - served).abs().max() / served.abs().max()
            assert err < TOLERANCE, f"sample {i}: max relative error {err:.2e}"


def test_context_matters_only_when_the_sample_has_one() -> None:
    dit = _dit()
    g = torch.Generator().manual_seed(4)
    noisy = torch.randn((1, 3, 2, 32, 32), generator=g)
    text = torch.randn((1, 8, dit.config.text_dim), generator=g)
    t = torch.tensor([500.0])
    outs = {}
    with torch.no_grad():
        for flag in (0, 1):
            for seed in (5, 6):
                ctx = torch.randn((1, 3, 2, 32, 32), generator=torch.Generator().manual_seed(seed))
                outs[flag, seed] = pair_prediction(dit, ctx, noisy, t, text, torch.tensor([flag]))
    assert torch.equal(outs[0, 5], outs[0, 6])
    assert not torch.allclose(outs[1, 5], outs[1, 6], atol=1e-3)


def test_pair_mask_layout() -> None:
    m = pair_mask(torch.tensor([1, 0]), 2)[:, 0].int()  # tokens: ctx ctx tgt tgt
    assert m[0].tolist() == [[1, 1, 0, 0], [1, 1, 0, 0], [1, 1, 1, 1], [1, 1, 1, 1]]
    assert m[1].tolist() == [[1, 1, 0, 0], [1, 1, 0, 0], [0, 0, 1, 1], [0, 0, 1, 1]]


def test_shape_errors_name_the_shapes() -> None:
    dit = _dit()
    x = torch.zeros((1, 3, 2, 32, 32))
    with pytest.raises(TeacherForcingShapeError, match=r"timestep \(1, 1\)"):
        pair_prediction(dit, x, x, torch.zeros((1, 1)), torch.zeros((1, 8, 16)), torch.ones(1))
    with pytest.raises(TeacherForcingShapeError, match="must match"):
        pair_prediction(dit, x[:, :, :1], x, torch.zeros(1), torch.zeros((1, 8, 16)), torch.ones(1))
