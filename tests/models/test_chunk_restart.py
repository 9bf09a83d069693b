"""Regenerate or finish: an input that changes the picture restarts the chunk in flight when
that shows it sooner (models/loops/chunk_rollout/restart.py), on the tiny random card."""

from __future__ import annotations

import asyncio
import copy

import msgspec
import pytest
import torch

from models.instance import load_instance
from models.loops.chunk_rollout.restart import ChunkProgress, RegenerateWhenSooner, RestartCutsOnly
from models.loops.requests import SessionRequest
from models.registry import get
from runtime.contract import ActionInput, InputEvent, InputKind, PromptInput, PromptMode
from runtime.driver import Driver, InlineContext


def _progress(done: int, **overrides) -> ChunkProgress:
    values = dict(
        steps_done=done,
        steps_total=4,
        decoded=False,
        kv_written=False,
        kv_update_units=1,
        restarts=0,
    )
    values.update(overrides)
    return ChunkProgress(**values)


def test_regenerate_when_the_work_dropped_is_less_than_the_wait_saved() -> None:
    policy = RegenerateWhenSooner()  # decode = 1 step, KV update = 1 step
    # 4 steps: saved = (4 - j) + 1 + 1 > j  <=>  j <= 2
    assert [policy.restart("switch", _progress(j)) for j in range(5)] == [
        True,
        True,
        True,
        False,
        False,
    ]
    # a folded card saves no KV update pass: j < (4 - j) + 1  <=>  j <= 2 as well, but not 3
    assert not policy.restart("cut", _progress(3, kv_update_units=0))
    # never a finished chunk, never twice at one position
    assert not policy.restart("cut", _progress(0, decoded=True))
    assert not policy.restart("cut", _progress(0, kv_written=True))
    assert not policy.restart("action", _progress(0, restarts=1))
    assert RegenerateWhenSooner(max_restarts=2).restart("action", _progress(0, restarts=1))
    with pytest.raises(ValueError, match="decode_units=-1"):
        RegenerateWhenSooner(decode_units=-1)


def test_the_first_builds_policy_restarts_for_cuts_only() -> None:
    policy = RestartCutsOnly()
    assert policy.restart("cut", _progress(3))
    assert not policy.restart("cut", _progress(1, decoded=True))
    assert not policy.restart("switch", _progress(0))
    assert not policy.restart("action", _progress(0))


@pytest.fixture(scope="module")
def instance():
    return load_instance(get("wan-tiny-random"), device="cpu")


# driver steps of the tiny card: 0 text encode, 1-4 chunk 0's steps, 5-6 its two decode parts,
# 7 its KV update, 8-11 chunk 1's steps, 12 its decode
def _run(instance, inputs_at: dict[int, list[InputEvent]], chunks: int = 2):
    loop = instance.loop("chunk_rollout")
    ctx = InlineContext("s")
    driver = Driver(loop, ctx)

    async def go() -> None:
        driver.init(
            SessionRequest(
                prompt="a red ball on grass", seed=5, max_chunks=chunks, width=32, height=32
            ),
            instance,
        )
        k = 0
        while True:
            for event in inputs_at.get(k, []):
                ctx.push_input(event)
            if not await driver.step():
                break
            k += 1

    asyncio.run(go())
    return ctx, driver.state


def _applied(ctx) -> list[dict]:
    return [
        msgspec.structs.asdict(e.spec.meta) for e in ctx.emissions if e.spec.stream == "applied"
    ]


def _chunk_frames(ctx, chunk: int) -> torch.Tensor:
    return torch.cat(
        [e.output for e in ctx.emissions if e.spec.stream == "media" and e.spec.meta.chunk == chunk]
    )


def _switch(seq: int, text: str = "a blue square on sand") -> InputEvent:
    return InputEvent(InputKind.PROMPT, seq, PromptInput(text=text))


def test_an_early_switch_restarts_the_chunk_and_equals_a_switch_at_its_boundary(instance) -> None:
    # mid chunk 1 (1 of 4 steps done): regenerate, with the re-cache of chunk 0's frames
    restarted, state = _run(instance, {9: [_switch(3)]})
    assert _applied(restarted) == [
        {"kind": "prompt", "seq": 3, "chunk": 1, "pts_90k": 101250, "changes": True}
    ]
    kinds = [p.kind.value for p in restarted.executed]
    assert kinds[8:12] == ["chunk_step", "text_encode", "kv_recache", "chunk_step"]
    assert kinds.count("chunk_step") == 9  # 4 + 1 dropped + 4
    # the plans of the restarted chunk name the input for the runtime; the earlier ones do not
    assert [p.inputs for p in restarted.executed[8:10]] == [(), (3,)]
    # during chunk 0's KV update its frames are decoded: the switch latches at the boundary
    at_boundary, _ = _run(instance, {7: [_switch(3)]})
    assert _applied(at_boundary)[0]["chunk"] == 1
    # same noise, same re-cache: the restarted chunk is the chunk a boundary switch makes
    assert torch.equal(_chunk_frames(restarted, 1), _chunk_frames(at_boundary, 1))
    assert torch.equal(_chunk_frames(restarted, 0), _chunk_frames(at_boundary, 0))
    assert state.prompt == "a blue square on sand" and state.segment == 0


def test_a_late_switch_finishes_the_chunk_in_flight(instance) -> None:
    ctx, _ = _run(instance, {4: [_switch(3)]})  # 3 of 4 steps done: finishing is sooner
    assert _applied(ctx)[0]["chunk"] == 1
    assert [p.kind.value for p in ctx.executed].count("chunk_step") == 8


def test_a_chunk_restarts_once_then_later_prompts_wait_for_the_boundary(instance) -> None:
    ctx, state = _run(instance, {2: [_switch(3, "a white ball")], 3: [_switch(4)]})
    applied = _applied(ctx)
    # the first switch restarted chunk 0; the second (latest wins) waits for chunk 1
    assert [(a["seq"], a["chunk"]) for a in applied] == [(3, 0), (4, 1)]
    assert state.prompt == "a blue square on sand"


def test_a_changed_key_restarts_and_a_repeated_one_does_not(instance) -> None:
    def press(seq: int, keys: tuple[str, ...]) -> InputEvent:
        return InputEvent(InputKind.ACTION, seq, ActionInput(keys=keys))

    def acks(ctx) -> list[tuple[int, int, bool]]:
        return [(a["seq"], a["chunk"], a["changes"]) for a in _applied(ctx)]

    def steps(ctx) -> int:
        return [p.kind.value for p in ctx.executed].count("chunk_step")

    # w pressed early in chunk 0: it restarts (one step dropped); held, the page sends it
    # again during every chunk: a repeat of the keys in flight changes nothing and waits for
    # the next chunk, in playout order
    held = {2: [press(1, ("w",))], 4: [press(2, ("w",))], 10: [press(4, ("w",))]}
    ctx, _ = _run(instance, held, chunks=3)
    assert acks(ctx) == [(1, 0, True), (2, 1, False), (4, 2, False)]
    assert steps(ctx) == 3 * 4 + 1
    # released early in chunk 1 (2 of its steps done): a change, chunk 1 restarts, and the
    # release replaces the held key's ack that chunk carried
    released = {2: [press(1, ("w",))], 4: [press(2, ("w",))], 11: [press(3, ())]}
    ctx, state = _run(instance, released)
    assert acks(ctx) == [(1, 0, True), (3, 1, True)]
    assert steps(ctx) == 2 * 4 + 1 + 2
    assert state.chunk_keys == []


def test_a_cut_after_decode_starts_the_next_chunk_as_a_new_segment(instance) -> None:
    cut = InputEvent(InputKind.PROMPT, 5, PromptInput(text="snow", mode=PromptMode.CUT))
    ctx, state = _run(instance, {6: [cut]})  # between chunk 0's decode parts: frames are out
    assert _applied(ctx)[0]["chunk"] == 1
    # the cut's chunk shows a change: like the stream's first chunk, its first latent frame
    # decodes alone (its first pictures out sooner), then the rest
    media = [e.spec.meta for e in ctx.emissions if e.spec.stream == "media"]
    assert [(m.segment, m.num_frames, m.final) for m in media] == [
        (0, 1, False),
        (0, 8, True),
        (1, 4, False),
        (1, 8, True),
    ]
    assert state.segment == 1


def test_only_a_chunk_that_shows_a_change_decodes_its_first_latent_frame_first(instance) -> None:
    def press(seq: int, keys: tuple[str, ...]) -> InputEvent:
        return InputEvent(InputKind.ACTION, seq, ActionInput(keys=keys))

    # w pressed in chunk 0 (a change: chunk 0 restarts), then sent again while held (no change)
    held = {2: [press(1, ("w",))], 4: [press(2, ("w",))]}
    ctx, _ = _run(instance, held, chunks=3)
    parts = [
        (e.spec.meta.chunk, e.spec.meta.num_frames)
        for e in ctx.emissions
        if e.spec.stream == "media"
    ]
    # chunk 0: the stream's first picture alone, then 8; chunk 1 carries only the repeat: whole
    assert parts == [(0, 1), (0, 8), (1, 12), (2, 12)]
    switch = InputEvent(InputKind.PROMPT, 3, PromptInput(text="a blue square on sand"))
    ctx, _ = _run(instance, {10: [switch]}, chunks=3)  # during chunk 1: a switch
    parts = [
        (e.spec.meta.chunk, e.spec.meta.num_frames, e.spec.meta.final)
        for e in ctx.emissions
        if e.spec.stream == "media"
    ]
    (ack,) = _applied(ctx)
    assert ack["pts_90k"] == next(
        e.spec.meta.pts_90k
        for e in ctx.emissions
        if e.spec.stream == "media" and e.spec.meta.chunk == ack["chunk"]
    )  # the ack rides on the chunk's first part
    shown = [p for p in parts if p[0] == ack["chunk"]]
    assert shown == [(ack["chunk"], 4, False), (ack["chunk"], 8, True)]


def test_a_restarted_chunks_capture_is_what_its_decoded_attempt_used(instance) -> None:
    """Behaviour capture x restart: the record of a chunk a key change restarted names that
    key's action digest (the conditioning the decoded frames saw) and the policy that restarted
    it (a replay latches inputs with the same policy)."""
    from models.loops.digests import host_digest
    from models.loops.inputs import action_vector

    press = {2: [InputEvent(InputKind.ACTION, 1, ActionInput(keys=("w",)))]}

    def capture(ctx, chunk: int) -> dict:
        (meta,) = [
            e.spec.meta
            for e in ctx.emissions
            if e.spec.stream == "media" and e.spec.meta.chunk == chunk and e.spec.meta.final
        ]
        return meta.capture

    restarted, _ = _run(instance, press)
    facts = capture(restarted, 0)
    assert facts["action_digest"] == host_digest(action_vector(("w",), (0.0, 0.0)))
    assert facts["restart_policy"] == "regenerate-when-sooner"
    assert capture(restarted, 1)["action_digest"] == ""  # nothing latched for chunk 1
    finishing = copy.copy(instance)
    finishing.chunk_restart = RestartCutsOnly()
    waited, _ = _run(finishing, press)
    assert capture(waited, 0)["action_digest"] == "" and capture(waited, 0)["restart_policy"] == (
        "cuts-only"
    )
    assert capture(waited, 1)["action_digest"] == facts["action_digest"]
