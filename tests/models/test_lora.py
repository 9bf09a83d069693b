"""LoRA adapters on the tiny DiT: PEFT and diffusers layouts the tests write, the hook's math,
base weights untouched, shapes and names checked at registration, and adapted steps."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch
from safetensors.torch import save_file

from models.instance import load_instance
from models.lora import AdapterError
from models.registry import get
from models.wan.dit import keymaps

RANK = 2


@pytest.fixture
def tiny() -> Any:
    return load_instance(get("wan-tiny-random"), device="cpu", seed=0)


def lora_tensors(dit: Any, modules: list[str], *, seed: int, scale: float = 0.5) -> dict:
    """{module: (A [r, in], B [out, r])} with nonzero B (a fresh PEFT adapter starts at B = 0)."""
    g = torch.Generator().manual_seed(seed)
    linears = dict(dit.named_modules())
    return {
        m: (
            torch.randn(RANK, linears[m].in_features, generator=g) * scale,
            torch.randn(linears[m].out_features, RANK, generator=g) * scale,
        )
        for m in modules
    }


def write_peft(path: Path, layers: dict, alpha: float) -> Path:
    tensors = {}
    for module, (a, b) in layers.items():
        tensors[f"base_model.model.{module}.lora_A.weight"] = a
        tensors[f"base_model.model.{module}.lora_B.weight"] = b
    path.mkdir(parents=True, exist_ok=True)
    save_file(tensors, str(path / "adapter_model.safetensors"))
    (path / "adapter_config.json").write_text(json.dumps({"r": RANK, "lora_alpha": alpha}))
    return path / "adapter_model.safetensors"


def write_diffusers(path: Path, layers: dict) -> Path:
    tensors = {}
    for module, (a, b) in layers.items():
        theirs = keymaps.from_native(f"{module}.weight", keymaps.DIFFUSERS).removesuffix(".weight")
        tensors[f"transformer.{theirs}.lora_A.weight"] = a
        tensors[f"transformer.{theirs}.lora_B.weight"] = b
    save_file(tensors, str(path))
    return path


def test_the_hook_adds_the_scaled_low_rank_product_only_while_active(
    tiny: Any, tmp_path: Path
) -> None:
    module = "blocks.0.self_attn.q"
    layers = lora_tensors(tiny.dit, [module], seed=1)
    tiny.adapters.register("peft", write_peft(tmp_path / "peft", layers, alpha=4.0))
    linear = dict(tiny.dit.named_modules())[module]
    before = {k: v.clone() for k, v in tiny.dit.state_dict().items()}
    x = torch.randn(3, linear.in_features)
    base = linear(x)
    op = tiny.adapters.bind(lambda args, deterministic=False: [linear(a) for a in args], [])
    assert torch.equal(op([x])[0], base), "no adapters: the op itself"

    class Probe:
        name, batchable, spmd = "probe", False, "all"

        def __call__(self, args, *, deterministic=False):
            return [linear(a) for a in args]

    probe = Probe()
    adapted = tiny.adapters.bind(probe, [("peft", 0.5)])
    assert adapted is tiny.adapters.bind(probe, [("peft", 0.5)]), "one op per adapter set"
    a, b = layers[module]
    want = base + 0.5 * (4.0 / RANK) * (x @ a.T @ b.T)
    torch.testing.assert_close(adapted([x])[0], want)
    assert torch.equal(linear(x), base), "inactive outside the op"
    assert all(torch.equal(v, before[k]) for k, v in tiny.dit.state_dict().items())
    assert tiny.adapters.versions([("peft", 0.5)])[0].startswith("peft@b2:")


def test_diffusers_keys_map_onto_the_same_linears(tiny: Any, tmp_path: Path) -> None:
    modules = ["blocks.0.self_attn.q", "blocks.1.cross_attn.v", "blocks.0.ffn.0"]
    layers = lora_tensors(tiny.dit, modules, seed=2)
    adapter = tiny.adapters.register("diff", write_diffusers(tmp_path / "d.safetensors", layers))
    assert sorted(adapter.layers) == sorted(modules)
    assert all(scale == 1.0 for _, _, scale in adapter.layers.values()), "no alpha: alpha = r"


def test_registration_refuses_what_does_not_fit(tiny: Any, tmp_path: Path) -> None:
    module = "blocks.0.self_attn.q"
    a, b = lora_tensors(tiny.dit, [module], seed=3)[module]
    cases = {
        "shape": {f"{module}.lora_A.weight": a, f"{module}.lora_B.weight": b[:-1]},
        "half": {f"{module}.lora_A.weight": a},
        "other": {"blocks.0.norm3.lora_A.weight": a, "blocks.0.norm3.lora_B.weight": b},
        "junk": {"something.else": a},
    }
    for name, tensors in cases.items():
        save_file(tensors, str(tmp_path / f"{name}.safetensors"))
        with pytest.raises(AdapterError):
            tiny.adapters.register(name, tmp_path / f"{name}.safetensors")
    assert tiny.adapters.adapters == {}
    with pytest.raises(AdapterError, match="not registered"):
        tiny.adapters.check([("nobody", 1.0)])
    with pytest.raises(AdapterError, match="NAME=PATH"):
        tiny.adapters.register_specs(["no-equals-sign"])
