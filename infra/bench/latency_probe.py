"""One measuring viewer of ``dreamrt bench latency``: a real aiortc peer on a real server.

``probe_session`` creates a session (``"start": "now"`` unless told otherwise), negotiates,
waits for the first frame, streams for a warm-up, then sends control messages one at a time on
the data channel - prompt switches, then actions with keys that differ from the last - each
after a gap plus a random fraction of a chunk (so inputs land at every phase of a chunk). Per
input it records, on this process's monotonic clock (the server's is the same one on Linux:
``CLOCK_MONOTONIC`` is system-wide):

- at the viewer: ``input.received`` and ``*.applied`` arrival, and the arrival of the first
  video frame whose PTS (RTP - first RTP: wire PTS = generation PTS) is at or after the applied
  PTS - the first frame that reflects it: its first RTP packet (``wire``) and the decoded frame
  (``decoded``: aiortc's receiver releases a frame only when the next one starts arriving, one
  frame interval later; a browser does not wait for that);
- the server's breakdown (``input.shown``'s ``latency``: received -> latched -> started ->
  generated -> decoded -> enqueued -> sent), absent from a server that does not publish it.

Start: create (HTTP round trip), the data channel open, ICE/DTLS connected, the first frame at
the viewer, and the server's ``viewer.first_frame`` breakdown. Delivered fps counts fresh frames
(a stall repeat is a PTS only one tick later) over the trials.
"""

from __future__ import annotations

import asyncio
import random
import time
from dataclasses import dataclass, field
from typing import Any

from clients.python.api import DreamrtClient
from clients.python.viewer import Viewer

__all__ = ["ProbeConfig", "probe_session"]

ACTION_KEYS = (("d",), ("a",), ("w",), ("s",))  # consecutive entries always differ


@dataclass(frozen=True, slots=True)
class ProbeConfig:
    prompts: tuple[str, ...]
    num_prompts: int
    num_actions: int
    chunk_s: float
    fps: int | None = None
    start: str = "now"  # "now" | "viewer" | "" (a server without the field)
    warmup_s: float = 2.0
    gap_s: float = 0.6
    timeout_s: float = 30.0
    seed: int = 0


@dataclass
class ProbeResult:
    session_id: str = ""
    profile: dict[str, int] = field(default_factory=dict)
    start: dict[str, Any] = field(default_factory=dict)
    trials: list[dict[str, Any]] = field(default_factory=list)
    fresh_fps: float = 0.0
    stall_frames: int = 0
    errors: list[str] = field(default_factory=list)


def _ms(seconds: float | None) -> float | None:
    return None if seconds is None else round(1000.0 * seconds, 2)


async def _event(
    viewer: Viewer, predicate: Any, start: int, timeout_s: float
) -> tuple[dict[str, Any], float]:
    """The first event from index ``start`` matching ``predicate`` and its arrival time."""
    event = await viewer.wait_event(predicate, timeout_s, start=start)
    index = next(i for i in range(start, len(viewer.events)) if viewer.events[i] is event)
    return event, viewer.event_times[index]


async def _wire_at(viewer: Viewer, pts: int, after_s: float, timeout_s: float) -> float:
    """When the first packet of the first frame with PTS >= ``pts`` arrived after ``after_s``."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        arrived_s = viewer.wire_arrival(pts, after_s)
        if arrived_s is not None:
            return arrived_s
        await asyncio.sleep(0.002)
    raise TimeoutError(f"no packet of a frame with PTS >= {pts} within {timeout_s} s")


async def _frame_at(viewer: Viewer, pts: int, after_s: float, timeout_s: float) -> float:
    """Arrival time of the first frame received after ``after_s`` with PTS >= ``pts``
    (decoded frames' PTS may be a tick off the wire's: PyAV's time-base rounding)."""
    deadline = time.monotonic() + timeout_s
    index = 0
    while time.monotonic() < deadline:
        frames = viewer.frames
        while index < len(frames):
            frame = frames[index]
            index += 1
            if frame.received_s >= after_s and frame.pts >= pts - 2:
                return frame.received_s
        await asyncio.sleep(0.002)
    raise TimeoutError(f"no frame with PTS >= {pts} within {timeout_s} s")


async def _trial(viewer: Viewer, kind: str, message: dict[str, Any], cfg: ProbeConfig) -> dict:
    since = len(viewer.events)
    sent_s = time.monotonic()
    viewer.send(message)
    received, received_s = await _event(
        viewer,
        lambda e: e["type"] == "input.received" and e.get("kind") in (kind, "cut"),
        since,
        cfg.timeout_s,
    )
    seq = received["seq"]
    applied, applied_s = await _event(
        viewer, lambda e: e["type"] == f"{kind}.applied" and e["seq"] == seq, since, cfg.timeout_s
    )
    wire_s = await _wire_at(viewer, applied["pts"], sent_s, cfg.timeout_s)
    frame_s = await _frame_at(viewer, applied["pts"], sent_s, cfg.timeout_s)
    shown: dict[str, Any] | None = None
    if applied.get("latency") is not None:  # a server that publishes the breakdown
        shown, _ = await _event(
            viewer, lambda e: e["type"] == "input.shown" and e["seq"] == seq, since, 5.0
        )
    latency = (shown or {}).get("latency") or applied.get("latency") or {}
    return {
        "kind": kind,
        "seq": seq,
        "chunk": applied["chunk"],
        "received_ms": _ms(received_s - sent_s),
        "applied_ms": _ms(applied_s - sent_s),
        "wire_ms": _ms(wire_s - sent_s),
        "frame_ms": _ms(frame_s - sent_s),
        "server": {k: _ms(v) if k.endswith("_s") else v for k, v in latency.items()},
    }


async def probe_session(url: str, cfg: ProbeConfig, index: int = 0) -> ProbeResult:
    """One session measured end to end (see the module docstring)."""
    rng = random.Random(cfg.seed * 1000 + index)
    out = ProbeResult()
    async with DreamrtClient(url) as api:
        params: dict[str, Any] = {"seed": cfg.seed + index, "fps": cfg.fps}
        if cfg.start:
            params["start"] = cfg.start
        t0 = time.monotonic()
        created = await api.create_session(cfg.prompts[0], **params)
        created_s = time.monotonic()
        out.session_id, out.profile = created["id"], created["profile"]
        viewer = Viewer(api)
        try:
            await viewer.connect(session_id=created["id"], timeout_s=cfg.timeout_s)
            open_s = time.monotonic()
            await viewer.wait_first_frame(cfg.timeout_s)
            first_s = viewer.frames[0].received_s
            first_wire_s = viewer.wire_arrival(0, t0)
            out.start = {
                "create_ms": _ms(created_s - t0),
                "channel_open_ms": _ms(open_s - t0),
                "connected_ms": _ms(
                    None if viewer.connected_s is None else viewer.connected_s - t0
                ),
                "first_wire_ms": _ms(first_wire_s and first_wire_s - t0),
                "first_frame_ms": _ms(first_s - t0),
            }
            try:
                event, _ = await _event(viewer, lambda e: e["type"] == "viewer.first_frame", 0, 2.0)
                out.start["server"] = {k: _ms(v) for k, v in event["latency"].items()}
            except TimeoutError:
                pass  # a server without the start breakdown
            await asyncio.sleep(cfg.warmup_s)
            begin_s, begin_frames = time.monotonic(), len(viewer.fresh_frames())
            begin_all = len(viewer.frames)
            plan = [("prompt", i) for i in range(cfg.num_prompts)]
            plan += [("action", i) for i in range(cfg.num_actions)]
            for kind, i in plan:
                await asyncio.sleep(cfg.gap_s + rng.uniform(0.0, cfg.chunk_s))
                message: dict[str, Any]
                if kind == "prompt":
                    text = cfg.prompts[(i + 1) % len(cfg.prompts)]
                    message = {"type": "prompt", "text": text}
                else:
                    message = {"type": "action", "keys": list(ACTION_KEYS[i % len(ACTION_KEYS)])}
                try:
                    out.trials.append(await _trial(viewer, kind, message, cfg))
                except TimeoutError as exc:
                    out.errors.append(f"{kind} {i}: {exc}")
            span_s = time.monotonic() - begin_s
            fresh = len(viewer.fresh_frames()) - begin_frames
            out.fresh_fps = round(fresh / span_s, 2) if span_s > 0 else 0.0
            out.stall_frames = (len(viewer.frames) - begin_all) - fresh
        finally:
            await viewer.close(delete=False)
            await api.delete_session(created["id"])
    return out
