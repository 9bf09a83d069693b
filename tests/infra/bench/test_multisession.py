"""``dreamrt bench multisession`` end to end on the CPU with the tiny card: the table and the
JSON have the rows the run asked for, the sessions delivered frames, and the cost snapshot
holds measured plan costs of the profile."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from infra.bench import multisession


@pytest.mark.slow
def test_smoke_n1_n2_two_policies(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out_json, snapshot = tmp_path / "multisession.json", tmp_path / "cost_snapshot.json"
    code = multisession.main(
        [
            "--device",
            "cpu",
            "--model",
            "wan-tiny-random",
            "--seconds",
            "2",
            "--scenarios",
            "n1,n2",
            "--schedulers",
            "step-edf,fifo",
            "--json",
            str(out_json),
            "--cost-snapshot",
            str(snapshot),
        ]
    )
    assert code == 0
    table = capsys.readouterr().out.split("| scenario | scheduler | session |", 1)[1]
    table, _, gates = table.partition("| interleave gate")
    rows = [line.split("|")[1:4] for line in table.splitlines()[2:] if line.startswith("| n")]
    expected = [
        ("n1", "step-edf", "s0"),
        ("n1", "fifo", "s0"),
        ("n2", "step-edf", "s0"),
        ("n2", "step-edf", "s1"),
        ("n2", "fifo", "s0"),
        ("n2", "fifo", "s1"),
    ]
    assert [tuple(cell.strip() for cell in row) for row in rows] == expected

    data = json.loads(out_json.read_text())
    assert [(r["scenario"], r["scheduler"], sorted(r["sessions"])) for r in data["runs"]] == [
        ("n1", "step-edf", ["s0"]),
        ("n1", "fifo", ["s0"]),
        ("n2", "step-edf", ["s0", "s1"]),
        ("n2", "fifo", ["s0", "s1"]),
    ]
    for run in data["runs"]:
        assert run["failures"] == {}
        for session in run["sessions"].values():
            assert session["fps"] > 0 and session["fresh_frames"] > 0
            assert session["first_frame_s"] > 0  # measured; its size is the report's
        assert {"chunk_step", "vae_decode", "text_encode"} <= set(run["costs_ms"])

    # the interleave gate: s0 beside another session (and under another policy) equals s0
    # alone, bit for bit, until its first input applies
    gate = {(r["scenario"], r["scheduler"]): r["gate"] for r in data["runs"]}
    assert gate[("n1", "step-edf")]["role"] == "reference"
    for key in [("n1", "fifo"), ("n2", "step-edf"), ("n2", "fifo")]:
        assert gate[key]["reference"] == "n1/step-edf"
        assert gate[key]["chunks"] >= 1 and gate[key]["identical"] is True, (key, gate[key])
    assert gates.count("| True |") == 3

    costs = json.loads(snapshot.read_text())
    shapes = costs["profiles"]["64x64@8"]["shapes"]
    assert shapes["chunk_step"]["c3x8x8"]["median_s"] > 0
    assert costs["cost_model"]["device"]["name"] == "cpu" and costs["cost_model"]["entries"]
