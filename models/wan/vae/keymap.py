"""What a Wan2.1 VAE checkpoint looks like: the parameter-name map ours <-> diffusers <->
original Wan, how the naming is recognised, and where the config comes from.

The table is generated from the config (not from a module), one row per tensor, so that
``models/checkpoint/load.py`` (the generic mechanics) can report every missing or unexpected key.

Original Wan naming (``Wan2.1_VAE.pth``; learnt from diffusers' single-file converter)::

    encoder.conv1                   encoder.conv_in
    encoder.downsamples.K.residual.{0,2,3,6}   encoder.down_blocks.K.{norm1,conv1,norm2,conv2}
    encoder.downsamples.K.shortcut  encoder.down_blocks.K.conv_shortcut
    encoder.downsamples.K.resample.1 / .time_conv     (a downsampler at flat index K)
    {en,de}coder.middle.{0,1,2}     mid_block.{resnets.0, attentions.0, resnets.1}
    {en,de}coder.head.{0,2}         norm_out, conv_out
    conv1 / conv2                   quant_conv / post_quant_conv
    decoder.conv1                   decoder.conv_in
    decoder.upsamples.K             decoder.up_blocks.i.{resnets.j | upsamplers.0}, flat:
                                    K = i * (num_res_blocks + 2) + j,
                                    upsampler at j = num_res_blocks + 1

Ours equals diffusers' naming except that a resampler's spatial conv is ``spatial_conv`` (diffusers
and Wan: ``resample.1``) and a decoder block's upsampler is ``upsampler`` (diffusers:
``upsamplers.0``).
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from itertools import pairwise
from typing import Any

from models.wan.dit.keymaps import DIFFUSERS, ORIGINAL
from models.wan.vae.config import WanVAEConfig

__all__ = [
    "CONFIG_METADATA_KEY",
    "FORMATS",
    "KeyRow",
    "config_from_json",
    "config_from_metadata",
    "detect_format",
    "vae_key_table",
]

FORMATS = (DIFFUSERS, ORIGINAL)
# safetensors metadata key under which the files we write carry the config (diffusers form)
CONFIG_METADATA_KEY = "dreamrt.wan_vae_config"


@dataclass(frozen=True, slots=True)
class KeyRow:
    """One tensor's name in our module, in diffusers' ``AutoencoderKLWan``, and in Wan's own."""

    ours: str
    diffusers: str
    original: str

    def name_in(self, fmt: str) -> str:
        """The name in naming ``fmt`` (``keymaps.DIFFUSERS`` or ``keymaps.ORIGINAL``)."""
        return self.diffusers if fmt == DIFFUSERS else self.original


_CONV = ("weight", "bias")
_RESNET = (
    ("norm1.gamma", "residual.0.gamma"),
    ("conv1.weight", "residual.2.weight"),
    ("conv1.bias", "residual.2.bias"),
    ("norm2.gamma", "residual.3.gamma"),
    ("conv2.weight", "residual.6.weight"),
    ("conv2.bias", "residual.6.bias"),
)
_SHORTCUT = (("conv_shortcut.weight", "shortcut.weight"), ("conv_shortcut.bias", "shortcut.bias"))
_ATTENTION = ("norm.gamma", "to_qkv.weight", "to_qkv.bias", "proj.weight", "proj.bias")


def _same(ours: str, diffusers: str, original: str, suffixes: tuple[str, ...]) -> Iterator[KeyRow]:
    for s in suffixes:
        yield KeyRow(f"{ours}.{s}", f"{diffusers}.{s}", f"{original}.{s}")


def _resnet(ours: str, diffusers: str, original: str, shortcut: bool) -> Iterator[KeyRow]:
    pairs = _RESNET + (_SHORTCUT if shortcut else ())
    for mine, theirs in pairs:
        yield KeyRow(f"{ours}.{mine}", f"{diffusers}.{mine}", f"{original}.{theirs}")


def _resampler(ours: str, diffusers: str, original: str, temporal: bool) -> Iterator[KeyRow]:
    # ours: <ours>.spatial_conv / .time_conv; diffusers and Wan: <prefix>.resample.1 / .time_conv
    for s in _CONV:
        yield KeyRow(f"{ours}.spatial_conv.{s}", f"{diffusers}.resample.1.{s}",
                     f"{original}.resample.1.{s}")  # fmt: skip
    if temporal:
        yield from _same(
            f"{ours}.time_conv", f"{diffusers}.time_conv", f"{original}.time_conv", _CONV
        )


def _middle(side: str) -> Iterator[KeyRow]:
    # side: "encoder" | "decoder"
    mid = f"{side}.mid_block"
    yield from _resnet(f"{mid}.resnets.0", f"{mid}.resnets.0", f"{side}.middle.0", False)
    yield from _same(f"{mid}.attentions.0", f"{mid}.attentions.0", f"{side}.middle.1", _ATTENTION)
    yield from _resnet(f"{mid}.resnets.1", f"{mid}.resnets.1", f"{side}.middle.2", False)


def _encoder(config: WanVAEConfig) -> Iterator[KeyRow]:
    dims = [config.base_dim * m for m in (1, *config.dim_mult)]
    yield from _same("encoder.conv_in", "encoder.conv_in", "encoder.conv1", _CONV)
    flat = 0
    last_stage = len(config.dim_mult) - 1
    for stage, (in_dim, out_dim) in enumerate(pairwise(dims)):
        for _ in range(config.num_res_blocks):
            name = f"encoder.down_blocks.{flat}"
            yield from _resnet(name, name, f"encoder.downsamples.{flat}", in_dim != out_dim)
            in_dim, flat = out_dim, flat + 1
        if stage != last_stage:
            temporal = config.temperal_downsample[stage]
            name = f"encoder.down_blocks.{flat}"
            yield from _resampler(name, name, f"encoder.downsamples.{flat}", temporal)
            flat += 1
    yield from _middle("encoder")
    yield KeyRow("encoder.norm_out.gamma", "encoder.norm_out.gamma", "encoder.head.0.gamma")
    yield from _same("encoder.conv_out", "encoder.conv_out", "encoder.head.2", _CONV)


def _decoder(config: WanVAEConfig) -> Iterator[KeyRow]:
    dims = [config.base_dim * m for m in (config.dim_mult[-1], *reversed(config.dim_mult))]
    temporal_up = tuple(reversed(config.temperal_downsample))
    last_stage = len(config.dim_mult) - 1
    per_stage = config.num_res_blocks + 2  # resnets + one upsampler in the flat Wan list
    yield from _same("decoder.conv_in", "decoder.conv_in", "decoder.conv1", _CONV)
    yield from _middle("decoder")
    for stage, (in_dim, out_dim) in enumerate(pairwise(dims)):
        in_dim = in_dim // 2 if stage > 0 else in_dim
        block = f"decoder.up_blocks.{stage}"
        for j in range(config.num_res_blocks + 1):
            name = f"{block}.resnets.{j}"
            original = f"decoder.upsamples.{stage * per_stage + j}"
            yield from _resnet(name, name, original, in_dim != out_dim)
            in_dim = out_dim
        if stage != last_stage:
            yield from _resampler(f"{block}.upsampler", f"{block}.upsamplers.0",
                                  f"decoder.upsamples.{stage * per_stage + per_stage - 1}",
                                  temporal_up[stage])  # fmt: skip
    yield KeyRow("decoder.norm_out.gamma", "decoder.norm_out.gamma", "decoder.head.0.gamma")
    yield from _same("decoder.conv_out", "decoder.conv_out", "decoder.head.2", _CONV)


def vae_key_table(config: WanVAEConfig) -> tuple[KeyRow, ...]:
    """Every parameter of ``WanVAE(config)`` with its name in the three namings."""
    rows = [
        *_encoder(config),
        *(KeyRow(f"quant_conv.{s}", f"quant_conv.{s}", f"conv1.{s}") for s in _CONV),
        *(KeyRow(f"post_quant_conv.{s}", f"post_quant_conv.{s}", f"conv2.{s}") for s in _CONV),
        *_decoder(config),
    ]
    return tuple(rows)


def detect_format(keys: Iterable[str], table: tuple[KeyRow, ...]) -> str | None:
    """The naming most of ``keys`` follow, or None when no key is a VAE name in either."""
    keys = set(keys)
    hits = {fmt: sum(row.name_in(fmt) in keys for row in table) for fmt in FORMATS}
    best = max(FORMATS, key=lambda fmt: hits[fmt])
    return best if hits[best] > 0 else None


def config_from_json(cfg: Mapping[str, Any], name: str = "") -> WanVAEConfig | None:
    """An ``AutoencoderKLWan`` ``config.json``; None for anything else (a Wan root holds the
    DiT's config.json next to ``Wan2.1_VAE.pth``)."""
    if cfg.get("_class_name") != "AutoencoderKLWan":
        return None
    return WanVAEConfig.from_diffusers_config(cfg)


def config_from_metadata(metadata: Mapping[str, str]) -> WanVAEConfig | None:
    """The config embedded by ``models.checkpoint.load.save_original_format``, if any."""
    text = metadata.get(CONFIG_METADATA_KEY)
    return WanVAEConfig.from_diffusers_config(json.loads(text)) if text else None
