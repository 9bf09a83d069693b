"""Content digests of small host tensors, for behaviour records (conditioning a chunk used)."""

from __future__ import annotations

import hashlib

import torch

__all__ = ["host_digest"]


def host_digest(tensor: torch.Tensor) -> str:
    """16 hex chars of blake2b over a host tensor's dtype, shape and bytes (equal digests:
    bit-identical tensors). Call it on CPU tensors: it reads their memory."""
    t = tensor.detach().contiguous()
    h = hashlib.blake2b(f"{t.dtype}:{tuple(t.shape)}".encode(), digest_size=8)
    if t.numel():
        h.update(t.view(torch.uint8).numpy().tobytes())
    return h.hexdigest()
