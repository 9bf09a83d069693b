"""Audio input: decode an upload (or a LiveKit room's PCM) into 16 kHz mono float32.

Accepted bodies (docs/api.md "REST", ``POST /v1/sessions/{id}/audio``): raw PCM s16le mono at
16 kHz, or a RIFF/WAVE file (PCM 8/16/24/32-bit integer or IEEE float 32/64-bit, any channel
count and rate; ``WAVE_FORMAT_EXTENSIBLE`` with those sub-formats). PyAV (FFmpeg) demuxes and
decodes the WAV and ``av.AudioResampler`` (libswresample, band-limited) resamples; channels are
then averaged to mono, so 44.1 or 48 kHz stereo microphones need no client-side work. The
per-frame conditioning features are the model's business (computed by the loop from these
samples); sessions deliver clean 16 kHz mono samples ``[n]`` float32 in [-1, 1]. Malformed
input raises ``AudioFormatError`` naming what is wrong.
"""

from __future__ import annotations

import io
from collections.abc import Iterable
from dataclasses import dataclass

import av
import numpy as np
import numpy.typing as npt

from runtime.errors import DreamrtError

__all__ = [
    "TARGET_RATE_HZ",
    "AudioClip",
    "AudioFormatError",
    "AudioTooLongError",
    "decode_audio",
    "resample",
]

Samples = npt.NDArray[np.float32]  # [n] float32, mono

TARGET_RATE_HZ = 16_000
MAX_SECONDS = 30.0  # per upload; longer streams arrive as several uploads

# FFmpeg's decoders of the WAV sample formats accepted (format tags 1 and 3, or EXTENSIBLE
# with those sub-formats); anything else in a WAV (ADPCM, mu-law, ...) is refused.
_WAV_CODECS = frozenset({"pcm_u8", "pcm_s16le", "pcm_s24le", "pcm_s32le", "pcm_f32le", "pcm_f64le"})


class AudioFormatError(DreamrtError, ValueError):
    """The upload is not PCM s16le nor a WAV file this decoder understands (400)."""

    code = "bad_audio"
    status = 400


class AudioTooLongError(AudioFormatError):
    """The upload decodes to more seconds than the limit allows (413)."""

    code = "too_long"
    status = 413


@dataclass(frozen=True, slots=True)
class AudioClip:
    samples: Samples  # [n] float32, mono, 16 kHz, in [-1, 1]
    source_rate_hz: int
    source_channels: int

    @property
    def duration_s(self) -> float:
        return len(self.samples) / TARGET_RATE_HZ


def decode_audio(
    body: bytes, *, content_type: str = "", max_seconds: float = MAX_SECONDS
) -> AudioClip:
    """WAV (detected by its RIFF header) or raw s16le mono 16 kHz -> 16 kHz mono float32.
    Longer than ``max_seconds``: ``AudioTooLongError``."""
    if not body:
        raise AudioFormatError("empty audio body")
    if body[:4] == b"RIFF" and body[8:12] == b"WAVE":
        return _decode_wav(body, max_seconds)
    if "wav" in content_type.lower():
        raise AudioFormatError("content-type says WAV but the body has no RIFF/WAVE header")
    if len(body) % 2:
        raise AudioFormatError(f"raw PCM s16le needs an even byte count, got {len(body)}")
    samples = np.frombuffer(body, dtype="<i2").astype(np.float32) / 32768.0  # [n]
    _check_duration(samples.shape[0], TARGET_RATE_HZ, max_seconds)
    return AudioClip(samples, TARGET_RATE_HZ, 1)


def _decode_wav(body: bytes, max_seconds: float) -> AudioClip:
    try:
        with av.open(io.BytesIO(body), mode="r", format="wav") as container:
            if not container.streams.audio:
                raise AudioFormatError("WAV file lacks a 'fmt ' or 'data' chunk")
            stream = container.streams.audio[0]
            codec, rate, channels = stream.codec_context.name, stream.rate, stream.channels
            if codec not in _WAV_CODECS:
                raise AudioFormatError(
                    f"WAV codec {codec!r} is unsupported (PCM int 8/16/24/32 or float 32/64 only)"
                )
            if channels < 1 or rate < 1000 or rate > 384_000:
                raise AudioFormatError(f"WAV has {channels} channels at {rate} Hz; unsupported")
            frames = list(container.decode(stream))
    except av.error.FFmpegError as exc:
        raise AudioFormatError(
            f"WAV file lacks a 'fmt ' or 'data' chunk, or they are malformed ({exc})"
        ) from None
    _check_duration(sum(f.samples for f in frames), rate, max_seconds)
    return AudioClip(_to_target(frames), rate, channels)


def _check_duration(num_samples: int, rate_hz: int, max_seconds: float) -> None:
    if num_samples / rate_hz > max_seconds:
        raise AudioTooLongError(
            f"audio is {num_samples / rate_hz:.1f} s long; at most {max_seconds:g} s per upload"
        )


def _to_target(frames: Iterable[av.AudioFrame]) -> Samples:
    """Decoded frames (any layout, rate, sample format) -> [n] float32 16 kHz mono in [-1, 1].

    The resampler keeps the channels (planar float) and the mean of them is the mono signal:
    FFmpeg's own stereo-to-mono downmix weighs each side by 1/sqrt(2) and would change the
    level of a signal present on both sides."""
    resampler = av.AudioResampler(format="fltp", rate=TARGET_RATE_HZ)
    parts = [
        out.to_ndarray()  # [channels, n]
        for frame in [*frames, None]  # None flushes what the filter still holds
        for out in resampler.resample(frame)
    ]
    if not parts:
        return np.zeros(0, np.float32)
    mono: npt.NDArray[np.float64] = np.concatenate(parts, axis=1).mean(axis=0)
    return np.clip(mono, -1.0, 1.0).astype(np.float32)


def resample(x: Samples, from_hz: int, to_hz: int = TARGET_RATE_HZ) -> Samples:
    """Band-limited resampling of a mono signal through ``av.AudioResampler``.

    # x: [n] float32 -> [round(n * to_hz / from_hz)] float32 (the resampler is flushed)
    """
    if from_hz == to_hz or x.shape[0] == 0:
        return x.astype(np.float32, copy=True)
    frame = av.AudioFrame.from_ndarray(
        np.ascontiguousarray(x, dtype=np.float32)[None, :], format="flt", layout="mono"
    )
    frame.sample_rate = from_hz
    resampler = av.AudioResampler(format="flt", layout="mono", rate=to_hz)
    parts = [out.to_ndarray()[0] for f in (frame, None) for out in resampler.resample(f)]
    return np.concatenate(parts).astype(np.float32) if parts else np.zeros(0, np.float32)
