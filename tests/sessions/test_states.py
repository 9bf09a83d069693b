import itertools

import pytest

from sessions.states import (
    JOB_TERMINAL,
    SESSION_TERMINAL,
    JobState,
    SessionState,
    TransitionError,
    check_job_transition,
    check_session_transition,
)

S, J = SessionState, JobState


def test_session_happy_path_is_allowed() -> None:
    path = [S.CREATED, S.NEGOTIATING, S.LIVE, S.PAUSED, S.LIVE, S.CLOSING, S.CLOSED]
    for old, new in itertools.pairwise(path):
        check_session_transition("session s1", old, new)


@pytest.mark.parametrize(
    "state", [s for s in S if s not in SESSION_TERMINAL and s is not S.CLOSING]
)
def test_every_live_state_can_close_and_fail(state: SessionState) -> None:
    check_session_transition("s", state, S.CLOSING)
    check_session_transition("s", state, S.FAILED)


@pytest.mark.parametrize("state", sorted(SESSION_TERMINAL, key=lambda s: s.value))
def test_terminal_session_states_allow_nothing(state: SessionState) -> None:
    for target in S:
        with pytest.raises(TransitionError, match="terminal"):
            check_session_transition("s", state, target)


def test_illegal_session_transition_names_current_target_and_allowed() -> None:
    with pytest.raises(TransitionError) as info:
        check_session_transition("session abc", S.CREATED, S.LIVE)
    message = str(info.value)
    assert "session abc is 'created'" in message and "'live'" in message
    assert "negotiating" in message
    assert (info.value.current, info.value.target) == ("created", "live")


def test_job_transitions() -> None:
    check_job_transition("job", J.QUEUED, J.RUNNING)
    check_job_transition("job", J.RUNNING, J.SUCCEEDED)
    check_job_transition("job", J.QUEUED, J.CANCELLED)
    with pytest.raises(TransitionError):
        check_job_transition("job", J.QUEUED, J.SUCCEEDED)
    for terminal in JOB_TERMINAL:
        with pytest.raises(TransitionError):
            check_job_transition("job", terminal, J.RUNNING)
    assert {s.value for s in J} == {"queued", "running", "succeeded", "failed", "cancelled"}
    assert {s.value for s in S} == {
        "created",
        "negotiating",
        "live",
        "paused",
        "closing",
        "closed",
        "failed",
    }
