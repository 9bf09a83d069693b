"""``dreamrt eval tiny-world`` in short, through the real loop with the shipped weights: every
threshold of the evaluation is asserted (the full evaluation: infra/bench/RESULTS.md, tiny-world).
Also: inputs latch where the protocol says."""

from __future__ import annotations

import dataclasses

import pytest

from models.instance import load_instance
from models.registry import get
from models.tinyworld.evaluation.evaluate import EvalReport, evaluate
from models.tinyworld.evaluation.stream import LoopStream
from runtime.contract import PromptInput


@pytest.fixture(scope="module")
def short_report() -> EvalReport:
    instance = load_instance(get("tiny-world"), device="cpu")
    # the collapse check runs its full 60 s: a shorter window weighs its one audio pulse (the
    # model's sprite grows a little past the world's largest) out of proportion
    return evaluate(instance, rollouts=10, chunks=18, long_s=60.0)


def test_inputs_pushed_between_chunks_apply_to_the_next_one_and_are_acknowledged() -> None:
    card = get("tiny-world")
    dit = dataclasses.replace(card.components["dit"], preset="tinyworld-test")
    card = dataclasses.replace(
        card,
        components={**card.components, "dit": dit},
        weights="random",
        description="random weights (tests)",
    )
    stream = LoopStream(load_instance(card, device="cpu"), "a red ball on grass", seed=0)
    first = stream.next_chunk()
    assert first.shape == (4, 96, 96, 3)
    keys = stream.push_keys(["d"])
    prompt = stream.push(PromptInput(text="a blue square on snow"))
    stream.next_chunk()
    stream.next_chunk()
    assert stream.applied == {keys: 1, prompt: 1}
    kinds = [kind for kind, _ in stream.plan_wall_s]
    # the first chunk decodes in two parts (its first frame alone), LoopStream joins them
    assert kinds[:8] == [
        "text_encode",
        "chunk_step",
        "chunk_step",
        "chunk_step",
        "chunk_step",
        "vae_decode",
        "vae_decode",
        "kv_update",
    ]
    assert "kv_recache" in kinds  # the switch re-cached the window under the new prompt


@pytest.mark.slow
def test_prompt_adherence_and_switches_meet_their_thresholds(short_report) -> None:
    r = short_report
    assert (r.action_trials, r.switches, r.long_frames) == (20, 10, 720)
    assert r.adherence_frames > 600
    assert r.verdicts["prompt_adherence"], r.as_dict()
    assert r.verdicts["switch_success"], r.as_dict()
    assert r.audio_pulse_ratio > 1.5  # loud audio visibly grows the sprite


@pytest.mark.slow
def test_keys_move_the_sprite(short_report) -> None:
    assert short_report.verdicts["action_accuracy"], short_report.as_dict()
    assert short_report.mean_move_px > 10.0  # the world moves it ~25 px over a trial


@pytest.mark.slow
def test_no_collapse(short_report) -> None:
    assert short_report.verdicts["long_in_range"], short_report.as_dict()
