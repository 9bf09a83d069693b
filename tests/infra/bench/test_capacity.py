"""The capacity bench's pure parts: setup parsing, the viewer-side frame statistics and the
table a run prints."""

from __future__ import annotations

import pytest

from infra.bench.capacity import (
    Setup,
    frame_stats,
    parse_setup,
    refusal_reason,
    setup_rows,
    time_per_minute,
    time_rows,
    trace_line,
)


def test_setups_parse_into_a_profile_and_serve_arguments() -> None:
    assert parse_setup("full=832x480@16") == Setup("full", 832, 480, 16)
    assert parse_setup("tiny=832x480@16;--kv-cache fp8 --decoder tiny") == Setup(
        "tiny", 832, 480, 16, ("--kv-cache", "fp8", "--decoder", "tiny")
    )
    assert parse_setup("tiny=832x480@16/tiny") == Setup("tiny", 832, 480, 16, decoder="tiny")
    assert parse_setup("default=") == Setup("default")
    with pytest.raises(ValueError, match="expected NAME=WxH@FPS"):
        parse_setup("832x480")


def test_frame_stats_count_stalls_and_the_tail_interval() -> None:
    steady = [i / 16 for i in range(32)]  # 2 s at 16 fps
    stats = frame_stats(steady, 16, 2.0)
    assert stats["fps"] == 16.0 and stats["stalls_per_min"] == 0.0
    assert stats["p95_interval_ms"] == pytest.approx(62.5, abs=0.1)
    assert stats["p95_over_nominal"] == pytest.approx(1.0, abs=0.01)
    gapped = steady[:16] + [t + 0.5 for t in steady[16:]]  # one 0.5-s freeze
    stats = frame_stats(gapped, 16, 2.5)
    assert stats["stalls_per_min"] == pytest.approx(24.0)  # 1 stall in 2.5 s
    assert stats["max_interval_ms"] == pytest.approx(562.5, abs=0.1)


def test_the_table_says_why_the_next_session_was_refused_and_what_compiled_after_ready() -> None:
    refusal = {
        "code": "capacity",
        "message": "no capacity for another session: compute "
        "(ses_5145b59133b0022a: 0.732+0.719 GPU-s/s > 0.900)",
    }
    assert refusal_reason(refusal) == "capacity: compute 0.732+0.719 GPU-s/s > 0.900"
    assert refusal_reason(None) == "-"
    assert refusal_reason({"code": "rate_limited", "message": "slow down"}) == "rate_limited"
    stats = {"fps": 15.5, "stalls_per_min": 25.0, "p95_interval_ms": 69.0, "max_interval_ms": 131.8}
    result = {
        "admitted": 1,
        "sessions": [stats],
        "refusal": refusal,
        "compiles_after_ready": {"dynamo": 0.0, "outside_set": 2.0},
        "load": {
            "compute_gpu_s_per_s": 0.8234,
            "steering_gpu_s_per_s": 0.0512,
            "compute_capacity": 0.9,
        },
    }
    header, rule, row, failed = setup_rows(
        [("cached", "full", result), ("cached", "tiny", {"error": "boom"})], first="server"
    )
    assert header.startswith("| server | setup | admitted |") and rule.count("---") == 10
    cells = [c.strip() for c in row.strip("|").split("|")]
    assert cells == [
        "cached",
        "full",
        "1",
        "[15.5]",
        "25.0",
        "69.0",
        "131.8",
        "capacity: compute 0.732+0.719 GPU-s/s > 0.900",
        "0.823 (0.051)",
        "2",
    ]
    assert "error: boom" in failed


def test_the_time_table_says_where_the_executors_time_went_per_minute() -> None:
    before = {"chunk_step": (100.0, 6.0), "text_encode": (2.0, 0.1)}
    after = {"chunk_step": (340.0, 20.4), "text_encode": (8.0, 0.46), "kv_recache": (6.0, 0.7)}
    per = time_per_minute(before, after, 30.0)  # a 30-s watch: per minute is twice the delta
    assert per == {
        "chunk_step": {"calls": 480.0, "seconds": 28.8},
        "kv_recache": {"calls": 12.0, "seconds": 1.4},
        "text_encode": {"calls": 12.0, "seconds": 0.72},
    }
    assert time_per_minute(after, after, 30.0) == {}  # nothing ran: no kinds
    header, rule, row, empty = time_rows(
        [("cached", "full", {"engine_per_min": per}), ("cached", "tiny", {"error": "boom"})],
        first="server",
    )
    assert header == (
        "| server | setup | chunk_step s/min (calls) | kv_recache s/min (calls) | "
        "text_encode s/min (calls) |"
    )
    assert row == "| cached | full | 28.8 (480) | 1.4 (12) | 0.72 (12) |"
    assert empty == "| cached | tiny | - | - | - |" and rule.count("---") == 5


def test_a_trace_line_says_how_busy_the_executor_and_the_device_were() -> None:
    trace = {
        "trace": "/data/traces/trace-1.json",
        "window_s": 2.01,
        "batches": 40,
        "executor_busy_fraction": 0.82,
        "device": {
            "kernels": 9000,
            "busy_fraction": 0.61,
            "idle_s": 0.78,
            "longest_gaps_ms": [12.5, 9.1, 4.0, 1.0],
            "top_kernels": [{"name": "sm90_xmma_gemm_bf16", "calls": 900, "seconds": 0.4}],
        },
    }
    line = trace_line("small", trace)
    assert line == (
        "small: 2.01-s trace, 40 batches, executor busy 82%, device busy 61% (9000 kernels, "
        "idle 0.780 s, longest gaps [12.5, 9.1, 4.0] ms; longest kernel sm90_xmma_gemm_bf16); "
        "/data/traces/trace-1.json"
    )
    assert trace_line("cpu", {**trace, "device": None}).endswith(
        "busy 82%; /data/traces/trace-1.json"
    )
    assert trace_line("x", {"error": "409 busy"}) == "x: trace failed: 409 busy"
    assert trace_line("y", None) == "y: no trace"
