"""models/checkpoint/load.py for the VAE (``load_vae``): diffusers and original Wan checkpoints
(single, sharded, .pth, directory layouts) load into identical modules; every missing or
unexpected key is reported in one error, wrong shapes in another; the key table agrees with
diffusers' module and with diffusers' own single-file converter."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import safetensors.torch
import torch
from diffusers import AutoencoderKLWan
from diffusers.loaders.single_file_utils import convert_wan_vae_to_diffusers

import models
from models.checkpoint.load import (
    CheckpointError,
    CheckpointFormatError,
    CheckpointKeyError,
    CheckpointShapeError,
    load_vae,
    save_original_format,
)
from models.wan.dit.keymaps import DIFFUSERS, ORIGINAL
from models.wan.vae.autoencoder import WanVAE
from models.wan.vae.config import VAEConfigError, WanVAEConfig
from models.wan.vae.keymap import CONFIG_METADATA_KEY, vae_key_table


@pytest.fixture(scope="module", autouse=True)
def one_intra_op_thread():
    """These tensors are tiny: OpenMP fork/join costs more than it saves (and far more when the
    2 CI cores are shared), so this module runs single-threaded and restores the setting."""
    previous = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(previous)


# Wan2.1 layout (what diffusers' single-file converter hard-codes) at a tiny width
WAN21_TINY = WanVAEConfig(z_dim=4, base_dim=4, latents_mean=(0.0,) * 4, latents_std=(1.0,) * 4)
OTHER_LAYOUT = WanVAEConfig(base_dim=6, dim_mult=(1, 2, 2), num_res_blocks=1,
                            temperal_downsample=(True, False))  # fmt: skip


def make_reference(config: WanVAEConfig, seed: int = 0) -> AutoencoderKLWan:
    torch.manual_seed(seed)
    ref = AutoencoderKLWan(**config.to_diffusers_config()).eval()
    with torch.no_grad():
        for name, p in ref.named_parameters():
            if name.endswith("gamma") or name.endswith("bias"):
                p.copy_(torch.randn_like(p))
    return ref


def assert_same_module(a: WanVAE, b: WanVAE) -> None:
    sa, sb = a.state_dict(), b.state_dict()
    assert sa.keys() == sb.keys()
    for name in sa:
        assert torch.equal(sa[name], sb[name]), name


@pytest.fixture(params=[WAN21_TINY, OTHER_LAYOUT], ids=["wan21-layout", "other-layout"])
def diffusers_dir(request: pytest.FixtureRequest, tmp_path: Path) -> tuple[Path, AutoencoderKLWan]:
    ref = make_reference(request.param)
    ref.save_pretrained(tmp_path / "vae")
    return tmp_path / "vae", ref


# --------------------------------------------------------------------------------------------
# formats and layouts


@torch.no_grad()
def test_every_checkpoint_form_loads_the_same_module(
    diffusers_dir: tuple[Path, AutoencoderKLWan], tmp_path: Path
) -> None:
    vae_dir, ref = diffusers_dir
    base = load_vae(vae_dir)
    config = base.config
    assert config == WanVAEConfig.from_diffusers_config(ref.config)

    forms: dict[str, Path] = {}
    # diffusers pipeline root (model_index.json + vae/)
    (tmp_path / "pipe").mkdir()
    ref.save_pretrained(tmp_path / "pipe" / "vae")
    forms["pipeline-root"] = tmp_path / "pipe"
    # diffusers, sharded with an index
    ref.save_pretrained(tmp_path / "sharded", max_shard_size="30KB")
    assert (tmp_path / "sharded" / "diffusion_pytorch_model.safetensors.index.json").is_file()
    forms["diffusers-sharded"] = tmp_path / "sharded"
    # original naming: one safetensors file
    save_original_format(base, tmp_path / "wan_vae.safetensors")
    forms["original-file"] = tmp_path / "wan_vae.safetensors"
    # original naming in a Wan model root, next to the DiT's config.json
    (tmp_path / "wan_root").mkdir()
    save_original_format(base, tmp_path / "wan_root" / "Wan2.1_VAE.safetensors")
    (tmp_path / "wan_root" / "config.json").write_text(json.dumps({"dim": 1536, "num_layers": 30}))
    forms["original-wan-root"] = tmp_path / "wan_root"
    # original naming as a .pth pickle of tensors (carries no config)
    original = safetensors.torch.load_file(tmp_path / "wan_vae.safetensors")
    torch.save(original, tmp_path / "Wan2.1_VAE.pth")
    forms["original-pth"] = tmp_path / "Wan2.1_VAE.pth"
    # original naming, sharded by hand (no config either)
    names = sorted(original)
    half = len(names) // 2
    (tmp_path / "orig_sharded").mkdir()
    weight_map = {}
    for i, part in enumerate((names[:half], names[half:])):
        file = f"vae-{i:05d}.safetensors"
        shard = {n: original[n] for n in part}
        safetensors.torch.save_file(shard, tmp_path / "orig_sharded" / file)
        weight_map.update(dict.fromkeys(part, file))
    index = tmp_path / "orig_sharded" / "vae.safetensors.index.json"
    index.write_text(json.dumps({"weight_map": weight_map}))
    forms["original-sharded"] = index

    z = torch.randn(1, config.z_dim, 2, 3, 2)
    expected = base.decode(z)
    assert (expected - ref.decode(z).sample).abs().max() <= 1e-4 * ref.decode(z).sample.abs().max()
    for form, path in forms.items():
        # files we write carry their config; Wan's own original files do not
        needs_config = form in ("original-pth", "original-sharded")
        vae = load_vae(path, config=config if needs_config else None)
        assert vae.config == config, form
        assert_same_module(vae, base)
        assert torch.equal(vae.decode(z), expected), form
    # without any config the wan2.1 preset is assumed, and the tiny weights do not fit it
    # (wrong shapes for the Wan2.1 layout, other key names for the other layout)
    with pytest.raises(CheckpointError, match=re.escape(str(forms["original-pth"]))) as info:
        load_vae(forms["original-pth"])
    assert isinstance(info.value, (CheckpointShapeError, CheckpointKeyError))


def test_original_naming_matches_diffusers_single_file_converter(tmp_path: Path) -> None:
    ref = make_reference(WAN21_TINY)
    ref.save_pretrained(tmp_path / "vae")
    save_original_format(load_vae(tmp_path / "vae"), tmp_path / "orig.safetensors")
    original = safetensors.torch.load_file(tmp_path / "orig.safetensors")
    assert "decoder.middle.0.residual.0.gamma" in original  # diffusers' detection key
    converted = convert_wan_vae_to_diffusers(original)
    expected = ref.state_dict()
    assert converted.keys() == expected.keys()
    for name, tensor in expected.items():
        assert torch.equal(converted[name], tensor), name


@pytest.mark.parametrize(
    "config", [WAN21_TINY, OTHER_LAYOUT, WanVAEConfig.preset("tiny"), WanVAEConfig.preset("wan2.1")]
)
def test_key_table_covers_module_and_diffusers_exactly(config: WanVAEConfig) -> None:
    with torch.device("meta"):
        ours = WanVAE(config).state_dict()
        theirs = AutoencoderKLWan(**config.to_diffusers_config()).state_dict()
    table = vae_key_table(config)
    assert len(table) == len({r.ours for r in table}) == len(ours)
    assert {r.ours for r in table} == set(ours)
    assert {r.diffusers for r in table} == set(theirs)
    assert len({r.original for r in table}) == len(table)
    for row in table:
        assert ours[row.ours].shape == theirs[row.diffusers].shape, row


@torch.no_grad()
def test_dtype_and_eval_mode(diffusers_dir: tuple[Path, AutoencoderKLWan]) -> None:
    vae = load_vae(diffusers_dir[0], dtype=torch.bfloat16)
    assert not vae.training
    assert {p.dtype for p in vae.parameters()} == {torch.bfloat16}
    assert {p.device.type for p in vae.parameters()} == {"cpu"}
    assert vae.new_decoder_cache(1, 2, 2).buffers[0].dtype == torch.bfloat16


# --------------------------------------------------------------------------------------------
# errors


def _zeros_state(fmt: str) -> dict[str, torch.Tensor]:
    """A WAN21_TINY-shaped state in naming ``fmt``."""
    with torch.device("meta"):
        params = WanVAE(WAN21_TINY).state_dict()
    return {r.name_in(fmt): torch.zeros(params[r.ours].shape) for r in vae_key_table(WAN21_TINY)}


@pytest.mark.parametrize("fmt", [DIFFUSERS, ORIGINAL])
def test_key_errors_are_listed_in_one_error(fmt: str, tmp_path: Path) -> None:
    table = vae_key_table(WAN21_TINY)
    state = _zeros_state(fmt)
    dropped = [table[3].name_in(fmt), table[-1].name_in(fmt)]
    for name in dropped:
        del state[name]
    state["decoder.extra_head.weight"] = torch.zeros(2)
    safetensors.torch.save_file(state, tmp_path / "broken.safetensors")

    with pytest.raises(CheckpointKeyError) as info:  # also through the package entry point
        models.load_vae(tmp_path / "broken.safetensors", config=WAN21_TINY)
    err = info.value
    assert isinstance(err, CheckpointError)
    assert (err.fmt, err.component) == (fmt, "WanVAE")
    assert err.missing == sorted(dropped)
    assert err.unexpected == ["decoder.extra_head.weight"]
    message = str(err)
    for name in [*dropped, "decoder.extra_head.weight", str(tmp_path / "broken.safetensors")]:
        assert name in message
    assert f"({fmt} naming) does not fit WanVAE" in message


@pytest.mark.parametrize("fmt", [DIFFUSERS, ORIGINAL])
def test_shape_errors_name_the_checkpoint_key_and_both_shapes(fmt: str, tmp_path: Path) -> None:
    state = _zeros_state(fmt)
    bias = "encoder.conv_in.bias" if fmt == DIFFUSERS else "encoder.conv1.bias"
    state[bias] = torch.zeros(3)
    safetensors.torch.save_file(state, tmp_path / "shapes.safetensors")
    with pytest.raises(CheckpointShapeError) as info:
        load_vae(tmp_path / "shapes.safetensors", config=WAN21_TINY)
    assert info.value.mismatches == [(bias, (3,), (4,))]
    assert f"{bias}: file (3,) vs module (4,)" in str(info.value)


def test_validation_runs_before_any_tensor_reaches_the_device(tmp_path: Path) -> None:
    """The target device does not exist: moving any tensor there would raise a RuntimeError, so
    getting the shape error proves validation came first."""
    state = _zeros_state(ORIGINAL)
    state["encoder.conv1.bias"] = torch.zeros(3)
    safetensors.torch.save_file(state, tmp_path / "shapes.safetensors")
    with pytest.raises(CheckpointShapeError):
        load_vae(tmp_path / "shapes.safetensors", config=WAN21_TINY, device="cuda:99")


def test_written_files_carry_their_config(tmp_path: Path) -> None:
    vae = WanVAE(WAN21_TINY)
    path = save_original_format(vae, tmp_path / "vae.safetensors")
    with safetensors.safe_open(str(path), framework="pt") as fh:
        embedded = json.loads(fh.metadata()[CONFIG_METADATA_KEY])
    assert WanVAEConfig.from_diffusers_config(embedded) == WAN21_TINY
    assert load_vae(path).config == WAN21_TINY


def test_unrelated_checkpoint_is_a_format_error_listing_its_keys(tmp_path: Path) -> None:
    dit_like = {f"blocks.{i}.self_attn.q.weight": torch.zeros(2, 2) for i in range(70)}
    safetensors.torch.save_file(dit_like, tmp_path / "dit.safetensors")
    with pytest.raises(CheckpointFormatError, match="not a WanVAE checkpoint") as info:
        load_vae(tmp_path / "dit.safetensors", config=WAN21_TINY)
    message = str(info.value)
    assert "keys found (70)" in message and "blocks.0.self_attn.q.weight" in message
    assert "... and 6 more" in message  # long listings are truncated


def test_missing_checkpoint_names_what_was_looked_for(tmp_path: Path) -> None:
    with pytest.raises(CheckpointFormatError, match=re.escape("Wan2.1_VAE.pth")):
        load_vae(tmp_path)
    with pytest.raises(CheckpointFormatError, match="nope.safetensors does not exist"):
        load_vae(tmp_path / "nope.safetensors")


# --------------------------------------------------------------------------------------------
# config


def test_config_round_trips_through_diffusers_config() -> None:
    for config in (WanVAEConfig.preset("wan2.1"), WanVAEConfig.preset("tiny"), OTHER_LAYOUT):
        assert WanVAEConfig.from_diffusers_config(config.to_diffusers_config()) == config
    wan = WanVAEConfig.preset("wan2.1")
    assert (wan.z_dim, wan.base_dim, wan.spatial_factor, wan.temporal_factor) == (16, 96, 8, 4)
    assert wan.num_pixel_frames(21) == 81
    assert WanVAEConfig.preset("wan2.1-vae") == wan


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"is_residual": True}, "is_residual=True"),
        ({"patch_size": 2}, "patch_size=2"),
        ({"attn_scales": [0.5]}, "attn_scales"),
        ({"decoder_base_dim": 64}, "decoder_base_dim=64"),
        ({"flux_capacitor": 1}, "unknown AutoencoderKLWan config keys: \\['flux_capacitor'\\]"),
        ({"temperal_downsample": [True]}, "temperal_downsample needs len"),
        ({"latents_mean": [0.0]}, "latents_mean needs z_dim = 16 values, got 1"),
    ],
)
def test_unsupported_diffusers_configs_raise_naming_the_field(changes: dict, message: str) -> None:
    config = WanVAEConfig.preset("wan2.1").to_diffusers_config() | changes
    with pytest.raises(VAEConfigError, match=message):
        WanVAEConfig.from_diffusers_config(config)


def test_a_decoder_base_dim_equal_to_the_default_base_dim_is_supported() -> None:
    config = WanVAEConfig.preset("wan2.1").to_diffusers_config()
    del config["base_dim"]
    config["decoder_base_dim"] = 96  # the default base_dim, which the config leaves out
    assert WanVAEConfig.from_diffusers_config(config) == WanVAEConfig.preset("wan2.1")


def test_unknown_preset_lists_known_ones() -> None:
    with pytest.raises(VAEConfigError, match=re.escape("['tiny', 'wan2.1', 'wan2.1-vae']")):
        WanVAEConfig.preset("wan2.2")
