"""The attention-library bench's CPU dry run: every shape, every backend a row, a backend
whose package is missing says so in its row, the kernel-alone section survives its
failures, and the JSON says what ran."""

from __future__ import annotations

import json

import pytest

from infra.bench import attention_libs


@pytest.mark.slow
def test_the_dry_run_records_every_backend_on_every_shape(tmp_path, capsys) -> None:
    path = tmp_path / "libs.json"
    assert attention_libs.main(["--device", "cpu", "--json", str(path)]) == 0
    result = json.loads(path.read_text())
    assert set(result["environment"]["packages"]) == set(attention_libs.PACKAGES)
    assert "flash_attention_impls" in result["environment"]
    activation = result["environment"]["flash_attention_activation"]
    assert set(activation) == set(result["environment"]["flash_attention_impls"])
    shapes = [(e["shape"]["queries"], e["shape"]["keys"]) for e in result["shapes"]]
    assert shapes == list(attention_libs.CPU_SHAPES)
    names = attention_libs.BACKENDS.split(",")
    for entry in result["shapes"]:
        rows = {r["backend"]: r for r in entry["rows"]}
        assert list(rows) == names
        assert rows["auto"]["vs_bf16_sdpa"]["rel_l2"] == 0.0  # SDPA against itself
        for name in ("fa3", "fa3-fp8"):
            assert rows[name]["served_by"].startswith("SDPA (fa3-fwd not importable")
            assert "ms" not in rows[name]
        assert rows["cudnn-fp8"]["served_by"].startswith("SDPA (nvidia-cudnn-frontend not")
        alone = {r["what"]: r for r in entry["alone"]}
        assert alone["quantise Q,K,V per head"]["ms"] > 0
        assert alone["quantise Q,K,V per tensor"]["ms"] > 0
        assert "fa3_fwd_interface" in alone["fa3-fp8 kernel alone"]["error"]
        assert "cudnn" in alone["cudnn-fp8 graph alone"]["error"]
    out = capsys.readouterr().out
    assert out.count("| fa3-fp8 | SDPA (fa3-fwd not importable") == 3


def test_dreamrt_bench_names_it() -> None:
    from server.cli import BENCHMARKS

    assert BENCHMARKS["attention-libs"] == "infra.bench.attention_libs"
