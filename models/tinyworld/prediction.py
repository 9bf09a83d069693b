"""x0-prediction for the Wan DiT: the network's head outputs the clean frames, the loops get v.

Why: tiny-world's DiT reads pixels through a (1, 16, 16) patch, so one token carries 768 pixel
values in a 192-wide vector. A velocity target ``v = eps - x0`` holds the per-pixel noise, which
cannot pass that bottleneck (about 1 - 192/768 of its variance is lost whatever the weights),
while clean frames lie on a low-dimensional manifold and pass easily (the large-patch pixel
diffusion finding of "Back to Basics: Let Denoising Generative Models Denoise", 2025).

``X0PredictionDiT`` is a ``WanDiT`` (same parameters, same names, same checkpoint keys) whose
public forwards convert its head's x0 estimate into the velocity the loops and samplers expect::

    v = (x_t - x0_hat) / sigma,    sigma = timestep / 1000 (clamped to ``MIN_SIGMA``)

so a loop's ``x0 = x_t - sigma * v`` recovers ``x0_hat`` exactly. At t = 0 (the KV-update pass,
whose output is discarded) the clamp keeps the value finite. ``predict_x0`` exposes the raw head
output for the trainer.
"""

from __future__ import annotations

import torch

from models.wan.transformer import WanDiT

__all__ = ["MIN_SIGMA", "X0PredictionDiT"]

MIN_SIGMA = 1e-3
_TIMESTEP_SCALE = 1000.0  # Wan's timestep = sigma * num_train_timesteps


class X0PredictionDiT(WanDiT):
    """A WanDiT trained to predict x0; its forwards return velocities (module docstring)."""

    @staticmethod
    def velocity(x: torch.Tensor, x0: torch.Tensor, timestep: torch.Tensor) -> torch.Tensor:
        """x, x0: [B, C, F, H, W]; timestep: [B] or [B, F] -> v [B, C, F, H, W] in x0's dtype."""
        sigma = (timestep.float() / _TIMESTEP_SCALE).clamp_min(MIN_SIGMA)
        sigma = sigma[:, None, :, None, None] if sigma.ndim == 2 else sigma.view(-1, 1, 1, 1, 1)
        return ((x.float() - x0.float()) / sigma).to(x0.dtype)

    def forward(self, hidden_states: torch.Tensor, timestep: torch.Tensor,
                encoder_hidden_states: torch.Tensor, **hooks: torch.Tensor | None) -> torch.Tensor:
        x0 = super().forward(hidden_states, timestep, encoder_hidden_states, **hooks)
        return self.velocity(hidden_states, x0, timestep)

    def forward_block_causal(self, hidden_states: torch.Tensor, timestep: torch.Tensor,
                             encoder_hidden_states: torch.Tensor, chunk_frames: int,
                             **hooks: torch.Tensor | None) -> torch.Tensor:
        x0 = super().forward_block_causal(hidden_states, timestep, encoder_hidden_states,
                                          chunk_frames, **hooks)
        return self.velocity(hidden_states, x0, timestep)

    def forward_chunk(self, x: torch.Tensor, timestep: torch.Tensor, *args: object,
                      **kwargs: object) -> torch.Tensor:
        x0 = super().forward_chunk(x, timestep, *args, **kwargs)
        return self.velocity(x, x0, timestep)

    def predict_x0(self, x: torch.Tensor, timestep: torch.Tensor, *args: object,
                   **kwargs: object) -> torch.Tensor:
        """The raw head output of ``forward_chunk`` (x0 estimate), same arguments."""
        return super().forward_chunk(x, timestep, *args, **kwargs)
