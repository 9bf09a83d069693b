"""TAEHV, the tiny streaming decoder of Wan latents: its config, its checkpoints, and its
distillation from a card's VAE (``dreamrt train tiny-decoder``).
"""
