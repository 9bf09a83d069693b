"""Loading TAEHV decoders from the published checkpoint layout (files the tests write: random
weights under the published names, as ``.pth`` and ``.safetensors``); every key and shape
problem reported at once, before any tensor moves."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import safetensors.torch
import torch

from models.checkpoint.load import CheckpointFormatError, CheckpointKeyError, CheckpointShapeError
from models.wan.taehv.checkpoint import (
    CONFIG_METADATA_KEY,
    load_taehv,
    published_state_dict,
    save_taehv,
    taehv_key_table,
)
from models.wan.taehv.config import TAEHVConfig
from models.wan.taehv.decoder import TAEHVDecoder

# the published stage layout at a few channels (64 decoder tensors, like taew2_1)
SMALL = TAEHVConfig(widths=(8, 6, 4, 4))


def make_decoder(config: TAEHVConfig = SMALL, seed: int = 0) -> TAEHVDecoder:
    torch.manual_seed(seed)
    return TAEHVDecoder(config).eval()


def published_file(path: Path, state: dict[str, torch.Tensor]) -> Path:
    """A file as madebyollin publishes them: the whole TAEHV state dict, encoder included, no
    metadata; ``.pth`` through torch.save, anything else as safetensors."""
    state = {
        **state,
        "encoder.0.weight": torch.zeros(64, 3, 3, 3),
        "encoder.0.bias": torch.zeros(64),
    }
    if path.suffix == ".pth":
        torch.save(state, path)
    else:
        safetensors.torch.save_file(state, str(path))
    return path


def outputs_equal(a: TAEHVDecoder, b: TAEHVDecoder) -> bool:
    z = torch.randn(1, 16, 2, 2, 3, generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        return torch.equal(a.decode(z), b.decode(z))


def test_the_key_table_is_the_published_layout() -> None:
    table = taehv_key_table(TAEHVConfig.preset("taew2_1"))
    published = {row.published for row in table}
    assert len(table) == 64
    assert {
        "decoder.1.weight",
        "decoder.1.bias",
        "decoder.22.weight",
        "decoder.22.bias",
    } <= published
    assert {
        "decoder.7.conv.weight",
        "decoder.13.conv.weight",
        "decoder.19.conv.weight",
    } <= published
    assert "decoder.17.conv.4.bias" in published and "decoder.8.bias" not in published  # no bias
    with torch.device("meta"):
        ours = set(TAEHVDecoder(TAEHVConfig.preset("taew2_1")).state_dict())
    assert {row.ours for row in table} == ours
    shapes = {k: tuple(v.shape) for k, v in published_state_dict(make_decoder()).items()}
    assert shapes["decoder.13.conv.weight"] == (12, 6, 1, 1)  # time grow x2: C * 2 rows


@pytest.mark.parametrize("name", ["taew2_1.pth", "taew2_1.safetensors"])
def test_a_published_file_loads_with_its_encoder_skipped(tmp_path: Path, name: str) -> None:
    source = make_decoder(seed=2)
    path = published_file(tmp_path / name, published_state_dict(source))
    loaded = load_taehv(path, config=SMALL)
    assert outputs_equal(loaded, source)
    assert not any(p.is_meta for p in loaded.parameters()) and not loaded.training
    assert load_taehv(tmp_path, config=SMALL).config == SMALL  # the directory form finds it
    half = load_taehv(path, config=SMALL, dtype=torch.bfloat16)
    assert {p.dtype for p in half.parameters()} == {torch.bfloat16}


def test_our_files_carry_the_config_and_round_trip(tmp_path: Path) -> None:
    source = make_decoder(TAEHVConfig.preset("tiny"), seed=3)
    path = save_taehv(source, tmp_path / "tiny_decoder" / "tiny_decoder.safetensors")
    with safetensors.safe_open(str(path), framework="pt") as fh:
        assert TAEHVConfig(**json.loads(fh.metadata()[CONFIG_METADATA_KEY])) == source.config
        assert all(k.startswith("decoder.") for k in fh.keys())
    for where in (path, tmp_path / "tiny_decoder", tmp_path):  # file, directory, pipeline root
        assert outputs_equal(load_taehv(where), source)
    with pytest.raises(CheckpointFormatError, match="expected TAEHVConfig"):
        load_taehv(path, config=SMALL)  # the card says another decoder than the file holds


def test_key_errors_are_listed_in_one_error(tmp_path: Path) -> None:
    state = published_state_dict(make_decoder())
    dropped = ["decoder.4.conv.2.bias", "decoder.19.conv.weight"]
    for key in dropped:
        del state[key]
    state["decoder.23.weight"] = torch.zeros(3)
    path = published_file(tmp_path / "broken.pth", state)
    with pytest.raises(CheckpointKeyError) as info:
        load_taehv(path, config=SMALL)
    err = info.value
    assert (err.fmt, err.component) == ("taehv", "TAEHVDecoder")
    assert err.missing == sorted(dropped) and err.unexpected == ["decoder.23.weight"]
    assert all(name in str(err) for name in [*dropped, "decoder.23.weight", str(path)])


def test_shape_errors_name_every_key_and_run_before_any_tensor_moves(tmp_path: Path) -> None:
    state = published_state_dict(make_decoder())
    state["decoder.1.weight"] = torch.zeros(8, 4, 3, 3)  # a 4-channel latent space
    state["decoder.22.bias"] = torch.zeros(12)  # a patch-2 (Wan 2.2) head
    path = published_file(tmp_path / "shapes.safetensors", state)
    # the device does not exist: moving any tensor there would raise, so the shape error
    # proves validation came first
    with pytest.raises(CheckpointShapeError) as info:
        load_taehv(path, config=SMALL, device="cuda:99")
    assert info.value.mismatches == [
        ("decoder.1.weight", (8, 4, 3, 3), (8, 16, 3, 3)),
        ("decoder.22.bias", (12,), (3,)),
    ]
    assert "decoder.22.bias: file (12,) vs module (3,)" in str(info.value)


def test_files_that_are_not_taehv_are_format_errors(tmp_path: Path) -> None:
    safetensors.torch.save_file(
        {"blocks.0.q.weight": torch.zeros(2)}, str(tmp_path / "x.safetensors")
    )
    with pytest.raises(CheckpointFormatError, match="not a TAEHV checkpoint"):
        load_taehv(tmp_path / "x.safetensors")
    with pytest.raises(CheckpointFormatError, match="empty does not exist"):
        load_taehv(tmp_path / "empty")
    (tmp_path / "empty").mkdir()  # an empty directory: the message names what was looked for
    with pytest.raises(CheckpointFormatError, match="taew2_1.pth"):
        load_taehv(tmp_path / "empty")


def test_build_decoder_gives_a_bench_the_cards_decoder(tmp_path: Path) -> None:
    from types import SimpleNamespace

    from models.registry import get
    from models.wan.taehv.checkpoint import build_decoder

    def instance(card_id: str) -> SimpleNamespace:
        cpu = torch.device("cpu")
        return SimpleNamespace(card=get(card_id), device=cpu, dtype=torch.float32, levers={})

    assert build_decoder(instance("wan-tiny-random")).config == TAEHVConfig.preset("taew2_1")
    tiny = build_decoder(instance("wan-tiny-taehv-random"))
    assert tiny.config == TAEHVConfig.preset("tiny") and not tiny.training
    source = make_decoder(TAEHVConfig.preset("tiny"), seed=4)
    path = save_taehv(source, tmp_path / "tiny_decoder.safetensors")
    assert outputs_equal(build_decoder(instance("wan-tiny-taehv-random"), weights=path), source)
