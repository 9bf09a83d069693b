"""Requests that start loops, and the emission/input conventions loops share with sessions/.

Streams a loop emits on (``EmitSpec.stream``):

- ``"media"``: ``output`` is ``uint8 [n, H, W, 3]`` RGB frames on the CPU; ``meta`` holds
  ``chunk`` (int, from 0), ``segment`` (int), ``pts_90k`` (PTS of the first frame, 90 kHz clock
  from 0), ``num_frames`` (n), ``fps``.
- ``"applied"``: ``output`` is None; ``meta`` holds ``kind`` (``"prompt"``, ``"cut"``,
  ``"action"``, ``"audio"``), ``seq`` (the InputEvent's seq), ``chunk`` and ``pts_90k`` of the
  first chunk that reflects it.
- ``"progress"``: ``output`` is None; ``meta`` holds ``done`` and ``total`` (plans).

Live inputs (``runtime.contract.InputEvent.kind`` / ``payload``):

- ``"prompt"``: ``{"text": str}`` — switch: applies at the next chunk boundary, the stream goes on.
- ``"cut"``: ``{"text": str}`` — a new segment: the in-flight chunk is abandoned at the next step
  boundary and generation continues from the session's chunk-KV under the new prompt.
- ``"action"``: ``{"keys": list[str], "mouse": [dx, dy]}`` — latched per chunk, latest wins.
- ``"audio"``: ``{"samples": list[float] | float32 tensor}`` — 16 kHz mono in [-1, 1], appended.
"""

from __future__ import annotations

import msgspec

PTS_HZ = 90_000


class SessionRequest(msgspec.Struct, frozen=True, kw_only=True):
    """Starts ``chunk_rollout``: an unbounded (or ``max_chunks``-bounded) realtime stream."""

    prompt: str
    seed: int = 0
    width: int | None = None  # None: the card's default profile
    height: int | None = None
    fps: int | None = None
    max_chunks: int | None = None  # None: until cancelled


class JobRequest(msgspec.Struct, frozen=True, kw_only=True):
    """Starts ``diffusion_denoise`` (+ ``vae_decode``): an offline T2V/T2I job."""

    task: str  # "t2v" | "t2i"
    prompt: str
    num_frames: int | None = None  # t2i: 1
    width: int | None = None
    height: int | None = None
    steps: int | None = None
    seed: int = 0
    guidance_scale: float | None = None


def pts_of_frame(frame_index: int, fps: int) -> int:
    """PTS (90 kHz) of frame ``frame_index`` of a stream at ``fps``; exact for integer fps."""
    return (frame_index * PTS_HZ) // fps
