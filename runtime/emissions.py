"""What a loop's plans emit once they have run (part of the loop contract, ``runtime.contract``):
the sinks, the metadata a loop knows at plan time, and the emission the driver hands a sink.
Imports neither torch nor asyncio.
"""

from __future__ import annotations

import enum
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import msgspec

from runtime.live_inputs import InputKind

__all__ = [
    "AppliedMeta",
    "Emission",
    "EmitFn",
    "EmitSpec",
    "InputTiming",
    "MediaMeta",
    "ProgressMeta",
    "Stream",
]


class Stream(str, enum.Enum):
    """The sinks a loop emits to (``EmitSpec.stream``)."""

    MEDIA = "media"  # output: uint8 [n, H, W, 3] RGB frames (or a PendingOutput of them)
    APPLIED = "applied"  # output: None; an input took effect
    PROGRESS = "progress"  # output: None; jobs' plan count


class MediaMeta(msgspec.Struct, frozen=True, kw_only=True):
    """What a loop knows of frames it emits on ``Stream.MEDIA``.

    ``frame_start`` is the stream index of the first frame (from 0), so every frame's PTS is
    ``pts_of_frame(frame_start + i, fps)``; ``pts_90k`` is the first frame's. A chunk may come in
    parts: ``final`` is False on every part but its last.
    """

    chunk: int
    segment: int
    frame_start: int
    pts_90k: int
    num_frames: int
    fps: int
    final: bool = True
    # Behaviour facts of the chunk the loop captured when it described the plan (seeds, noise
    # schedule, conditioning digests...): opaque to the runtime, set on a chunk's final part.
    capture: dict[str, Any] | None = None


class AppliedMeta(msgspec.Struct, frozen=True, kw_only=True):
    """An input (session sequence number ``seq``) first reflected by chunk ``chunk`` whose first
    frame has PTS ``pts_90k``. Emitted on ``Stream.APPLIED`` beside that chunk's first media.
    ``changes``: False when it repeats what the chunk in flight had (a held key sent again); a
    sink shows a changing input's frames at once, a repeat's in playout order."""

    kind: InputKind
    seq: int
    chunk: int
    pts_90k: int
    changes: bool = True


class ProgressMeta(msgspec.Struct, frozen=True, kw_only=True):
    """A job's progress on ``Stream.PROGRESS``: ``done`` of ``total`` plans."""

    done: int
    total: int


@dataclass(frozen=True, slots=True)
class EmitSpec:
    """Declares that a plan's output becomes a stream item once the plan has run.

    ``stream`` names the sink (a ``Stream`` for the model loops; toy and custom loops may use
    any string); ``meta`` is what the loop knew at plan time: a ``MediaMeta`` /
    ``AppliedMeta`` / ``ProgressMeta`` on the standard streams, any plain value otherwise.
    The driver pairs it with the plan's output.
    """

    stream: str
    meta: Any = None


@dataclass(frozen=True, slots=True)
class InputTiming:
    """Seconds after its push, per runtime stage (``runtime.input_trace``; ``None``: not seen)."""

    seq: int
    latched_s: float | None
    started_s: float | None
    generated_s: float | None
    decoded_s: float | None


@dataclass(frozen=True, slots=True)
class Emission:
    """What ``LoopContext.emit`` receives: an EmitSpec plus the output it refers to (and, on an
    ``applied`` emission the engine delivers, the input's runtime stages)."""

    spec: EmitSpec
    output: Any
    timing: InputTiming | None = None


EmitFn = Callable[[Emission], None]
