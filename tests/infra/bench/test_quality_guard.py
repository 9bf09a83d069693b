"""The tiny-world quality guard: every lever evaluated in one process against ``off``, judged by
the four thresholds and the 1-point rule; a CPU smoke run of the real evaluation."""

from __future__ import annotations

import json

import pytest
import torch

from infra.bench.quality_guard import _judge, lever_config, print_table, run_guard
from models.tinyworld.evaluation.classify import FrameClassifier
from models.tinyworld.evaluation.evaluate import THRESHOLDS


def test_levers_compose_and_unknown_or_clashing_ones_are_refused() -> None:
    assert lever_config("off") == {}
    assert lever_config("fp8attn+fp8+fold") == {
        "attention": "fp8-triton",
        "fp8": "row",
        "kv_update": "last_step",
    }
    with pytest.raises(ValueError, match="unknown lever 'int4'"):
        lever_config("int4")
    with pytest.raises(ValueError, match=r"sets \['attention'\] twice"):
        lever_config("sage+fp8attn")


def _row(passed: bool = True, **scores: float) -> dict:
    return {m: scores.get(m, 0.95) for m in THRESHOLDS} | {"passed_thresholds": passed}


def test_a_lever_passes_only_with_every_threshold_and_no_drop_above_one_point() -> None:
    rows = {
        "off": _row(),
        "small": _row(prompt_adherence=0.941),  # -0.9 points
        "drop": _row(prompt_adherence=0.935),  # -1.5 points, thresholds still pass
        "below": _row(passed=False, long_in_range=0.98),
        "better": _row(action_accuracy=0.99),
    }
    _judge(rows)
    assert {k: r.get("passes") for k, r in rows.items()} == {
        "off": True,
        "small": True,
        "drop": False,
        "below": False,
        "better": True,
    }
    assert rows["drop"]["max_drop_points"] == pytest.approx(1.5)
    assert rows["better"]["delta_points"]["action_accuracy"] == pytest.approx(4.0)


@pytest.mark.slow
def test_cpu_smoke_run_of_the_guard(tmp_path, capsys) -> None:
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        classifier = FrameClassifier(96, 96)
        classifier.calibrate(seeds=1, frames=8)  # a coarser calibration keeps the smoke short
        out = tmp_path / "guard.json"
        result = run_guard(
            device="cpu",
            levers=["fp8attn", "fp8", "fold"],
            rollouts=1,
            long_s=2.0,
            classifier=classifier,
            json_path=str(out),
        )
    finally:
        torch.set_num_threads(threads)
    rows = result["rows"]
    assert list(rows) == ["off", "fp8attn", "fp8", "fold"]
    assert not any("error" in r for r in rows.values())
    # on the CPU the FP8 attention kernel never runs: SDPA serves, and the scores equal off's
    served = rows["fp8attn"]["served_by"]
    assert served.startswith("fp8-triton: kernel 0 calls, SDPA ") and not served.endswith(" 0")
    assert all(rows["fp8attn"][m] == rows["off"][m] for m in THRESHOLDS)
    assert rows["fp8attn"]["max_drop_points"] == 0.0
    assert (
        rows["fp8"]["levers"]["fp8"] == "row" and rows["fold"]["levers"]["kv_update"] == "last_step"
    )
    for lever in ("fp8", "fold"):
        r = rows[lever]
        assert r["passes"] == (r["passed_thresholds"] and r["max_drop_points"] <= 1.0)
    assert json.loads(out.read_text())["rows"].keys() == rows.keys()
    print_table(result)
    table = capsys.readouterr().out
    assert [line.split("|")[1].strip() for line in table.splitlines() if line.startswith("| ")][
        2:
    ] == ["off", "fp8attn", "fp8", "fold"]
