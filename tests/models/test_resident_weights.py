"""ResidentWeights: validated weight updates (full, delta, diffusers names, files), versions,
the text-embedding cache's key, and sleep/wake of a component (tiny preset, CPU)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file

from models.checkpoint.load import save_original_format
from models.instance import load_instance
from models.registry import get
from models.resident_weights import WeightUpdateError
from models.wan.dit import keymaps


@pytest.fixture
def tiny():
    return load_instance(get("wan-tiny-random"), device="cpu", seed=0)


def _dit_state(instance) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone() for k, v in instance.dit.state_dict().items()}


def test_a_full_update_from_tensors_replaces_the_weights_and_moves_the_version(tiny) -> None:
    old_version, old_text_key = tiny.weights_digest, tiny.text.key_for("a cat")
    assert old_text_key.weights_version == old_version != ""
    new = {k: v + 0.01 for k, v in _dit_state(tiny).items()}
    update = tiny.weights.prepare(new, mode="full")
    version = tiny.weights.apply(update)
    assert version.startswith("b2:")
    assert tiny.weights_digest == version != old_version
    assert tiny.text.key_for("a cat").weights_version == version
    for key, tensor in tiny.dit.state_dict().items():
        assert torch.equal(tensor, new[key]), key
    # the same update on the same starting weights gives the same version (a content hash)
    other = load_instance(get("wan-tiny-random"), device="cpu", seed=0)
    assert other.weights.apply(other.weights.prepare(new, mode="full")) == version


def test_a_delta_is_added_and_names_may_be_diffusers_or_wrapped(tiny) -> None:
    before = _dit_state(tiny)
    q = "blocks.0.self_attn.q.weight"
    diffusers_q = keymaps.from_native(q, keymaps.DIFFUSERS)
    assert diffusers_q != q
    delta = {diffusers_q: torch.full_like(before[q], 0.5), "generator.head.head.bias": None}
    delta["generator.head.head.bias"] = torch.ones_like(before["head.head.bias"])
    tiny.weights.apply(tiny.weights.prepare(delta, mode="delta"))
    after = tiny.dit.state_dict()
    assert torch.allclose(after[q], before[q] + 0.5)
    assert torch.allclose(after["head.head.bias"], before["head.head.bias"] + 1)
    untouched = [k for k in before if k not in (q, "head.head.bias")]
    assert all(torch.equal(after[k], before[k]) for k in untouched)


@pytest.mark.parametrize(
    "corrupt, message",
    [
        (
            lambda s: {k: v for k, v in s.items() if k != "head.head.weight"},
            "missing [head.head.weight] (1)",
        ),
        (
            lambda s: s | {"blocks.0.bogus.weight": torch.zeros(2)},
            "unexpected [blocks.0.bogus.weight] (1)",
        ),
        (lambda s: s | {"head.head.bias": torch.zeros(3)}, "shapes do not fit"),
        (lambda s: s | {"head.head.bias": s["head.head.bias"] * float("nan")}, "non-finite"),
    ],
)
def test_a_bad_update_raises_before_anything_changes(tiny, corrupt, message) -> None:
    before, version = _dit_state(tiny), tiny.weights_digest
    with pytest.raises(WeightUpdateError, match=re.escape(message)):
        tiny.weights.prepare(corrupt(_dit_state(tiny)), mode="full")
    assert tiny.weights_digest == version
    assert all(torch.equal(v, before[k]) for k, v in tiny.dit.state_dict().items())


def test_files_load_in_the_original_layout_and_a_truncated_file_is_refused(
    tiny, tmp_path: Path
) -> None:
    source = load_instance(get("wan-tiny-random"), device="cpu", seed=5)
    path = tmp_path / "transformer" / "model.safetensors"
    path.parent.mkdir()
    save_original_format(source.dit, path)
    version = tiny.weights.apply(tiny.weights.prepare(tmp_path / "transformer"))
    assert version != source.weights_digest and tiny.weights_digest == version
    for key, tensor in tiny.dit.state_dict().items():
        assert torch.equal(tensor, source.dit.state_dict()[key]), key
    bad = tmp_path / "bad.safetensors"
    bad.write_bytes(path.read_bytes()[: path.stat().st_size // 2])
    with pytest.raises(Exception) as caught:
        tiny.weights.prepare(bad)
    assert tiny.weights_digest == version, type(caught.value)
    save_file({"text_encoder.x": torch.zeros(1)}, str(tmp_path / "no_dit.safetensors"))
    with pytest.raises(WeightUpdateError, match="no DiT tensor"):
        tiny.weights.prepare(tmp_path / "no_dit.safetensors", mode="delta")


def test_sleep_empties_a_component_and_wake_restores_it_bit_for_bit(tiny) -> None:
    before = _dit_state(tiny)
    tiny.text.encode(["a cat"])
    assert len(tiny.text.store) == 1
    tiny.weights.sleep(["dit", "text_encoder"])
    assert all(p.numel() == 0 for p in tiny.dit.parameters())
    assert len(tiny.text.store) == 0, "a sleeping encoder's embeddings are dropped"
    with pytest.raises(WeightUpdateError, match="asleep"):
        tiny.weights.prepare(before)
    tiny.weights.wake(["dit", "text_encoder"])
    assert not tiny.weights.asleep
    assert all(torch.equal(v, before[k]) for k, v in tiny.dit.state_dict().items())
    with pytest.raises(WeightUpdateError, match="not among"):
        tiny.weights.sleep(["gpu"])
