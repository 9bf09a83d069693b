"""The built-in programs a request may name instead of sending a graph (``"program": name``).

``preview_and_final``: one rollout's latents fan out to the tiny decoder, whose frames are
streamed as they are decoded (the job's ``job.preview`` events), and to the full VAE, whose
frames are the artifact. ``render_moment``: a session's snapshot continued for more chunks at
job priority, decoded by the full VAE into an MP4. ``resolve`` turns a request's ``program``
(a name, a name with parameters, or a graph) into a ``Program``.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from models.programs.graph import Program, ProgramError

__all__ = ["PRESETS", "preview_and_final", "render_moment", "resolve"]


def preview_and_final(**loop: Any) -> Program:
    """latents -> tiny decoder -> ``preview`` stream; latents -> full VAE -> the MP4."""
    return Program.from_dict(
        {
            "name": "preview_and_final",
            "nodes": {
                "denoise": {"kind": "loop", "loop": "text_to_video", **loop},
                "preview": {"kind": "decode", "decoder": "tiny"},
                "final": {"kind": "decode", "decoder": "full"},
                "preview_frames": {"kind": "stream", "name": "preview"},
                "video": {"kind": "artifact", "format": "mp4"},
            },
            "edges": [
                {"from": "denoise.latents", "to": "preview.latents", "kind": "tensor"},
                {"from": "denoise.latents", "to": "final.latents", "kind": "tensor"},
                {"from": "preview.frames", "to": "preview_frames.frames", "kind": "stream"},
                {"from": "final.frames", "to": "video.frames", "kind": "artifact"},
            ],
        }
    )


def render_moment(**loop: Any) -> Program:
    """A session's snapshot (``session``, ``at_chunk``) continued ``chunks`` more chunks,
    decoded by the full VAE into an MP4."""
    return Program.from_dict(
        {
            "name": "render_moment",
            "nodes": {
                "rollout": {"kind": "loop", "loop": "chunk_rollout", **loop},
                "final": {"kind": "decode", "decoder": "full"},
                "video": {"kind": "artifact", "format": "mp4"},
            },
            "edges": [
                {"from": "rollout.latents", "to": "final.latents", "kind": "tensor"},
                {"from": "final.frames", "to": "video.frames", "kind": "artifact"},
            ],
        }
    )


PRESETS: Mapping[str, Callable[..., Program]] = {
    "preview_and_final": preview_and_final,
    "render_moment": render_moment,
}


def resolve(program: str | Mapping[str, Any]) -> Program:
    """A preset by name, a preset with its loop node's parameters (``{"preset": name,
    **params}``), or a graph in the wire form; ``ProgramError`` for an unknown name."""
    params: dict[str, Any] = {}
    if isinstance(program, Mapping) and "preset" in program:
        params = {k: v for k, v in program.items() if k != "preset"}
        program = program["preset"]
    if isinstance(program, str):
        preset = PRESETS.get(program)
        if preset is None:
            raise ProgramError([f"unknown program {program!r} (presets: {sorted(PRESETS)})"])
        return preset(**params)
    return Program.from_dict(program)
