"""Explicit parameter-name maps between WanDiT and the two checkpoint formats in the wild.

``WanDiT`` uses the original Wan names, so:

- (a) diffusers (``WanTransformer3DModel``: ``condition_embedder.time_proj``,
  ``blocks.N.attn1.to_q`` ...) maps name by name through ``DIFFUSERS_RULES`` (every rule is a bijection, so the same
  table writes diffusers names back);
- (b) original Wan / Self-Forcing / CausVid / LongLive (``blocks.N.self_attn.q``, ``head.head``
  ...) is our own naming once wrapper prefixes (``model.``, ``generator.``, ``module.`` ...) are
  stripped; ``ORIGINAL_RULES`` lists every accepted name, so anything else is "unexpected".

A key no rule matches maps to ``None``; the loader reports it. The action/audio hooks are ours
and carry the same names in both formats.
"""

from __future__ import annotations

import re
from collections.abc import Iterable

__all__ = [
    "DIFFUSERS",
    "HOOK_PREFIXES",
    "ORIGINAL",
    "ORIGINAL_PREFIXES",
    "detect_format",
    "from_native",
    "is_hook_key",
    "strip_prefix",
    "to_native",
]

DIFFUSERS = "diffusers"
ORIGINAL = "original"

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
ORIGINAL_PREFIXES = ("generator_ema.", "generator.", "model.diffusion_model.", "diffusion_model.",
                     "model.", "module.", "_orig_mod.")

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


def strip_prefix(key: str, only: str | None = None) -> str | None:
    """Remove wrapper prefixes; with ``only``, keys without that prefix are dropped (None)."""
    if only is not None:
        return key[len(only):] if key.startswith(only) else None
    changed = True
    while changed:
        changed = False
        for prefix in ORIGINAL_PREFIXES:
            if key.startswith(prefix):
                key, changed = key[len(prefix):], True
                break
    return key


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
