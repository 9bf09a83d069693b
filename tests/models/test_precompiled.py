"""Precompiled regions (``models.precompiled``): one artifact per call signature shared by every
module of a region, the marked dimensions symbolic, artifacts saved and loaded by a new region
(a new start) without compiling, a sealed region running a new signature eagerly (counted), and
a region whose forward does not trace whole falling back to ``module.compile()``.

Inductor's CPU backend compiles each graph here (seconds apiece)."""

from __future__ import annotations

import msgspec
import pytest
import torch
from torch import nn

from models.compile_guard import CompileGuard
from models.loops.pieces import decode_pieces
from models.precompiled import Region, aot_supported, signature
from models.wan.vae.cache import CausalCache, SlotSpec, coder_call, coder_dynamic, decoder_dynamic

pytestmark = pytest.mark.skipif(not aot_supported(), reason="this torch has no aot_compile")


class _Block(nn.Module):
    """A block whose call attends to a variable-length past (the DiT's shape)."""

    def __init__(self) -> None:
        super().__init__()
        self.inner, self.outer = nn.Linear(8, 16), nn.Linear(16, 8)

    def forward(self, x: torch.Tensor, past: torch.Tensor) -> torch.Tensor:
        h = self.inner(torch.cat([past, x], dim=1)).relu()
        return x + self.outer(h)[:, -x.shape[1] :]


def _past_length(args: tuple) -> list[tuple[torch.Tensor, int]]:
    return [(args[2], 1)]


def _blocks(n: int = 3) -> list[_Block]:
    torch.manual_seed(0)
    return [_Block() for _ in range(n)]


def test_one_artifact_serves_every_block_and_every_past_length() -> None:
    blocks = _blocks()
    region = Region("blocks", _Block.forward, blocks, CompileGuard(), dynamic=_past_length)
    x = torch.randn(1, 4, 8)
    with torch.inference_mode():
        for length in (6, 10, 22):
            past = torch.randn(1, length, 8)
            for block in blocks:
                torch.testing.assert_close(block(x, past), _Block.forward(block, x, past))
    assert region.signatures() == 1 and region.stats.compiled == 1
    assert not region.stats.fallbacks


def test_a_new_region_loads_the_artifacts_and_compiles_nothing(tmp_path) -> None:
    blocks = _blocks(2)
    first = Region("blocks", _Block.forward, blocks, CompileGuard(), dynamic=_past_length)
    first.use_store(tmp_path)
    x, past = torch.randn(1, 4, 8), torch.randn(1, 6, 8)
    with torch.inference_mode():
        want = [block(x, past) for block in blocks]
    assert first.stats.compiled == 1 and len(list(tmp_path.glob("blocks/*.aot"))) == 1

    again = _blocks(2)  # the same weights in new modules: a restarted process's
    second = Region("blocks", _Block.forward, again, CompileGuard(), dynamic=_past_length)
    assert second.use_store(tmp_path) == 1
    with torch.inference_mode():
        got = [block(x, past) for block in again]
        longer = again[0](x, torch.randn(1, 30, 8))  # another length: the same artifact
    for a, b in zip(got, want, strict=True):
        torch.testing.assert_close(a, b)
    assert longer.shape == x.shape
    assert second.stats.compiled == 0 and second.stats.loaded == 1


def test_a_sealed_region_runs_a_new_signature_eagerly_and_counts_it() -> None:
    blocks = _blocks(1)
    guard = CompileGuard()
    region = Region("blocks", _Block.forward, blocks, guard, dynamic=_past_length)
    with torch.inference_mode():
        blocks[0](torch.randn(1, 4, 8), torch.randn(1, 6, 8))
        guard.seal()
        try:
            x, past = torch.randn(1, 5, 8), torch.randn(1, 6, 8)  # 5 new tokens: not compiled
            torch.testing.assert_close(blocks[0](x, past), _Block.forward(blocks[0], x, past))
            after = guard.after_ready()
        finally:
            guard.unseal()
    assert region.stats.compiled == 1 and region.stats.eager == 1
    assert after["outside_set"] == 1


class _Counter(msgspec.Struct):
    n: int = 0


class _Breaking(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(4, 4)

    def forward(self, x: torch.Tensor, count: _Counter) -> torch.Tensor:
        y = self.lin(x)
        count.n += 1  # a store Dynamo does not trace: the graph breaks here
        return y * 2


def test_a_forward_that_does_not_trace_whole_falls_back_to_torch_compile() -> None:
    module = _Breaking()
    region = Region("breaking", _Breaking.forward, [module], CompileGuard())
    count = _Counter()
    x = torch.randn(2, 4)
    with torch.compiler.set_stance("default"):
        out = module(x, count)
        again = module(x, count)  # now through module.compile()
    torch._dynamo.reset()
    torch.testing.assert_close(out, module.lin(x) * 2)
    torch.testing.assert_close(again, out)
    assert region.stats.fallbacks and region.signatures() == 0
    assert count.n >= 2


class _Coder(nn.Module):
    """A causal coder over a ``CausalCache``: the stream's first chunk is treated apart."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv3d(2, 2, (1, 3, 3), padding=(0, 1, 1))

    def forward(self, x: torch.Tensor, cache: CausalCache) -> torch.Tensor:
        history = cache.buffers[0]
        y = self.conv(x if cache.frames_seen == 0 else torch.cat([history, x], dim=2))
        history.copy_(x[:, :, -1:])
        return y[:, :, -x.shape[2] :]


def _stream(
    coder: _Coder, height: int, width: int, chunks: int, pieces: tuple[int, ...] = ()
) -> list[torch.Tensor]:
    spec = SlotSpec(channels=2, frames=1, level=0)
    cache = CausalCache((spec,), [torch.zeros(1, 2, 1, height, width)], (height, width))
    out = []
    for frames in pieces or (1, *([2] * (chunks - 1))):
        out.append(coder(torch.randn(1, 2, frames, height, width), cache))
        cache.frames_seen += frames
    return out


def test_a_coder_region_serves_every_grid_and_every_later_chunk_with_few_graphs() -> None:
    """The frame count only matters as first chunk or not (``coder_call``), the grid and the
    chunk's frames are symbolic (``coder_dynamic``): two grids, six chunks each, two graphs
    (the first chunk's and the later chunks'), outputs as the coder's own."""
    torch.manual_seed(0)
    coder = _Coder()
    region = Region(
        "coder", _Coder.forward, [coder], CompileGuard(), dynamic=coder_dynamic, adapt=coder_call
    )
    with torch.inference_mode():
        for height, width in ((6, 10), (12, 8)):
            torch.manual_seed(1)
            compiled = _stream(coder, height, width, 6)
            torch.manual_seed(1)
            coder._compiled_call_impl, saved = None, coder._compiled_call_impl
            eager = _stream(coder, height, width, 6)
            coder._compiled_call_impl = saved
            for a, b in zip(compiled, eager, strict=True):
                torch.testing.assert_close(a, b)
    assert region.signatures() == 2 and region.stats.compiled == 2


def test_the_vae_decoders_rule_shares_one_graph_between_the_later_pieces_above_one_frame() -> None:
    """``decoder_dynamic`` keeps a piece's frame count symbolic above one: a session's first
    chunk (1 + 2 frames), steady chunks (3) and a changing chunk's parts (1 + 2) compile three
    graphs (first frame, a later frame alone, any later piece), outputs as the coder's own."""
    torch.manual_seed(0)
    coder = _Coder()
    region = Region(
        "coder", _Coder.forward, [coder], CompileGuard(), dynamic=decoder_dynamic, adapt=coder_call
    )
    pieces = (1, 2, 3, 3, 1, 2, 3)
    with torch.inference_mode():
        torch.manual_seed(1)
        compiled = _stream(coder, 6, 10, 0, pieces)
        torch.manual_seed(1)
        coder._compiled_call_impl, saved = None, coder._compiled_call_impl
        eager = _stream(coder, 6, 10, 0, pieces)
        coder._compiled_call_impl = saved
    for a, b in zip(compiled, eager, strict=True):
        torch.testing.assert_close(a, b)
    assert region.signatures() == 3 and region.stats.compiled == 3
    one, three = torch.zeros(1, 2, 1, 4, 4), torch.zeros(1, 2, 3, 4, 4)
    assert (one, 2) not in decoder_dynamic((coder, one))
    assert [d for t, d in decoder_dynamic((coder, three)) if t is three] == [3, 4, 2]


def test_a_streams_decodes_take_its_first_latent_frame_alone() -> None:
    """Jobs and programs decode as sessions do (``decode_pieces``), so their decodes after a
    stream's first frame run the graphs sessions run."""
    assert decode_pieces(0, 7, 3) == [(0, 1), (1, 4), (4, 7)]
    assert decode_pieces(0, 1, 3) == [(0, 1)]
    assert decode_pieces(4, 9, 3) == [(4, 7), (7, 9)]
    assert decode_pieces(5, 5, 3) == []


def test_the_signature_leaves_out_the_dynamic_dimensions_only() -> None:
    a, b = torch.zeros(1, 6, 8), torch.zeros(1, 9, 8)
    assert signature((a,), [(a, 1)]) == signature((b,), [(b, 1)])
    assert signature((a,)) != signature((b,))
    assert signature((a, None)) != signature((a, a))
    outside = signature((a,))
    with torch.inference_mode():
        assert signature((a,)) != outside  # the grad mode is part of it
