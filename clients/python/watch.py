"""``dreamrt watch``: open a session, receive its video over WebRTC, report fps/stalls, save MP4.

Prints one progress line per second (fresh frames per second, stalls, the last event) and a
summary at the end; ``--out`` writes every received frame to an MP4 at the session's fps.
``--action KEYS`` holds those keys for the whole watch (sent on the data channel every
``ACTION_PERIOD_S``, since actions are latched per chunk). Returns the summary as a dict.
"""

from __future__ import annotations

import asyncio
import sys
import time
from pathlib import Path
from typing import Any, Literal, TextIO

import numpy as np

from clients.python.api import DreamrtClient
from clients.python.viewer import Viewer, limit_host_candidates

__all__ = ["ACTION_PERIOD_S", "watch", "write_mp4"]

ACTION_PERIOD_S = 0.25


def write_mp4(frames: list[np.ndarray], path: Path, fps: int) -> int:
    """Encodes RGB frames ([H, W, 3] uint8) at ``fps``; returns the frame count."""
    import av

    if not frames:
        raise ValueError("no frames were received; nothing to write")
    h, w = frames[0].shape[:2]
    pad_h, pad_w = h % 2, w % 2
    codec: Literal["libx264", "mpeg4"] = "libx264" if "libx264" in av.codecs_available else "mpeg4"
    with av.open(str(path), mode="w", format="mp4") as container:
        stream = container.add_stream(codec, rate=fps)
        stream.width, stream.height, stream.pix_fmt = w + pad_w, h + pad_h, "yuv420p"
        for rgb in frames:
            if pad_h or pad_w:
                rgb = np.pad(rgb, ((0, pad_h), (0, pad_w), (0, 0)), mode="edge")
            for packet in stream.encode(av.VideoFrame.from_ndarray(rgb, format="rgb24")):
                container.mux(packet)
        for packet in stream.encode():
            container.mux(packet)
    return len(frames)


async def watch(
    url: str,
    *,
    prompt: str = "a quiet forest at dawn",
    seconds: float = 5.0,
    out: Path | None = None,
    actions: list[str] | None = None,
    token: str | None = None,
    ice_hosts: list[str] | None = None,
    model: str | None = None,
    stream: TextIO = sys.stdout,
) -> dict[str, Any]:
    undo = limit_host_candidates(ice_hosts) if ice_hosts else None
    try:
        async with DreamrtClient(url, token=token) as api:
            viewer = Viewer(api, keep_rgb=out is not None)
            try:
                started = time.monotonic()
                await viewer.connect(prompt, model=model)
                fps = viewer.profile["fps"]
                stream.write(
                    f"session {viewer.session_id}: "
                    f"{viewer.profile['width']}x{viewer.profile['height']} "
                    f"at {fps} fps; waiting for the first frame\n"
                )
                await viewer.wait_first_frame(timeout_s=60.0)
                first_frame_s = time.monotonic() - started
                watch_start = time.monotonic()
                next_action = watch_start
                next_report = watch_start + 1.0
                while (now := time.monotonic()) < watch_start + seconds:
                    if actions and now >= next_action:
                        viewer.send({"type": "action", "keys": actions})
                        next_action = now + ACTION_PERIOD_S
                    if now >= next_report:
                        recent = [f for f in viewer.fresh_frames() if f.received_s >= now - 1.0]
                        last = viewer.events[-1]["type"] if viewer.events else "-"
                        stream.write(
                            f"  t={now - watch_start:4.1f}s  fps={len(recent):3d}"
                            f"  frames={len(viewer.frames)}"
                            f"  last event={last}\n"
                        )
                        next_report += 1.0
                    await asyncio.sleep(0.05)
                frames = [f for f in viewer.frames if f.received_s >= watch_start]
                fresh = [f for f in viewer.fresh_frames() if f.received_s >= watch_start]
                assert viewer.session_id is not None  # connect set it
                status = await viewer.api.session(viewer.session_id)
                summary = {
                    "session": viewer.session_id,
                    "seconds": seconds,
                    "first_frame_s": round(first_frame_s, 3),
                    "frames_received": len(frames),
                    "fresh_frames": len(fresh),
                    "fps_received": round(len(fresh) / seconds, 2),
                    "fps_target": fps,
                    "stalls": status["stalls"],
                    "server_fps_measured": status["fps_measured"],
                }
                if out is not None:
                    rgb = [f.rgb for f in viewer.frames if f.rgb is not None]
                    summary["mp4_frames"] = await asyncio.to_thread(write_mp4, rgb, out, fps)
                    summary["out"] = str(out)
            finally:
                await viewer.close()
    finally:
        if undo is not None:
            undo()
    stream.write(
        f"received {summary['fresh_frames']} fresh frames in {seconds:g} s "
        f"({summary['fps_received']} fps, "
        f"target {summary['fps_target']}), {summary['stalls']} stalls, first frame after "
        f"{summary['first_frame_s']} s"
        + (f"; wrote {summary['out']}" if out is not None else "")
        + "\n"
    )
    return summary
