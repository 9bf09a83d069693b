import numpy as np
import pytest

from runtime.contract import (
    ActionInput,
    AppliedMeta,
    Emission,
    EmitSpec,
    InputKind,
    MediaMeta,
    PromptInput,
    PromptMode,
    Stream,
    pts_of_frame,
)
from sessions.audio import AudioClip
from sessions.records import frames_digest
from sessions.session import (
    InvalidInputError,
    PromptTooLongError,
    Session,
    SessionClosedError,
    SessionConfig,
    SessionStateError,
    UnsupportedInputError,
)
from sessions.store import Store
from tests.sessions.fakes import FakeHandle

ALL_CAPS = frozenset(
    {"prompt.switch", "prompt.cut", "input.action", "input.audio", "session.realtime"}
)


class FakeClock:
    def __init__(self, t: float = 100.0) -> None:
        self.t = t

    def __call__(self) -> float:
        return self.t


def make_session(
    capabilities=ALL_CAPS, store=None, clock=None, recording=None, **overrides
) -> Session:
    fields = {
        "session_id": "s1",
        "model_id": "tiny",
        "prompt": "a forest",
        "seed": 7,
        "fps": 8,
        "width": 8,
        "height": 8,
        "priority_class": "realtime",
        "capabilities": capabilities,
        "record_template": {
            "weights_version": "w0",
            "loop_id": "chunk_rollout",
            "sampler": "euler",
            "steps": 4,
            "timesteps": [1000, 750, 500, 250],
            "precision": "fp32",
        },
    }
    fields.update(overrides)
    return Session(
        SessionConfig(**fields),
        media_capacity_frames=64,
        store=store,
        clock=clock or FakeClock(),
        wall_clock=FakeClock(1000.0),
        recording=recording,
    )


def media(chunk: int, n: int = 4, value: int = 0, fps: int = 8, segment: int = 0) -> Emission:
    frames = np.full((n, 8, 8, 3), value, dtype=np.uint8)
    meta = MediaMeta(
        chunk=chunk,
        segment=segment,
        frame_start=chunk * n,
        pts_90k=pts_of_frame(chunk * n, fps),
        num_frames=n,
        fps=fps,
    )
    return Emission(EmitSpec(Stream.MEDIA, meta), frames)


def applied(kind: str, seq: int, chunk: int, pts: int) -> Emission:
    meta = AppliedMeta(kind=InputKind(kind), seq=seq, chunk=chunk, pts_90k=pts)
    return Emission(EmitSpec(Stream.APPLIED, meta), None)


def event_types(session: Session) -> list[str]:
    return [type(e).__struct_config__.tag for e in session.events.history()]


def states(session: Session) -> list[str]:
    return [
        e.state
        for e in session.events.history()
        if type(e).__struct_config__.tag == "session.state"
    ]


async def test_viewer_lifecycle_pauses_resumes_and_anchors_deadlines() -> None:
    clock = FakeClock(100.0)
    session = make_session(clock=clock)
    handle = FakeHandle()
    session.attach(handle)
    session.begin_negotiation()
    session.viewer_started()
    assert handle.calls == [("t0", 100.0), ("resume",)]
    session.on_emission(media(0))
    clock.t = 103.0
    frame = session.media.pop()
    session.frame_shown(frame, shown_s=103.0)  # shown 3 s after the first pull: re-anchor
    assert handle.calls[-1] == ("t0", 103.0)
    session.frame_shown(session.media.pop(), shown_s=103.125)  # on time: no re-anchor
    assert handle.calls[-1] == ("t0", 103.0)
    session.pause()
    session.pause()  # idempotent
    clock.t = 110.0
    session.resume()
    # next frame (pts 2/8 s) anchors at now - 0.25
    assert handle.calls[-3:] == [("pause",), ("t0", 109.75), ("resume",)]
    session.viewer_left()
    with pytest.raises(SessionStateError, match="no viewer"):
        session.resume()
    session.begin_negotiation()
    session.negotiation_failed("bad sdp")
    await session.close()
    assert states(session) == [
        "created",
        "negotiating",
        "live",
        "paused",
        "live",
        "paused",
        "negotiating",
        "paused",
        "closing",
        "closed",
    ]
    assert ("cancel", "deleted") in handle.calls


async def test_prompt_switch_two_phase_ack_flushes_stale_backlog() -> None:
    session = make_session()
    handle = FakeHandle()
    session.attach(handle)
    session.on_emission(media(0, value=1))
    session.on_emission(media(1, value=2))
    seq, applies_at = session.push_prompt("a desert", "switch")
    assert (seq, applies_at) == (1, 3)
    assert handle.inputs[-1].kind is InputKind.PROMPT
    assert handle.inputs[-1].payload == PromptInput(text="a desert", mode=PromptMode.SWITCH)
    assert session.prompts.active_text == "a forest"
    session.media.pop()  # one frame already on the wire
    session.on_emission(applied("prompt", seq, chunk=2, pts=90000))
    assert len(session.media) == 0  # 7 stale frames of chunks 0-1 flushed
    info = session.snapshot()
    assert (info["media_flushed"], info["media_dropped"]) == (7, 0)  # generated, never shown
    session.on_emission(media(2, value=3))
    # the frames play at once; the events wait for the chunks' digests (hashed off the loop)
    assert [session.media.pop().chunk for _ in range(4)] == [2, 2, 2, 2]
    await session.settle()
    assert session.prompts.active_text == "a desert"
    tags = event_types(session)
    # input.received at once; what the loop emitted follows in emission order
    assert tags == [
        "session.state",
        "input.received",
        "media.chunk",
        "media.chunk",
        "prompt.applied",
        "media.chunk",
    ]
    assert [e.chunk for e in session.events.history() if hasattr(e, "digest")] == [0, 1, 2]
    received, applied_event = (session.events.history()[i] for i in (1, 4))
    assert (received.seq, received.kind) == (1, "prompt")
    assert (applied_event.seq, applied_event.chunk, applied_event.pts, applied_event.mode) == (
        1,
        2,
        90000,
        "switch",
    )
    await session.close()


async def test_cut_starts_a_new_segment_and_predicts_the_in_flight_chunk() -> None:
    session = make_session()
    session.attach(FakeHandle())
    session.on_emission(media(0))
    seq, applies_at = session.push_prompt("a city", "cut")
    assert applies_at == 1
    # the loop counts the cut: the chunk's media (before its acks) is of segment 1
    session.on_emission(media(1, segment=1))
    session.on_emission(applied("prompt", seq, chunk=1, pts=45000))
    await session.settle()
    event = session.events.history()[-1]
    assert (event.mode, event.segment, session.chunks.segment) == ("cut", 1, 1)
    assert session.snapshot()["segment"] == 1 and session.snapshot()["prompt"] == "a city"
    await session.close()


async def test_actions_latest_wins_supersedes_older_pending_ones() -> None:
    session = make_session()
    handle = FakeHandle()
    session.attach(handle)
    first = session.push_action(["w"], (1.0, 0.0))
    second = session.push_action(["w", "a"])
    assert [e.payload for e in handle.inputs] == [
        ActionInput(keys=("w",), mouse=(1.0, 0.0)),
        ActionInput(keys=("w", "a"), mouse=(0.0, 0.0)),
    ]
    session.on_emission(applied("action", second, chunk=1, pts=45000))
    history = session.events.history()
    assert [(type(e).__struct_config__.tag, e.seq) for e in history[1:]] == [
        ("input.received", first),
        ("input.received", second),
        ("input.superseded", first),
        ("action.applied", second),
    ]
    assert history[3].by_seq == second
    await session.close()


async def test_inputs_need_the_capability_and_an_open_session() -> None:
    session = make_session(capabilities=frozenset({"prompt.switch"}))
    session.attach(FakeHandle())
    with pytest.raises(UnsupportedInputError, match="input.audio"):
        session.push_audio(AudioClip(np.zeros(1600, np.float32), 16000, 1))
    with pytest.raises(UnsupportedInputError, match="input.action"):
        session.push_action(["w"])
    with pytest.raises(UnsupportedInputError, match="prompt.cut"):
        session.push_prompt("x", "cut")
    await session.close()
    with pytest.raises(SessionClosedError, match="closed"):
        session.push_prompt("x")


async def test_a_prompt_over_the_limit_is_refused_before_it_is_numbered() -> None:
    session = make_session(capabilities=frozenset({"prompt.switch"}), max_prompt_chars=5)
    handle = FakeHandle()
    session.attach(handle)
    # the length is checked first: a too-long prompt says so whatever else is wrong with it
    with pytest.raises(PromptTooLongError, match="prompt is 6 characters; the limit is 5"):
        session.push_prompt("abcdef", "cut")
    assert handle.inputs == [] and event_types(session) == ["session.state"]
    assert session.push_prompt("abcde") == (1, 1)
    assert handle.inputs[-1].payload == PromptInput(text="abcde", mode=PromptMode.SWITCH)
    await session.close()


async def test_audio_reaches_the_loop_as_16k_samples() -> None:
    session = make_session()
    handle = FakeHandle()
    session.attach(handle)
    seq = session.push_audio(AudioClip(np.zeros(4000, np.float32), 16000, 1))
    payload = handle.inputs[-1].payload
    assert handle.inputs[-1].kind is InputKind.AUDIO and handle.inputs[-1].seq == seq
    assert isinstance(handle.inputs[-1].payload.samples, np.ndarray)  # passed as is, not listed
    assert payload.samples.shape == (4000,) and not payload.samples.any()
    assert session.snapshot()["audio_seconds_in"] == 0.25
    session.on_emission(applied("audio", seq, chunk=3, pts=135000))
    assert event_types(session)[-1] == "audio.applied"
    await session.close()


async def test_loop_failure_fails_the_session_with_an_error_event() -> None:
    session = make_session()
    handle = FakeHandle()
    finished = []
    session.attach(handle, on_finished=finished.append)
    handle.fail("nan", "NaN in chunk_step")
    await session.wait_finished()
    assert session.state.value == "failed" and session.error == "nan: NaN in chunk_step"
    assert event_types(session)[-2:] == ["error", "session.state"]
    assert finished == [session]
    await session.close()  # idempotent on a failed session


async def test_loop_completion_closes_and_bad_emissions_become_error_events() -> None:
    session = make_session()
    handle = FakeHandle()
    session.attach(handle)
    session.on_emission(
        Emission(
            EmitSpec(
                Stream.MEDIA,
                MediaMeta(chunk=0, segment=0, frame_start=0, pts_90k=0, num_frames=1, fps=8),
            ),
            np.zeros((1, 4, 4, 3), np.float32),
        )
    )
    assert event_types(session)[-1] == "error"
    assert "uint8" in session.events.history()[-1].message
    session.on_emission(applied("prompt", 99, chunk=1, pts=1))  # never received
    assert session.events.history()[-1].code == "emission"
    handle.finish()
    await session.wait_finished()
    assert states(session)[-2:] == ["closing", "closed"]
    assert session.events.closed and session.media.closed


async def test_media_digest_records_and_persisted_events(tmp_path) -> None:
    store = Store(tmp_path / "db.sqlite3")
    store.add_session(
        session_id="s1",
        model_id="tiny",
        prompt="a forest",
        seed=7,
        fps=8,
        width=8,
        height=8,
        priority_class="realtime",
        state="created",
    )
    session = make_session(store=store)
    session.attach(FakeHandle())
    emission = media(0, value=9)
    session.on_emission(emission)
    await session.settle()
    assert session.events.history()[-1].digest == frames_digest(emission.output)
    session.push_action(["d"])
    await session.close()
    await store.run(lambda: None)
    (record,) = store.records("s1")
    assert (
        record["chunk"],
        record["num_frames"],
        record["pts_end"],
        record["prompt"],
        record["seed"],
    ) == (0, 4, 3 * 90000 // 8, "a forest", 7)
    assert record["timesteps"] == [1000, 750, 500, 250] and record["digest"] == frames_digest(
        emission.output
    )
    persisted = [e["type"] for e in store.events("s1")]
    assert persisted == ["session.state", "input.received", "session.state", "session.state"]
    assert store.get_session("s1")["state"] == "closed"
    store.close()


async def test_fps_measured_counts_fresh_frames_and_stalls_count_repeats() -> None:
    clock = FakeClock(0.0)
    session = make_session(clock=clock)
    session.attach(FakeHandle())
    session.on_emission(media(0, n=8))
    for i in range(8):
        clock.t = i / 8
        session.frame_shown(session.media.pop(), clock.t)
    session.frame_shown(None, 1.0)
    clock.t = 1.0
    assert session.stalls == 1 and session.frames_sent == 9
    assert session.fps_measured() == pytest.approx(7 / 1.0)
    await session.close()


async def test_actions_are_checked_by_the_models_validator_before_reaching_the_loop() -> None:
    def validator(keys, mouse):
        if "x" in keys:
            raise ValueError("unknown action key 'x'")
        return [k.lower() for k in keys]

    session = make_session(action_validator=validator)
    handle = FakeHandle()
    session.attach(handle)
    with pytest.raises(InvalidInputError, match="unknown action key 'x'"):
        session.push_action(["W", "x"])
    assert handle.inputs == [] and event_types(session) == ["session.state"]
    session.push_action(["W"])
    assert handle.inputs[-1].payload == ActionInput(keys=("w",), mouse=(0.0, 0.0))
    await session.close()


async def test_unwatched_time_counts_only_without_viewer_or_offer() -> None:
    clock = FakeClock(100.0)
    session = make_session(clock=clock)
    session.attach(FakeHandle())
    clock.t = 130.0
    assert session.unwatched_for_s() == 30.0
    session.begin_negotiation()
    clock.t = 200.0
    assert session.unwatched_for_s() == 0.0
    session.viewer_started()
    session.viewer_left()
    clock.t = 205.0
    assert session.unwatched_for_s() == 5.0
    await session.close()


async def test_a_chunk_in_parts_is_queued_at_once_and_recorded_whole(tmp_path) -> None:
    store = Store(tmp_path / "db.sqlite3")
    store.add_session(
        session_id="s1",
        model_id="tiny",
        prompt="a forest",
        seed=7,
        fps=8,
        width=8,
        height=8,
        priority_class="realtime",
        state="created",
    )
    session = make_session(store=store)
    session.attach(FakeHandle())
    first = np.full((1, 8, 8, 3), 5, dtype=np.uint8)
    rest = np.full((3, 8, 8, 3), 6, dtype=np.uint8)
    meta = {"chunk": 0, "segment": 0, "fps": 8}
    session.on_emission(
        Emission(
            EmitSpec(
                Stream.MEDIA, MediaMeta(**meta, frame_start=0, pts_90k=0, num_frames=1, final=False)
            ),
            first,
        )
    )
    # the first frame is playable before the rest of its chunk exists
    assert session.media.pop().pts_90k == 0 and session.chunks_generated == 0
    assert "media.chunk" not in event_types(session)
    session.on_emission(
        Emission(
            EmitSpec(
                Stream.MEDIA,
                MediaMeta(**meta, frame_start=1, pts_90k=11250, num_frames=3, final=True),
            ),
            rest,
        )
    )
    whole = np.concatenate((first, rest))
    await session.settle()
    chunk_events = [e for e in session.events.history() if e.__struct_config__.tag == "media.chunk"]
    assert [(e.chunk, e.pts_start, e.frames, e.digest) for e in chunk_events] == [
        (0, 0, 4, frames_digest(whole))
    ]
    assert session.chunks_generated == 1 and session.last_chunk == 0
    await session.close()
    await store.run(lambda: None)
    (record,) = store.records("s1")
    assert (record["num_frames"], record["pts_start"], record["pts_end"], record["digest"]) == (
        4,
        0,
        3 * 11250,
        frames_digest(whole),
    )
    store.close()


async def test_a_chunks_record_holds_the_inputs_it_first_reflects(tmp_path) -> None:
    store = Store(tmp_path / "db.sqlite3")
    config = make_session().config
    columns = ("session_id", "model_id", "prompt", "seed", "fps", "width", "height")
    store.add_session(
        **{c: getattr(config, c) for c in columns}, priority_class="realtime", state="created"
    )
    session = make_session(store=store)
    session.attach(FakeHandle())
    session.on_emission(media(0))
    prompt, _ = session.push_prompt("a desert")
    action = session.push_action(["w"], (2.0, 0.0))
    session.on_emission(media(1))  # a chunk's media comes before the acks of what it reflects
    session.on_emission(applied("prompt", prompt, chunk=1, pts=45000))
    session.on_emission(applied("action", action, chunk=1, pts=45000))
    await session.close()
    await store.run(lambda: None)
    records = store.records("s1")
    assert [(r["chunk"], r["prompt"], r["prompt_seq"]) for r in records] == [
        (0, "a forest", 0),
        (1, "a desert", prompt),
    ]
    assert records[1]["actions"] == {
        "action": {"seq": action, "keys": ["w"], "mouse": [2.0, 0.0]},
        "audio_seqs": [],
    }
    store.close()
