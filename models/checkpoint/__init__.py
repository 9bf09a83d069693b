"""Weights on disk: the loaders of the DiT and the VAE, their errors, and the content digest."""
