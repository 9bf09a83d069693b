"""A weight sync under a watched session, end to end: a real ``dreamrt serve`` subprocess
(tiny-world, its trained weights), a real aiortc viewer, the trainer's POST /v1/weights, the
real SQLite file.

A reference session (same seed and prompt, no sync) runs first; the synced session's chunk
digests must equal the reference's before the chunk ``weights.updated`` names and differ from
it on, its records must name the old version before and the new one from there, and a
truncated file in between must change nothing.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest
from safetensors.torch import save_file

from clients.python.api import ApiCallError, DreamrtClient
from clients.python.viewer import Viewer
from infra.browser_harness import ServerProcess

pytestmark = pytest.mark.slow

PROMPT, SEED, CHUNKS = "a red ball on grass", 7, 4


def _policy_files(root: Path) -> tuple[Path, Path]:
    """The trainer's next policy (tiny-world's weights, scaled) and a truncated copy."""
    from models.instance import load_instance
    from models.registry import get

    dit = load_instance(get("tiny-world"), device="cpu").dit
    good = root / "policy.safetensors"
    save_file({k: (v * 1.1).contiguous() for k, v in dit.state_dict().items()}, str(good))
    bad = root / "truncated.safetensors"
    bad.write_bytes(good.read_bytes()[: good.stat().st_size // 3])
    return good, bad


def _digests(viewer: Viewer) -> dict[int, str]:
    return {e["chunk"]: e["digest"] for e in viewer.events if e["type"] == "media.chunk"}


async def _session(url: str, sync: tuple[Path, Path] | None) -> dict[str, Any]:
    async with DreamrtClient(url) as api:
        viewer = Viewer(api)
        out: dict[str, Any] = {}
        try:
            await viewer.connect(PROMPT, seed=SEED)
            out["session"] = viewer.session_id
            start_chunk = 1
            if sync is not None:
                good, bad = sync
                await viewer.wait_event(lambda e: e["type"] == "media.chunk" and e["chunk"] >= 1)
                with pytest.raises(ApiCallError) as refused:
                    await api.request("POST", "/v1/weights", json={"path": str(bad)})
                out["refused"] = refused.value
                answer = await api.request("POST", "/v1/weights", json={"path": str(good)})
                out["sync"] = answer.json()
                updated = await viewer.wait_event(lambda e: e["type"] == "weights.updated")
                out["updated"], start_chunk = updated, updated["chunk"]
            last = start_chunk + CHUNKS - 1
            await viewer.wait_event(
                lambda e: e["type"] == "media.chunk" and e["chunk"] >= last, timeout_s=60
            )
            out["digests"] = _digests(viewer)
        finally:
            await viewer.close()
    return out


def test_a_sync_under_a_watched_session_changes_it_from_the_next_chunk(tmp_path: Path) -> None:
    from sessions.store import Store

    files = _policy_files(tmp_path)
    server = ServerProcess(tmp_path / "data", tmp_path / "server.log").start()
    try:
        reference = asyncio.run(_session(server.url, None))
        synced = asyncio.run(_session(server.url, files))
    finally:
        server.stop(timeout_s=20.0)
    log = server.log_path.read_text(errors="replace")
    assert "dreamrt stopped" in log and "Traceback" not in log, log[-4000:]
    assert synced["refused"].status == 422
    sync, k = synced["sync"], synced["updated"]["chunk"]
    assert synced["updated"]["weights_version"] == sync["weights_version"] != sync["previous"]
    want, got = reference["digests"], synced["digests"]
    assert k >= 1 and all(got[c] == want[c] for c in range(k)), (k, got, want)
    compared = [c for c in range(k, k + CHUNKS) if c in want]
    assert compared and all(got[c] != want[c] for c in compared), (k, got, want)
    store = Store(tmp_path / "data" / "dreamrt.sqlite3")
    try:
        rows = store.records(synced["session"])
    finally:
        store.close()
    versions = {r["chunk"]: r["weights_version"] for r in rows}
    assert {versions[c] for c in range(k)} == {sync["previous"]}
    assert {v for c, v in versions.items() if c >= k} == {sync["weights_version"]}
