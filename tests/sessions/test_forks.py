"""A fork candidate's session goes on with its parent's inputs (``ForkRegistry._candidate``,
then ``_inherit`` at the parent's chunk boundary):
the forked loop state holds the parent's unapplied inputs, so the candidate's ledger must know
them (prompt memory, actions, sequence numbers) and time them from the parent's receipt, while
its parts (chunk records, acknowledgements) all read the candidate's own prompt memory."""

from __future__ import annotations

import time
from types import SimpleNamespace

from runtime.admission import AdmissionConfig, AdmissionController
from runtime.contract import PTS_HZ, pts_of_frame
from runtime.cost import CostModel, DeviceConstants
from runtime.engine import Engine
from sessions.events import ActionApplied, MediaChunk, PromptApplied
from sessions.forks import ForkRegistry
from sessions.host import SessionHost
from sessions.served_models import ServedModels
from sessions.store import Store
from tests.sessions.conftest import TINY_MODEL
from tests.sessions.fakes import FakeHandle
from tests.sessions.test_session import ALL_CAPS, applied, make_session, media
from tests.sessions.test_weight_sync import until_chunk


async def test_a_candidate_acknowledges_its_parents_pending_inputs(tmp_path) -> None:
    clock = time.monotonic  # the candidate's clock (the server's): both time the inputs
    store = Store(tmp_path / "db.sqlite3")
    parent = make_session(ALL_CAPS, clock=clock)
    parent.attach(FakeHandle("parent"))
    parent.on_emission(media(0))
    pushed_s = clock()
    prompt, _ = parent.push_prompt("a city at night")
    host = SimpleNamespace(store=store, recording=None)
    candidate = ForkRegistry(host)._candidate(parent, "ses_candidate", seed=11)  # the request
    # an input the parent takes between the fork request and its chunk boundary is in the
    # forked loop state: the candidate's ledger, copied at the boundary, must know it too
    action = parent.push_action(["w"])
    ForkRegistry._inherit(candidate, parent)  # the boundary
    candidate.attach(FakeHandle("candidate"))
    assert candidate.config.seed == 11 and candidate.prompts.active_text == "a forest"
    # the forked loop acknowledges both at the candidate's first chunk
    pts = media(1).spec.meta.pts_90k
    candidate.on_emission(media(1))
    candidate.on_emission(applied("prompt", prompt, 1, pts))
    candidate.on_emission(applied("action", action, 1, pts))
    await candidate.settle()
    since_push_s = clock() - pushed_s  # no latency from the parent's receipt can exceed it
    history = candidate.events.history()
    (switched,) = [e for e in history if isinstance(e, PromptApplied)]
    (acted,) = [e for e in history if isinstance(e, ActionApplied)]
    assert switched.text == "a city at night"
    assert 0 <= switched.latency.enqueued_s <= since_push_s
    assert acted.seq == action and 0 <= acted.latency.enqueued_s <= since_push_s
    assert candidate.prompts.active_text == "a city at night"
    assert candidate.push_action([]) == action + 1  # numbering goes on from the parent's
    # the parent's own memory is its own: its prompt is still waiting there
    assert parent.prompts.active_text == "a forest"
    assert [e.seq for e in parent.prompts.pending()] == [prompt]
    await candidate.close()
    await parent.close()
    store.close()
    rows = Store(tmp_path / "db.sqlite3").records("ses_candidate")
    (row,) = rows
    assert (row["chunk"], row["prompt"], row["prompt_seq"]) == (1, "a city at night", prompt)
    assert row["actions"]["action"]["seq"] == action


async def test_a_candidates_first_pull_anchors_its_playout_where_the_parent_stopped(
    instance, tmp_path
) -> None:
    """Real engine and tiny model: the candidate's first chunk is due the moment its viewer
    starts (anchored at PTS 0 it would wait seconds for its PTS under the lead window)."""
    admission = AdmissionController(AdmissionConfig(peak_capacity_bytes=1 << 40))
    engine = Engine(cost=CostModel(DeviceConstants.cpu()), admission=admission)
    await engine.start()
    store = Store(tmp_path / "db.sqlite3")
    models = ServedModels({TINY_MODEL: instance}, default=TINY_MODEL)
    host = SessionHost(engine=engine, models=models, store=store, slabs_per_geometry=2)
    try:
        parent = host.create_session(prompt="a red ball", seed=3, priority_class="realtime")
        parent.begin_negotiation()
        parent.viewer_started()
        await until_chunk(parent, 1)
        # one candidate: the shared instance keeps the two slabs the other host tests expect
        fork = await ForkRegistry(host).fork(parent, 1)
        last = max(e.pts_start + pts_of_frame(e.frames - 1, e.fps) for e in chunks(parent))
        candidate = next(iter(fork.candidates.values()))
        candidate.begin_negotiation()
        before_s = time.monotonic()
        candidate.viewer_started()
        after_s = time.monotonic()
        await until_chunk(candidate, fork.at_chunk)
        first = min(chunks(candidate), key=lambda e: e.chunk)
    finally:
        await host.close()
        await engine.close()
        store.close()
    assert first.pts_start == last + pts_of_frame(1, first.fps)  # the parent's next frame
    assert before_s <= candidate.playout.anchor_s + first.pts_start / PTS_HZ <= after_s


def chunks(session) -> list[MediaChunk]:
    return [e for e in session.events.history() if isinstance(e, MediaChunk)]
