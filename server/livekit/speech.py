"""The avatar's speech published in step with the video it drives.

An avatar session (``server.livekit.avatar``) receives the agent's speech one segment at a
time. ``SpeechPlayout.play`` does two things with a segment:

- **Feeds the engine** (cards with ``input.audio``): 16 kHz mono blocks of ``PUSH_S`` seconds.
  The first block is pushed as soon as it is complete; its ``audio.applied`` names the first
  frame it drove (PTS ``P0``), and ``P0`` minus the PTS on the wire when it was pushed is the
  engine's input-to-screen delay ``L``. Block ``k`` is then pushed once the wire reaches
  ``P0 + k * PUSH_S - L``, so that its frames land where its samples will play (a TTS sends
  faster than real time; pushed at once, the whole segment would drive a few chunks).
- **Publishes the audio** as the session participant's audio track (``AUDIO_RATE_HZ`` mono
  int16, resampled by one streaming resampler per segment). Sample ``i`` of the segment has
  PTS ``P0 + i / rate``: the segment is delayed by ``L`` so that each sample plays with the
  frames it drove. Capture is clocked by the video: every frame the LiveKit video sink
  publishes (``frame_published``) releases the audio up to the end of that frame, so a video
  stall pauses the speech instead of letting it run ahead of the lips. A card without audio
  input drives nothing: its speech starts with the frame on the wire when it arrives. When no
  ``audio.applied`` comes within ``MAX_START_WAIT_S`` of wire time the speech starts anyway.

Playback started = the first sample was captured; finished = the last sample was captured,
the wire passed the segment's end and the room's audio queue played out. ``clear()`` (an
interrupt) drops every sample not captured yet, the room's queued audio and the blocks not
pushed. Each segment is measured (``SegmentReport``: the delay ``L`` and the offset between
its audio and the first frame it drove), logged, and the latest is in ``stats()``.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import asdict, dataclass

import av
import numpy as np

from server.livekit.room import RoomConnection
from sessions.audio import TARGET_RATE_HZ, AudioClip, resample
from sessions.events import AudioApplied, Event
from sessions.playout import PTS_HZ
from sessions.session import Session

__all__ = [
    "AUDIO_RATE_HZ",
    "MAX_START_WAIT_S",
    "PUSH_S",
    "SegmentReport",
    "SpeechPlayout",
    "to_int16",
]

log = logging.getLogger(__name__)

AUDIO_RATE_HZ = 48_000  # Opus' native rate: the SDK resamples nothing
PUSH_S = 0.5
MAX_START_WAIT_S = 2.0


def to_int16(x: np.ndarray) -> np.ndarray:
    """float32 in [-1, 1] -> int16 (rounded, clipped). # x: [n] -> [n]"""
    return np.clip(np.round(x * 32768.0), -32768, 32767).astype(np.int16)


@dataclass(frozen=True, slots=True)
class SegmentReport:
    """One played segment, as measured."""

    index: int
    seconds: float  # speech received
    played_s: float  # what played out before the end or the interrupt
    interrupted: bool
    driven: bool  # its blocks went to the engine (the card takes audio)
    delay_s: float | None  # how long the speech was held back to play with its frames
    av_offset_ms: float | None  # audio start minus its first driven frame on the wire


class _Segment:
    def __init__(self, index: int, rate: int, out_rate: int) -> None:
        self.index = index
        self.rate = rate
        self.out_rate = out_rate
        self.resampler = (
            None
            if rate == out_rate
            else av.AudioResampler(format="flt", layout="mono", rate=out_rate)
        )
        self.out: list[np.ndarray] = []  # int16 [n] at out_rate, not captured yet
        self.out_total = 0
        self.captured = 0
        self.blocks: list[np.ndarray] = []  # float32 [n] at rate, mono: engine blocks
        self.partial = np.zeros(0, np.float32)
        self.pushed = 0
        self.seqs: dict[int, int] = {}  # engine seq -> block index
        self.in_samples = 0
        self.read_done = False
        self.cleared = False
        self.pushed_at_pts: int | None = None  # wire PTS when block 0 was pushed
        self.driven_pts: int | None = None  # first frame the speech drove
        self.start_pts: int | None = None  # PTS of the segment's first sample
        self.first_capture_s: float | None = None
        self.frame_shown_s: float | None = None  # wall time the start frame was published

    def end_pts(self) -> int:
        assert self.start_pts is not None
        return self.start_pts + self.out_total * PTS_HZ // self.out_rate


class SpeechPlayout:
    """See the module docstring. Event-loop thread only."""

    def __init__(
        self,
        session: Session,
        room: RoomConnection,
        *,
        out_rate_hz: int = AUDIO_RATE_HZ,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.session = session
        self.room = room
        self.out_rate = out_rate_hz
        self._clock = clock
        self._frame_ticks = PTS_HZ // session.config.fps
        self._wire_pts: int | None = None
        self._wire_s = 0.0
        self._segment: _Segment | None = None
        self._changed = asyncio.Event()
        self._closed = False
        self.segments = 0
        self.reports: list[SegmentReport] = []
        session.events.add_sink(self._on_event)

    @property
    def driving(self) -> bool:
        return "input.audio" in self.session.config.capabilities

    # ---------------------------------------------------------------- inputs

    def frame_published(self, pts_90k: int) -> None:
        """The video sink put the frame with wire PTS ``pts_90k`` into the room."""
        self._wire_pts = pts_90k
        self._wire_s = self._clock()
        seg = self._segment
        if seg is not None and seg.start_pts is not None and seg.frame_shown_s is None:
            if pts_90k + self._frame_ticks > seg.start_pts:
                seg.frame_shown_s = self._wire_s
        self._changed.set()

    def _on_event(self, event: Event) -> None:
        seg = self._segment
        if self._closed or seg is None or not isinstance(event, AudioApplied):
            return
        block = seg.seqs.get(event.seq)
        if block is not None and seg.driven_pts is None:
            # block k drove this frame: the segment's first sample plays k blocks before it
            seg.driven_pts = event.pts - round(block * PUSH_S * PTS_HZ)
            self._changed.set()

    def clear(self) -> bool:
        """Drops what is not played yet (module doc); False when nothing was playing."""
        seg = self._segment
        if seg is None or seg.cleared:
            return False
        seg.cleared = True
        seg.out.clear()
        self.room.clear_audio()
        self._changed.set()
        return True

    # ---------------------------------------------------------------- one segment

    async def play(
        self,
        chunks: AsyncIterator[bytes],
        rate: int,
        channels: int,
        on_started: Callable[[], None],
    ) -> SegmentReport:
        """Plays one segment of interleaved int16 PCM to its end or an interrupt."""
        seg = self._segment = _Segment(self.segments, rate, self.out_rate)
        self.segments += 1
        reader = asyncio.get_running_loop().create_task(
            self._read(seg, chunks, channels), name=f"peer-{self.session.id}-livekit-speech"
        )
        started = False
        try:
            while not seg.cleared:
                self._changed.clear()  # before the work: a change during it wakes the wait
                self._push_due(seg)
                self._decide_start(seg)
                if await self._capture_due(seg) and not started:
                    started = True
                    on_started()
                if seg.read_done and self._finished(seg):
                    await self.room.wait_audio_playout()
                    break
                await self._changed.wait()
        finally:
            reader.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await reader
            self._segment = None
        if not started:
            on_started()  # the agent waits for a start before it takes the finish
        report = self._report(seg)
        self.reports = [*self.reports[-15:], report]
        log.info(
            "session %s: speech segment %d: %.2f s played of %.2f s%s; %s",
            self.session.id,
            report.index,
            report.played_s,
            report.seconds,
            " (interrupted)" if report.interrupted else "",
            "not driving the video (no audio input)"
            if not report.driven
            else f"delayed {report.delay_s:.3f} s to play with its frames, "
            f"audio - first driven frame {report.av_offset_ms:+.1f} ms"
            if report.delay_s is not None and report.av_offset_ms is not None
            else "no frame reported driving it",
        )
        return report

    async def _read(self, seg: _Segment, chunks: AsyncIterator[bytes], channels: int) -> None:
        pending = bytearray()
        frame_bytes = 2 * channels
        try:
            async for data in chunks:
                pending += data
                usable = len(pending) - len(pending) % frame_bytes
                if usable:
                    self._take(seg, bytes(pending[:usable]), channels)
                    del pending[:usable]
                if seg.cleared:
                    return
        finally:
            if seg.resampler is not None and not seg.cleared:
                self._append_out(seg, [o.to_ndarray()[0] for o in seg.resampler.resample(None)])
            if len(seg.partial):
                seg.blocks.append(seg.partial)
                seg.partial = np.zeros(0, np.float32)
            seg.read_done = True
            self._changed.set()

    def _take(self, seg: _Segment, pcm: bytes, channels: int) -> None:
        frames = np.frombuffer(pcm, dtype=np.int16).reshape(-1, channels)  # [n, channels]
        mono = frames.astype(np.float32).mean(axis=1) / 32768.0  # [n]
        seg.in_samples += mono.shape[0]
        if seg.resampler is None:
            self._append_out(seg, [to_int16(mono)])
        else:
            frame = av.AudioFrame.from_ndarray(mono[None, :], format="flt", layout="mono")
            frame.sample_rate = seg.rate
            self._append_out(seg, [o.to_ndarray()[0] for o in seg.resampler.resample(frame)])
        if self.driving:
            block_n = int(PUSH_S * seg.rate)
            rest = np.concatenate([seg.partial, mono])
            while rest.shape[0] >= block_n:
                seg.blocks.append(rest[:block_n])
                rest = rest[block_n:]
            seg.partial = rest
        self._changed.set()

    def _append_out(self, seg: _Segment, parts: list[np.ndarray]) -> None:
        for part in parts:
            samples = part if part.dtype == np.int16 else to_int16(part)
            if samples.shape[0]:
                seg.out.append(samples)
                seg.out_total += samples.shape[0]

    def _push_due(self, seg: _Segment) -> None:
        session = self.session
        wire = self._wire_pts
        while seg.pushed < len(seg.blocks) and wire is not None and session.accepts_inputs:
            k = seg.pushed
            if k > 0:
                if seg.start_pts is None or seg.pushed_at_pts is None:
                    return
                lead = max(0, seg.start_pts - seg.pushed_at_pts)
                if wire < seg.start_pts + round(k * PUSH_S * PTS_HZ) - lead:
                    return
            samples = np.clip(resample(seg.blocks[k], seg.rate, TARGET_RATE_HZ), -1.0, 1.0)
            seq = session.push_audio(AudioClip(samples, TARGET_RATE_HZ, 1))
            seg.seqs[seq] = k
            if k == 0:
                seg.pushed_at_pts = wire
            seg.pushed += 1

    def _decide_start(self, seg: _Segment) -> None:
        wire = self._wire_pts
        if seg.start_pts is not None or wire is None or not seg.out_total:
            return
        if seg.driven_pts is not None:
            # never behind the wire: late audio starts now (the lag is its measured offset)
            seg.start_pts = max(seg.driven_pts, wire)
        elif not seg.seqs:
            if self.driving and not seg.read_done and self.session.accepts_inputs:
                return  # its first block is still filling
            seg.start_pts = wire  # nothing to drive (no audio input): play with this frame
        elif wire >= (seg.pushed_at_pts or 0) + round(MAX_START_WAIT_S * PTS_HZ):
            seg.start_pts = wire
        if seg.start_pts is not None and seg.start_pts <= wire:
            seg.frame_shown_s = self._wire_s

    async def _capture_due(self, seg: _Segment) -> bool:
        """Captures the samples up to the end of the frame on the wire; True if any."""
        wire = self._wire_pts
        if seg.start_pts is None or wire is None or not seg.out:
            return False
        due_pts = wire + self._frame_ticks - seg.start_pts
        due = min(seg.out_total, max(0, due_pts * seg.out_rate // PTS_HZ))
        take = due - seg.captured
        if take <= 0:
            return False
        pieces: list[np.ndarray] = []
        while take > 0 and seg.out:
            head = seg.out[0]
            if head.shape[0] <= take:
                pieces.append(seg.out.pop(0))
                take -= head.shape[0]
            else:
                pieces.append(head[:take])
                seg.out[0] = head[take:]
                take = 0
        samples = np.concatenate(pieces)
        stamp_us = (
            (seg.start_pts * seg.out_rate + seg.captured * PTS_HZ)
            * 1_000_000
            // (PTS_HZ * seg.out_rate)
        )
        if seg.first_capture_s is None:
            seg.first_capture_s = self._clock()
        seg.captured += samples.shape[0]
        await self.room.capture_audio(samples, stamp_us)
        return True

    def _finished(self, seg: _Segment) -> bool:
        if seg.out_total == 0:
            return True
        if seg.start_pts is None or seg.captured < seg.out_total:
            return False
        return self._wire_pts is not None and self._wire_pts + self._frame_ticks >= seg.end_pts()

    def _report(self, seg: _Segment) -> SegmentReport:
        seconds = seg.in_samples / seg.rate
        captured_s = seg.captured / seg.out_rate
        if seg.cleared and seg.start_pts is not None and self._wire_pts is not None:
            shown_s = (self._wire_pts + self._frame_ticks - seg.start_pts) / PTS_HZ
            played_s = max(0.0, min(captured_s, shown_s))
        else:
            played_s = captured_s
        delay_s = offset_ms = None
        if seg.driven_pts is not None and seg.pushed_at_pts is not None:
            delay_s = (seg.driven_pts - seg.pushed_at_pts) / PTS_HZ
        if seg.driven_pts is not None and seg.start_pts is not None:
            offset_ms = (seg.start_pts - seg.driven_pts) / PTS_HZ * 1000.0
            if seg.first_capture_s is not None and seg.frame_shown_s is not None:
                offset_ms += (seg.first_capture_s - seg.frame_shown_s) * 1000.0
        return SegmentReport(
            index=seg.index,
            seconds=round(seconds, 4),
            played_s=round(played_s, 4),
            interrupted=seg.cleared,
            driven=bool(seg.seqs),
            delay_s=None if delay_s is None else round(delay_s, 4),
            av_offset_ms=None if offset_ms is None else round(offset_ms, 2),
        )

    # ---------------------------------------------------------------- views

    def stats(self) -> dict[str, object]:
        """What ``GET /v1/sessions/{id}`` shows under ``avatar.speech``."""
        last = self.reports[-1] if self.reports else None
        return {
            "segments": self.segments,
            "interrupted": sum(1 for r in self.reports if r.interrupted),
            "rate_hz": self.out_rate,
            "last": None if last is None else asdict(last),
        }

    def close(self) -> None:
        self._closed = True
        self.clear()
