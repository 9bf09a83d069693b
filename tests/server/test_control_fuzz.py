"""Hypothesis fuzz of the control protocol: 10,000 generated messages through the decoder, and
2,000 through a session's control inbox, which must answer each rejected one with exactly one
``error`` event and never raise. (The live data-channel fuzz is in tests/e2e.)"""

from __future__ import annotations

from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st

from models.loops.inputs import action_vector, normalize_keys
from server.live.control import ControlError, ControlMessage, decode_control
from server.live.control_inbox import ControlInbox
from sessions.events import ErrorEvent
from sessions.session import Session, SessionConfig
from tests.server.control_fuzz import control_messages, expected_error
from tests.sessions.fakes import FakeHandle

FUZZ = settings(
    max_examples=10_000,
    deadline=None,
    database=None,
    phases=[Phase.generate],  # the property is checked on every example; no shrinking budget
    suppress_health_check=list(HealthCheck),
)


def test_ten_thousand_messages_through_the_decoder() -> None:
    seen = {"accepted": 0, "rejected": 0}

    # batches of 25 messages per example: hypothesis's per-example overhead, not the decoder,
    # is what 10,000 single examples would spend their time on
    @settings(FUZZ, max_examples=420)
    @given(st.lists(control_messages(), min_size=25, max_size=25))
    def decode(batch: list[str | bytes]) -> None:
        for raw in batch:
            try:
                msg = decode_control(raw)
            except ControlError as exc:  # the only way it may refuse: a code and a message
                assert exc.code in {"invalid_json", "invalid_message", "message_too_large"}
                assert exc.message
                seen["rejected"] += 1
            else:
                assert isinstance(msg, ControlMessage)
                seen["accepted"] += 1

    decode()
    assert sum(seen.values()) >= 10_000
    assert min(seen.values()) >= 1_000, seen  # both sides of the decoder were exercised


CAPS = frozenset({"prompt.switch", "prompt.cut", "input.action"})


def validate_action(keys: list[str], mouse: tuple[float, float]) -> list[str]:
    action_vector(keys, mouse)  # the server's check (server.app)
    return normalize_keys(keys)


def live_session() -> Session:
    config = SessionConfig(
        session_id="s",
        model_id="m",
        prompt="p",
        seed=0,
        fps=8,
        width=8,
        height=8,
        priority_class="realtime",
        capabilities=CAPS,
        action_validator=validate_action,
    )
    session = Session(config, media_capacity_frames=16)
    session.attach(FakeHandle())
    session.begin_negotiation()
    session.viewer_started()
    return session


async def test_the_inbox_answers_every_rejected_message_with_one_error_event() -> None:
    session = live_session()
    errors: list[ErrorEvent] = []
    session.events.add_sink(lambda e: errors.append(e) if isinstance(e, ErrorEvent) else None)
    replies: list[bytes] = []
    now = [0.0]
    inbox = ControlInbox(
        session, store=None, reply=replies.append, rate_per_s=1e9, burst=10**9,
        clock=lambda: now[0],
    )  # fmt: skip
    counts = {"messages": 0, "rejected": 0}

    @settings(FUZZ, max_examples=2_000)
    @given(control_messages())
    def feed(raw: str | bytes) -> None:
        before = len(errors)
        expected = expected_error(raw, capabilities=CAPS, max_prompt_chars=4000)
        inbox.handle(raw)  # never raises
        got = [e.code for e in errors[before:]]
        assert got == ([] if expected is None else [expected]), raw
        if session.state.value == "paused":
            session.resume()
        counts["messages"] += 1
        counts["rejected"] += expected is not None

    feed()
    assert counts["messages"] >= 2_000 and counts["rejected"] >= 500, counts
    assert session.state.value == "live"


async def test_a_flood_over_the_rate_costs_one_error_event_per_second() -> None:
    session = live_session()
    now = [100.0]
    inbox = ControlInbox(session, store=None, reply=lambda _: None, rate_per_s=30, burst=60,
                         clock=lambda: now[0])  # fmt: skip
    start = session.events.last_id
    for i in range(10_000):  # 10,000 pings within 2 s
        now[0] = 100.0 + i * 0.0002
        inbox.handle('{"type": "ping", "t": 1}')
    errors = [e for e in session.events.history() if e.event_id > start]
    assert all(e.code == "rate_limited" for e in errors)
    assert 1 <= len(errors) <= 3 and "dropped" in errors[-1].message
    assert inbox.bucket.refused >= 9_800
