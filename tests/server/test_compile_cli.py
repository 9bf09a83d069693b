"""``dreamrt compile``: builds the compile cache of a card's compiled set without serving (its
graphs compiled by a pool of worker processes), and a second build (a new start) loads every
graph from it and compiles nothing; a region that could not be precompiled whole is a graph
break, which fails the build."""

from __future__ import annotations

import json

import pytest
import torch
from torch._dynamo.utils import counters

from models.compile_guard import CompileGuard
from models.precompiled import Region, aot_supported
from server.cli import main
from server.ops.warm_start import WarmStart

pytestmark = pytest.mark.skipif(not aot_supported(), reason="this torch has no aot_compile")


def _table(out: str) -> dict[str, list[str]]:
    rows = [line.split("|")[1:-1] for line in out.splitlines() if line.startswith("| ")]
    return {cells[0].strip(): [c.strip() for c in cells[1:]] for cells in rows[1:]}


@pytest.mark.slow
def test_compile_builds_the_cache_and_a_second_build_loads_all_of_it(
    tmp_path, monkeypatch, capsys
) -> None:
    # Inductor's own caches in a directory of this test (the process's environment is shared)
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path / "inductor"))
    args = ["compile", "--device", "cpu", "--data-dir", str(tmp_path / "data"), "--log-level"]
    # a build with a compile pool: worker processes compile every graph, and this
    # process traces none (a call that did not reach the pool would be traced here)
    traced = counters["stats"]["unique_graphs"]
    assert main([*args, "warning", "--compile-workers", "2"]) == 0
    first = capsys.readouterr().out
    assert counters["stats"]["unique_graphs"] == traced
    assert main([*args, "warning"]) == 0
    second = capsys.readouterr().out

    built, again = _table(first), _table(second)
    assert "dit.blocks" in built
    graphs, compiled, _, loaded, _ = built["dit.blocks"]
    assert int(graphs) >= 1 and compiled == graphs and loaded == "0"
    graphs2, compiled2, _, loaded2, _ = again["dit.blocks"]
    assert graphs2 == graphs and compiled2 == "0" and loaded2 == graphs
    (directory,) = (tmp_path / "data" / "compile-cache").iterdir()
    assert json.loads((directory / "key.json").read_text())["model"] == "tiny-world"
    assert (directory / "cost.json").exists()  # the calibration is kept with the graphs
    assert len(list((directory / "regions" / "dit.blocks").glob("*.aot"))) == int(graphs)


def test_bad_settings_exit_2(tmp_path, capsys) -> None:
    assert main(["compile", "--data-dir", str(tmp_path), "--max-sessions", "-1"]) == 2
    assert "dreamrt:" in capsys.readouterr().err


class _Breaking(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        print("a side effect Dynamo does not trace")  # noqa: T201 - a graph break on purpose
        return x * 2


def test_a_region_that_falls_back_is_a_graph_break_the_build_reports() -> None:
    module = _Breaking()
    region = Region("breaking", _Breaking.forward, [module], CompileGuard())
    with torch.compiler.set_stance("default"):
        module(torch.ones(2))
    torch._dynamo.reset()
    done = WarmStart(None, {}, {"restarts": 0.0}, {"breaking": region.report()})
    (reason,) = done.graph_breaks()
    assert reason.startswith("breaking: ")
    assert WarmStart(None, {}, {"restarts": 2.0}, {}).graph_breaks() == [
        "2 restarted Dynamo analyses"
    ]
