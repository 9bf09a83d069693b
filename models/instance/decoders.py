"""The decoders of a loaded instance: which a session may pick (``"full"`` / ``"tiny"``), and the
codec, op and cache of each.

A mixin of ``WanInstance`` (``models/instance/resident.py``). The default decoder (the card's
``decoder_component``) is ``vae`` and ``decode_op`` - attributes a multi-GPU decode may replace
(``models.wan.vae.split``) - and the card's other decoder, when it was loaded, sits beside it
with an op of its own, so one resident instance serves sessions of either; the two ops never
batch together (the engine batches plans of one op object only).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping

from models.card import CheckpointManifest, ModelCard
from models.loops.ops import DecodeOp, LatentCodec

__all__ = ["DecoderUnavailableError", "InstanceDecoders", "with_loaded_decoders"]


class DecoderUnavailableError(ValueError):
    """A session asked for a decoder the instance does not serve (the message names them)."""


class InstanceDecoders:
    """Decoder options of a loaded instance (see the module docstring)."""

    card: ModelCard
    vae: LatentCodec
    decode_op: DecodeOp
    _other_codecs: dict[str, LatentCodec]
    _other_decode_ops: dict[str, DecodeOp]

    @property
    def default_decoder(self) -> str:
        """The decoder of a session that names none (the card's ``decoder_component``)."""
        return self.card.default_decoder

    def decoder_options(self) -> tuple[str, ...]:
        """The decoders sessions may pick here: the loaded ones, ``"full"`` before ``"tiny"``."""
        return self.card.decoders

    def resolve_decoder(self, decoder: str | None) -> str:
        """``decoder`` (None: the default) if this instance has it, else
        ``DecoderUnavailableError`` naming the decoders it has."""
        option = decoder or self.default_decoder
        if option not in self.decoder_options():
            raise DecoderUnavailableError(
                f"decoder {option!r}: model {self.card.model_id!r} serves the decoders "
                f"{list(self.decoder_options())}"
            )
        return option

    def codec_for(self, decoder: str | None) -> LatentCodec:
        """The latent codec of ``decoder`` (None: the default, ``vae``)."""
        option = self.resolve_decoder(decoder)
        return self.vae if option == self.default_decoder else self._other_codecs[option]

    def decode_op_for(self, decoder: str | None) -> DecodeOp:
        """The decode op of ``decoder`` (None: the default, ``decode_op``)."""
        option = self.resolve_decoder(decoder)
        if option == self.default_decoder:
            return self.decode_op
        return self._other_decode_ops[option]


def with_loaded_decoders(card: ModelCard, loaded: Mapping[str, object]) -> ModelCard:
    """``card`` without the non-default decoders that were not ``loaded`` (their component and
    manifest entry), so what the card says of its decoders (``GET /v1/models``) is what the
    instance serves."""
    missing = {
        card.decoder_component_for(option)
        for option in card.decoders
        if option != card.default_decoder and option not in loaded
    }
    if not missing:
        return card
    components = {k: v for k, v in card.components.items() if k not in missing}
    entries = {k: v for k, v in card.checkpoint.components.items() if k not in missing}
    return dataclasses.replace(card, components=components, checkpoint=CheckpointManifest(entries))
