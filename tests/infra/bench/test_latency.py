"""``dreamrt bench latency`` on the CPU with tiny-world through a real server and a real aiortc
viewer: every prompt and key gets the whole server breakdown in order, the changed frame reaches
the viewer, the start breakdown is there, and the server's histograms counted the same inputs."""

from __future__ import annotations

import json
from pathlib import Path

import httpx
import pytest

from infra.bench import latency
from infra.browser_harness import ServerProcess
from tests.e2e.test_sessions_e2e import parse_metrics

STAGES = ("latched", "started", "generated", "decoded", "enqueued", "sent")


@pytest.mark.slow
def test_smoke_tiny_world_on_the_cpu(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "latency.json"
    server = ServerProcess(
        tmp_path / "data", tmp_path / "server.log", extra_args=("--unwatched-timeout", "0")
    )
    server.start()
    try:
        code = latency.main(
            ["--url", server.url, "--prompts", "3", "--actions", "3", "--warmup-s", "1"]
            + ["--gap-s", "0.3", "--json", str(out)]
        )
        metrics = parse_metrics(httpx.get(f"{server.url}/metrics", timeout=10).text)
    finally:
        server.stop()
    assert code == 0
    printed = capsys.readouterr().out
    assert (
        "| server: sent |" in printed and "| viewer: first changed frame, first packet |" in printed
    )
    report = json.loads(out.read_text())
    (session,) = report["variants"]["server"]["scenarios"]["1x12"]["sessions"]
    assert session["errors"] == []
    trials = session["trials"]
    assert sorted(t["kind"] for t in trials) == ["action"] * 3 + ["prompt"] * 3
    for trial in trials:  # a changing input: every stage, in order, then the wire
        times = [trial["server"][f"{stage}_s"] for stage in STAGES]
        assert None not in times, trial
        # in order (runtime stages count from the push, 0.1 ms rounding)
        assert all(a <= b + 0.2 for a, b in zip(times, times[1:])), trial
        assert trial["received_ms"] <= trial["applied_ms"] <= trial["frame_ms"], trial
        assert trial["server"]["enqueued_s"] <= trial["wire_ms"] + 5.0, trial  # clocks agree
    start = session["start"]["server"]
    order = [start[f"{s}_s"] for s in ("offer", "answered", "connected", "sent")]
    assert order == sorted(order) and start["generated_s"] <= start["sent_s"]
    assert session["fresh_fps"] > 0  # measured and reported: the benchmark's number, not a bound
    for kind in ("prompt", "action"):
        count = f'dreamrt_input_latency_seconds_count{{kind="{kind}",stage="sent"}}'
        assert metrics[count] == 3
    assert metrics['dreamrt_first_frame_seconds_count{stage="sent"}'] == 1
