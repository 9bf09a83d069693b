"""The decode of an instance split over the ranks of an ``sp`` group, the family's own way.

``server/spmd_serving.py`` names no family: it calls ``split_decode`` here, which hands the
instance to the family whose codec can split (today the Wan VAE, by rows with halo exchange:
``models/wan/vae/split.py``). Any other codec keeps decoding on rank 0 alone.
"""

from __future__ import annotations

from typing import Any

__all__ = ["split_decode"]


def split_decode(instance: Any, group: Any, latent_rows: int) -> bool:
    """Split ``instance``'s decode over ``group`` (every rank calls it alike, before serving);
    True if it now runs on every rank, False if rank 0 keeps decoding alone."""
    if getattr(instance.card, "family", None) != "wan":
        return False
    from models.wan.vae.split import split_decode as split_rows

    return split_rows(instance, group, latent_rows)
