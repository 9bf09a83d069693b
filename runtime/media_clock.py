"""The one media clock: every PTS in the system ticks at 90 kHz from a stream's frame 0.

Part of the loop contract (``runtime.contract`` re-exports it: loops stamp their media with
it); sessions, playout and tracks use the same functions, so no module keeps a private copy of
the clock or adds up per-frame steps.
"""

from __future__ import annotations

__all__ = ["PTS_HZ", "frame_of_pts", "pts_of_frame"]

PTS_HZ = 90_000
"""The one media clock: PTS of loops, media queues, playout, sessions and tracks tick at 90 kHz."""


def pts_of_frame(frame_index: int, fps: int) -> int:
    """PTS (90 kHz) of frame ``frame_index`` (from 0) of a stream at ``fps``.

    Every PTS in the system comes from here, never from adding a per-frame step: when ``fps``
    does not divide 90,000 (7 fps: 12857.14 ticks) a running sum would drift a tick per frame.
    """
    return (frame_index * PTS_HZ) // fps


def frame_of_pts(pts_90k: int, fps: int) -> int:
    """The frame index whose PTS is ``pts_90k`` (the inverse of ``pts_of_frame``: a ceiling,
    since ``pts_of_frame`` rounds down)."""
    return -(-pts_90k * fps // PTS_HZ)
