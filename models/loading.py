"""Build models on the meta device and fill them from real checkpoints.

``load_transformer(path)`` accepts, for the Wan2.1 DiT:

- a diffusers directory (``config.json`` + ``diffusion_pytorch_model*.safetensors``, sharded
  ``*.safetensors.index.json`` included) or a diffusers pipeline root with ``transformer/``;
- an original-format file or directory (Wan, Self-Forcing, CausVid, LongLive:
  ``blocks.N.self_attn.q.weight`` ..., with or without ``model.`` / ``generator.`` wrappers):
  ``*.safetensors``, ``*.safetensors.index.json``, or a ``torch.save`` file (``.pt``/``.pth``,
  read with ``weights_only=True``).

The format is recognised from the key names; names are translated by the explicit tables of
``models/wan/keymaps.py``. The config comes from, in order: the ``config`` argument, a Wan or
diffusers ``config.json`` next to the weights, the config we embed in files we write, or the
tensor shapes (then head_dim = 128 is assumed, true for every released Wan2.1).

Every missing or unexpected key is reported at once in one ``CheckpointKeyError`` (hook keys of
the action/audio conditioning are optional: absent hooks start as exact no-ops); wrong shapes
raise one ``CheckpointShapeError``. Nothing is allocated on the target device before the
checkpoint has been validated.
"""

from __future__ import annotations

import json
import logging
import math
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch
from safetensors import safe_open
from safetensors.torch import save_file
from torch import nn

from models.wan import keymaps
from models.wan.config import WanDiTConfig
from models.wan.transformer import WanDiT, param_dtype

__all__ = [
    "CheckpointError",
    "CheckpointFormatError",
    "CheckpointKeyError",
    "CheckpointShapeError",
    "load_transformer",
    "load_vae",
    "save_original_format",
]

log = logging.getLogger(__name__)

CONFIG_METADATA_KEY = "dreamrt.wan_config"
_TORCH_SUFFIXES = (".pt", ".pth")
_ASSUMED_HEAD_DIM = 128


class CheckpointError(Exception):
    """A checkpoint that cannot be turned into the requested model."""


class CheckpointFormatError(CheckpointError):
    """No weights found, an unreadable layout, or a format that cannot be recognised."""


class CheckpointKeyError(CheckpointError):
    """The checkpoint's parameter names do not match the model: lists every offending key.

    ``missing``: model parameters the checkpoint lacks (model names); ``unexpected``: checkpoint
    keys no rule maps onto a model parameter (checkpoint names); ``ambiguous``: model names that
    several checkpoint keys map onto.
    """

    def __init__(self, source: str, fmt: str, missing: list[str], unexpected: list[str],
                 ambiguous: list[str] | None = None) -> None:
        self.source, self.fmt = source, fmt
        self.missing, self.unexpected = sorted(missing), sorted(unexpected)
        self.ambiguous = sorted(ambiguous or [])
        parts = [f"{len(self.missing)} missing: {self.missing}",
                 f"{len(self.unexpected)} unexpected: {self.unexpected}"]
        if self.ambiguous:
            parts.append(f"{len(self.ambiguous)} ambiguous (pass prefix=...): {self.ambiguous}")
        super().__init__(f"checkpoint {source} ({fmt} format) does not match WanDiT; "
                         + "; ".join(parts))


class CheckpointShapeError(CheckpointError):
    """Tensors whose shapes differ from the model built from the config (lists them all)."""

    def __init__(self, source: str, mismatches: list[tuple[str, tuple, tuple]]) -> None:
        self.source, self.mismatches = source, mismatches
        listed = ", ".join(f"{k}: checkpoint {c} vs model {m}" for k, c, m in mismatches)
        super().__init__(f"checkpoint {source} has {len(mismatches)} wrongly shaped tensors "
                         f"(wrong config?): {listed}")


# --------------------------------------------------------------------------------------------
# public API


def load_transformer(
    path: str | Path,
    *,
    device: torch.device | str = "cpu",
    dtype: torch.dtype = torch.float32,
    config: WanDiTConfig | None = None,
    prefix: str | None = None,
) -> WanDiT:
    """Load a Wan2.1 DiT from a diffusers or original-format checkpoint (see module docstring).

    ``prefix`` selects the keys under one wrapper (e.g. ``"generator_ema."`` in a training
    checkpoint that holds several models); by default ``generator.`` is preferred when present
    and the other known wrappers are stripped. Returns the model in eval mode on ``device``:
    parameters in ``dtype`` except the timestep path and modulation tables (float32).
    """
    weight_files, dir_config = _resolve(Path(path))
    source = str(path)
    raw, metadata = _read_tensors(weight_files)
    fmt, native, unexpected, ambiguous = _to_native(raw, prefix)
    if fmt is None:
        raise CheckpointFormatError(
            f"{source}: neither diffusers nor original Wan key names under prefix "
            f"{prefix!r} (first keys: {sorted(raw)[:8]})"
        )
    cfg = config or dir_config or _config_from_metadata(metadata) or _infer_config(native, source)
    if config is None:
        cfg = _adopt_hooks(cfg, native)

    with torch.device("meta"):
        model = WanDiT(cfg)
    expected = {name: p.shape for name, p in model.state_dict().items()}
    # a hook is optional as a whole: absent entirely -> no-op init; partly present -> missing
    present_hooks = {k.split(".", 1)[0] for k in native if keymaps.is_hook_key(k)}
    missing = [k for k in expected if k not in native
               and (not keymaps.is_hook_key(k) or k.split(".", 1)[0] in present_hooks)]
    unexpected += [k for k in native if k not in expected]
    if missing or unexpected or ambiguous:
        raise CheckpointKeyError(source, fmt, missing, unexpected, ambiguous)
    wrong = [(k, tuple(t.shape), tuple(expected[k])) for k, t in native.items()
             if t.shape != expected[k]]
    if wrong:
        raise CheckpointShapeError(source, wrong)

    # copy=True: fresh, allocator-aligned storage. safetensors hands out tensors at whatever
    # offset the file header leaves (CPU kernels then take other SIMD paths and results differ
    # in the last bit) and torch.load(mmap=True) ones that keep the file mapped.
    # Tensors are popped as they are copied so the host copy is freed progressively.
    del raw
    state = {k: native.pop(k).to(device=device, dtype=param_dtype(k, dtype), copy=True)
             for k in list(native)}
    model.load_state_dict(state, strict=False, assign=True)
    _materialise_hooks(model, device, dtype)
    log.info("loaded %s (%s format, %s) onto %s as %s", source, fmt, cfg.name, device, dtype)
    return model.eval()


def save_original_format(
    module: nn.Module,
    path: str | Path,
    *,
    prefix: str = "",
    max_shard_bytes: int | None = None,
) -> Path:
    """Write ``module`` (a ``WanDiT`` or diffusers ``WanTransformer3DModel``) with original names.

    Keys get ``prefix`` prepended (``"model."``, ``"generator.model."`` to mimic training
    checkpoints). The config travels in the safetensors metadata. With ``max_shard_bytes`` the
    tensors are split into ``<stem>-0000i-of-0000n.safetensors`` files plus
    ``<path>.index.json``; returns the path to load (the file or the index).
    """
    path = Path(path)
    if isinstance(module, WanDiT):
        cfg, native = module.config, dict(module.state_dict())
    else:
        cfg = WanDiTConfig.from_diffusers_config(dict(module.config))
        native, unknown = {}, []
        for key, tensor in module.state_dict().items():
            name = keymaps.to_native(key, keymaps.DIFFUSERS)
            if name is None:
                unknown.append(key)
            else:
                native[name] = tensor
        if unknown:
            raise CheckpointKeyError(type(module).__name__, keymaps.DIFFUSERS, [], unknown)
    tensors = {prefix + keymaps.from_native(k, keymaps.ORIGINAL): t.detach().cpu().contiguous()
               for k, t in native.items()}
    metadata = {"format": "pt", CONFIG_METADATA_KEY: json.dumps(cfg.to_original_config())}
    path.parent.mkdir(parents=True, exist_ok=True)
    if max_shard_bytes is None:
        save_file(tensors, str(path), metadata=metadata)
        return path
    shards: list[dict[str, torch.Tensor]] = [{}]
    size = 0
    for key, tensor in tensors.items():
        if shards[-1] and size + tensor.nbytes > max_shard_bytes:
            shards.append({})
            size = 0
        shards[-1][key] = tensor
        size += tensor.nbytes
    stem = path.name.removesuffix(".safetensors")
    weight_map: dict[str, str] = {}
    for i, shard in enumerate(shards, start=1):
        name = f"{stem}-{i:05d}-of-{len(shards):05d}.safetensors"
        save_file(shard, str(path.parent / name), metadata=metadata)
        weight_map.update(dict.fromkeys(shard, name))
    index = path.parent / (path.name + ".index.json")
    total = sum(t.nbytes for t in tensors.values())
    index.write_text(json.dumps({"metadata": {"total_size": total, **metadata},
                                 "weight_map": weight_map}, indent=1))
    return index


def load_vae(path: str | Path, **kwargs: Any) -> Any:
    """Re-export of ``models.wan.vae_loading.load_vae`` (imported on first use)."""
    from models.wan.vae_loading import load_vae as _load_vae

    return _load_vae(path, **kwargs)


# --------------------------------------------------------------------------------------------
# locating and reading files


def _resolve(path: Path) -> tuple[list[Path], WanDiTConfig | None]:
    """Weight files and (if a config.json describes them) the config."""
    if not path.exists():
        raise CheckpointFormatError(f"{path} does not exist")
    if path.is_file():
        files = _files_of_index(path) if path.name.endswith(".index.json") else [path]
        return files, _config_from_json(path.parent / "config.json")
    if (path / "transformer").is_dir() and not list(path.glob("*.safetensors")):
        path = path / "transformer"  # diffusers pipeline root
    indexes = sorted(path.glob("*.safetensors.index.json"))
    singles = sorted(path.glob("*.safetensors"))
    if len(indexes) == 1:
        files = _files_of_index(indexes[0])
    elif len(indexes) == 0 and len(singles) == 1:
        files = singles
    else:
        raise CheckpointFormatError(
            f"{path}: expected one *.safetensors.index.json or one *.safetensors, found "
            f"{[p.name for p in indexes + singles]}"
        )
    return files, _config_from_json(path / "config.json")


def _files_of_index(index: Path) -> list[Path]:
    weight_map = json.loads(index.read_text()).get("weight_map")
    if not isinstance(weight_map, dict) or not weight_map:
        raise CheckpointFormatError(f"{index}: no weight_map")
    files = [index.parent / name for name in sorted(set(weight_map.values()))]
    absent = [str(f) for f in files if not f.exists()]
    if absent:
        raise CheckpointFormatError(f"{index}: shards missing: {absent}")
    return files


def _read_tensors(files: list[Path]) -> tuple[dict[str, torch.Tensor], dict[str, str]]:
    """All tensors (on CPU, memory-mapped where possible) and the first file's metadata."""
    tensors: dict[str, torch.Tensor] = {}
    metadata: dict[str, str] = {}
    for file in files:
        if file.suffix in _TORCH_SUFFIXES:
            obj = torch.load(file, map_location="cpu", weights_only=True, mmap=True)
            tensors.update(_flatten(obj))
            continue
        with safe_open(str(file), framework="pt", device="cpu") as fh:
            metadata = metadata or dict(fh.metadata() or {})
            for key in fh.keys():
                tensors[key] = fh.get_tensor(key)
    return tensors, metadata


def _flatten(obj: Any, prefix: str = "") -> dict[str, torch.Tensor]:
    # nested dicts of a torch.save checkpoint -> dotted names; non-tensor leaves are dropped
    if isinstance(obj, torch.Tensor):
        return {prefix.rstrip("."): obj}
    if isinstance(obj, Mapping):
        out: dict[str, torch.Tensor] = {}
        for key, value in obj.items():
            out.update(_flatten(value, f"{prefix}{key}."))
        return out
    return {}


def _to_native(
    raw: Mapping[str, torch.Tensor], prefix: str | None
) -> tuple[str | None, dict[str, torch.Tensor], list[str], list[str]]:
    """-> (format, {model name: tensor}, unexpected checkpoint keys, ambiguous model names)."""
    if prefix is None:
        for wrapper in ("generator.", "generator_ema."):
            if any(k.startswith(wrapper) for k in raw):
                log.info("using the %r weights of a multi-model checkpoint", wrapper)
                prefix = wrapper
                break
    stripped: dict[str, str] = {}  # checkpoint key -> key without wrappers
    for key in raw:
        short = keymaps.strip_prefix(key, prefix)
        if short is not None:
            stripped[key] = keymaps.strip_prefix(short)
    fmt = keymaps.detect_format(stripped.values())
    if fmt is None:
        return None, {}, [], []
    native: dict[str, torch.Tensor] = {}
    unexpected: list[str] = []
    ambiguous: set[str] = set()
    for key, short in stripped.items():
        name = keymaps.to_native(short, fmt)
        if name is None:
            unexpected.append(key)
        elif name in native:
            ambiguous.add(name)
        else:
            native[name] = raw[key]
    return fmt, native, unexpected, sorted(ambiguous)


# --------------------------------------------------------------------------------------------
# configs


def _config_from_json(path: Path) -> WanDiTConfig | None:
    if not path.is_file():
        return None
    cfg = json.loads(path.read_text())
    if cfg.get("_class_name") == "WanTransformer3DModel" or "num_attention_heads" in cfg:
        return WanDiTConfig.from_diffusers_config(cfg, name=path.parent.name)
    if "dim" in cfg and "num_heads" in cfg:
        return WanDiTConfig.from_original_config(cfg, name=path.parent.name)
    return None


def _config_from_metadata(metadata: Mapping[str, str]) -> WanDiTConfig | None:
    text = metadata.get(CONFIG_METADATA_KEY)
    return WanDiTConfig.from_original_config(json.loads(text), name="embedded") if text else None


def _infer_config(native: Mapping[str, torch.Tensor], source: str) -> WanDiTConfig:
    """A config from tensor shapes alone (heads are invisible in shapes: head_dim 128 assumed)."""
    needed = ("patch_embedding.weight", "text_embedding.0.weight", "time_embedding.0.weight",
              "blocks.0.ffn.0.weight", "head.head.weight")
    absent = [k for k in needed if k not in native]
    if absent:
        raise CheckpointKeyError(source, "original", absent, [])
    dim, in_channels, *patch = native["patch_embedding.weight"].shape
    if dim % _ASSUMED_HEAD_DIM:
        raise CheckpointFormatError(
            f"{source}: dim={dim} is not a multiple of {_ASSUMED_HEAD_DIM}; cannot infer "
            "num_heads, pass config=WanDiTConfig(...)"
        )
    layers = 1 + max(int(m.group(1)) for k in native if (m := re.match(r"blocks\.(\d+)\.", k)))
    cfg = WanDiTConfig(
        name="inferred",
        dim=dim,
        num_layers=layers,
        num_heads=dim // _ASSUMED_HEAD_DIM,
        ffn_dim=native["blocks.0.ffn.0.weight"].shape[0],
        freq_dim=native["time_embedding.0.weight"].shape[1],
        patch_size=tuple(patch),
        in_channels=in_channels,
        out_channels=native["head.head.weight"].shape[0] // math.prod(patch),
        text_dim=native["text_embedding.0.weight"].shape[1],
        qk_norm="rms_norm_across_heads" if "blocks.0.self_attn.norm_q.weight" in native else None,
        cross_attn_norm="blocks.0.norm3.weight" in native,
    )
    log.warning("%s has no config; inferred %s from tensor shapes (head_dim %d assumed)",
                source, cfg, _ASSUMED_HEAD_DIM)
    return cfg


def _adopt_hooks(cfg: WanDiTConfig, native: Mapping[str, torch.Tensor]) -> WanDiTConfig:
    """Hook widths from the checkpoint when its config.json predates the hooks."""
    changes = {}
    for field, key in (("action_dim", "action_embedding.0.weight"),
                       ("audio_dim", "audio_embedding.0.weight")):
        if key in native and getattr(cfg, field) == 0:
            changes[field] = native[key].shape[1]
    return cfg.replace(**changes) if changes else cfg


def _materialise_hooks(model: WanDiT, device: torch.device | str, dtype: torch.dtype) -> None:
    """Give hooks the checkpoint did not fill real (no-op) weights on ``device``."""
    for name in ("action_embedding", "audio_embedding"):
        hook = getattr(model, name)
        if hook is None or not any(p.is_meta for p in hook.parameters()):
            continue
        hook.to_empty(device=device)
        hook.reset_parameters()
        hook.to(param_dtype(f"{name}.0.weight", dtype))
        log.info("%s absent from the checkpoint: initialised as a no-op", name)
