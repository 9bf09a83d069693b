"""chunk_rollout on the tiny random card: determinism, inputs at chunk boundaries, snapshots."""

from __future__ import annotations

import asyncio
import copy
import dataclasses

import msgspec
import pytest
import torch

from models.card import CardError
from models.instance import load_instance
from models.loops.chunk_rollout.loop import ChunkRolloutState, Phase
from models.loops.chunk_rollout.plans import ChunkPlanner
from models.loops.chunk_rollout.restart import RestartCutsOnly
from models.loops.requests import JobRequest, SessionRequest
from models.registry import get
from runtime.contract import (
    ActionInput,
    AudioInput,
    Emission,
    InputEvent,
    InputKind,
    PromptInput,
    PromptMode,
)
from runtime.driver import Driver, InlineContext


@pytest.fixture(scope="module")
def instance():
    return load_instance(get("wan-tiny-random"), device="cpu")


def _run(
    instance, request, inputs_at: dict[int, list[InputEvent]] | None = None, loop_id: str = "s"
) -> tuple[list[Emission], ChunkRolloutState, dict]:
    """Run to completion; ``inputs_at[k]`` are pushed just before driver step k."""
    loop = instance.loop("chunk_rollout")
    ctx = InlineContext(loop_id)
    driver = Driver(loop, ctx)

    async def go():
        driver.init(request, instance)
        k = 0
        while True:
            for event in (inputs_at or {}).get(k, []):
                ctx.push_input(event)
            if not await driver.step():
                break
            k += 1
        return driver.finalize()

    result = asyncio.run(go())
    return ctx.emissions, driver.state, dict(result.outputs)


def _parts(emissions: list[Emission]) -> list[tuple[dict, torch.Tensor]]:
    """Media emissions as emitted (a session's first chunk comes in two parts)."""
    return [
        (msgspec.structs.asdict(e.spec.meta), e.output)
        for e in emissions
        if e.spec.stream == "media"
    ]


def _media(emissions: list[Emission]) -> list[tuple[dict, torch.Tensor]]:
    """One entry per chunk: its parts' frames joined, the first part's meta."""
    chunks: list[tuple[dict, torch.Tensor]] = []
    open_part = False
    for meta, frames in _parts(emissions):
        if open_part:
            chunks[-1] = (chunks[-1][0], torch.cat((chunks[-1][1], frames)))
        else:
            chunks.append((meta, frames))
        open_part = not meta["final"]
    return chunks


def _applied(emissions: list[Emission]) -> list[dict]:
    return [msgspec.structs.asdict(e.spec.meta) for e in emissions if e.spec.stream == "applied"]


def _with_policy(instance, policy):
    """The instance serving its loops with another ``chunk_restart`` policy."""
    other = copy.copy(instance)
    other.chunk_restart = policy
    return other


# plans per chunk on the tiny card: 4 denoise steps + decode + kv_update (+1 text encode once)
STEPS_PER_CHUNK = 6


def _step_of_chunk(chunk: int) -> int:
    """Driver step index at which chunk ``chunk``'s boundary inputs must already be absorbed
    for it: inputs pushed during chunk k-1 latch at its decode -> apply to chunk k."""
    return 1 + STEPS_PER_CHUNK * (chunk - 1) + 1  # mid-way through chunk k-1


def test_same_seed_same_frames_and_pts_strictly_increase(instance) -> None:
    request = SessionRequest(prompt="a red ball on grass", seed=3, max_chunks=3)
    first, _, _ = _run(instance, request)
    second, _, _ = _run(instance, request)
    a, b = _media(first), _media(second)
    assert [m for m, _ in a] == [m for m, _ in b]
    assert all(torch.equal(x, y) for (_, x), (_, y) in zip(a, b))
    pts = [m["pts_90k"] for m, _ in a]
    assert pts == sorted(set(pts)) and pts[0] == 0
    assert [f.shape[0] for _, f in a] == [9, 12, 12]  # 1 + 4(c-1), then 4c
    parts = _parts(first)  # the stream's first frame comes alone, as early as possible
    assert [(m["chunk"], m["num_frames"], m["final"], f.shape[0]) for m, f in parts] == [
        (0, 1, False, 1),
        (0, 8, True, 8),
        (1, 12, True, 12),
        (2, 12, True, 12),
    ]
    assert all(f.dtype == torch.uint8 and f.shape[1:] == (64, 64, 3) for _, f in a)
    other, _, _ = _run(instance, SessionRequest(prompt="a red ball on grass", seed=4, max_chunks=1))
    assert not torch.equal(_media(other)[0][1], a[0][1])


@pytest.fixture(scope="module")
def baseline_run(instance) -> tuple[SessionRequest, list[Emission]]:
    request = SessionRequest(prompt="a red ball on grass", seed=5, max_chunks=2)
    return request, _run(instance, request)[0]


@pytest.mark.parametrize(
    "kind, payload, ack",
    [
        (InputKind.PROMPT, PromptInput(text="a purple triangle on snow"), "prompt"),
        (InputKind.ACTION, ActionInput(keys=("w", "ArrowLeft"), mouse=(30, -10)), "action"),
        (
            InputKind.AUDIO,
            AudioInput(samples=(0.8 * torch.sin(torch.arange(24000) * 0.3)).numpy()),
            "audio",
        ),
    ],
)
def test_input_applies_at_next_chunk_and_earlier_frames_are_unchanged(
    instance, baseline_run, kind, payload, ack
) -> None:
    request, baseline = baseline_run
    event = InputEvent(kind, 7, payload)
    # a loop that never restarts a chunk for a switch or a key (the plain policy)
    finishing = _with_policy(instance, RestartCutsOnly())
    steered, _, _ = _run(finishing, request, {_step_of_chunk(1): [event]})
    applied = _applied(steered)
    pts = _media(steered)[1][0]["pts_90k"]
    changes = kind is not InputKind.AUDIO  # audio never changes the picture discretely
    assert applied == [{"kind": ack, "seq": 7, "chunk": 1, "pts_90k": pts, "changes": changes}]
    base, new = _media(baseline), _media(steered)
    assert torch.equal(base[0][1], new[0][1])  # chunk 0 was generated before the input
    assert not torch.equal(base[1][1], new[1][1])  # chunk 1 reflects it


def test_switch_recaches_and_stream_continues(instance) -> None:
    request = SessionRequest(prompt="a red ball on grass", seed=6, max_chunks=2)
    emissions, state, _ = _run(
        instance,
        request,
        {
            _step_of_chunk(1): [
                InputEvent(InputKind.PROMPT, 1, PromptInput(text="a blue square on sand"))
            ]
        },
    )
    assert state.prompt == state.active_prompt == "a blue square on sand"
    assert state.segment == 0  # a switch is not a new segment
    # the re-cache rewrote chunk 0's 3 frames; the last chunk's KV update is skipped
    assert not state.recache_needed and state.kv.frames_written == 3
    assert [m["chunk"] for m, _ in _media(emissions)] == [0, 1]


def test_cut_abandons_in_flight_chunk_and_starts_a_segment(instance) -> None:
    request = SessionRequest(prompt="a red ball on grass", seed=8, max_chunks=2)
    # step 3 is mid-denoise of chunk 0 (text encode, 2 denoise steps done)
    emissions, state, _ = _run(
        instance,
        request,
        {
            3: [
                InputEvent(
                    InputKind.PROMPT,
                    2,
                    PromptInput(text="a white ball at night", mode=PromptMode.CUT),
                )
            ]
        },
    )
    media = _media(emissions)
    assert [m["segment"] for m, _ in media] == [1, 1]
    assert _applied(emissions)[0] == {
        "kind": "prompt",
        "seq": 2,
        "chunk": 0,
        "pts_90k": 0,
        "changes": True,
    }
    direct, _, _ = _run(
        instance, SessionRequest(prompt="a white ball at night", seed=8, max_chunks=2)
    )
    # the cut chunk restarts with segment-1 noise, so it differs from a fresh segment-0 run
    assert not torch.equal(media[0][1], _media(direct)[0][1])
    assert state.chunk == 2


def test_rolling_window_keeps_sinks_over_long_rollouts(instance) -> None:
    request = SessionRequest(prompt="a green ball", seed=9, max_chunks=5)
    emissions, state, _ = _run(instance, request)
    sink, ring = state.kv.sink_frames, state.kv.window_frames
    assert state.kv.slot_positions[:sink] == list(range(sink))  # the first frames stay as sinks
    # 5 chunks x 3 frames; the last chunk's KV update is skipped: 12 frames written
    last = state.frame_start - state.chunk_frames
    assert state.kv.frames_written == last == 12
    assert sorted(state.kv.slot_positions[sink:]) == list(range(last - ring, last))
    assert all(torch.isfinite(f.float()).all() for _, f in _media(emissions))


def snapshot_and_resume(instance, request, cut_at: int) -> list[Emission]:
    """Run ``cut_at`` driver steps, snapshot, resume the blob in a fresh driver to the end:
    the emissions of both halves, in order."""
    loop = instance.loop("chunk_rollout")
    ctx = InlineContext("s")
    driver = Driver(loop, ctx)

    async def first_half() -> bytes:
        driver.init(request, instance)
        for _ in range(cut_at):
            await driver.step()
        return driver.snapshot()

    blob = asyncio.run(first_half())
    ctx2 = InlineContext("s")
    asyncio.run(Driver.from_snapshot(loop, ctx2, blob, ChunkRolloutState).run())
    return ctx.emissions + ctx2.emissions


def test_snapshot_at_any_boundary_resumes_bit_identically(instance) -> None:
    request = SessionRequest(prompt="a yellow square", seed=11, max_chunks=2)
    reference, _, _ = _run(instance, request)
    # after text encode, mid-denoise, between the first chunk's decode parts, before KV update
    for cut_at in (1, 4, 6, 7):
        combined = _media(snapshot_and_resume(instance, request, cut_at))
        assert [m for m, _ in combined] == [m for m, _ in _media(reference)]
        assert all(torch.equal(a, b) for (_, a), (_, b) in zip(combined, _media(reference)))


def test_job_returns_exactly_the_requested_frames(instance) -> None:
    loop = instance.loop_for("text_to_video")
    ctx = InlineContext("job")
    result = asyncio.run(
        Driver(loop, ctx).run(
            JobRequest(task="t2v", prompt="a red ball", num_frames=17, seed=1), instance
        )
    )
    assert result.outputs["frames"].shape == (17, 64, 64, 3)
    progress = [
        msgspec.structs.asdict(e.spec.meta) for e in ctx.emissions if e.spec.stream == "progress"
    ]
    assert progress[-1]["done"] == progress[-1]["total"]
    assert [p["done"] for p in progress] == list(range(1, len(progress) + 1))
    image = asyncio.run(
        Driver(loop, InlineContext("img")).run(
            JobRequest(task="t2i", prompt="a red ball", seed=1), instance
        )
    )
    assert image.outputs["frames"].shape == (1, 64, 64, 3)


def test_unsupported_input_fails_clearly(instance) -> None:
    state_loop = instance.loop("chunk_rollout")
    state = state_loop.init(SessionRequest(prompt="x", max_chunks=1), instance, None)
    with pytest.raises(ValueError, match="does not accept input 'teleport'"):
        state_loop.absorb(state, [InputEvent("teleport", 1, {})])
    assert state.phase is Phase.START


def test_first_chunk_in_two_parts_equals_one_decode(instance, monkeypatch) -> None:
    request = SessionRequest(prompt="a red ball on grass", seed=3, max_chunks=2)
    split, _, _ = _run(instance, request)

    def whole_chunk(self, state):
        latent = state.chunk_frames - state.decoded
        first = state.frames_emitted == 0
        return latent, self._m.latent.pixel_frames(latent, includes_first=first)

    monkeypatch.setattr(ChunkPlanner, "decode_part", whole_chunk)
    whole, _, _ = _run(instance, request)
    assert len(_parts(split)) == 3 and len(_parts(whole)) == 2
    # the causal decoder's parts equal one decode up to float rounding (rel 1e-6): at most one
    # uint8 level where a value sits on a rounding edge
    for (_, a), (_, b) in zip(_media(split), _media(whole), strict=True):
        diff = (a.int() - b.int()).abs()
        assert a.shape == b.shape and diff.max() <= 1 and diff.float().mean() < 1e-3


def test_a_card_whose_last_step_caches_the_kv_skips_the_update_pass(instance) -> None:
    card = instance.card
    spec = dataclasses.replace(card.loops["chunk_rollout"], kv_update="last_step")
    folded = copy.copy(instance)
    folded.card = dataclasses.replace(card, loops={**card.loops, "chunk_rollout": spec})
    request = SessionRequest(prompt="a red ball on grass", seed=3, max_chunks=3)
    loop = folded.loop("chunk_rollout")
    ctx = InlineContext("s")
    driver = Driver(loop, ctx)
    asyncio.run(driver.run(request, folded))
    kinds = [p.kind.value for p in ctx.executed]
    assert "kv_update" not in kinds
    assert kinds.count("chunk_step") == 12 and kinds.count("vae_decode") == 4
    assert driver.state.kv.frames_written == 6  # chunks 0 and 1; nothing reads the last one's
    clean, _, _ = _run(instance, request)
    ours, theirs = _media(ctx.emissions), _media(clean)
    assert torch.equal(ours[0][1], theirs[0][1])  # the first chunk reads no cache
    assert not torch.equal(ours[1][1], theirs[1][1])  # later ones read another context


def test_kv_update_mode_must_be_known(instance) -> None:
    with pytest.raises(CardError, match="kv_update='sometimes'"):
        dataclasses.replace(instance.card.loops["chunk_rollout"], kv_update="sometimes")


def test_followups_are_the_work_left_before_the_plans_media_is_due(instance) -> None:
    loop = instance.loop("chunk_rollout")
    ctx = InlineContext("s")
    asyncio.run(
        Driver(loop, ctx).run(SessionRequest(prompt="a red ball", seed=1, max_chunks=2), instance)
    )
    shape = "c3x8x8"

    def described(plan) -> list[str]:
        return [f"{f.kind.value}:{f.shape_sig}" for f in plan.followups]

    by_kind = [(p.kind.value, described(p)) for p in ctx.executed]
    steps = [f"chunk_step:{shape}"]
    assert by_kind[:8] == [
        ("text_encode", steps * 4 + [f"vae_decode:decode:1:1:{shape}"]),
        ("chunk_step", steps * 3 + [f"vae_decode:decode:1:1:{shape}"]),
        ("chunk_step", steps * 2 + [f"vae_decode:decode:1:1:{shape}"]),
        ("chunk_step", steps * 1 + [f"vae_decode:decode:1:1:{shape}"]),
        ("chunk_step", [f"vae_decode:decode:1:1:{shape}"]),
        ("vae_decode", []),  # the stream's first frame
        ("vae_decode", []),  # the rest of chunk 0
        ("kv_update", steps * 4 + [f"vae_decode:decode:0:3:{shape}"]),  # chunk 1 is next
    ]
