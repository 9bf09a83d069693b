"""TAEHV checkpoints on disk: the published key layout, the loader and the writer.

The published files (madebyollin/taehv: ``taew2_1.pth``, ``safetensors/taew2_1.safetensors``)
hold the state dict of an ``nn.Sequential`` decoder (and encoder), so tensors are named by
position. For ``B`` memory blocks per stage (3 in ``taew2_1``)::

    decoder.0                          tanh clamp (no weights)
    decoder.1.{weight,bias}            conv_in
    decoder.2                          relu
    stage s starts at i = 3 + s (B + 3):
      decoder.{i+k}.conv.{0,2,4}.{weight,bias}  stages.s.blocks.k.conv{1,2,3}   (k < B)
      decoder.{i+B}                             nearest 2x upsample (no weights)
      decoder.{i+B+1}.conv.weight               stages.s.time_grow  [C * stride, C, 1, 1]
      decoder.{i+B+2}.weight                    stages.s.proj       (no bias)
    decoder.{3 + 3 (B + 3)}            relu
    decoder.{4 + 3 (B + 3)}.{weight,bias}  conv_out
    encoder.*                          the encoder: present in the published files, not ours

``taew2_1`` has 64 decoder tensors. The loader reuses ``models/checkpoint/load.py``'s machinery: the
files are resolved and read (``.pth`` with ``torch.load(weights_only=True)``), the names mapped
through the table below, every missing / unexpected key reported in one ``CheckpointKeyError``
and every wrong shape in one ``CheckpointShapeError`` before any tensor moves, then assigned to a
module built on the meta device. ``encoder.*`` keys are skipped (we decode only); anything else
that maps onto nothing is unexpected. Files we write carry the config in their metadata.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import save_file

from models.checkpoint.load import (
    CheckpointFormatError,
    Layout,
    assign,
    map_keys,
    read_tensors,
    resolve,
    validate,
)
from models.wan.taehv.config import TAEHVConfig, TAEHVConfigError
from models.wan.taehv.decoder import TAEHVDecoder

__all__ = [
    "CONFIG_METADATA_KEY",
    "PUBLISHED",
    "TAEHV_LAYOUT",
    "TAEHVKeyRow",
    "build_decoder",
    "load_taehv",
    "published_state_dict",
    "save_taehv",
    "taehv_key_table",
]

log = logging.getLogger(__name__)

PUBLISHED = "taehv"  # the naming's name in error messages
CONFIG_METADATA_KEY = "dreamrt.taehv_config"
_ENCODER_PREFIX = "encoder."
# In a directory: a distilled decoder of ours first (it is what the operator made for this
# card), then the published names, then the only *.safetensors there.
TAEHV_LAYOUT = Layout(
    "TAEHVDecoder",
    "tiny_decoder",
    ("tiny_decoder.safetensors", "taew2_1.safetensors", "taew2_1.pth"),
)


@dataclass(frozen=True, slots=True)
class TAEHVKeyRow:
    """One tensor's name in our module and in the published layout."""

    ours: str
    published: str


def taehv_key_table(config: TAEHVConfig) -> tuple[TAEHVKeyRow, ...]:
    """Every decoder tensor of ``config``, ours <-> published (see the module docstring)."""
    rows: list[TAEHVKeyRow] = []

    def add(ours: str, published: str, *, bias: bool = True) -> None:
        for suffix in ("weight", "bias") if bias else ("weight",):
            rows.append(TAEHVKeyRow(f"decoder.{ours}.{suffix}", f"decoder.{published}.{suffix}"))

    blocks = config.blocks_per_stage
    add("conv_in", "1")
    for s in range(3):
        first = 3 + s * (blocks + 3)
        for k in range(blocks):
            for j, seq in enumerate((0, 2, 4), start=1):
                add(f"stages.{s}.blocks.{k}.conv{j}", f"{first + k}.conv.{seq}")
        add(f"stages.{s}.time_grow", f"{first + blocks + 1}.conv", bias=False)
        add(f"stages.{s}.proj", f"{first + blocks + 2}", bias=False)
    add("conv_out", f"{4 + 3 * (blocks + 3)}")
    return tuple(rows)


def published_state_dict(model: TAEHVDecoder) -> dict[str, torch.Tensor]:
    """``model``'s tensors under their published names (CPU, contiguous), for writing."""
    params = model.state_dict()
    return {
        row.published: params[row.ours].detach().cpu().contiguous()
        for row in taehv_key_table(model.config)
    }


def save_taehv(model: TAEHVDecoder, path: str | Path) -> Path:
    """Write ``model`` as safetensors in the published layout, its config in the metadata (so
    ``load_taehv`` rebuilds it without being told); returns ``path``."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    metadata = {"format": "pt", CONFIG_METADATA_KEY: model.config.to_json()}
    save_file(published_state_dict(model), str(path), metadata=metadata)
    return path


def load_taehv(
    path: str | Path,
    *,
    device: torch.device | str = "cpu",
    dtype: torch.dtype = torch.float32,
    config: TAEHVConfig | None = None,
) -> TAEHVDecoder:
    """A ``TAEHVDecoder`` in eval mode on ``device`` in ``dtype`` from a file or directory
    (``TAEHV_LAYOUT``).

    The config is ``config`` (a card's preset), else the one in the file's metadata, else
    ``taew2_1``; a file whose metadata names another config than ``config`` is refused
    (``CheckpointFormatError`` naming both), as are files without published decoder names.
    """
    source = str(path)
    found = resolve(path, TAEHV_LAYOUT)
    tensors, metadata = read_tensors(found.files)
    config = _config(config, metadata.get(CONFIG_METADATA_KEY), source)
    ours = [k for k in tensors if not k.startswith(_ENCODER_PREFIX)]
    if not any(k.startswith("decoder.") for k in ours):
        raise CheckpointFormatError(
            f"{source}: not a TAEHV checkpoint (no published decoder.* names); "
            f"keys found: {sorted(tensors)[:16]}"
        )
    table = taehv_key_table(config)
    by_published = {row.published: row.ours for row in table}
    by_ours = {row.ours: row.published for row in table}
    mapping = map_keys(ours, PUBLISHED, by_published.get, by_ours.get)
    with torch.device("meta"):
        model = TAEHVDecoder(config)
    validate(source, "TAEHVDecoder", mapping, tensors, model)
    assign(model, mapping, tensors, device, lambda name: dtype)
    log.info("loaded %s (TAEHV, %s) onto %s as %s", source, config.widths, device, dtype)
    return model.eval()


def build_decoder(instance: Any, *, weights: str | Path | None = None) -> TAEHVDecoder:
    """A TAEHV decoder for a loaded Wan instance, on its device and dtype: from ``weights``
    (any form ``load_taehv`` reads), else seeded random weights; the card's ``tiny_decoder``
    preset if it has one, else ``taew2_1``; compiled if the instance is. The factory
    ``dreamrt bench gpu-session --tiny-decoder models.wan.taehv.checkpoint:build_decoder`` swaps
    in for ``+taehv``."""
    spec = instance.card.components.get("tiny_decoder")
    config = TAEHVConfig.preset(spec.preset if spec is not None else "taew2_1")
    if weights is not None:
        decoder = load_taehv(weights, device=instance.device, dtype=instance.dtype, config=config)
    else:
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(0)
            with instance.device:
                decoder = TAEHVDecoder(config)
        decoder = decoder.to(dtype=instance.dtype).eval()
    if getattr(instance, "levers", {}).get("compiled"):
        decoder.decoder.compile()
        guard = getattr(instance, "compile_guard", None)
        if guard is not None:
            guard.wrap(decoder.decoder, "vae.decoder")
    return decoder


def _config(given: TAEHVConfig | None, stored: str | None, source: str) -> TAEHVConfig:
    try:
        from_file = None if stored is None else TAEHVConfig.from_json(stored)
    except TAEHVConfigError as exc:
        raise CheckpointFormatError(f"{source}: {exc}") from exc
    if given is not None and from_file is not None and given != from_file:
        raise CheckpointFormatError(
            f"{source} holds a TAEHV decoder of config {from_file}, expected {given}"
        )
    return given or from_file or TAEHVConfig.preset("taew2_1")
