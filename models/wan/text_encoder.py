"""Wan's text encoder: UMT5 (``transformers.UMT5EncoderModel``) plus a tokenizer, and a
content-hash cache so a prompt is encoded once.

Output contract (as Wan and diffusers' ``WanPipeline``): ``[B, text_len, text_dim]``; the rows of
real tokens (including EOS) hold the encoder's last hidden state, every padding row is zero.

Tokenizers: a real checkpoint directory brings its own tokenizer files (``from_pretrained``;
nothing is ever downloaded). For random-weight cards and tests there is ``ByteFallbackTokenizer``,
an OFFLINE STAND-IN that is not the UMT5 vocabulary: its embeddings mean nothing to a trained
DiT, and ``from_pretrained`` never falls back to it.

``transformers`` is an optional extra (``reference``): this module imports without it (the cache
and the byte tokenizer serve every card), and building a UMT5 encoder without it raises
``MissingExtraError`` naming the extra to install.
"""

from __future__ import annotations

import hashlib
import html
import logging
import re
from collections import OrderedDict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

import torch

from runtime.contract import CacheKey

if TYPE_CHECKING:
    from transformers import UMT5EncoderModel

__all__ = [
    "ByteFallbackTokenizer",
    "CachedTextEncoder",
    "EmbeddingStore",
    "HFTokenizer",
    "MissingExtraError",
    "TextEmbeddingCache",
    "TextEncoderError",
    "UMT5_PRESETS",
    "UMT5Preset",
    "UMT5TextEncoder",
    "clean_prompt",
    "require_transformers",
]

log = logging.getLogger(__name__)

_PRECISION_OF = {torch.float32: "fp32", torch.bfloat16: "bf16", torch.float16: "fp16"}
_CLEANING = "ws1"  # version of clean_prompt; part of every tokenizer signature


class TextEncoderError(ValueError):
    """A text encoder cannot be built or loaded (names the path, preset or value)."""


class MissingExtraError(ImportError):
    """An optional dependency is not installed; the message names the extra that brings it."""


def require_transformers() -> Any:
    """The ``transformers`` package, imported on first use (only UMT5 encoders need it);
    ``MissingExtraError`` when it is not installed."""
    try:
        import transformers
    except ImportError as exc:
        raise MissingExtraError(
            "the UMT5 text encoder of the Wan cards needs the optional package 'transformers': "
            "pip install 'dreamrt[reference]'"
        ) from exc
    return transformers


@dataclass(frozen=True, slots=True)
class UMT5Preset:
    """``config``: ``UMT5Config`` kwargs; ``text_len``: padded prompt length in tokens."""

    name: str
    text_len: int
    config: Mapping[str, Any]

    @property
    def text_dim(self) -> int:
        return int(self.config["d_model"])


_UMT5_COMMON = {
    "feed_forward_proj": "gated-gelu",
    "relative_attention_num_buckets": 32,
    "relative_attention_max_distance": 128,
    "layer_norm_epsilon": 1e-6,
    "tie_word_embeddings": False,
    "pad_token_id": 0,
    "eos_token_id": 1,
}

UMT5_PRESETS: Mapping[str, UMT5Preset] = {
    # google/umt5-xxl encoder as shipped in Wan2.1-T2V-*-Diffusers/text_encoder.
    "umt5-xxl": UMT5Preset(
        "umt5-xxl",
        512,
        {
            **_UMT5_COMMON,
            "vocab_size": 256384,
            "d_model": 4096,
            "d_kv": 64,
            "d_ff": 10240,
            "num_layers": 24,
            "num_heads": 64,
        },
    ),
    # Matches the "tiny" DiT preset (text_dim 32, text_len 16); vocab covers the byte fallback.
    "umt5-tiny": UMT5Preset(
        "umt5-tiny",
        16,
        {
            **_UMT5_COMMON,
            "vocab_size": 384,
            "d_model": 32,
            "d_kv": 8,
            "d_ff": 64,
            "num_layers": 2,
            "num_heads": 4,
        },
    ),
}


def clean_prompt(text: str) -> str:
    """Wan's prompt cleaning without ftfy: HTML-unescape twice, collapse whitespace, strip."""
    return re.sub(r"\s+", " ", html.unescape(html.unescape(text))).strip()


# --------------------------------------------------------------------------------------------
# Tokenizers


class Tokenizer(Protocol):
    """Maps texts to ``ids``/``mask`` ``[B, text_len]`` int64 (right-padded, EOS kept on
    truncation). ``signature`` identifies the vocabulary and is part of the cache key."""

    signature: str

    def __call__(
        self, texts: Sequence[str], text_len: int
    ) -> tuple[torch.Tensor, torch.Tensor]: ...


class ByteFallbackTokenizer:
    """OFFLINE FALLBACK, NOT THE UMT5 VOCABULARY: for random-weight cards and tests only.

    Token ``j`` is ``3 + byte_j mod (vocab_size - 3)`` of the UTF-8 text (0 pad, 1 EOS, 2 unused
    as in T5), then EOS, then padding. Bytes past ``text_len - 1`` are folded into the earlier
    positions rather than dropped, so long prompts that share a prefix still differ.
    """

    PAD, EOS, OFFSET = 0, 1, 3

    def __init__(self, vocab_size: int) -> None:
        if vocab_size <= self.OFFSET + 1:
            raise TextEncoderError(
                f"byte fallback needs vocab_size > {self.OFFSET + 1}, got {vocab_size}"
            )
        self.vocab_size = vocab_size
        self.signature = f"byte-fallback-v1:vocab={vocab_size}:{_CLEANING}"

    def __call__(self, texts: Sequence[str], text_len: int) -> tuple[torch.Tensor, torch.Tensor]:
        if text_len < 1:
            raise TextEncoderError(f"text_len must be >= 1, got {text_len}")
        span = self.vocab_size - self.OFFSET
        width = text_len - 1  # positions for text; the last real position is EOS
        ids = torch.full((len(texts), text_len), self.PAD, dtype=torch.int64)  # [B, L]
        mask = torch.zeros((len(texts), text_len), dtype=torch.int64)  # [B, L]
        for row, text in enumerate(texts):
            data = text.encode("utf-8")
            tokens = [b % span for b in data[:width]]
            for j in range(width, len(data)):
                slot = j % width
                tokens[slot] = (tokens[slot] * 31 + data[j] + j) % span
            n = len(tokens)
            ids[row, :n] = torch.tensor(tokens, dtype=torch.int64) + self.OFFSET
            ids[row, n] = self.EOS
            mask[row, : n + 1] = 1
        return ids, mask


class HFTokenizer:
    """A ``transformers`` tokenizer loaded from local files (``local_files_only``)."""

    def __init__(self, tokenizer: Any, signature: str) -> None:
        self.tokenizer = tokenizer
        self.signature = signature

    @classmethod
    def from_dir(cls, path: str | Path) -> HFTokenizer:
        """Load the tokenizer files in ``path``; ``TextEncoderError`` if there are none."""
        root = Path(path)
        files = sorted(p for p in root.glob("*") if p.is_file()) if root.is_dir() else []
        if not files:
            raise TextEncoderError(
                f"no tokenizer files in {str(root)!r}; a checkpoint directory "
                f"must bring its tokenizer (nothing is downloaded)"
            )
        auto = require_transformers().AutoTokenizer
        tokenizer = auto.from_pretrained(str(root), local_files_only=True)
        digest = hashlib.sha256()
        for p in files:
            digest.update(p.name.encode() + b"\0" + p.read_bytes())
        return cls(tokenizer, f"hf-sha256:{digest.hexdigest()[:16]}:{_CLEANING}")

    def __call__(self, texts: Sequence[str], text_len: int) -> tuple[torch.Tensor, torch.Tensor]:
        out = self.tokenizer(
            list(texts),
            padding="max_length",
            max_length=text_len,
            truncation=True,
            add_special_tokens=True,
            return_attention_mask=True,
            return_tensors="pt",
        )
        return out.input_ids.long(), out.attention_mask.long()  # [B, L] each


# --------------------------------------------------------------------------------------------
# Encoder


class UMT5TextEncoder:
    """UMT5 encoder + tokenizer: ``encode(texts) -> [B, text_len, text_dim]``, padding rows zero.

    Holds weights only (no per-request state). Runs under ``torch.no_grad``; the model is in
    eval mode (no dropout). Build with ``from_pretrained`` (a real checkpoint) or
    ``from_preset`` (seeded random weights, byte fallback tokenizer).
    """

    def __init__(self, model: UMT5EncoderModel, tokenizer: Tokenizer, text_len: int) -> None:
        if text_len < 1:
            raise TextEncoderError(f"text_len must be >= 1, got {text_len}")
        self.model = model.eval()
        self.tokenizer = tokenizer
        self.text_len = text_len

    @classmethod
    def from_preset(
        cls,
        name: str,
        *,
        seed: int = 0,
        device: str | torch.device = "cpu",
        dtype: torch.dtype = torch.float32,
    ) -> UMT5TextEncoder:
        """Random weights from ``UMT5_PRESETS[name]``, deterministic for (seed, device type),
        with the byte fallback tokenizer."""
        preset = _preset(name)
        transformers = require_transformers()
        config = transformers.UMT5Config(**preset.config)
        device = torch.device(device)
        cuda = [device] if device.type == "cuda" else []
        with torch.random.fork_rng(devices=cuda):
            torch.manual_seed(seed)
            with device:
                model = transformers.UMT5EncoderModel(config)
        tokenizer = ByteFallbackTokenizer(config.vocab_size)
        return cls(model.to(dtype=dtype), tokenizer, preset.text_len)

    @classmethod
    def from_pretrained(
        cls,
        encoder_dir: str | Path,
        tokenizer_dir: str | Path,
        *,
        text_len: int = 512,
        preset: str | None = None,
        device: str | torch.device = "cpu",
        dtype: torch.dtype = torch.bfloat16,
    ) -> UMT5TextEncoder:
        """Load a diffusers-layout ``text_encoder/`` and its ``tokenizer/`` from local files.

        With ``preset``, the checkpoint's width must match it (catches a wrong directory before
        a DiT sees mis-sized embeddings).
        """
        encoder_dir = Path(encoder_dir)
        if not (encoder_dir / "config.json").is_file():
            raise TextEncoderError(f"{str(encoder_dir)!r} has no config.json")
        transformers = require_transformers()
        config = transformers.UMT5Config.from_pretrained(str(encoder_dir), local_files_only=True)
        if preset is not None and config.d_model != _preset(preset).text_dim:
            raise TextEncoderError(
                f"{str(encoder_dir)!r} has d_model={config.d_model}, "
                f"preset {preset!r} expects {_preset(preset).text_dim}"
            )
        tokenizer = HFTokenizer.from_dir(tokenizer_dir)
        model = transformers.UMT5EncoderModel.from_pretrained(
            str(encoder_dir), config=config, local_files_only=True, dtype=dtype
        )
        return cls(model.to(device=device), tokenizer, text_len)

    @property
    def device(self) -> torch.device:
        return self.model.device

    @property
    def dtype(self) -> torch.dtype:
        return self.model.dtype

    @property
    def text_dim(self) -> int:
        return int(self.model.config.d_model)

    @property
    def precision(self) -> str:
        if self.dtype not in _PRECISION_OF:
            raise TextEncoderError(
                f"no precision name for dtype {self.dtype}; known: {sorted(_PRECISION_OF.values())}"
            )
        return _PRECISION_OF[self.dtype]

    @property
    def shape_sig(self) -> str:
        """Everything besides weights and text that shapes the output (for cache keys)."""
        return f"text_len={self.text_len},text_dim={self.text_dim},tok={self.tokenizer.signature}"

    def tokenize(self, texts: Sequence[str]) -> tuple[torch.Tensor, torch.Tensor]:
        """``ids``, ``mask``: ``[B, text_len]`` int64 on the CPU."""
        return self.tokenizer([clean_prompt(t) for t in texts], self.text_len)

    @torch.no_grad()
    def encode(self, texts: Sequence[str]) -> torch.Tensor:
        """``[B, text_len, text_dim]`` in the model's dtype, on its device; padding rows zero."""
        ids, mask = self.tokenize(texts)  # [B, L]
        ids, mask = ids.to(self.device), mask.to(self.device)
        hidden = self.model(input_ids=ids, attention_mask=mask).last_hidden_state  # [B, L, D]
        return hidden.masked_fill(mask.unsqueeze(-1) == 0, 0.0)


def _preset(name: str) -> UMT5Preset:
    try:
        return UMT5_PRESETS[name]
    except KeyError:
        raise TextEncoderError(
            f"unknown UMT5 preset {name!r}; known: {sorted(UMT5_PRESETS)}"
        ) from None


# --------------------------------------------------------------------------------------------
# Content-hash cache


class EmbeddingStore(Protocol):
    """What the cached encoder needs from a cache: ``get`` returns None on a miss.
    The runtime's feature cache satisfies it; so does ``TextEmbeddingCache``."""

    def get(self, key: CacheKey) -> torch.Tensor | None: ...

    def put(
        self, key: CacheKey, value: torch.Tensor
    ) -> object: ...  # a "not cached" result is fine


class TextEmbeddingCache:
    """A bounded in-process LRU store: ``[text_len, text_dim]`` tensors by ``CacheKey``.

    A full cache evicts its least recently used entry on ``put`` (never raises). ``hits``,
    ``misses`` count ``get`` calls; ``evictions`` counts dropped entries.
    """

    def __init__(self, max_entries: int = 256) -> None:
        if max_entries < 1:
            raise ValueError(f"max_entries must be >= 1, got {max_entries}")
        self.max_entries = max_entries
        self._entries: OrderedDict[CacheKey, torch.Tensor] = OrderedDict()
        self.hits = 0
        self.misses = 0
        self.evictions = 0

    def get(self, key: CacheKey) -> torch.Tensor | None:
        value = self._entries.get(key)
        if value is None:
            self.misses += 1
            return None
        self._entries.move_to_end(key)
        self.hits += 1
        return value

    def put(self, key: CacheKey, value: torch.Tensor) -> None:
        self._entries[key] = value
        self._entries.move_to_end(key)
        while len(self._entries) > self.max_entries:
            self._entries.popitem(last=False)
            self.evictions += 1

    def __len__(self) -> int:
        return len(self._entries)

    def drop_version(self, weights_version: str) -> int:
        """Forget every entry made by ``weights_version`` (a weight sync, a sleeping encoder);
        -> how many."""
        stale = [k for k in self._entries if k.weights_version == weights_version]
        for key in stale:
            del self._entries[key]
        return len(stale)

    def __contains__(self, key: object) -> bool:
        return key in self._entries


class CachedTextEncoder:
    """Encodes each distinct prompt once per ``CacheKey`` (model, component, weights version,
    precision, shape/tokenizer signature, sha256 of the text).

    Also a batchable ``StepOp`` for ``PlanKind.TEXT_ENCODE``: ``op(texts) -> [[L, D], ...]``.
    ``hits``/``misses`` count prompts served from / added to ``store``. Returned tensors are
    fresh (stacked); the cached rows are never handed out for in-place modification.
    """

    name = "text_encode"
    batchable = True
    spmd = "leader"  # only rank 0 runs it (runtime/spmd.py): no collectives inside

    def __init__(
        self,
        encoder: UMT5TextEncoder,
        store: EmbeddingStore,
        *,
        model_id: str,
        weights_version: str,
        component: str = "text_encoder",
    ) -> None:
        self.encoder = encoder
        self.store = store
        self.model_id = model_id
        self.weights_version = weights_version
        self.component = component
        self.hits = 0
        self.misses = 0

    def key_for(self, text: str) -> CacheKey:
        return CacheKey(
            model_id=self.model_id,
            component=self.component,
            weights_version=self.weights_version,
            precision=self.encoder.precision,
            shape_sig=self.encoder.shape_sig,
            input_hash=hashlib.sha256(text.encode("utf-8")).hexdigest(),
        )

    def encode(self, texts: Sequence[str], *, deterministic: bool = False) -> torch.Tensor:
        """``[B, text_len, text_dim]``. Misses are encoded in one batch, or one at a time when
        ``deterministic`` (batch-invariant results)."""
        return torch.stack(self._rows(texts, deterministic))

    def __call__(self, args: Sequence[str], *, deterministic: bool = False) -> list[torch.Tensor]:
        """StepOp form: one ``[text_len, text_dim]`` tensor per text, in order."""
        return [row.clone() for row in self._rows(args, deterministic)]

    def _rows(self, texts: Sequence[str], deterministic: bool) -> list[torch.Tensor]:
        # Returns the cached tensors themselves; callers copy before handing them out.
        keys = [self.key_for(t) for t in texts]
        rows: dict[CacheKey, torch.Tensor] = {}
        missing: dict[CacheKey, str] = {}
        for key, text in zip(keys, texts, strict=True):
            if key in rows or key in missing:
                continue
            cached = self.store.get(key)
            if cached is None:
                missing[key] = text
            else:
                rows[key] = cached
                self.hits += 1
        miss_keys = list(missing)
        groups = [[k] for k in miss_keys] if deterministic else [miss_keys] if miss_keys else []
        for group in groups:
            out = self.encoder.encode([missing[k] for k in group])  # [b, L, D]
            for key, row in zip(group, out, strict=True):
                rows[key] = row.clone()  # own storage, not a view of the batch
                self.store.put(key, rows[key])
        self.misses += len(miss_keys)
        return [rows[k] for k in keys]
