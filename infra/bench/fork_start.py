"""How fast a fork candidate shows its first frame, against a new session (CPU, tiny-world).

Runs a real ``dreamrt serve`` subprocess on 127.0.0.1 and real aiortc viewers. Each trial:

1. a new session is created, then offered; *session* = offer sent -> first frame received;
2. it streams a second, then ``POST /v1/sessions/{id}/fork {"n": 2}``; *fork* = the POST's
   round trip; then the first candidate is offered; *candidate* = offer sent -> its first
   frame received, and *candidate chunk* = offer sent -> its first ``media.chunk`` event (the
   chunk generated, before it is paced and sent).

Both first frames are the aiortc receiver's (one frame interval after the frame's first packet
arrived, for both alike). Prints one JSON object: every trial and the medians::

    python -m infra.bench.fork_start --trials 5 [--out fork_start.json]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from clients.python.api import DreamrtClient
from clients.python.viewer import Viewer, limit_host_candidates
from infra.browser_harness import ServerProcess


async def _offer_to_first_frame(viewer: Viewer, session_id: str) -> dict[str, float]:
    sent_s = time.monotonic()
    await viewer.connect(session_id=session_id)
    chunk_s = None
    deadline = sent_s + 60.0
    while chunk_s is None or not viewer.frames:  # 5-ms resolution for the chunk event
        if chunk_s is None and any(e["type"] == "media.chunk" for e in viewer.events):
            chunk_s = time.monotonic()
        if time.monotonic() > deadline:
            raise TimeoutError(f"session {session_id}: no first frame in 60 s")
        await asyncio.sleep(0.005)
    return {"first_frame_s": viewer.frames[0].received_s - sent_s, "chunk_s": chunk_s - sent_s}


async def trial(api: DreamrtClient, seed: int) -> dict[str, Any]:
    created = await api.create_session("a lighthouse in a storm", seed=seed)
    parent = Viewer(api)
    parent.profile = created["profile"]
    viewers = [parent]
    try:
        session = await _offer_to_first_frame(parent, created["id"])
        await asyncio.sleep(1.0)
        fork_sent_s = time.monotonic()
        answer = (
            await api.request("POST", f"/v1/sessions/{created['id']}/fork", json={"n": 2})
        ).json()
        fork_s = time.monotonic() - fork_sent_s
        first = answer["sessions"][0]
        api._session_tokens[first["id"]] = first["token"]  # noqa: SLF001 - its own token
        candidate = Viewer(api)
        candidate.profile = created["profile"]
        viewers.append(candidate)
        picked = await _offer_to_first_frame(candidate, first["id"])
    finally:
        for viewer in viewers:
            await viewer.close(delete=False)
        await api.delete_session(created["id"])
    return {
        "session_first_frame_s": round(session["first_frame_s"], 3),
        "session_chunk_s": round(session["chunk_s"], 3),
        "fork_s": round(fork_s, 3),
        "candidate_first_frame_s": round(picked["first_frame_s"], 3),
        "candidate_chunk_s": round(picked["chunk_s"], 3),
    }


async def run(url: str, trials: int) -> dict[str, Any]:
    async with DreamrtClient(url) as api:
        rows = [await trial(api, seed=10 + i) for i in range(trials)]
    medians = {key: round(statistics.median(r[key] for r in rows), 3) for key in rows[0]}
    gap = medians["candidate_first_frame_s"] - medians["session_first_frame_s"]
    return {"trials": rows, "median": medians, "candidate_minus_session_s": round(gap, 3)}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trials", type=int, default=5)
    parser.add_argument("--out", type=Path, default=None)
    parser.add_argument("--server-args", default="--max-sessions 5", help="extra serve flags")
    args = parser.parse_args(argv)
    undo = limit_host_candidates(["127.0.0.1"])
    try:
        with tempfile.TemporaryDirectory() as tmp:
            server = ServerProcess(
                Path(tmp) / "data",
                Path(tmp) / "server.log",
                extra_args=tuple(args.server_args.split()),
            ).start()
            try:
                report = asyncio.run(run(server.url, args.trials))
            finally:
                server.stop()
    finally:
        undo()
    text = json.dumps(report, indent=2)
    print(text)
    if args.out is not None:
        args.out.write_text(text + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
