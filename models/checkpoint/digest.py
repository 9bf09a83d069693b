"""The content hash of a loaded model's weights: the ``weights_version`` behaviour records carry.

Computed once when a model loads (``models.instance.load_instance``), cheaply:

- checkpoint weights: blake2b over the checkpoint files the card's manifest names (a directory
  entry: every file under it, by relative path). A file up to ``FULL_HASH_BYTES`` is hashed
  whole; a larger one by its size, its first MiB (a safetensors header: every tensor's name,
  dtype, shape and offsets) and 64 evenly spaced MiB samples, so a multi-GB checkpoint costs
  ~65 MiB of reads. Two checkpoints that differ only outside the samples of a large file would
  collide: a stated limit, not a silent one.
- random weights: blake2b over the card id, its component presets and the seed (the weights
  are a pure function of them).

The result is ``"b2:"`` + 16 hex chars. The card's ``weights_version`` stays the human label.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable
from pathlib import Path

__all__ = ["FULL_HASH_BYTES", "checkpoint_digest", "random_digest"]

FULL_HASH_BYTES = 512 * 2**20
_MIB = 2**20
_SAMPLES = 64


def random_digest(model_id: str, presets: dict[str, str], seed: int) -> str:
    body = json.dumps({"model": model_id, "presets": presets, "seed": seed}, sort_keys=True)
    return "b2:" + hashlib.blake2b(body.encode(), digest_size=8).hexdigest()


def checkpoint_digest(root: Path, entries: Iterable[str]) -> str:
    """Digest of the files (or directories) ``entries`` under ``root``; missing ones count as
    absent (the loader reports them)."""
    h = hashlib.blake2b(digest_size=8)
    for rel in sorted(set(entries)):
        path = root / rel
        files = sorted(p for p in path.rglob("*") if p.is_file()) if path.is_dir() else [path]
        for file in files:
            if not file.is_file():
                continue
            h.update(str(file.relative_to(root)).encode() + b"\0")
            _hash_file(h, file)
    return "b2:" + h.hexdigest()


def _hash_file(h: hashlib.blake2b, path: Path) -> None:
    size = path.stat().st_size
    h.update(size.to_bytes(8, "little"))
    with path.open("rb") as f:
        if size <= FULL_HASH_BYTES:
            while block := f.read(8 * _MIB):
                h.update(block)
            return
        h.update(f.read(_MIB))
        for i in range(_SAMPLES):
            f.seek((size - _MIB) * i // (_SAMPLES - 1))
            h.update(f.read(_MIB))
