"""The learned text encoder of tiny-world: one embedding per vocabulary word.

The world's vocabulary is closed (``models.tinyworld.vocab``), so the encoder is a lookup: the
prompt's known words (synonyms folded onto their canonical word, everything else dropped) become
``text_len`` ids, padded with id 0, and each id a learned ``text_dim`` vector. Word order does not
matter to the DiT (cross-attention has no positions), which suits prompts like "snow, purple
triangle, night". It satisfies the text-encoder interface ``models.instance`` wraps in its
content-hash cache: ``encode(texts) -> [B, text_len, text_dim]``, ``precision``, ``shape_sig``.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import nn

from models.tinyworld.vocab import WORDS, word_ids

__all__ = ["TextEncoderDtypeError", "WordTextEncoder"]

_PRECISION_OF = {torch.float32: "fp32", torch.bfloat16: "bf16", torch.float16: "fp16"}


class TextEncoderDtypeError(ValueError):
    """The encoder's weights are in a dtype that has no precision name."""


class WordTextEncoder(nn.Module):
    """Prompt text -> ``[B, text_len, text_dim]`` learned word embeddings (see module docstring).

    Never fails on text: unknown words are ignored and an empty prompt is all padding.
    """

    def __init__(self, text_len: int, text_dim: int) -> None:
        super().__init__()
        self.text_len = text_len
        self.embedding = nn.Embedding(len(WORDS) + 1, text_dim)
        nn.init.normal_(self.embedding.weight, std=1.0)

    @property
    def device(self) -> torch.device:
        return self.embedding.weight.device

    @property
    def dtype(self) -> torch.dtype:
        return self.embedding.weight.dtype

    @property
    def text_dim(self) -> int:
        return self.embedding.embedding_dim

    @property
    def precision(self) -> str:
        if self.dtype not in _PRECISION_OF:
            raise TextEncoderDtypeError(f"no precision name for dtype {self.dtype}")
        return _PRECISION_OF[self.dtype]

    @property
    def shape_sig(self) -> str:
        """Everything besides weights and text that shapes the output (for cache keys)."""
        return f"text_len={self.text_len},text_dim={self.text_dim},tok=words{len(WORDS)}"

    def tokenize(self, texts: Sequence[str]) -> torch.Tensor:
        """``[B, text_len]`` int64 word ids on the CPU."""
        return torch.tensor([word_ids(t, self.text_len) for t in texts], dtype=torch.long)

    def embed(self, ids: torch.Tensor) -> torch.Tensor:
        """ids: [B, text_len] -> [B, text_len, text_dim] (differentiable: the trainer's path)."""
        return self.embedding(ids.to(self.device))

    @torch.no_grad()
    def encode(self, texts: Sequence[str]) -> torch.Tensor:
        """``[B, text_len, text_dim]`` in the weights' dtype, on their device."""
        return self.embed(self.tokenize(texts))
