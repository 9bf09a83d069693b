"""tiny-world's stream geometry: the numbers the card, the trainer and the evaluation share.

Pure data (no torch: the card registry imports it). Default profile: 96x96 RGB at 12 fps, chunks
of 4 frames; each chunk attends to the previous chunk (KV window 8 frames = 4 cached + the 4
being generated, no sink frames). Pixel latents, DiT patch (1, 16, 16) -> 36 tokens per frame,
144 per chunk, 288 keys per step.
"""

from __future__ import annotations

from models.card.profile import LatentSpec
from models.card.specs import ScheduleSpec

__all__ = [
    "CHUNK_FRAMES",
    "FPS",
    "HEIGHT",
    "LATENT",
    "SCHEDULE",
    "SINK_FRAMES",
    "WIDTH",
    "WINDOW_FRAMES",
]

WIDTH = HEIGHT = 96
FPS = 12
CHUNK_FRAMES = 4
WINDOW_FRAMES = 8  # includes the chunk being generated
SINK_FRAMES = 0

# Pixels are the latents: 3 channels, no VAE strides; the DiT patch compresses 16x16.
LATENT = LatentSpec(channels=3, temporal_stride=1, spatial_stride=1, patch=(1, 16, 16))

# 4 steps on an unshifted grid: sigmas 1, 0.75, 0.5, 0.25 (pixel space at 96x96 needs no shift).
SCHEDULE = ScheduleSpec(timesteps=(1000, 750, 500, 250), flow_shift=1.0)
