"""The TAEHV tiny streaming decoder: the published architecture (against a literal, frame-by-frame
reading of the published ``nn.Sequential`` written here from its state dict), chunked streaming
decode == whole-clip decode, the loops' frame-count contract, and its cache as loop state."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch.utils.flop_counter import FlopCounterMode

from models.wan.taehv.checkpoint import published_state_dict
from models.wan.taehv.config import TAEHVConfig, TAEHVConfigError
from models.wan.taehv.decoder import TAEHVDecoder
from models.wan.vae.autoencoder import VAEShapeError, WanVAE
from models.wan.vae.cache import CacheMismatchError, DecoderCache
from models.wan.vae.config import WanVAEConfig
from runtime.contract import LoopState
from runtime.snapshot import restore_state, snapshot_state

# CPU fp32: a chunk runs its convolutions over another number of frames than the whole clip
# does, so the sums may round differently; measured ~1e-7 relative.
TOLERANCE = 1e-5
LATENT_HW = (3, 4)
# the published stage layout (3 memory blocks per stage, 4x time, 8x space) at a few channels
SMALL = TAEHVConfig(widths=(8, 6, 4, 4))


@pytest.fixture(scope="module", autouse=True)
def one_intra_op_thread():
    previous = torch.get_num_threads()
    torch.set_num_threads(1)  # tiny tensors: threads cost more than they save on 2 shared cores
    yield
    torch.set_num_threads(previous)


def make_decoder(config: TAEHVConfig = SMALL, seed: int = 0) -> TAEHVDecoder:
    torch.manual_seed(seed)
    decoder = TAEHVDecoder(config).eval()
    with torch.no_grad():  # biases are zero-ish at init: make every term matter
        for name, p in decoder.named_parameters():
            if name.endswith("bias"):
                p.copy_(0.1 * torch.randn_like(p))
    return decoder


def latents(frames: int, seed: int, batch: int = 1) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return 2.0 * torch.randn(batch, 16, frames, *LATENT_HW, generator=g)


def decode_stream(dec: TAEHVDecoder, z: torch.Tensor, sizes: list[int]) -> list[torch.Tensor]:
    cache = dec.new_decoder_cache(z.shape[0], *LATENT_HW)
    out, start = [], 0
    for size in sizes:
        out.append(dec.decode_chunk(z[:, :, start : start + size], cache))
        start += size
    assert cache.frames_seen == start == z.shape[2]
    return out


def rel_err(ours: torch.Tensor, ref: torch.Tensor) -> float:
    return ((ours - ref).abs().max() / ref.abs().max()).item()


@pytest.fixture(scope="module")
def dec() -> TAEHVDecoder:
    return make_decoder()


# --------------------------------------------------------------------------------------------
# the published architecture, read literally


def published_reference(state: dict[str, torch.Tensor], z: torch.Tensor) -> torch.Tensor:
    """The published decoder as its ``nn.Sequential`` runs in streaming mode, one frame at a time
    through positions 0..22 (clamp, conv, relu, 3 x [3 MemBlock, Upsample, TGrow, conv], relu,
    conv), each MemBlock fed its previous frame's input; then [0, 1] -> [-1, 1] and the first 3
    frames trimmed. ``z``: [1, 16, t, h, w] -> [1, 3, 1 + 4(t - 1), 8h, 8w]."""

    def conv(x: torch.Tensor, i: int | str, pad: int = 1) -> torch.Tensor:
        return F.conv2d(
            x, state[f"decoder.{i}.weight"], state.get(f"decoder.{i}.bias"), padding=pad
        )

    memory: dict[int, torch.Tensor] = {}

    def frames_from(position: int, x: torch.Tensor) -> list[torch.Tensor]:
        # one frame x [1, C, H, W] entering the Sequential at ``position`` -> output frames
        while position < 23:
            if position == 0:
                x = torch.tanh(x / 3) * 3
            elif position in (1, 22):
                x = conv(x, position)
            elif position in (2, 21):
                x = F.relu(x)
            elif (position - 3) % 6 < 3:  # MemBlock
                past = memory.get(position, torch.zeros_like(x))
                memory[position] = x
                h = F.relu(conv(torch.cat((x, past), 1), f"{position}.conv.0"))
                h = F.relu(conv(h, f"{position}.conv.2"))
                x = F.relu(conv(h, f"{position}.conv.4") + x)
            elif (position - 3) % 6 == 3:  # Upsample
                x = F.interpolate(x, scale_factor=2, mode="nearest")
            elif (position - 3) % 6 == 4:  # TGrow: C * s channels -> s frames, in order
                grown = conv(x, f"{position}.conv", pad=0)
                stride = grown.shape[1] // x.shape[1]
                return [
                    y
                    for part in grown.chunk(stride, dim=1)
                    for y in frames_from(position + 1, part)
                ]
            else:
                x = conv(x, position)
            position += 1
        return [x]

    out = [y for t in range(z.shape[2]) for y in frames_from(0, z[:, :, t])]
    video = torch.stack(out[3:], dim=2)  # [1, 3, n, H, W]
    return video.clamp(0, 1) * 2 - 1


@torch.no_grad()
def test_decode_equals_the_published_sequential_read_literally() -> None:
    dec = make_decoder(SMALL, seed=1)
    z = latents(3, seed=2)
    expected = published_reference(published_state_dict(dec), z)
    assert expected.shape == (1, 3, 9, 24, 32)
    assert rel_err(dec.decode(z), expected) <= TOLERANCE


def test_taew2_1_preset_has_the_published_geometry() -> None:
    cfg = TAEHVConfig.preset("taew2_1")
    assert (cfg.temporal_factor, cfg.spatial_factor, cfg.frames_to_trim) == (4, 8, 3)
    with torch.device("meta"):
        dec = TAEHVDecoder(cfg)
    assert sum(p.numel() for p in dec.parameters()) == 9_844_611
    assert len(dec.decoder.slot_specs) == 9
    with pytest.raises(TAEHVConfigError, match="unknown TAEHV preset"):
        TAEHVConfig.preset("taehv9")
    with pytest.raises(TAEHVConfigError, match="widths"):
        TAEHVConfig(widths=(8, 8))
    assert TAEHVConfig.from_json(cfg.to_json()) == cfg


# --------------------------------------------------------------------------------------------
# streaming


@pytest.mark.parametrize(
    "sizes", [[1] * 5, [1, 3, 3], [3, 3, 1], [2, 3], [5]], ids=lambda s: "-".join(map(str, s))
)
@torch.no_grad()
def test_chunked_decode_equals_whole_clip_decode(dec: TAEHVDecoder, sizes: list[int]) -> None:
    z = latents(sum(sizes), seed=3)
    whole = dec.decode(z)
    chunks = decode_stream(dec, z, sizes)
    # the loops' contract: the stream's first latent frame -> 1 frame, every later one -> 4
    assert [c.shape[2] for c in chunks] == [1 + 4 * (sizes[0] - 1)] + [4 * s for s in sizes[1:]]
    assert whole.shape == (1, 3, 1 + 4 * (sum(sizes) - 1), 24, 32)
    assert rel_err(torch.cat(chunks, dim=2), whole) <= TOLERANCE
    assert whole.min() >= -1.0 and whole.max() <= 1.0


@torch.no_grad()
def test_interleaved_and_batched_streams_are_independent(dec: TAEHVDecoder) -> None:
    za, zb = latents(4, seed=4), latents(4, seed=5)
    alone_a, alone_b = decode_stream(dec, za, [1, 3]), decode_stream(dec, zb, [1, 3])
    cache_a, cache_b = dec.new_decoder_cache(1, *LATENT_HW), dec.new_decoder_cache(1, *LATENT_HW)
    inter = []
    for a0, a1 in ((0, 1), (1, 4)):
        inter.append((dec.decode_chunk(zb[:, :, a0:a1], cache_b), 1))
        inter.append((dec.decode_chunk(za[:, :, a0:a1], cache_a), 0))
    assert torch.equal(inter[1][0], alone_a[0]) and torch.equal(inter[3][0], alone_a[1])
    assert torch.equal(inter[0][0], alone_b[0]) and torch.equal(inter[2][0], alone_b[1])
    batched = torch.cat(decode_stream(dec, torch.cat([za, zb]), [1, 3]), dim=2)
    single = torch.cat([torch.cat(alone_a, dim=2), torch.cat(alone_b, dim=2)])
    assert rel_err(batched, single) <= TOLERANCE


@torch.no_grad()
def test_cache_is_static_written_in_place_and_sized_for_admission(dec: TAEHVDecoder) -> None:
    cache = dec.new_decoder_cache(1, *LATENT_HW)
    pointers = [b.data_ptr() for b in cache.buffers]
    # one frame of each memory block's input, at its stage's grid
    assert [tuple(b.shape) for b in cache.buffers] == (
        [(1, 8, 1, 3, 4)] * 3 + [(1, 6, 1, 6, 8)] * 3 + [(1, 4, 1, 12, 16)] * 3
    )
    z = latents(4, seed=6)
    for start, stop in ((0, 1), (1, 4)):
        dec.decode_chunk(z[:, :, start:stop], cache)
        assert [b.data_ptr() for b in cache.buffers] == pointers
    assert all(int(b.count_nonzero()) > 0 for b in cache.buffers)
    assert cache.nbytes == dec.decoder_cache_bytes(1, *LATENT_HW, torch.float32)
    assert dec.decoder_cache_bytes(2, *LATENT_HW, torch.bfloat16) == cache.nbytes


@torch.no_grad()
def test_a_wan_vae_cache_or_wrong_input_is_refused(dec: TAEHVDecoder) -> None:
    wan_cache = WanVAE(WanVAEConfig.preset("tiny")).new_decoder_cache(1, *LATENT_HW)
    with pytest.raises(CacheMismatchError, match="laid out for another coder"):
        dec.decode_chunk(latents(1, seed=7), wan_cache)
    with pytest.raises(CacheMismatchError, match="grid"):
        dec.decode_chunk(torch.zeros(1, 16, 1, 5, 5), dec.new_decoder_cache(1, *LATENT_HW))
    with pytest.raises(VAEShapeError, match="16"):
        dec.decode(torch.zeros(1, 4, 2, *LATENT_HW))


class _HoldsDecoder(LoopState, kw_only=True):
    decoder: DecoderCache


@torch.no_grad()
def test_a_loop_state_snapshot_restores_a_stream(dec: TAEHVDecoder) -> None:
    z = latents(7, seed=8)
    expected = decode_stream(dec, z, [1, 3, 3])
    cache = dec.new_decoder_cache(1, *LATENT_HW)
    dec.decode_chunk(z[:, :, :1], cache)
    dec.decode_chunk(z[:, :, 1:4], cache)
    blob = snapshot_state(_HoldsDecoder(decoder=cache))
    dec.decode_chunk(latents(3, seed=9), cache)  # the live stream moves on
    restored = restore_state(blob, _HoldsDecoder).decoder
    assert restored.frames_seen == 4
    assert torch.equal(dec.decode_chunk(z[:, :, 4:7], restored), expected[2])
    fork = restored.clone()
    restored.reset()
    assert restored.frames_seen == 0 and fork.frames_seen == 7


def test_decode_keeps_the_dit_latent_scale_and_unclamped_values_for_training(dec) -> None:
    z = latents(2, seed=10)
    assert dec.denormalize(z) is z and dec.normalize(z) is z
    raw = dec.decode(z, clamp=False)
    assert torch.equal(raw.clamp(-1.0, 1.0), dec.decode(z).detach())
    raw.abs().mean().backward()  # gradients reach the weights
    assert dec.decoder.conv_in.weight.grad is not None
    dec.zero_grad(set_to_none=True)


@pytest.mark.parametrize("frames", [1, 3])
def test_decode_flops_equal_torch_flop_counter(dec: TAEHVDecoder, frames: int) -> None:
    with torch.no_grad(), FlopCounterMode(display=False) as counter:
        dec.decode(latents(frames, seed=11))
    assert dec.decode_flops(frames, *LATENT_HW) == counter.get_total_flops()
