"""PixelDiT: x0-prediction behind the loops' velocity interface, and absolute positions."""

from __future__ import annotations

import torch

from models.tinyworld.components import load_checkpoint, new_components, save_checkpoint
from models.tinyworld.prediction import PixelDiT
from models.wan.kv.cache import ChunkKVCache


def _dit(seed: int = 0) -> PixelDiT:
    dit, _, _ = new_components("tinyworld-test", seed=seed)
    return dit.eval()


def _cache(dit: PixelDiT) -> ChunkKVCache:
    return ChunkKVCache.allocate(
        dit.config,
        batch=1,
        sink_frames=0,
        window_frames=2,
        tokens_per_frame=4,
        device="cpu",
        dtype=torch.float32,
    )


def test_x0_prediction_round_trips_through_the_loops_velocity() -> None:
    dit = _dit()
    g = torch.Generator().manual_seed(3)
    x = torch.randn((1, 3, 2, 32, 32), generator=g)
    cross = dit.cross_kv(torch.randn((1, 8, dit.config.text_dim), generator=g))
    cache = _cache(dit)
    with torch.no_grad():
        for t in (1000.0, 500.0, 250.0):
            timestep = torch.tensor([t])
            x0 = dit.predict_x0(x, timestep, cross, cache, 0)
            v = dit.forward_chunk(x, timestep, cross, cache, 0)
            assert torch.allclose(x - (t / 1000.0) * v, x0, atol=1e-5)
        v0 = dit.forward_chunk(x, torch.zeros(1), cross, cache, 0)  # the KV-update pass
    assert torch.isfinite(v0).all()


def test_positions_start_as_a_no_op_and_then_tell_tokens_apart() -> None:
    dit = _dit()
    assert torch.count_nonzero(dit.position_tokens((1, 2, 2), torch.device("cpu"))) == 0
    for p in dit.position_embedding.parameters():
        p.data.normal_(0, 0.5, generator=torch.Generator().manual_seed(1))
    tokens = dit.position_tokens((2, 2, 3), torch.device("cpu"))  # frame-major
    assert tokens.shape == (12, dit.config.dim)
    assert torch.equal(tokens[:6], tokens[6:])  # the same place in every frame
    assert len({tuple(t.tolist()) for t in tokens[:6]}) == 6  # every place its own
    for p in dit.frame_embedding.parameters():
        p.data.normal_(0, 0.5, generator=torch.Generator().manual_seed(2))
    dit.chunk_frames = 2
    when = dit.position_tokens((4, 2, 3), torch.device("cpu"))  # two chunks of two frames
    assert not torch.allclose(when[:6], when[6:12])  # frame 0 and frame 1 of a chunk differ
    assert torch.equal(when[:12], when[12:])  # and every chunk counts from 0 again
    # a constant input now gives position-dependent output (plain RoPE could not)
    cross = dit.cross_kv(torch.zeros((1, 8, dit.config.text_dim)))
    with torch.no_grad():
        x0 = dit.predict_x0(
            torch.zeros((1, 3, 1, 32, 32)), torch.tensor([1000.0]), cross, _cache(dit), 0
        )
    patches = x0[0, :, 0].unfold(1, 16, 16).unfold(2, 16, 16)  # [3, 2, 2, 16, 16]
    assert not torch.allclose(patches[:, 0, 0], patches[:, 1, 1], atol=1e-4)


def test_checkpoints_round_trip_and_older_ones_load_without_positions(tmp_path) -> None:
    dit, _, text = new_components("tinyworld-test", seed=2)
    for p in dit.position_embedding.parameters():
        p.data.fill_(0.1)
    save_checkpoint(tmp_path / "a.safetensors", dit, text, {"steps": 1})
    loaded, _, _, recipe = load_checkpoint(tmp_path / "a.safetensors")
    assert recipe == {"steps": 1}
    for (name, a), (_, b) in zip(
        dit.state_dict().items(), loaded.state_dict().items(), strict=True
    ):
        assert torch.equal(a, b), name
    from safetensors import safe_open
    from safetensors.torch import save_file

    with safe_open(str(tmp_path / "a.safetensors"), framework="pt") as f:
        meta = f.metadata()
        old = {k: f.get_tensor(k) for k in f.keys()}  # noqa: SIM118
    old = {k: v for k, v in old.items() if not k.startswith("dit.position_embedding.")}
    save_file(old, str(tmp_path / "old.safetensors"), metadata=meta)
    legacy, _, _, _ = load_checkpoint(tmp_path / "old.safetensors")
    assert torch.count_nonzero(legacy.position_tokens((1, 2, 2), torch.device("cpu"))) == 0
