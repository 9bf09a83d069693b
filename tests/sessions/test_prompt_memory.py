import pytest

from runtime.contract import PromptMode
from sessions.prompt_memory import PromptMemory, UnknownPromptError, text_hash


def test_initial_prompt_is_active_from_chunk_zero() -> None:
    memory = PromptMemory("a castle", received_s=10.0)
    assert memory.active_text == "a castle"
    assert (memory.active.seq, memory.active.chunk, memory.active.segment) == (0, 0, 0)
    assert memory.embedding_ref == text_hash("a castle")
    assert memory.pending() == []


def test_switch_then_cut_updates_active_prompt_and_history() -> None:
    memory = PromptMemory("a", received_s=0.0)
    memory.receive(1, "b", PromptMode.SWITCH, received_s=1.0)
    assert [e.seq for e in memory.pending()] == [1]
    assert memory.active_text == "a"  # not before it is applied
    entry, superseded = memory.apply(1, chunk=3, pts_90k=135000, segment=0, applied_s=1.5)
    assert (entry.chunk, entry.pts_90k, entry.segment, superseded) == (3, 135000, 0, [])
    memory.receive(2, "c", PromptMode.CUT, received_s=2.0)
    # the loop counts the segments: the cut's chunk is the first of segment 1
    entry, _ = memory.apply(2, chunk=5, pts_90k=225000, segment=1, applied_s=2.2)
    assert (memory.active_text, memory.active.segment, entry.mode) == ("c", 1, PromptMode.CUT)
    assert memory.embedding_ref == text_hash("c")
    history = [(e.seq, e.text, e.mode, e.received_s, e.applied_s) for e in memory.history()]
    assert history == [
        (0, "a", "initial", 0.0, 0.0),
        (1, "b", "switch", 1.0, 1.5),
        (2, "c", "cut", 2.0, 2.2),
    ]


def test_latest_wins_supersedes_older_pending_prompts() -> None:
    memory = PromptMemory("a", received_s=0.0)
    memory.receive(1, "b", PromptMode.SWITCH, received_s=1.0)
    memory.receive(2, "c", PromptMode.SWITCH, received_s=1.1)
    _, superseded = memory.apply(2, chunk=1, pts_90k=1, segment=0, applied_s=2.0)
    assert [e.seq for e in superseded] == [1]
    assert superseded[0].superseded_by == 2 and not superseded[0].pending
    with pytest.raises(ValueError, match="not pending"):
        memory.apply(1, chunk=2, pts_90k=2, segment=0, applied_s=3.0)
    assert memory.active_text == "c"


def test_unknown_and_duplicate_sequence_numbers_are_errors() -> None:
    memory = PromptMemory("a", received_s=0.0)
    with pytest.raises(UnknownPromptError, match="never received"):
        memory.apply(7, chunk=1, pts_90k=0, segment=0, applied_s=0.0)
    memory.receive(1, "b", PromptMode.SWITCH, received_s=0.0)
    with pytest.raises(ValueError, match="already received"):
        memory.receive(1, "b", PromptMode.SWITCH, received_s=0.0)
