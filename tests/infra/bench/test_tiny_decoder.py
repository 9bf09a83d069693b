"""CPU smoke of ``dreamrt bench tiny-decoder``: both decoders stream a chunk at tiny presets
through the DecodeOp path, the table and the JSON report them."""

from __future__ import annotations

import json

from infra.bench.tiny_decoder import main
from server.cli import BENCHMARKS


def test_cpu_smoke_prints_one_table_and_writes_json(tmp_path, capsys) -> None:
    out = tmp_path / "tiny_decoder.json"
    argv = ["--device", "cpu", "--tiny", "--iters", "1", "--warmup", "1"]
    assert main([*argv, "--variants", "wan_eager,taehv_eager", "--json", str(out)]) == 0
    report = json.loads(out.read_text())
    assert (report["device"], report["size"], report["tiny"]) == ("cpu", [64, 64], True)
    results = report["results"]
    assert list(results) == ["wan_eager", "taehv_eager"]
    for r in results.values():
        assert r["frames_per_chunk"] == 12 and r["median_ms"] > 0
        assert r["frames_per_s"] == 12 / (r["median_ms"] / 1e3)
    # the tiny decoder does a fraction of the full VAE's work at the same geometry
    assert results["taehv_eager"]["gflop_per_chunk"] < results["wan_eager"]["gflop_per_chunk"]
    table = capsys.readouterr().out.splitlines()
    assert table[-3].startswith("| --- |")
    assert table[-2].startswith("| wan_eager |") and table[-1].startswith("| taehv_eager |")
    assert main(["--device", "cpu", "--variants", "taehv_fast"]) == 2
    assert BENCHMARKS["tiny-decoder"] == "infra.bench.tiny_decoder"
