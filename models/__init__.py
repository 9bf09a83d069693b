"""dreamrt model plane: ModelCards, components (DiT, VAE, text encoders), loops, loaders.

Imports only ``runtime.contract`` from the runtime (docs/architecture.md §1). Public API::

    models.load_transformer(path, device=..., dtype=...)  # diffusers-format or original Wan
    models.load_vae(path, device=..., dtype=...)          # AutoencoderKLWan-compatible
    models.save_original_format(module, path)             # either, in Wan's original names
    models.registry.get(model_id) / list_cards()          # cards
    models.instance.load_instance(card, device=...)       # a resident instance with its loops

The loaders import torch; they are resolved lazily so that importing ``models.registry`` (for
``dreamrt models``) stays light.
"""

from __future__ import annotations

from typing import Any

__all__ = ["load_transformer", "load_vae", "save_original_format"]


def __getattr__(name: str) -> Any:
    if name in __all__:
        from models.checkpoint import load

        return getattr(load, name)
    raise AttributeError(f"module 'models' has no attribute {name!r}")
