"""Checkpoints on disk: find a component's weight files, read them, map their names, validate,
build the module, and write the original format back. One mechanism for the DiT and the VAE::

    path ─resolve─► weight files (+ config.json) ─read─► {checkpoint key: CPU tensor}
         ─key map─► {module name: checkpoint key} ─validate: keys, then shapes─► (nothing has
         touched the device yet) ─assign─► module built on the meta device, now on ``device``

``path`` may be a file (``*.safetensors``; ``*.safetensors.index.json`` with its shards;
``*.pt``/``*.pth``/``*.ckpt`` read with ``weights_only=True``) or a directory: a diffusers
component directory (``config.json`` + one ``*.safetensors`` or a sharded index), a diffusers
pipeline root holding the component's sub-directory (``transformer/``, ``vae/``), or a Wan model
root (original names; ``Wan2.1_VAE.pth`` for the VAE). The naming is recognised from the keys.

What differs per component is data and small functions of the family: the DiT's
(``models/wan/dit/keymaps.py``: diffusers/original name rules, training-checkpoint wrappers, config
inferred from shapes, optional action/audio hooks) and the VAE's (``models/wan/vae/keymap.py``:
a generated name table). The config comes from, in order: the ``config`` argument, a
``config.json`` next to the weights that describes this component, the config we embed in files
we write, then (DiT) the tensor shapes or (VAE) the ``wan2.1`` preset.

Errors name the checkpoint and every offending key at once: ``CheckpointFormatError`` (nothing
found, unreadable, or neither naming), ``CheckpointKeyError`` (missing / unexpected / ambiguous
keys), ``CheckpointShapeError`` (shapes that do not fit the config; checked once keys match).
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from safetensors import safe_open
from safetensors.torch import save_file
from torch import nn

from models.checkpoint.errors import (
    CheckpointError,
    CheckpointFormatError,
    CheckpointKeyError,
    CheckpointShapeError,
    listing,
)
from models.wan.dit import keymaps
from models.wan.dit.config import WanDiTConfig
from models.wan.dit.transformer import WanDiT, param_dtype
from models.wan.vae import keymap as vae_keymap
from models.wan.vae.autoencoder import WanVAE
from models.wan.vae.config import WanVAEConfig

__all__ = [
    "CheckpointError",
    "CheckpointFormatError",
    "CheckpointKeyError",
    "CheckpointShapeError",
    "Layout",
    "load_transformer",
    "load_vae",
    "read_tensors",
    "resolve",
    "save_original_format",
]

log = logging.getLogger(__name__)

_PICKLE_SUFFIXES = (".pt", ".pth", ".ckpt")
# --------------------------------------------------------------------------------------------
# locating and reading files


@dataclass(frozen=True, slots=True)
class Layout:
    """Where a component's weights lie in a directory: ``named_files`` are tried first, in order
    (e.g. ``Wan2.1_VAE.pth`` in a Wan root); ``subfolder`` is its diffusers pipeline directory."""

    component: str  # for messages: "WanDiT", "WanVAE"
    subfolder: str
    named_files: tuple[str, ...] = ()


# diffusers' own names win over other *.safetensors in the directory (fp16 variants, ...)
_DIFFUSERS_FILES = (
    "diffusion_pytorch_model.safetensors.index.json",
    "diffusion_pytorch_model.safetensors",
)
DIT_LAYOUT = Layout("WanDiT", "transformer", _DIFFUSERS_FILES)
VAE_LAYOUT = Layout(
    "WanVAE", "vae", ("Wan2.1_VAE.safetensors", "Wan2.1_VAE.pth", *_DIFFUSERS_FILES)
)


@dataclass(frozen=True, slots=True)
class Resolved:
    """The weight files of one checkpoint and the ``config.json`` found next to them."""

    files: tuple[Path, ...]
    config_json: Mapping[str, Any] | None
    config_dir: Path


def resolve(path: str | Path, layout: Layout) -> Resolved:
    """The weight files ``path`` stands for (see the module docstring)."""
    path = Path(path)
    if not path.exists():
        raise CheckpointFormatError(f"{layout.component} checkpoint {path} does not exist")
    if path.is_file():
        return Resolved(_files_of(path), _json_next_to(path.parent), path.parent)
    for name in layout.named_files:
        if (path / name).is_file():
            return Resolved(_files_of(path / name), _json_next_to(path), path)
    indexes = sorted(path.glob("*.safetensors.index.json"))
    singles = sorted(path.glob("*.safetensors"))
    if not (indexes or singles) and (path / layout.subfolder).is_dir():
        return resolve(path / layout.subfolder, layout)  # diffusers pipeline root
    if len(indexes) == 1:
        files = _shards(indexes[0])
    elif not indexes and len(singles) == 1:
        files = singles
    else:
        looked = [
            f"{layout.subfolder}/",
            *layout.named_files,
            "one *.safetensors.index.json",
            "one *.safetensors",
        ]
        found = [p.name for p in indexes + singles]
        raise CheckpointFormatError(
            f"no unambiguous {layout.component} weights in {path}: "
            f"looked for {looked}, found {found}"
        )
    return Resolved(tuple(files), _json_next_to(path), path)


def _files_of(file: Path) -> tuple[Path, ...]:
    return tuple(_shards(file)) if file.name.endswith(".index.json") else (file,)


def _json_next_to(directory: Path) -> Mapping[str, Any] | None:
    candidate = directory / "config.json"
    return json.loads(candidate.read_text()) if candidate.is_file() else None


def _shards(index: Path) -> list[Path]:
    weight_map = json.loads(index.read_text()).get("weight_map")
    if not isinstance(weight_map, dict) or not weight_map:
        raise CheckpointFormatError(f"{index}: no weight_map")
    files = [index.parent / name for name in sorted(set(weight_map.values()))]
    absent = [f.name for f in files if not f.exists()]
    if absent:
        raise CheckpointFormatError(f"{index}: shards missing {listing(absent)}")
    return files


def read_tensors(files: Iterable[Path]) -> tuple[dict[str, torch.Tensor], dict[str, str]]:
    """Every tensor of ``files`` on the CPU (memory-mapped where the format allows), names as
    stored (nested pickles flattened to dotted names), and the first safetensors metadata."""
    tensors: dict[str, torch.Tensor] = {}
    metadata: dict[str, str] = {}
    for file in files:
        if file.suffix in _PICKLE_SUFFIXES:
            try:
                obj = torch.load(file, map_location="cpu", weights_only=True, mmap=True)
            except Exception as exc:  # a foreign pickle: report which file, keep the cause
                raise CheckpointFormatError(f"{file}: not a tensor checkpoint ({exc})") from exc
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


# --------------------------------------------------------------------------------------------
# key maps, validation, assignment


@dataclass(frozen=True, slots=True)
class KeyMapping:
    """Checkpoint keys mapped onto module names under one naming ``fmt``; ``name_in_fmt``
    renders a module name in that naming (for reporting what is missing)."""

    fmt: str
    native: dict[str, str]  # module name -> checkpoint key
    unexpected: list[str]  # checkpoint keys no rule maps
    ambiguous: list[str]  # module names several checkpoint keys map onto
    name_in_fmt: Callable[[str], str | None]


def map_keys(
    keys: Iterable[str],
    fmt: str,
    rename: Callable[[str], str | None],
    name_in_fmt: Callable[[str], str | None] = lambda name: name,
) -> KeyMapping:
    """Apply a family's ``rename`` (checkpoint key -> module name or None) to every key;
    ``name_in_fmt`` is its inverse (module name -> name in ``fmt``)."""
    native: dict[str, str] = {}
    unexpected: list[str] = []
    ambiguous: set[str] = set()
    for key in keys:
        name = rename(key)
        if name is None:
            unexpected.append(key)
        elif name in native:
            ambiguous.add(name)
        else:
            native[name] = key
    return KeyMapping(fmt, native, unexpected, sorted(ambiguous), name_in_fmt)


def validate(
    source: str,
    component: str,
    mapping: KeyMapping,
    tensors: Mapping[str, torch.Tensor],
    model: nn.Module,
    optional: Callable[[str], bool] = lambda name: False,
) -> None:
    """Keys first (every problem in one ``CheckpointKeyError``), then shapes (one
    ``CheckpointShapeError``) against ``model`` (on the meta device). ``optional`` module names
    may be absent. Reads shapes only: no tensor data is touched."""
    expected = {name: tuple(t.shape) for name, t in model.state_dict().items()}
    missing = [
        mapping.name_in_fmt(k) or k for k in expected if k not in mapping.native and not optional(k)
    ]
    unexpected = mapping.unexpected + [
        mapping.native[k] for k in mapping.native if k not in expected
    ]
    if missing or unexpected or mapping.ambiguous:
        raise CheckpointKeyError(
            source, component, mapping.fmt, missing, unexpected, mapping.ambiguous
        )
    wrong = [
        (key, tuple(tensors[key].shape), expected[name])
        for name, key in mapping.native.items()
        if tuple(tensors[key].shape) != expected[name]
    ]
    if wrong:
        raise CheckpointShapeError(source, component, wrong)


def assign(
    model: nn.Module,
    mapping: KeyMapping,
    tensors: dict[str, torch.Tensor],
    device: torch.device | str,
    dtype_of: Callable[[str], torch.dtype],
) -> None:
    """Fill ``model`` (built on the meta device) with validated tensors on ``device``.

    copy=True: fresh, allocator-aligned storage (safetensors hands out tensors at whatever
    offset the file header leaves, and CPU kernels then take other SIMD paths; torch.load(mmap)
    ones keep the file mapped). Tensors are popped as they are copied so the host copy is freed
    progressively. Parameters the mapping lacks stay on the meta device for the caller.
    """
    state = {
        name: tensors.pop(key).to(device=device, dtype=dtype_of(name), copy=True)
        for name, key in mapping.native.items()
    }
    model.load_state_dict(state, strict=False, assign=True)


# --------------------------------------------------------------------------------------------
# the DiT


def load_transformer(
    path: str | Path,
    *,
    device: torch.device | str = "cpu",
    dtype: torch.dtype = torch.float32,
    config: WanDiTConfig | None = None,
    prefix: str | None = None,
) -> WanDiT:
    """A Wan2.1 ``WanDiT`` in eval mode on ``device`` (parameters in ``dtype`` except the
    timestep path and modulation tables, float32).

    ``prefix`` selects the keys under one wrapper (e.g. ``"generator_ema."`` of a training
    checkpoint holding several models); by default ``generator.`` is preferred when present and
    the other known wrappers are stripped. Absent action/audio hooks start as exact no-ops.
    """
    source = str(path)
    found = resolve(path, DIT_LAYOUT)
    tensors, metadata = read_tensors(found.files)
    if prefix is None and (prefix := keymaps.pick_wrapper(tensors)) is not None:
        log.info("using the %r weights of a multi-model checkpoint", prefix)
    # keys outside the chosen wrapper (a critic, an EMA copy) are not ours to report
    short = {
        k: keymaps.strip_prefix(s)
        for k in tensors
        if (s := keymaps.strip_prefix(k, prefix)) is not None
    }
    fmt = keymaps.detect_format(short.values())
    if fmt is None:
        raise CheckpointFormatError(
            f"{source}: not a WanDiT checkpoint: neither diffusers nor original Wan key names "
            f"under prefix {prefix!r}; keys found {listing(sorted(tensors))}"
        )
    mapping = map_keys(
        short,
        fmt,
        lambda k: keymaps.to_native(short[k], fmt),
        lambda name: keymaps.from_native(name, fmt),
    )
    shapes = {name: tuple(tensors[key].shape) for name, key in mapping.native.items()}
    cfg = config or _dit_config(found, metadata, shapes, source, fmt)

    with torch.device("meta"):
        model = WanDiT(cfg)
    # a hook is optional as a whole: absent entirely -> no-op init; partly present -> missing
    hooks = {name.split(".", 1)[0] for name in mapping.native if keymaps.is_hook_key(name)}

    def optional(name: str) -> bool:
        return keymaps.is_hook_key(name) and name.split(".", 1)[0] not in hooks

    validate(source, "WanDiT", mapping, tensors, model, optional)
    assign(model, mapping, tensors, device, lambda name: param_dtype(name, dtype))
    del tensors
    _materialise_hooks(model, device, dtype)
    log.info("loaded %s (%s naming, %s) onto %s as %s", source, fmt, cfg.name, device, dtype)
    return model.eval()


def _dit_config(
    found: Resolved, metadata: Mapping[str, str], shapes: Mapping[str, tuple], source: str, fmt: str
) -> WanDiTConfig:
    cfg = (
        keymaps.config_from_json(found.config_json, found.config_dir.name)
        if found.config_json is not None
        else None
    )
    cfg = cfg or keymaps.config_from_metadata(metadata)
    if cfg is None:
        absent = [k for k in keymaps.SHAPE_KEYS if k not in shapes]
        if absent:
            raise CheckpointKeyError(source, "WanDiT", fmt, absent, [])
        try:
            cfg = keymaps.config_from_shapes(shapes)
        except ValueError as exc:
            raise CheckpointFormatError(f"{source}: {exc}") from exc
    return keymaps.adopt_hooks(cfg, shapes)


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


# --------------------------------------------------------------------------------------------
# the VAE


def load_vae(
    path: str | Path,
    *,
    device: torch.device | str = "cpu",
    dtype: torch.dtype = torch.float32,
    config: WanVAEConfig | None = None,
) -> WanVAE:
    """A ``WanVAE`` in eval mode on ``device`` in ``dtype``; ``VAEConfigError`` for a diffusers
    config we do not implement."""
    source = str(path)
    found = resolve(path, VAE_LAYOUT)
    tensors, metadata = read_tensors(found.files)
    if config is None:
        config = (
            (
                vae_keymap.config_from_json(found.config_json)
                if found.config_json is not None
                else None
            )
            or vae_keymap.config_from_metadata(metadata)
            or WanVAEConfig.preset("wan2.1")
        )
    table = vae_keymap.vae_key_table(config)
    fmt = vae_keymap.detect_format(tensors, table)
    if fmt is None:
        raise CheckpointFormatError(
            f"{source}: not a WanVAE checkpoint: neither diffusers nor original Wan VAE names; "
            f"keys found {listing(sorted(tensors))}"
        )
    by_name = {row.name_in(fmt): row.ours for row in table}
    by_ours = {row.ours: row.name_in(fmt) for row in table}
    mapping = map_keys(tensors, fmt, by_name.get, by_ours.get)
    with torch.device("meta"):
        model = WanVAE(config)
    validate(source, "WanVAE", mapping, tensors, model)
    assign(model, mapping, tensors, device, lambda name: dtype)
    log.info("loaded %s (%s naming) onto %s as %s", source, fmt, device, dtype)
    return model.eval()


# --------------------------------------------------------------------------------------------
# writing


def save_original_format(
    module: nn.Module, path: str | Path, *, prefix: str = "", max_shard_bytes: int | None = None
) -> Path:
    """Write ``module`` (``WanDiT``, diffusers ``WanTransformer3DModel`` or ``WanVAE``) with
    original Wan names, its config in the safetensors metadata.

    Keys get ``prefix`` prepended (``"model."``, ``"generator.model."`` mimic training
    checkpoints). With ``max_shard_bytes`` the tensors are split into
    ``<stem>-0000i-of-0000n.safetensors`` files plus ``<path>.index.json``; returns the path to
    load (the file or the index).
    """
    if isinstance(module, WanVAE):
        params = module.state_dict()
        named = {row.original: params[row.ours] for row in vae_keymap.vae_key_table(module.config)}
        meta = {vae_keymap.CONFIG_METADATA_KEY: json.dumps(module.config.to_diffusers_config())}
    else:
        cfg, native = _dit_native(module)
        named = {_original_name(k): t for k, t in native.items()}
        meta = {keymaps.CONFIG_METADATA_KEY: json.dumps(cfg.to_original_config())}
    tensors = {prefix + k: t.detach().cpu().contiguous() for k, t in named.items()}
    return _write(tensors, Path(path), {"format": "pt", **meta}, max_shard_bytes)


def _original_name(native: str) -> str:
    name = keymaps.from_native(native, keymaps.ORIGINAL)
    if name is None:
        raise ValueError(f"WanDiT parameter {native!r} has no name in the original Wan format")
    return name


def _dit_native(module: nn.Module) -> tuple[WanDiTConfig, dict[str, torch.Tensor]]:
    """(config, {WanDiT name: tensor}) of a WanDiT or a diffusers WanTransformer3DModel."""
    if isinstance(module, WanDiT):
        return module.config, dict(module.state_dict())
    if type(module).__name__ != "WanTransformer3DModel":
        raise TypeError(f"cannot write a {type(module).__name__} in the original Wan format")
    mapping = map_keys(
        module.state_dict(), keymaps.DIFFUSERS, lambda k: keymaps.to_native(k, keymaps.DIFFUSERS)
    )
    if mapping.unexpected:
        raise CheckpointKeyError(
            type(module).__name__, "WanDiT", keymaps.DIFFUSERS, [], mapping.unexpected
        )
    state = module.state_dict()
    config: Any = module.config  # a diffusers FrozenDict (nn.Module's typing knows no such)
    cfg = WanDiTConfig.from_diffusers_config(dict(config))
    return cfg, {name: state[key] for name, key in mapping.native.items()}


def _write(
    tensors: dict[str, torch.Tensor],
    path: Path,
    metadata: dict[str, str],
    max_shard_bytes: int | None,
) -> Path:
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
    index.write_text(
        json.dumps(
            {"metadata": {"total_size": total, **metadata}, "weight_map": weight_map}, indent=1
        )
    )
    return index
