"""models/checkpoint/load.py for the DiT: diffusers and original formats load into identical
modules.

Every checkpoint here is written by the test into tmp_path from one random diffusers model.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from diffusers import WanTransformer3DModel
from safetensors import safe_open
from safetensors.torch import load_file, save_file

from models.checkpoint.load import (
    CheckpointFormatError,
    CheckpointKeyError,
    CheckpointShapeError,
    load_transformer,
    save_original_format,
)
from models.wan.dit import keymaps
from models.wan.dit.config import WanDiTConfig
from models.wan.dit.transformer import WanDiT

CFG = WanDiTConfig(
    dim=48,
    num_layers=2,
    num_heads=3,
    ffn_dim=64,
    freq_dim=16,
    in_channels=4,
    out_channels=4,
    text_dim=20,
)


@pytest.fixture(scope="module")
def reference() -> WanTransformer3DModel:
    torch.manual_seed(7)
    return WanTransformer3DModel(**CFG.to_diffusers_config()).eval()


@pytest.fixture(scope="module")
def inputs() -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(3)
    return (
        torch.randn(1, 4, 3, 4, 6, generator=gen),
        torch.tensor([321.0]),
        torch.randn(1, 5, 20, generator=gen),
    )


@pytest.fixture(scope="module")
def diffusers_dir(tmp_path_factory, reference) -> Path:
    path = tmp_path_factory.mktemp("ckpt") / "diffusers"
    reference.save_pretrained(path)
    return path


@pytest.fixture(scope="module")
def baseline(diffusers_dir, inputs) -> tuple[dict[str, torch.Tensor], torch.Tensor]:
    model = load_transformer(diffusers_dir)
    with torch.no_grad():
        return model.state_dict(), model(*inputs)


def assert_same_module(model: WanDiT, baseline, inputs) -> None:
    state, output = baseline
    got = model.state_dict()
    assert got.keys() == state.keys()
    assert all(torch.equal(got[k], state[k]) for k in state)
    with torch.no_grad():
        assert torch.equal(model(*inputs), output)


def test_diffusers_directory_loads_every_parameter_through_the_key_map(reference, baseline):
    state, _ = baseline
    assert len(state) == len(reference.state_dict())
    for key, tensor in reference.state_dict().items():
        assert torch.equal(state[keymaps.to_native(key, keymaps.DIFFUSERS)], tensor), key


def test_key_maps_are_bijections_on_the_real_key_sets(reference):
    native = {keymaps.to_native(k, keymaps.DIFFUSERS): k for k in reference.state_dict()}
    assert None not in native and len(native) == len(reference.state_dict())
    assert set(native) == set(WanDiT(CFG).state_dict())
    for name, diffusers_name in native.items():
        assert keymaps.from_native(name, keymaps.DIFFUSERS) == diffusers_name
        assert keymaps.to_native(name, keymaps.ORIGINAL) == name
    assert keymaps.to_native("blocks.0.attn2.add_k_proj.weight", keymaps.DIFFUSERS) is None


@pytest.mark.parametrize("prefix", ["", "model.", "generator.model.", "model.diffusion_model."])
def test_original_format_file_loads_the_same_module(tmp_path, reference, baseline, inputs, prefix):
    path = save_original_format(reference, tmp_path / "dit.safetensors", prefix=prefix)
    names = load_file(path).keys()
    assert f"{prefix}blocks.1.self_attn.q.weight" in names and f"{prefix}head.head.bias" in names
    assert_same_module(load_transformer(path), baseline, inputs)


def test_sharded_checkpoints_of_both_formats(tmp_path, reference, baseline, inputs):
    index = save_original_format(
        reference, tmp_path / "orig" / "model.safetensors", max_shard_bytes=40_000
    )
    shards = json.loads(index.read_text())["weight_map"].values()
    assert len(set(shards)) > 2
    assert_same_module(load_transformer(index), baseline, inputs)
    assert_same_module(load_transformer(tmp_path / "orig"), baseline, inputs)  # dir with index

    reference.save_pretrained(tmp_path / "diff", max_shard_size="50KB")
    assert list((tmp_path / "diff").glob("*.safetensors.index.json"))
    assert_same_module(load_transformer(tmp_path / "diff"), baseline, inputs)


def test_pipeline_root_and_original_wan_directory(tmp_path, reference, baseline, inputs):
    reference.save_pretrained(tmp_path / "pipe" / "transformer")
    (tmp_path / "pipe" / "model_index.json").write_text("{}")
    assert_same_module(load_transformer(tmp_path / "pipe"), baseline, inputs)

    # Wan's own layout: config.json with dim/num_heads next to the original-format weights
    wan_dir = tmp_path / "wan"
    path = save_original_format(reference, wan_dir / "diffusion_pytorch_model.safetensors")
    save_file(load_file(path), str(path))  # drop the embedded config: config.json must do
    (wan_dir / "config.json").write_text(
        json.dumps({"_class_name": "WanModel", **CFG.to_original_config()})
    )
    assert_same_module(load_transformer(wan_dir), baseline, inputs)


def test_training_checkpoint_picks_the_generator_or_the_named_wrapper(
    tmp_path, reference, baseline, inputs
):
    state = load_file(save_original_format(reference, tmp_path / "a.safetensors"))
    ema = {k: v + 1.0 for k, v in state.items()}
    path = tmp_path / "self_forcing.pt"
    torch.save(
        {
            "generator": {f"model.{k}": v for k, v in state.items()},
            "generator_ema": {f"model.{k}": v for k, v in ema.items()},
            "critic": {"model.blocks.0.self_attn.q.weight": torch.zeros(3)},
            "step": 100,
        },
        path,
    )
    assert_same_module(load_transformer(path, config=CFG), baseline, inputs)
    model = load_transformer(path, config=CFG, prefix="generator_ema.")
    assert torch.equal(model.state_dict()["head.head.weight"], ema["head.head.weight"])


def test_missing_and_unexpected_keys_raise_one_error_listing_all(tmp_path, reference):
    state = load_file(save_original_format(reference, tmp_path / "ok.safetensors"))
    del state["blocks.1.ffn.2.bias"], state["head.modulation"]
    state["blocks.0.self_attn.rotary.freqs"] = torch.zeros(2)
    state["vace_blocks.0.after_proj.weight"] = torch.zeros(2)
    save_file(state, str(tmp_path / "bad.safetensors"))

    with pytest.raises(CheckpointKeyError) as caught:
        load_transformer(tmp_path / "bad.safetensors", config=CFG)
    err = caught.value
    assert err.fmt == "original"
    assert err.missing == ["blocks.1.ffn.2.bias", "head.modulation"]
    assert err.unexpected == ["blocks.0.self_attn.rotary.freqs", "vace_blocks.0.after_proj.weight"]
    for key in err.missing + err.unexpected:
        assert key in str(err)


def test_wrong_config_raises_one_shape_error(tmp_path, reference):
    path = save_original_format(reference, tmp_path / "dit.safetensors")
    with pytest.raises(CheckpointShapeError) as caught:
        load_transformer(path, config=CFG.replace(ffn_dim=32))
    assert {k for k, _, _ in caught.value.mismatches} == {
        f"blocks.{i}.ffn.{j}.{p}"
        for i in range(2)
        for j, p in ((0, "weight"), (0, "bias"), (2, "weight"))
    }


def test_validation_runs_before_any_tensor_reaches_the_device(tmp_path, reference):
    # the target device does not exist: a tensor moved there first would raise RuntimeError
    path = save_original_format(reference, tmp_path / "dit.safetensors")
    with pytest.raises(CheckpointShapeError, match=r"blocks\.0\.ffn\.0\.weight: file \(64, 48\)"):
        load_transformer(path, config=CFG.replace(ffn_dim=32), device="cuda:99")


def test_unrecognised_files_raise_a_format_error(tmp_path):
    save_file({"encoder.conv_in.weight": torch.zeros(1)}, str(tmp_path / "vae.safetensors"))
    with pytest.raises(CheckpointFormatError, match="not a WanDiT checkpoint: neither diffusers"):
        load_transformer(tmp_path / "vae.safetensors")
    with pytest.raises(CheckpointFormatError, match="does not exist"):
        load_transformer(tmp_path / "nothing")


def test_absent_hooks_start_as_exact_no_ops_and_present_hooks_round_trip(
    tmp_path, diffusers_dir, baseline, inputs
):
    hooked = load_transformer(diffusers_dir, config=CFG.replace(action_dim=10, audio_dim=6))
    assert torch.equal(hooked.action_embedding[2].weight, torch.zeros(48, 48))
    x, t, text = inputs
    with torch.no_grad():
        out = hooked(x, t, text, action=torch.randn(1, 10), audio=torch.randn(1, 3, 6))
    assert torch.equal(out, baseline[1])

    with torch.no_grad():  # trained hooks: saved and reloaded with widths read from the file
        hooked.action_embedding[2].weight.normal_()
        hooked.audio_embedding[2].bias.normal_()
    path = save_original_format(hooked, tmp_path / "hooked.safetensors", prefix="model.")
    again = load_transformer(path)
    assert (again.config.action_dim, again.config.audio_dim) == (10, 6)
    assert all(torch.equal(again.state_dict()[k], v) for k, v in hooked.state_dict().items())

    state = load_file(path)  # a half-present hook is a missing key, not a silent no-op
    del state["model.action_embedding.2.bias"]
    with safe_open(str(path), framework="pt") as fh:
        save_file(state, str(tmp_path / "half.safetensors"), metadata=fh.metadata())
    with pytest.raises(CheckpointKeyError, match=r"action_embedding\.2\.bias"):
        load_transformer(tmp_path / "half.safetensors")


def test_config_is_inferred_from_shapes_when_nothing_describes_it(tmp_path):
    cfg = WanDiTConfig(
        dim=256,
        num_layers=2,
        num_heads=2,
        ffn_dim=64,
        freq_dim=16,
        in_channels=4,
        out_channels=4,
        text_dim=20,
        cross_attn_norm=False,
    )
    path = save_original_format(WanDiT(cfg), tmp_path / "bare.safetensors", prefix="model.")
    save_file(load_file(path), str(path))  # no embedded config
    loaded = load_transformer(path)
    assert loaded.config.replace(name=cfg.name) == cfg


def test_reduced_precision_keeps_the_timestep_path_in_float32(diffusers_dir, inputs):
    model = load_transformer(diffusers_dir, dtype=torch.bfloat16)
    dtypes = {k: v.dtype for k, v in model.state_dict().items()}
    assert dtypes["blocks.0.self_attn.q.weight"] == torch.bfloat16
    assert dtypes["blocks.0.modulation"] == dtypes["head.modulation"] == torch.float32
    assert dtypes["time_embedding.0.weight"] == dtypes["blocks.0.norm3.weight"] == torch.float32
    with torch.no_grad():
        out = model(*inputs)
    assert out.dtype == torch.bfloat16 and torch.isfinite(out).all()


def test_missing_shard_and_ambiguous_directory_are_named(tmp_path, reference):
    index = save_original_format(
        reference, tmp_path / "orig" / "model.safetensors", max_shard_bytes=40_000
    )
    shard = sorted(set(json.loads(index.read_text())["weight_map"].values()))[1]
    (tmp_path / "orig" / shard).unlink()
    with pytest.raises(CheckpointFormatError, match=f"shards missing.*{shard}"):
        load_transformer(tmp_path / "orig")

    two = tmp_path / "two"
    save_original_format(reference, two / "a.safetensors")
    save_original_format(reference, two / "b.safetensors")
    with pytest.raises(CheckpointFormatError, match=r"no unambiguous WanDiT weights.*a\.safe"):
        load_transformer(two)


def test_diffusers_weights_win_over_variants_in_the_same_directory(
    tmp_path, reference, baseline, inputs
):
    reference.save_pretrained(tmp_path / "diff")
    save_file({"junk": torch.zeros(1)}, str(tmp_path / "diff" / "model.fp16.safetensors"))
    assert_same_module(load_transformer(tmp_path / "diff"), baseline, inputs)
