"""Fork and choose end to end: a real ``dreamrt serve`` (tiny-world, deterministic mode, five
chunk-KV slabs) and real aiortc viewers.

A parent and a same-seed baseline stream side by side. The parent forks into three candidates
with seeds [parent's, parent's, other]: every candidate continues the parent's exact state, so
the two with the parent's seed generate exactly the baseline's next chunk (the shared prefix is
bit-identical, by frame digests) and the third differs. Choosing the third makes its state the
parent's continuation: the parent's viewer receives chunks that continue the candidate's
(numbers and PTS), regenerated bit-identically by ``replay`` from the candidate's snapshots,
and the store holds one preference pair per rejected candidate.
"""

from __future__ import annotations

import asyncio
import itertools
import time
from collections.abc import AsyncIterator, Iterator
from typing import Any

import httpx
import pytest

from clients.python.api import ApiCallError, DreamrtClient
from clients.python.viewer import Viewer
from infra.browser_harness import ServerProcess
from tests.e2e.test_sessions_e2e import next_fresh_frames

pytestmark = pytest.mark.slow

SEED = 5


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    root = tmp_path_factory.mktemp("fork")
    srv = ServerProcess(
        root / "data",
        root / "server.log",
        extra_args=("--deterministic", "--max-sessions", "5", "--snapshot-every", "2"),
    ).start()
    yield srv
    srv.stop(timeout_s=20.0)
    log = srv.log_path.read_text(errors="replace")
    assert "dreamrt stopped" in log and "Traceback" not in log, log[-6000:]


@pytest.fixture
async def api(server: ServerProcess) -> AsyncIterator[DreamrtClient]:
    async with DreamrtClient(server.url) as client:
        yield client


def digests(viewer: Viewer) -> dict[int, str]:
    return {e["chunk"]: e["digest"] for e in viewer.events if e["type"] == "media.chunk"}


async def wait_chunk(viewer: Viewer, chunk: int, timeout_s: float = 60.0) -> dict[str, Any]:
    return await viewer.wait_event(
        lambda e: e["type"] == "media.chunk" and e["chunk"] >= chunk, timeout_s
    )


async def slabs_free(url: str) -> float:
    async with httpx.AsyncClient() as http:
        text = (await http.get(f"{url}/metrics")).text
    return next(
        float(line.rsplit(" ", 1)[1])
        for line in text.splitlines()
        if line.startswith("dreamrt_kv_slabs_free ")
    )


async def test_fork_candidates_share_the_prefix_and_choose_continues_the_parent(
    api: DreamrtClient, server: ServerProcess
) -> None:
    from server.data.replay import replay_chunk
    from sessions.store import Store

    parent, baseline = Viewer(api), Viewer(api)
    viewers: list[Viewer] = [parent, baseline]
    try:
        await asyncio.gather(
            parent.connect("a red ball on grass", seed=SEED),
            baseline.connect("a red ball on grass", seed=SEED),
        )
        await asyncio.gather(wait_chunk(parent, 1), wait_chunk(baseline, 1))
        pid = parent.session_id
        free = await slabs_free(server.url)
        with pytest.raises(ApiCallError) as refused:  # 3 slabs free: 4 do not fit, none made
            await api.request("POST", f"/v1/sessions/{pid}/fork", json={"n": 4})
        assert refused.value.status == 503 and refused.value.retry_after_s >= 1
        assert await slabs_free(server.url) == free == 3
        other = SEED + 1000
        answer = (
            await api.request(
                "POST", f"/v1/sessions/{pid}/fork", json={"n": 3, "seeds": [SEED, SEED, other]}
            )
        ).json()
        ids, first = answer["candidates"], answer["at_chunk"]
        assert len(ids) == 3 and [s["seed"] for s in answer["sessions"]] == [SEED, SEED, other]
        assert answer["context"] == f"{pid}@{first - 1}"
        assert await slabs_free(server.url) == 0
        status = await api.session(pid)
        assert status["state"] == "paused"
        with pytest.raises(ApiCallError) as held:
            await api.request("POST", f"/v1/sessions/{pid}/resume")
        assert held.value.status == 409
        candidates = [Viewer(api) for _ in ids]
        viewers += candidates
        for viewer, sid in zip(candidates, ids, strict=True):
            viewer.api._session_tokens[sid] = next(  # noqa: SLF001 - its own token
                s["token"] for s in answer["sessions"] if s["id"] == sid
            )
        await asyncio.gather(*(v.connect(session_id=sid) for v, sid in zip(candidates, ids)))
        await asyncio.gather(*(wait_chunk(v, first + 1) for v in candidates))
        await wait_chunk(baseline, first + 1)
        c = [digests(v) for v in candidates]
        assert min(c[0]) == first and min(c[2]) == first  # they start after the fork point
        base = digests(baseline)
        assert c[0][first] == c[1][first] == base[first], "the prefix state is shared exactly"
        assert c[2][first] != c[0][first], "a candidate with its own seed differs"
        assert (await api.session(pid))["chunks"] == len(digests(parent))  # the parent waited
        last_parent = max(digests(parent))
        parent_pts = max(e["pts_start"] for e in parent.events if e["type"] == "media.chunk")
        mark = len(parent.events)
        chose = (
            await api.request("POST", f"/v1/sessions/{pid}/choose", json={"candidate": ids[2]})
        ).json()
        assert chose == {"chosen": ids[2], "preferences": 2}
        # from the choice on, the parent's viewer goes on receiving fresh frames in PTS order
        # (a stuck parent would time out here)
        resumed = await next_fresh_frames(parent, 2 * parent.profile["fps"])
        assert all(b.pts > a.pts for a, b in itertools.pairwise(resumed))
        taken = max(digests(candidates[2]))
        after = await wait_chunk(parent, taken + 2)
        continued = [e for e in parent.events[mark:] if e["type"] == "media.chunk"]
        assert continued[0]["chunk"] > max(last_parent, taken - 1)
        assert continued[0]["pts_start"] > parent_pts and after["chunk"] >= taken + 2
        for sid in ids:
            row = await api.session(sid)
            assert row["state"] in ("closing", "closed"), row
        assert (await api.session(pid))["state"] == "live"
        check = continued[0]["chunk"]
        deadline = time.monotonic() + 10
        data = server.data_dir
        while True:  # records are written a chunk later, through the store's writer
            store = Store(data / "dreamrt.sqlite3")
            try:
                rows = {r["chunk"]: r for r in store.records(pid)}
                prefs = store.preferences()
            finally:
                store.close()
            if check in rows or time.monotonic() > deadline:
                break
            await asyncio.sleep(0.2)
        assert rows[check]["loop_ref"] == ids[2] and rows[check]["seed"] == other
        assert rows[check]["digest"] == continued[0]["digest"]
        assert sorted((p["chosen_ref"], p["rejected_ref"]) for p in prefs) == sorted(
            [(ids[2], ids[0]), (ids[2], ids[1])]
        )
        assert {p["context_ref"] for p in prefs} == {answer["context"]}
        replayed = await asyncio.to_thread(replay_chunk, data, pid, check)
        assert replayed.matches and replayed.replay_key.startswith(ids[2])
    finally:
        await asyncio.gather(*(v.close() for v in viewers), return_exceptions=True)
    deadline = time.monotonic() + 10
    while await slabs_free(server.url) != 5:  # every slab back: the replaced loop's too
        assert time.monotonic() < deadline, "a fork left a chunk-KV slab taken"
        await asyncio.sleep(0.1)
