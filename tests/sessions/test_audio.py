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


def riff(tag: int, bits: int, channels: int, rate: int, data: bytes, *, extensible=False) -> bytes:
    """A WAV file by hand: format ``tag`` (1 PCM, 3 float; EXTENSIBLE carries it as sub-format)."""
    block = channels * bits // 8
    fmt = struct.pack(
        "<HHIIHH", 0xFFFE if extensible else tag, channels, rate, rate * block, block, bits
    )
    if extensible:
        guid_tail = b"\x00\x00\x00\x00\x10\x00\x80\x00\x00\xaa\x00\x38\x9b\x71"
        fmt += struct.pack("<HHI", 22, bits, 0) + struct.pack("<H", tag) + guid_tail
    body = b"WAVE" + b"fmt " + struct.pack("<I", len(fmt)) + fmt
    body += b"data" + struct.pack("<I", len(data)) + data
    return b"RIFF" + struct.pack("<I", len(body)) + body


def ints(x: np.ndarray, bits: int) -> bytes:
    if bits == 8:
        return (x * 127 + 128).astype(np.uint8).tobytes()
    v = (x * (2 ** (bits - 1) - 1)).astype(np.int64)
    if bits == 24:
        b = v.astype("<i4").view(np.uint8).reshape(-1, 4)[:, :3]
        return b.tobytes()
    return v.astype({16: "<i2", 32: "<i4"}[bits]).tobytes()


@pytest.mark.parametrize(
    "tag, bits, tolerance",
    [(1, 8, 2e-2), (1, 16, 1e-4), (1, 24, 1e-6), (1, 32, 1e-6), (3, 32, 1e-6), (3, 64, 1e-6)],
)
@pytest.mark.parametrize("extensible", [False, True])
def test_every_pcm_and_float_width_decodes(
    tag: int, bits: int, tolerance: float, extensible
) -> None:
    x = sine(440, 16000, 0.25)
    data = ints(x, bits) if tag == 1 else x.astype("<f4" if bits == 32 else "<f8").tobytes()
    clip = decode_audio(riff(tag, bits, 1, 16000, data, extensible=extensible))
    assert clip.samples.shape == x.shape and clip.samples.dtype == np.float32
    assert np.abs(clip.samples - x).max() < tolerance


def test_many_channels_average_to_mono() -> None:
    x = sine(440, 16000, 0.25)
    frames = np.stack([x, -x, x, x, 0 * x, x], axis=1)  # 6 channels: the mean is 0.5 x
    clip = decode_audio(riff(3, 32, 6, 16000, frames.astype("<f4").tobytes()))
    assert clip.source_channels == 6 and np.abs(clip.samples - 0.5 * x).max() < 1e-6


def test_wavs_this_decoder_refuses_say_why() -> None:
    with pytest.raises(AudioFormatError, match="adpcm|unsupported"):
        decode_audio(riff(2, 4, 1, 16000, b"\x00" * 256))  # MS ADPCM
    with pytest.raises(AudioFormatError, match="at most 30 s"):
        decode_audio(riff(1, 16, 1, 16000, b"\x00" * (2 * 16000 * 31)))
    with pytest.raises(AudioFormatError, match="at most 30 s"):
        decode_audio(b"\x00" * (2 * 16000 * 31))
