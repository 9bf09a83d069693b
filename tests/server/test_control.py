import json

import pytest

from server.live.control import (
    MAX_MESSAGE_BYTES,
    ActionMessage,
    ControlError,
    FeedbackMessage,
    PauseMessage,
    PingMessage,
    PromptMessage,
    ResumeMessage,
    TokenBucket,
    decode_control,
)


@pytest.mark.parametrize(
    ("wire", "expected"),
    [
        ({"type": "prompt", "text": "a cave"}, PromptMessage(text="a cave", mode="switch")),
        ({"type": "prompt", "text": "x", "mode": "cut"}, PromptMessage(text="x", mode="cut")),
        (
            {"type": "action", "keys": ["w", "a"], "mouse": [3, -2]},
            ActionMessage(keys=["w", "a"], mouse=(3.0, -2.0)),
        ),
        ({"type": "action", "keys": []}, ActionMessage(keys=[], mouse=None)),
        ({"type": "feedback", "rating": -1, "chunk": 4}, FeedbackMessage(rating=-1, chunk=4)),
        ({"type": "pause"}, PauseMessage()),
        ({"type": "resume"}, ResumeMessage()),
        ({"type": "ping", "t": 12.5}, PingMessage(t=12.5)),
    ],
)
def test_every_api_message_decodes(wire, expected) -> None:
    assert decode_control(json.dumps(wire)) == expected


@pytest.mark.parametrize(
    ("wire", "code", "names"),
    [
        ('{"type": "prompt", "text": 5}', "invalid_message", "$.text"),
        ('{"type": "prompt", "text": ""}', "invalid_message", "$.text"),
        ('{"type": "prompt", "text": "a", "mode": "jump"}', "invalid_message", "$.mode"),
        ('{"type": "action", "keys": ["w"], "mouse": [1]}', "invalid_message", "$.mouse"),
        ('{"type": "feedback", "rating": 3}', "invalid_message", "$.rating"),
        ('{"type": "teleport"}', "invalid_message", "$.type"),
        ('{"type": "pause", "now": true}', "invalid_message", "now"),
        ('{"text": "a"}', "invalid_message", "type"),
        ("not json", "invalid_json", "JSON"),
    ],
)
def test_invalid_messages_name_the_problem(wire, code, names) -> None:
    with pytest.raises(ControlError) as info:
        decode_control(wire)
    assert info.value.code == code and names in info.value.message


def test_oversized_messages_are_refused_before_decoding() -> None:
    big = json.dumps({"type": "prompt", "text": "a" * MAX_MESSAGE_BYTES})
    with pytest.raises(ControlError) as info:
        decode_control(big)
    assert info.value.code == "message_too_large" and str(MAX_MESSAGE_BYTES) in info.value.message


def test_token_bucket_allows_a_burst_then_the_sustained_rate() -> None:
    now = [0.0]
    bucket = TokenBucket(rate_per_s=10, burst=3, clock=lambda: now[0])
    assert [bucket.take() for _ in range(4)] == [True, True, True, False]
    now[0] = 0.1
    assert [bucket.take(), bucket.take()] == [True, False]
    now[0] = 10.0
    assert sum(bucket.take() for _ in range(10)) == 3  # capped at the burst
    assert bucket.refused == 9
    with pytest.raises(ValueError, match="burst"):
        TokenBucket(rate_per_s=1, burst=0)
