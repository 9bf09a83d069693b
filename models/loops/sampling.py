"""Flow-matching sampling arithmetic shared by the denoising loops (host-side, no tensors).

Wan is a rectified-flow model: ``x_t = (1 - sigma) * x0 + sigma * noise`` and the network
predicts the velocity ``v = noise - x0``, so ``x0 = x_t - sigma * v``. Schedules name timesteps
on the ``num_train_timesteps`` grid; ``flow_shift`` warps them toward high noise::

    sigma = t / T;   sigma' = shift * sigma / (1 + (shift - 1) * sigma);   t' = sigma' * T

Few-step distilled samplers (Self-Forcing, DMD) predict x0 at every step and re-noise it to the
next sigma with *fresh* noise; multi-step samplers take an Euler step along v.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass

__all__ = ["SigmaStep", "noise_seed", "shifted_sigma", "sigma_steps"]


def shifted_sigma(timestep: float, flow_shift: float, num_train_timesteps: int = 1000) -> float:
    """Warped sigma in [0, 1] of a nominal timestep."""
    sigma = timestep / num_train_timesteps
    return flow_shift * sigma / (1.0 + (flow_shift - 1.0) * sigma)


@dataclass(frozen=True, slots=True)
class SigmaStep:
    """One denoising step: the model sees ``timestep`` (= sigma * T) at noise level ``sigma``;
    the result moves to ``sigma_next`` (0 after the last step)."""

    timestep: float
    sigma: float
    sigma_next: float


def sigma_steps(
    timesteps: tuple[int, ...], flow_shift: float, num_train_timesteps: int = 1000
) -> tuple[SigmaStep, ...]:
    """The schedule as steps, highest noise first; the last step ends at sigma 0."""
    sigmas = [shifted_sigma(t, flow_shift, num_train_timesteps) for t in timesteps]
    nexts = sigmas[1:] + [0.0]
    return tuple(
        SigmaStep(timestep=s * num_train_timesteps, sigma=s, sigma_next=n)
        for s, n in zip(sigmas, nexts, strict=True)
    )


def noise_seed(seed: int, *parts: int) -> int:
    """A 63-bit seed for the noise of one (segment, chunk, step): a pure function of the
    session seed and the position, so interleaving, batching or resuming never changes it."""
    digest = hashlib.blake2b(repr((seed, *parts)).encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little") & 0x7FFF_FFFF_FFFF_FFFF
