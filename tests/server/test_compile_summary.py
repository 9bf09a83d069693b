"""The warm-up's compile summary (``server.ops.warm_up.compile_summary``), logged once the warm-up
is done: graphs made, Dynamo's tracing and backend seconds, and analyses restarted by a graph break
(the cost a start from the compile cache still pays)."""

from __future__ import annotations

import msgspec
import torch

from server.ops.warm_up import compile_summary


class _Count(msgspec.Struct):
    n: int = 0


def _clean(x: torch.Tensor) -> torch.Tensor:
    return x.cos() * 3


def _broken(x: torch.Tensor, count: _Count) -> torch.Tensor:
    y = x.sin() + 1
    count.n += 1  # a store Dynamo does not trace: a graph break, and the frame traced again
    return y * 2


def test_the_summary_counts_graphs_tracing_and_the_restarts_a_graph_break_costs() -> None:
    before = compile_summary()  # (cumulative over the process: other tests may have compiled)
    # the default stance, whatever a sealed instance of another test in this process left
    with torch.compiler.set_stance("default"):
        torch.compile(_clean, backend="eager")(torch.ones(3))
        clean = compile_summary()
        count = _Count()
        out = torch.compile(_broken, backend="eager")(torch.ones(3), count)
        broken = compile_summary()
    torch._dynamo.reset()
    assert clean["graphs"] == before["graphs"] + 1
    assert clean["tracing_s"] > before["tracing_s"]
    assert clean["restarts"] == before["restarts"]  # one graph, traced once
    assert count.n == 1 and torch.equal(out, (torch.ones(3).sin() + 1) * 2)
    assert broken["restarts"] == clean["restarts"] + 1
    assert broken["graphs"] >= clean["graphs"] + 2  # the graph before the store and after it
