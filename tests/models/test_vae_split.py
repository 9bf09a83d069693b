"""The Wan VAE decode split by rows over 2 gloo processes (models/wan/vae/split.py) against the
same decode in one process, on the tiny VAE preset with random weights.

One stream of four chunks (1, 2, 3, 3 latent frames: a first frame alone, then whole chunks) on
a 12x10 latent grid, so every causal cache carries over three times. Tolerance: 1e-5 absolute
on frames in [-1, 1] (float32; measured about 2e-6 - the convolutions and the attention run on
fewer rows, and the CPU kernels round a few values differently; on an 8x8 grid it is exact).
A band cache pickled as the SPMD channel does resolves to the receiver's own cache of that
stream. About 10-25 s (load): two processes import torch and decode the stream.
"""

from __future__ import annotations

import pytest
import torch

from tests.gloo_world import run_world

pytestmark = pytest.mark.slow

CHUNKS = (1, 2, 3, 3)
H, W = 12, 10
TOLERANCE = 1e-5


def _vae():
    from models.wan.vae.autoencoder import WanVAE
    from models.wan.vae.config import WanVAEConfig

    torch.manual_seed(0)
    vae = WanVAE(WanVAEConfig.preset("tiny")).eval()
    with torch.no_grad():
        for p in vae.parameters():  # away from the init's near-identity, so every layer matters
            p.normal_(0.0, 0.3)
    return vae


def _latents() -> list[torch.Tensor]:
    gen = torch.Generator().manual_seed(3)
    return [torch.randn(1, 16, c, H, W, generator=gen) for c in CHUNKS]


def _worker(rank: int, world: int) -> dict:
    import torch.distributed as dist

    from models.wan.vae.split import RowSplitVAE

    vae, zs = _vae(), _latents()
    out: dict = {}
    with torch.no_grad():
        if rank == 0:  # one process: the reference stream
            cache = vae.new_decoder_cache(1, H, W)
            out["ref"] = [vae.decode_chunk(z, cache).numpy() for z in zs]
            blank = vae.new_decoder_cache(1, H, W)  # chunk 2 with zeros for history
            blank.frames_seen = sum(CHUNKS[:2])
            out["fresh"] = vae.decode_chunk(zs[2], blank).numpy()
        split = RowSplitVAE(vae, dist.group.WORLD)
        cache = split.new_decoder_cache(1, H, W)
        out["cache_grid"] = cache.grid_hw
        out["cache_bytes"] = (cache.nbytes, split.decoder_cache_bytes(1, H, W, torch.float32))
        # numpy: the queue back to the test would share torch storages with exiting processes
        out["got"] = [split.decode_chunk(z, cache).numpy() for z in zs]
        out["frames_seen"] = cache.frames_seen
        out["exchanges"] = split.bands.exchanges
    out["crossing"] = _cross_the_channel(split)
    return out


def _cross_the_channel(split) -> dict:
    """A band cache pickled (as runtime/spmd.py's channel does) and loaded in this process,
    standing in for a follower: it resolves to the follower's own cache of that stream."""
    import gc
    import pickle

    from models.wan.vae.split import _STREAMS

    first = split.new_decoder_cache(1, H, W)
    first.buffers[0].fill_(1.0)
    first.frames_seen = 3
    mine = pickle.loads(pickle.dumps(first))
    again = pickle.loads(pickle.dumps(first))
    found = {
        "own": mine is not first and not bool(mine.buffers[0].any()),
        "same_stream": again is mine and mine.stream == first.stream,
        "frames_seen": mine.frames_seen,
    }
    stream = first.stream
    del first
    gc.collect()
    pickle.loads(pickle.dumps(split.new_decoder_cache(1, H, W)))  # carries the drop
    found["dropped"] = stream not in _STREAMS.held
    return found


@pytest.fixture(scope="module")
def world() -> list[dict]:
    return run_world(_worker, 2, timeout_s=120)


def test_split_decode_equals_one_process_across_chunks(world: list[dict]) -> None:
    lead = world[0]
    for got, ref in zip(lead["got"], lead["ref"], strict=True):
        assert got.shape == ref.shape  # rank 0 holds whole frames
        assert abs(got - ref).max() <= TOLERANCE
    # the carried caches matter: chunk 2 decoded without its history is another picture
    assert abs(lead["fresh"] - lead["ref"][2]).max() > 100 * TOLERANCE


def test_a_band_cache_crosses_as_a_reference_to_the_receivers_own(world: list[dict]) -> None:
    for rank in world:
        crossing = rank["crossing"]
        assert crossing["own"] and crossing["same_stream"]
        assert crossing["frames_seen"] == 3  # the leader's count is every rank's
        assert crossing["dropped"]  # collected on the leader: dropped with the next message


def test_each_rank_keeps_its_band_of_caches_and_frames(world: list[dict]) -> None:
    for rank in world:
        assert rank["cache_grid"] == (H // 2, W)
        assert rank["cache_bytes"][0] == rank["cache_bytes"][1]
        assert rank["frames_seen"] == sum(CHUNKS)
        assert rank["exchanges"] > 0
    follower, lead = world[1], world[0]
    for band, whole in zip(follower["got"], lead["got"], strict=True):
        assert band.shape[3] == whole.shape[3] // 2  # rank 1 decoded the bottom band
        assert (band == whole[:, :, :, whole.shape[3] // 2 :]).all()
