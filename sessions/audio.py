"""Audio input: decode an upload (or a WebRTC audio track's frames) into 16 kHz mono float32.

Accepted bodies (API.md ``POST /v1/sessions/{id}/audio``): raw PCM s16le mono at 16 kHz, or a
RIFF/WAVE file (PCM 8/16/24/32-bit integer or IEEE float 32/64-bit, any channel count and
rate; ``WAVE_FORMAT_EXTENSIBLE`` with those sub-formats). Channels are averaged to mono and the
signal is resampled with a Kaiser-windowed sinc (band-limited to the lower Nyquist), so 44.1 or
48 kHz microphones need no client-side work. The per-frame conditioning features are the
model's business (``models.loops.inputs.audio_features``, computed by the loop from these
samples); sessions deliver clean 16 kHz mono samples ``[n]`` float32 in [-1, 1].
Malformed input raises ``AudioFormatError`` naming what is wrong.
"""

from __future__ import annotations

import math
import struct
from dataclasses import dataclass

import numpy as np

__all__ = [
    "TARGET_RATE_HZ",
    "AudioClip",
    "AudioFormatError",
    "decode_audio",
    "resample",
]

TARGET_RATE_HZ = 16_000
MAX_SECONDS = 30.0  # per upload; longer streams arrive as several uploads

_PCM = 1
_FLOAT = 3
_EXTENSIBLE = 0xFFFE


class AudioFormatError(ValueError):
    """The upload is not PCM s16le nor a WAV file this decoder understands."""


@dataclass(frozen=True, slots=True)
class AudioClip:
    samples: np.ndarray  # [n] float32, mono, 16 kHz, in [-1, 1]
    source_rate_hz: int
    source_channels: int

    @property
    def duration_s(self) -> float:
        return self.samples.shape[0] / TARGET_RATE_HZ


def decode_audio(body: bytes, *, content_type: str = "") -> AudioClip:
    """WAV (detected by its RIFF header) or raw s16le mono 16 kHz -> 16 kHz mono float32."""
    if not body:
        raise AudioFormatError("empty audio body")
    if body[:4] == b"RIFF" and body[8:12] == b"WAVE":
        samples, rate, channels = _decode_wav(body)
    elif "wav" in content_type.lower():
        raise AudioFormatError("content-type says WAV but the body has no RIFF/WAVE header")
    else:
        if len(body) % 2:
            raise AudioFormatError(f"raw PCM s16le needs an even byte count, got {len(body)}")
        samples = np.frombuffer(body, dtype="<i2").astype(np.float32) / 32768.0
        samples = samples[:, None]
        rate, channels = TARGET_RATE_HZ, 1
    if samples.shape[0] / rate > MAX_SECONDS:
        raise AudioFormatError(
            f"audio is {samples.shape[0] / rate:.1f} s long; at most {MAX_SECONDS} s per upload"
        )
    mono = samples.mean(axis=1).astype(np.float32)
    out = resample(mono, rate, TARGET_RATE_HZ)
    return AudioClip(np.clip(out, -1.0, 1.0).astype(np.float32), rate, channels)


def _decode_wav(body: bytes) -> tuple[np.ndarray, int, int]:
    # returns samples: [n, channels] float32
    fmt: tuple[int, int, int, int] | None = None
    data: bytes | None = None
    pos = 12
    while pos + 8 <= len(body):
        chunk_id = body[pos : pos + 4]
        (size,) = struct.unpack_from("<I", body, pos + 4)
        payload = body[pos + 8 : pos + 8 + size]
        if chunk_id == b"fmt ":
            if len(payload) < 16:
                raise AudioFormatError(f"WAV fmt chunk is {len(payload)} bytes, expected >= 16")
            tag, channels, rate, _, _, bits = struct.unpack_from("<HHIIHH", payload)
            if tag == _EXTENSIBLE and len(payload) >= 26:
                (tag,) = struct.unpack_from("<H", payload, 24)
            fmt = (tag, channels, rate, bits)
        elif chunk_id == b"data":
            data = payload
        pos += 8 + size + (size & 1)
    if fmt is None or data is None:
        raise AudioFormatError("WAV file lacks a 'fmt ' or 'data' chunk")
    tag, channels, rate, bits = fmt
    if channels < 1 or rate < 1000 or rate > 384_000:
        raise AudioFormatError(f"WAV has {channels} channels at {rate} Hz; unsupported")
    frame_bytes = channels * bits // 8
    if frame_bytes == 0:
        raise AudioFormatError(f"WAV has {bits} bits per sample; unsupported")
    data = data[: len(data) - len(data) % frame_bytes]
    if tag == _PCM and bits == 8:
        x = (np.frombuffer(data, np.uint8).astype(np.float32) - 128.0) / 128.0
    elif tag == _PCM and bits == 16:
        x = np.frombuffer(data, "<i2").astype(np.float32) / 32768.0
    elif tag == _PCM and bits == 24:
        b = np.frombuffer(data, np.uint8).reshape(-1, 3).astype(np.int32)
        v = b[:, 0] | (b[:, 1] << 8) | (b[:, 2] << 16)
        v = np.where(v >= 1 << 23, v - (1 << 24), v)
        x = v.astype(np.float32) / float(1 << 23)
    elif tag == _PCM and bits == 32:
        x = (np.frombuffer(data, "<i4").astype(np.float64) / 2147483648.0).astype(np.float32)
    elif tag == _FLOAT and bits in (32, 64):
        x = np.frombuffer(data, "<f4" if bits == 32 else "<f8").astype(np.float32)
    else:
        raise AudioFormatError(
            f"WAV format tag {tag} with {bits} bits is unsupported (PCM int or float only)"
        )
    return x.reshape(-1, channels), rate, channels


def resample(
    x: np.ndarray, from_hz: int, to_hz: int, *, half_taps: int = 16, beta: float = 8.6
) -> np.ndarray:
    """Band-limited resampling with a Kaiser-windowed sinc kernel.

    # x: [n] float32 -> [ceil(n * to_hz / from_hz)] float32
    """
    if from_hz == to_hz or x.shape[0] == 0:
        return x.astype(np.float32, copy=True)
    ratio = to_hz / from_hz
    cutoff = min(1.0, ratio)  # fraction of the input Nyquist kept
    n_out = math.ceil(x.shape[0] * ratio)
    out = np.empty(n_out, dtype=np.float32)
    span = math.ceil(half_taps / cutoff)
    offsets = np.arange(-span + 1, span + 1)  # [taps]
    padded = np.concatenate(
        [np.zeros(span, np.float32), x.astype(np.float32), np.zeros(span + 1, np.float32)]
    )
    block = 4096
    for start in range(0, n_out, block):
        t = np.arange(start, min(start + block, n_out)) / ratio  # [b] input-time of each output
        base = np.floor(t).astype(np.int64)
        idx = base[:, None] + offsets[None, :]  # [b, taps]
        d = t[:, None] - idx  # distance in input samples
        r = np.clip(d / span, -1.0, 1.0)
        w = np.i0(beta * np.sqrt(1.0 - r * r)) / np.i0(beta)  # Kaiser window at distance d
        h = cutoff * np.sinc(cutoff * d) * w
        out[start : start + t.shape[0]] = (padded[idx + span] * h).sum(axis=1)
    return out
