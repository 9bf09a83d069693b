"""The sleep/wake bench end to end on the CPU (tiny preset): every variant runs, wakes bit for
bit and moves the version; the JSON holds the rows the table shows."""

from __future__ import annotations

import json
from pathlib import Path

from infra.bench.sleep_wake import VARIANTS, main


def test_every_variant_runs_on_a_tiny_preset(tmp_path: Path) -> None:
    out = tmp_path / "sleep_wake.json"
    args = ["--device", "cpu", "--card", "wan-tiny-random", "--sync-chunks", "2"]
    rows = main([*args, "--json", str(out)])
    assert [r["variant"] for r in rows] == list(VARIANTS)
    assert all("error" not in r for r in rows), rows
    assert all(r["bit_identical"] for r in rows if r["variant"].startswith("sleep"))
    assert all(r["version_changed"] and r["tensors"] > 0 for r in rows if "mode" in r)
    [graphs] = [r for r in rows if r["variant"] == "sync_graphs"]  # no CUDA: eager, no graphs
    assert graphs["bit_identical"] and graphs["changed"] and graphs["replays_after_sync"] == 0
    assert json.loads(out.read_text())["rows"] == json.loads(json.dumps(rows))
