"""Every input bounded (server.config.limits): each limit answered with the status docs/api.md
names."""

from __future__ import annotations

import numpy as np
import pytest

from server.config.limits import Limits, RateLimiter
from tests.server.conftest import make_client


def test_limits_refuse_nonsense_values() -> None:
    with pytest.raises(ValueError, match="max_queued_jobs"):
        Limits(max_queued_jobs=0)
    with pytest.raises(ValueError, match="connect_timeout_s"):
        Limits(connect_timeout_s=float("nan"))
    with pytest.raises(ValueError, match="at most"):
        Limits(max_prompt_chars=10**6)


def test_rate_limiter_is_per_key_and_bounded_in_keys() -> None:
    now = [0.0]
    rate = RateLimiter(2.0, 3, max_keys=4, clock=lambda: now[0])
    assert [rate.take("a") for _ in range(4)] == [None, None, None, 0.5]
    assert rate.take("b") is None  # another key has its own bucket
    now[0] = 0.5
    assert rate.take("a") is None  # one token back after 1 / rate
    for i in range(100):
        rate.take(f"spray-{i}")
    assert len(rate) == 4  # a client spraying keys cannot grow the table
    assert RateLimiter(0.0, 1).take("x") is None  # 0: off


def test_request_sizes_prompts_and_audio_are_bounded(tmp_path) -> None:
    limits = Limits(
        max_body_bytes=2048,
        max_sdp_bytes=1024,
        max_prompt_chars=50,
        max_audio_bytes=64 * 1024,
        max_audio_seconds=1.0,
    )
    with make_client(tmp_path, limits=limits) as client:
        sid = client.post("/v1/sessions", json={"prompt": "a red ball"}).json()["id"]
        big = client.post(f"/v1/sessions/{sid}/prompt", json={"text": "x" * 4000})
        assert big.status_code == 413 and big.json()["code"] == "too_large"

        def chunks():  # no Content-Length: counted as it arrives
            for _ in range(8):
                yield b'{"text": "' + b"y" * 500

        chunked = client.post(f"/v1/sessions/{sid}/prompt", content=chunks())
        assert chunked.status_code == 413
        long_prompt = client.post(f"/v1/sessions/{sid}/prompt", json={"text": "z" * 51})
        assert long_prompt.status_code == 422
        assert long_prompt.json()["detail"][0]["loc"] == ["body", "text"]
        assert client.post("/v1/sessions", json={"prompt": "z" * 51}).status_code == 422
        assert client.post("/v1/jobs", json={"task": "t2i", "prompt": "z" * 51}).status_code == 422
        sdp = client.post(f"/v1/sessions/{sid}/offer", json={"sdp": "v" * 1500, "type": "offer"})
        assert sdp.status_code == 413 and "SDP" in sdp.json()["detail"]
        two_s = np.zeros(32000, "<i2").tobytes()  # 2 s at 16 kHz
        audio = client.post(f"/v1/sessions/{sid}/audio", content=two_s)
        assert audio.status_code == 413 and "at most 1 s" in audio.json()["detail"]
        huge = client.post(f"/v1/sessions/{sid}/audio", content=b"\x00" * (65 * 1024))
        assert huge.status_code == 413
        ok = client.post(f"/v1/sessions/{sid}/audio", content=np.zeros(8000, "<i2").tobytes())
        assert ok.status_code == 202
        assert client.get(f"/v1/sessions/{sid}").status_code == 200  # the server is fine


def test_rest_rate_queued_jobs_and_event_streams_answer_429(tmp_path) -> None:
    limits = Limits(rest_rate_per_s=1.0, rest_burst=5, max_queued_jobs=2, max_sse_per_session=1)
    with make_client(tmp_path, limits=limits) as client:
        codes = [client.get("/v1/models").status_code for _ in range(7)]
        assert codes[:5] == [200] * 5 and codes[5:] == [429, 429]
        limited = client.get("/v1/models")
        # /v1/models answers errors in OpenAI's shape, the guard's refusal too
        assert limited.json()["error"]["code"] == "rate_limited"
        assert int(limited.headers["retry-after"]) >= 1
        assert client.get("/healthz").status_code == 200  # outside /v1: not limited

    with make_client(tmp_path / "a", limits=Limits(max_sse_per_session=1)) as client:
        sid = client.post("/v1/sessions", json={"prompt": "a red ball"}).json()["id"]
        with client.stream("GET", f"/v1/sessions/{sid}/events") as first:
            assert first.status_code == 200
            assert next(first.iter_lines()).startswith("retry:")
            second = client.get(f"/v1/sessions/{sid}/events")
            assert second.status_code == 429 and second.json()["code"] == "too_many_streams"
        # (the slot coming back when a client hangs up is checked on a real server:
        # tests/e2e/test_isolation_e2e.py)

    with make_client(tmp_path / "b", limits=Limits(max_queued_jobs=2)) as client:
        body = {"task": "t2v", "prompt": "a kite", "num_frames": 200}
        assert [client.post("/v1/jobs", json=body).status_code for _ in range(2)] == [202, 202]
        full = client.post("/v1/jobs", json=body)
        assert full.status_code == 429 and full.json()["code"] == "queue_full"
        assert 1 <= int(full.headers["retry-after"]) <= 600


def test_draining_answers_503_with_retry_after(tmp_path) -> None:
    with make_client(tmp_path) as client:
        client.app.state.draining = True
        refused = client.post("/v1/sessions", json={"prompt": "a"})
        assert refused.status_code == 503 and refused.json()["code"] == "shutting_down"
        assert int(refused.headers["retry-after"]) >= 1
        client.app.state.draining = False
        assert client.post("/v1/sessions", json={"prompt": "a"}).status_code == 201
