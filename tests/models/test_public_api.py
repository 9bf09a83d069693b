"""The model plane's public entry points: ``models.load_transformer`` / ``models.load_vae``."""

from __future__ import annotations

import subprocess
import sys

import pytest
import torch

import models
from models.checkpoint.load import save_original_format
from models.wan.dit.config import WanDiTConfig
from models.wan.dit.transformer import WanDiT
from models.wan.vae.autoencoder import WanVAE
from models.wan.vae.config import WanVAEConfig


def test_load_transformer_and_vae_from_the_package(tmp_path) -> None:
    torch.manual_seed(0)
    dit = WanDiT(WanDiTConfig.preset("tiny")).eval()
    save_original_format(dit, tmp_path / "dit.safetensors")
    loaded = models.load_transformer(tmp_path / "dit.safetensors")
    x = torch.randn(1, 16, 2, 4, 4)
    t = torch.tensor([500.0])
    text = torch.randn(1, 5, 32)
    with torch.no_grad():
        assert torch.equal(loaded(x, t, text), dit(x, t, text))

    vae = WanVAE(WanVAEConfig.preset("tiny")).eval()
    models.save_original_format(vae, tmp_path / "vae.safetensors")
    loaded_vae = models.load_vae(tmp_path / "vae.safetensors", config=WanVAEConfig.preset("tiny"))
    z = torch.randn(1, 16, 2, 4, 4)
    with torch.no_grad():
        assert torch.equal(loaded_vae.decode(z), vae.decode(z))


def test_registry_import_does_not_pull_torch() -> None:
    code = "import sys; import models.registry as r; r.list_cards(); print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


def test_unknown_attribute_is_an_attribute_error() -> None:
    with pytest.raises(AttributeError, match="no attribute 'load_everything'"):
        models.load_everything  # noqa: B018
