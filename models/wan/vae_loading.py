"""Load a Wan2.1 VAE from diffusers-format or original Wan checkpoints; write the original format.

Accepted ``path``s:

- a diffusers VAE directory: ``config.json`` + ``diffusion_pytorch_model.safetensors`` (or a
  sharded ``diffusion_pytorch_model.safetensors.index.json``);
- a diffusers pipeline root with such a directory under ``vae/``;
- a Wan model directory holding ``Wan2.1_VAE.safetensors`` or ``Wan2.1_VAE.pth``;
- one checkpoint file: ``*.safetensors``, ``*.safetensors.index.json`` (shards), ``*.pth``/``*.pt``
  (loaded with ``weights_only=True``).

The naming (diffusers or original) is detected from the keys. The module is built on the meta
device and the checkpoint tensors are assigned to it, so weights are never initialised twice.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Mapping, Sequence
from pathlib import Path

import safetensors.torch
import torch

from models.loading import CheckpointError, CheckpointFormatError, CheckpointKeyError
from models.wan.vae import WanVAE
from models.wan.vae_config import WanVAEConfig
from models.wan.vae_keymap import CheckpointFormat, KeyRow, vae_key_table

__all__ = [
    "CheckpointFormatError",
    "CheckpointKeyError",
    "VAECheckpointKeyError",
    "load_vae",
    "read_vae_state_dict",
    "save_original_format",
]

log = logging.getLogger(__name__)

_DIFFUSERS_WEIGHTS = "diffusion_pytorch_model.safetensors"
_DIFFUSERS_INDEX = "diffusion_pytorch_model.safetensors.index.json"
_WAN_FILES = ("Wan2.1_VAE.safetensors", "Wan2.1_VAE.pth")
_MAX_LISTED = 64


class VAECheckpointKeyError(CheckpointKeyError):
    """``models.loading.CheckpointKeyError`` for the VAE: every problem in one message.

    ``missing``: names (in the checkpoint's naming) the module needs but the file lacks;
    ``unexpected``: names in the file the module has no place for; ``mismatched``:
    ``(name, file_shape, module_shape)`` (the DiT loader reports shapes in a separate error; the
    VAE brief asks for one error listing everything). ``fmt`` is the detected naming.
    """

    def __init__(
        self,
        source: str,
        fmt: CheckpointFormat,
        missing: list[str],
        unexpected: list[str],
        mismatched: Sequence[tuple[str, tuple[int, ...], tuple[int, ...]]] = (),
    ) -> None:
        self.source, self.fmt = source, fmt
        self.missing, self.unexpected = sorted(missing), sorted(unexpected)
        self.ambiguous: list[str] = []
        self.mismatched = sorted(mismatched)
        parts = [f"checkpoint {source} ({fmt.value} naming) does not fit the Wan VAE:"]
        parts += _listing("missing", self.missing)
        parts += _listing("unexpected", self.unexpected)
        parts += _listing(
            "shape mismatch", [f"{n}: file {a} vs module {b}" for n, a, b in self.mismatched]
        )
        # The base class words its message for the DiT; keep its attributes, use our message.
        CheckpointError.__init__(self, "\n".join(parts))


def _listing(label: str, items: list[str]) -> list[str]:
    if not items:
        return []
    shown = items[:_MAX_LISTED]
    more = [f"    ... and {len(items) - len(shown)} more"] if len(items) > len(shown) else []
    return [f"  {label} ({len(items)}):", *(f"    {item}" for item in shown), *more]


# --------------------------------------------------------------------------------------------
# locating and reading files


def _resolve(path: Path) -> tuple[list[Path], Path | None]:
    """-> (weight files, diffusers config.json or None) for any accepted ``path``."""
    if path.is_dir():
        if (path / "vae").is_dir():
            return _resolve(path / "vae")
        if (path / _DIFFUSERS_INDEX).is_file():
            return _shards(path / _DIFFUSERS_INDEX), _config_next_to(path)
        if (path / _DIFFUSERS_WEIGHTS).is_file():
            return [path / _DIFFUSERS_WEIGHTS], _config_next_to(path)
        for name in _WAN_FILES:
            if (path / name).is_file():
                return [path / name], None
        looked = ["vae/", _DIFFUSERS_INDEX, _DIFFUSERS_WEIGHTS, *_WAN_FILES]
        raise CheckpointFormatError(f"no Wan VAE checkpoint in {path}; looked for {looked}")
    if not path.is_file():
        raise CheckpointFormatError(f"no such VAE checkpoint: {path}")
    if path.name.endswith(".index.json"):
        return _shards(path), _config_next_to(path.parent)
    return [path], _config_next_to(path.parent)


def _config_next_to(directory: Path) -> Path | None:
    """A ``config.json`` that describes an ``AutoencoderKLWan`` (Wan roots hold the DiT's)."""
    candidate = directory / "config.json"
    if not candidate.is_file():
        return None
    if json.loads(candidate.read_text()).get("_class_name") != "AutoencoderKLWan":
        return None
    return candidate


def _shards(index: Path) -> list[Path]:
    weight_map: Mapping[str, str] = json.loads(index.read_text())["weight_map"]
    return [index.parent / name for name in sorted(set(weight_map.values()))]


def read_vae_state_dict(
    path: str | Path, device: torch.device | str = "cpu"
) -> dict[str, torch.Tensor]:
    """Every tensor of the checkpoint at ``path`` (any accepted form), names as stored, on
    ``device`` (pickled ``.pth`` files are memory-mapped on the CPU first)."""
    files, _ = _resolve(Path(path))
    state: dict[str, torch.Tensor] = {}
    for file in files:
        if file.suffix in (".pth", ".pt", ".ckpt"):
            part = torch.load(file, map_location="cpu", weights_only=True, mmap=True)
            part = {name: t.to(device) for name, t in part.items()}
        else:
            part = safetensors.torch.load_file(file, device=str(device))
        state.update(part)
    return state


# --------------------------------------------------------------------------------------------
# mapping


def _detect_format(keys: set[str], table: tuple[KeyRow, ...]) -> CheckpointFormat | None:
    hits = {fmt: sum(row.name_in(fmt) in keys for row in table) for fmt in CheckpointFormat}
    best = max(hits, key=lambda fmt: hits[fmt])
    return best if hits[best] > 0 else None


def _check_table(model: WanVAE, table: tuple[KeyRow, ...]) -> None:
    # The table is written from the config; a difference from the module is a bug in this package.
    ours = set(model.state_dict())
    listed = {row.ours for row in table}
    if ours != listed:
        raise RuntimeError(
            f"VAE key table out of sync with WanVAE: only in module {sorted(ours - listed)}, "
            f"only in table {sorted(listed - ours)}"
        )


def _to_ours(
    state: Mapping[str, torch.Tensor], model: WanVAE, config: WanVAEConfig, source: str
) -> dict[str, torch.Tensor]:
    table = vae_key_table(config)
    _check_table(model, table)
    keys = set(state)
    fmt = _detect_format(keys, table)
    if fmt is None:
        head = f"{source} is not a Wan VAE checkpoint in diffusers or original naming"
        raise CheckpointFormatError("\n".join([head, *_listing("keys found", sorted(keys))]))
    by_name = {row.name_in(fmt): row.ours for row in table}
    params = model.state_dict()
    mismatched = [
        (name, tuple(state[name].shape), tuple(params[ours].shape))
        for name, ours in by_name.items()
        if name in keys and state[name].shape != params[ours].shape
    ]
    missing = sorted(set(by_name) - keys)
    unexpected = sorted(keys - set(by_name))
    if missing or unexpected or mismatched:
        raise VAECheckpointKeyError(source, fmt, missing, unexpected, mismatched)
    log.info("VAE checkpoint %s: %s naming, %d tensors", source, fmt.value, len(keys))
    return {ours: state[name] for name, ours in by_name.items()}


# --------------------------------------------------------------------------------------------
# public API


def load_vae(
    path: str | Path,
    *,
    device: torch.device | str = "cpu",
    dtype: torch.dtype = torch.float32,
    config: WanVAEConfig | None = None,
) -> WanVAE:
    """A ``WanVAE`` in eval mode with the checkpoint's weights, on ``device`` in ``dtype``.

    ``config``: overrides the checkpoint's; without one, a diffusers ``config.json`` is used, else
    the ``wan2.1`` preset. Raises (``models.loading`` error types) ``CheckpointFormatError`` if no
    checkpoint is found or its keys are in neither naming, ``CheckpointKeyError`` (a
    ``VAECheckpointKeyError`` listing every missing/unexpected/mis-shaped tensor) if it does not
    fit; ``VAEConfigError`` for a config we do not implement.
    """
    path = Path(path)
    _, config_file = _resolve(path)
    if config is None:
        config = (
            WanVAEConfig.from_diffusers_config(json.loads(config_file.read_text()))
            if config_file is not None
            else WanVAEConfig.preset("wan2.1")
        )
    with torch.device("meta"):
        model = WanVAE(config)
    state = read_vae_state_dict(path, device=device)
    mapped = _to_ours(state, model, config, str(path))
    ours = {name: t.to(dtype=dtype) for name, t in mapped.items()}
    model.load_state_dict(ours, strict=True, assign=True)
    return model.eval()


def save_original_format(model: WanVAE, path: str | Path) -> None:
    """Write ``model``'s weights as one safetensors file in original Wan naming."""
    table = vae_key_table(model.config)
    _check_table(model, table)
    params = model.state_dict()
    state = {row.original: params[row.ours].detach().contiguous().clone() for row in table}
    safetensors.torch.save_file(state, str(path))
