import io
import struct
import wave

import numpy as np
import pytest

from sessions.audio import TARGET_RATE_HZ, AudioFormatError, decode_audio, resample


def sine(freq_hz: float, rate_hz: int, seconds: float) -> np.ndarray:
    t = np.arange(int(rate_hz * seconds)) / rate_hz
    return (0.5 * np.sin(2 * np.pi * freq_hz * t)).astype(np.float32)


def wav_bytes(x: np.ndarray, rate: int, channels: int = 1, width: int = 2) -> bytes:
    buf = io.BytesIO()
    with wave.open(buf, "wb") as w:
        w.setnchannels(channels)
        w.setsampwidth(width)
        w.setframerate(rate)
        scale = {2: 32767, 4: 2147483647}[width]
        ints = (np.repeat(x[:, None], channels, axis=1) * scale).astype({2: "<i2", 4: "<i4"}[width])
        w.writeframes(ints.tobytes())
    return buf.getvalue()


def float_wav_bytes(x: np.ndarray, rate: int) -> bytes:
    data = x.astype("<f4").tobytes()
    fmt = struct.pack("<HHIIHH", 3, 1, rate, rate * 4, 4, 32)
    body = (
        b"WAVE"
        + b"fmt "
        + struct.pack("<I", len(fmt))
        + fmt
        + b"data"
        + struct.pack("<I", len(data))
        + data
    )
    return b"RIFF" + struct.pack("<I", len(body)) + body


def test_raw_s16le_is_16k_mono_passthrough() -> None:
    x = sine(440, TARGET_RATE_HZ, 0.5)
    clip = decode_audio((x * 32768).astype("<i2").tobytes())
    assert clip.samples.shape == (8000,) and clip.samples.dtype == np.float32
    assert np.abs(clip.samples - x).max() < 1e-4
    assert (clip.source_rate_hz, clip.source_channels) == (16000, 1)


@pytest.mark.parametrize("rate", [48000, 44100, 8000])
def test_wav_stereo_is_downmixed_and_resampled(rate: int) -> None:
    x = sine(440, rate, 1.0)
    clip = decode_audio(wav_bytes(x, rate, channels=2))
    assert clip.samples.shape[0] == int(np.ceil(x.shape[0] * 16000 / rate))
    assert (clip.source_rate_hz, clip.source_channels) == (rate, 2)
    expected = sine(440, 16000, 1.0)
    n = min(clip.samples.shape[0], expected.shape[0])
    assert np.abs(clip.samples[200 : n - 200] - expected[200 : n - 200]).max() < 2e-3


def test_float_and_32bit_wavs_decode() -> None:
    x = sine(1000, 16000, 0.25)
    assert np.abs(decode_audio(float_wav_bytes(x, 16000)).samples - x).max() < 1e-6
    assert np.abs(decode_audio(wav_bytes(x, 16000, width=4)).samples - x).max() < 1e-6


def test_resampling_rejects_content_above_the_new_nyquist() -> None:
    alias = sine(12000, 48000, 1.0)  # above 8 kHz: must vanish, not fold to 4 kHz
    assert np.abs(resample(alias, 48000, 16000)[200:-200]).max() < 1e-3


def test_malformed_audio_is_a_typed_error() -> None:
    with pytest.raises(AudioFormatError, match="even byte count"):
        decode_audio(b"\x00\x01\x02")
    with pytest.raises(AudioFormatError, match="empty"):
        decode_audio(b"")
    with pytest.raises(AudioFormatError, match="RIFF"):
        decode_audio(b"\x00\x00", content_type="audio/wav")
    with pytest.raises(AudioFormatError, match="fmt"):
        decode_audio(b"RIFF\x04\x00\x00\x00WAVE")
