"""Artifact sinks for jobs: MP4 through PyAV (text-to-video), PNG through Pillow (text-to-image).

Both take ``uint8 [F, H, W, 3]`` RGB frames (``LoopResult.outputs["frames"]``) and write one
file atomically (a temporary name in the same directory, then ``os.replace``), so a reader never
sees half an artifact. MP4 uses libx264 (yuv420p, CRF 18) when this PyAV build has it and
falls back to mpeg4 otherwise; odd frame sizes are padded by edge replication to even ones
because 4:2:0 chroma needs them. These are blocking calls: run them off the event loop
(``asyncio.to_thread``).
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass
from pathlib import Path

import numpy as np

__all__ = [
    "Artifact",
    "ArtifactError",
    "jpeg_b64",
    "preferred_video_codec",
    "write_mp4",
    "write_png",
    "write_task_artifact",
]

log = logging.getLogger(__name__)


class ArtifactError(ValueError):
    """The frames cannot form the requested artifact (wrong dtype/shape, no frames)."""


@dataclass(frozen=True, slots=True)
class Artifact:
    path: Path
    media_type: str  # "video/mp4" | "image/png"
    size_bytes: int
    num_frames: int
    codec: str


def preferred_video_codec() -> str:
    import av

    return "libx264" if "libx264" in av.codecs_available else "mpeg4"


def _check_frames(frames: np.ndarray) -> np.ndarray:
    # frames: [F, H, W, 3] uint8
    frames = np.asarray(frames)
    if frames.ndim == 3:
        frames = frames[None]
    if frames.ndim != 4 or frames.shape[-1] != 3 or frames.dtype != np.uint8:
        raise ArtifactError(
            f"frames must be uint8 [F, H, W, 3], got {frames.dtype} {tuple(frames.shape)}"
        )
    if frames.shape[0] == 0:
        raise ArtifactError("no frames to write")
    return np.ascontiguousarray(frames)


def write_mp4(
    frames: np.ndarray,
    path: str | Path,
    *,
    fps: int,
    codec: str | None = None,
    preset: str = "veryfast",
) -> Artifact:
    """Encodes ``frames`` (uint8 [F, H, W, 3]) at ``fps`` into an MP4 file (``preset``: the
    libx264 speed preset)."""
    import av

    frames = _check_frames(frames)
    if fps <= 0:
        raise ArtifactError(f"fps must be positive, got {fps}")
    pad_h, pad_w = frames.shape[1] % 2, frames.shape[2] % 2
    if pad_h or pad_w:
        frames = np.pad(frames, ((0, 0), (0, pad_h), (0, pad_w), (0, 0)), mode="edge")
    codec = codec or preferred_video_codec()
    path = Path(path)
    tmp = path.with_name(f".{path.name}.partial")
    with av.open(str(tmp), mode="w", format="mp4") as container:
        stream = container.add_stream(codec, rate=fps)
        if not isinstance(stream, av.VideoStream):
            raise ArtifactError(f"codec {codec!r} is not a video codec")
        stream.width = frames.shape[2]
        stream.height = frames.shape[1]
        stream.pix_fmt = "yuv420p"
        if codec == "libx264":
            stream.options = {"crf": "18", "preset": preset}
        else:
            stream.bit_rate = 4_000_000
        for rgb in frames:
            for packet in stream.encode(av.VideoFrame.from_ndarray(rgb, format="rgb24")):
                container.mux(packet)
        for packet in stream.encode():
            container.mux(packet)
    os.replace(tmp, path)
    return Artifact(path, "video/mp4", path.stat().st_size, frames.shape[0], codec)


def write_png(frames: np.ndarray, path: str | Path) -> Artifact:
    """Writes the first frame of ``frames`` (uint8 [F, H, W, 3] or [H, W, 3]) as PNG."""
    from PIL import Image

    frames = _check_frames(frames)
    path = Path(path)
    tmp = path.with_name(f".{path.name}.partial")
    Image.fromarray(frames[0]).save(tmp, format="PNG")
    os.replace(tmp, path)
    return Artifact(path, "image/png", path.stat().st_size, 1, "png")


def jpeg_b64(frame: np.ndarray, quality: int = 80) -> str:
    """One uint8 [H, W, 3] frame as base64 JPEG (a job's preview event)."""
    import base64
    import io

    from PIL import Image

    out = io.BytesIO()
    Image.fromarray(np.ascontiguousarray(frame)).save(out, format="JPEG", quality=quality)
    return base64.b64encode(out.getvalue()).decode("ascii")


def write_task_artifact(
    task: str, frames: np.ndarray, directory: str | Path, stem: str, *, fps: int
) -> Artifact:
    """The sink for a job's task: ``t2v`` -> ``<stem>.mp4``, ``t2i`` -> ``<stem>.png``."""
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    if task == "t2v":
        return write_mp4(frames, directory / f"{stem}.mp4", fps=fps)
    if task == "t2i":
        return write_png(frames, directory / f"{stem}.png")
    raise ArtifactError(f"unknown task {task!r}; expected 't2v' or 't2i'")
