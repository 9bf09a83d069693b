"""What a Wan DiT checkpoint looks like: parameter-name maps for the two formats in the wild,
the wrappers training code puts around them, and the config the names and shapes imply.

``models/checkpoint/load.py`` runs the generic mechanics (files, shards, validation, writing); this
module is the data and the small functions it applies for the DiT.

``WanDiT`` uses the original Wan names, so:

- (a) diffusers (``WanTransformer3DModel``: ``condition_embedder.time_proj``,
  ``blocks.N.attn1.to_q`` ...) maps name by name through ``DIFFUSERS_RULES`` (every rule is a
  bijection, so the same table writes diffusers names back);
- (b) original Wan / Self-Forcing / CausVid / LongLive (``blocks.N.self_attn.q``, ``head.head``
  ...) is our own naming once wrapper prefixes (``model.``, ``generator.``, ``module.`` ...) are
  stripped; ``ORIGINAL_RULES`` lists every accepted name, so anything else is "unexpected".

A key no rule matches maps to ``None``; the loader reports it. The action/audio hooks are ours
and carry the same names in both formats.
"""

from __future__ import annotations

import json
import logging
import math
import re
from collections.abc import Iterable, Mapping, Sequence
from typing import Any, cast, overload

from models.wan.dit.config import WanDiTConfig

__all__ = [
    "CONFIG_METADATA_KEY",
    "DIFFUSERS",
    "HOOK_PREFIXES",
    "ORIGINAL",
    "ORIGINAL_PREFIXES",
    "SHAPE_KEYS",
    "adopt_hooks",
    "config_from_json",
    "config_from_metadata",
    "config_from_shapes",
    "detect_format",
    "from_native",
    "is_hook_key",
    "pick_wrapper",
    "strip_prefix",
    "to_native",
]

log = logging.getLogger(__name__)

DIFFUSERS = "diffusers"
ORIGINAL = "original"

# safetensors metadata key under which the files we write carry the config (original form)
CONFIG_METADATA_KEY = "dreamrt.wan_config"
# the tensors whose shapes determine a config when nothing describes it
SHAPE_KEYS = (
    "patch_embedding.weight",
    "text_embedding.0.weight",
    "time_embedding.0.weight",
    "blocks.0.ffn.0.weight",
    "head.head.weight",
)
_ASSUMED_HEAD_DIM = 128  # invisible in shapes; true for every released Wan2.1

# {n}: block or layer index; {p}: weight | bias. Left: checkpoint name; right: WanDiT name.
_HOOKS = (
    ("action_embedding.{n}.{p}", "action_embedding.{n}.{p}"),
    ("audio_embedding.{n}.{p}", "audio_embedding.{n}.{p}"),
)

DIFFUSERS_RULES: tuple[tuple[str, str], ...] = (
    ("patch_embedding.{p}", "patch_embedding.{p}"),
    ("condition_embedder.time_embedder.linear_1.{p}", "time_embedding.0.{p}"),
    ("condition_embedder.time_embedder.linear_2.{p}", "time_embedding.2.{p}"),
    ("condition_embedder.time_proj.{p}", "time_projection.1.{p}"),
    ("condition_embedder.text_embedder.linear_1.{p}", "text_embedding.0.{p}"),
    ("condition_embedder.text_embedder.linear_2.{p}", "text_embedding.2.{p}"),
    ("blocks.{n}.attn1.to_q.{p}", "blocks.{n}.self_attn.q.{p}"),
    ("blocks.{n}.attn1.to_k.{p}", "blocks.{n}.self_attn.k.{p}"),
    ("blocks.{n}.attn1.to_v.{p}", "blocks.{n}.self_attn.v.{p}"),
    ("blocks.{n}.attn1.to_out.0.{p}", "blocks.{n}.self_attn.o.{p}"),
    ("blocks.{n}.attn1.norm_q.{p}", "blocks.{n}.self_attn.norm_q.{p}"),
    ("blocks.{n}.attn1.norm_k.{p}", "blocks.{n}.self_attn.norm_k.{p}"),
    ("blocks.{n}.attn2.to_q.{p}", "blocks.{n}.cross_attn.q.{p}"),
    ("blocks.{n}.attn2.to_k.{p}", "blocks.{n}.cross_attn.k.{p}"),
    ("blocks.{n}.attn2.to_v.{p}", "blocks.{n}.cross_attn.v.{p}"),
    ("blocks.{n}.attn2.to_out.0.{p}", "blocks.{n}.cross_attn.o.{p}"),
    ("blocks.{n}.attn2.norm_q.{p}", "blocks.{n}.cross_attn.norm_q.{p}"),
    ("blocks.{n}.attn2.norm_k.{p}", "blocks.{n}.cross_attn.norm_k.{p}"),
    # diffusers' norm2 is the cross-attention norm, Wan's norm3 (diffusers' norm3 = Wan's
    # norm2 has no parameters).
    ("blocks.{n}.norm2.{p}", "blocks.{n}.norm3.{p}"),
    ("blocks.{n}.ffn.net.0.proj.{p}", "blocks.{n}.ffn.0.{p}"),
    ("blocks.{n}.ffn.net.2.{p}", "blocks.{n}.ffn.2.{p}"),
    ("blocks.{n}.scale_shift_table", "blocks.{n}.modulation"),
    ("scale_shift_table", "head.modulation"),
    ("proj_out.{p}", "head.head.{p}"),
    *_HOOKS,
)

ORIGINAL_RULES: tuple[tuple[str, str], ...] = tuple((name, name) for _, name in DIFFUSERS_RULES)

# Wrappers around the original names: Self-Forcing / CausVid training checkpoints
# (``generator.model.blocks...``), ComfyUI single files (``model.diffusion_model.``), DDP
# (``module.``), torch.compile (``_orig_mod.``). Stripped repeatedly from the front of a key.
ORIGINAL_PREFIXES = (
    "generator_ema.",
    "generator.",
    "model.diffusion_model.",
    "diffusion_model.",
    "model.",
    "module.",
    "_orig_mod.",
)

HOOK_PREFIXES = ("action_embedding.", "audio_embedding.")

_FIELDS = {"n": r"(?P<n>\d+)", "p": r"(?P<p>weight|bias)"}


def _compile(template: str) -> re.Pattern[str]:
    pattern = re.escape(template).replace(r"\{n\}", "{n}").replace(r"\{p\}", "{p}")
    return re.compile("^" + pattern.format(**_FIELDS) + "$")


_TABLES = {
    DIFFUSERS: [(_compile(src), src, dst, _compile(dst)) for src, dst in DIFFUSERS_RULES],
    ORIGINAL: [(_compile(src), src, dst, _compile(dst)) for src, dst in ORIGINAL_RULES],
}


def _fill(template: str, match: re.Match[str]) -> str:
    return template.format(**match.groupdict())


def to_native(key: str, fmt: str) -> str | None:
    """WanDiT name of checkpoint key ``key`` (prefix already stripped), or None if unknown."""
    for src_re, _src, dst, _dst_re in _TABLES[fmt]:
        if match := src_re.match(key):
            return _fill(dst, match)
    return None


def from_native(key: str, fmt: str) -> str | None:
    """Checkpoint name in format ``fmt`` of WanDiT parameter ``key``, or None if unknown."""
    for _src_re, src, _dst, dst_re in _TABLES[fmt]:
        if match := dst_re.match(key):
            return _fill(src, match)
    return None


@overload
def strip_prefix(key: str) -> str: ...


@overload
def strip_prefix(key: str, only: str | None) -> str | None: ...


def strip_prefix(key: str, only: str | None = None) -> str | None:
    """Remove wrapper prefixes; with ``only``, keys without that prefix are dropped (None)."""
    if only is not None:
        return key[len(only) :] if key.startswith(only) else None
    changed = True
    while changed:
        changed = False
        for prefix in ORIGINAL_PREFIXES:
            if key.startswith(prefix):
                key, changed = key[len(prefix) :], True
                break
    return key


def pick_wrapper(keys: Iterable[str]) -> str | None:
    """The model to take from a multi-model training checkpoint (the generator, not its EMA or
    critic), or None when the checkpoint holds one model."""
    keys = list(keys)
    for wrapper in ("generator.", "generator_ema."):
        if any(k.startswith(wrapper) for k in keys):
            return wrapper
    return None


def is_hook_key(native_key: str) -> bool:
    return native_key.startswith(HOOK_PREFIXES)


def detect_format(keys: Iterable[str]) -> str | None:
    """``DIFFUSERS``, ``ORIGINAL`` or None, from names alone (prefixes already stripped)."""
    keys = list(keys)
    if any(k.startswith(("condition_embedder.", "proj_out.")) or ".attn1." in k for k in keys):
        return DIFFUSERS
    if any(k.startswith(("head.head.", "time_embedding.")) or ".self_attn." in k for k in keys):
        return ORIGINAL
    return None


# --------------------------------------------------------------------------------------------
# the config a checkpoint implies


def config_from_json(cfg: Mapping[str, Any], name: str) -> WanDiTConfig | None:
    """A diffusers ``WanTransformer3DModel`` or Wan ``config.json``; None for anything else."""
    if cfg.get("_class_name") == "WanTransformer3DModel" or "num_attention_heads" in cfg:
        return WanDiTConfig.from_diffusers_config(cfg, name=name)
    if "dim" in cfg and "num_heads" in cfg:
        return WanDiTConfig.from_original_config(cfg, name=name)
    return None


def config_from_metadata(metadata: Mapping[str, str]) -> WanDiTConfig | None:
    """The config embedded by ``models.checkpoint.load.save_original_format``, if any."""
    text = metadata.get(CONFIG_METADATA_KEY)
    return WanDiTConfig.from_original_config(json.loads(text), name="embedded") if text else None


def config_from_shapes(shapes: Mapping[str, Sequence[int]]) -> WanDiTConfig:
    """A config from WanDiT-named tensor shapes alone (every ``SHAPE_KEYS`` entry present).

    Heads are invisible in shapes: head_dim 128 is assumed; ``ValueError`` if ``dim`` is not a
    multiple of it.
    """
    dim, in_channels, *patch = shapes["patch_embedding.weight"]
    if dim % _ASSUMED_HEAD_DIM:
        raise ValueError(
            f"dim={dim} is not a multiple of {_ASSUMED_HEAD_DIM}; cannot infer "
            "num_heads, pass config=WanDiTConfig(...)"
        )
    layers = 1 + max(int(m.group(1)) for k in shapes if (m := re.match(r"blocks\.(\d+)\.", k)))
    cfg = WanDiTConfig(
        name="inferred",
        dim=dim,
        num_layers=layers,
        num_heads=dim // _ASSUMED_HEAD_DIM,
        ffn_dim=shapes["blocks.0.ffn.0.weight"][0],
        freq_dim=shapes["time_embedding.0.weight"][1],
        # WanDiTConfig refuses a patch that is not three sizes
        patch_size=cast(tuple[int, int, int], tuple(patch)),
        in_channels=in_channels,
        out_channels=shapes["head.head.weight"][0] // math.prod(patch),
        text_dim=shapes["text_embedding.0.weight"][1],
        qk_norm="rms_norm_across_heads" if "blocks.0.self_attn.norm_q.weight" in shapes else None,
        cross_attn_norm="blocks.0.norm3.weight" in shapes,
    )
    log.warning(
        "no config; inferred %s from tensor shapes (head_dim %d assumed)", cfg, _ASSUMED_HEAD_DIM
    )
    return cfg


def adopt_hooks(cfg: WanDiTConfig, shapes: Mapping[str, Sequence[int]]) -> WanDiTConfig:
    """Hook widths from the checkpoint when its config predates the hooks."""
    changes = {}
    for field, key in (
        ("action_dim", "action_embedding.0.weight"),
        ("audio_dim", "audio_embedding.0.weight"),
    ):
        if key in shapes and getattr(cfg, field) == 0:
            changes[field] = shapes[key][1]
    return cfg.replace(**changes) if changes else cfg
