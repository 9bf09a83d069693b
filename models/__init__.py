"""dreamrt model plane: ModelCards, components (DiT, VAE, text encoders), loops, loaders.

Imports only ``runtime.contract`` from the runtime (ARCHITECTURE.md §2).
"""
