"""Session churn against a running server: N sessions created, offered, then ended every way a
client ends one, and afterwards nothing of them may be left.

Each session is created and offered by a real aiortc peer on loopback, then ends one of four
ways, in turn:

- ``cancelled``: the client DELETEs it right after the answer (mid-negotiation);
- ``abandoned``: the client closes its peer after the answer and never comes back (the
  server's connect timeout closes its side, the unwatched timeout closes the session);
- ``watched``: it plays until the first frame, then the client DELETEs it;
- ``vanished``: it plays until the first frame, then the client disappears without a word
  (peer closed, no DELETE: the unwatched timeout reclaims it).

Before (after a warm-up of four sessions, so lazily created pools and caches are counted in
the baseline) and after (once ``/metrics`` says idle), it reads the server process's RSS, open
file descriptors and threads from ``/proc``, and the server's tasks, slabs and peers from
``/metrics``. The server must run with short timeouts so abandoned sessions are reclaimed
(``--unwatched-timeout 2 --connect-timeout 2``).

    python -m infra.load.churn http://127.0.0.1:8000 --pid PID --sessions 200

prints the table (``infra/bench/RESULTS.md``); ``tests/e2e/test_churn_e2e.py`` runs a smaller
count through ``run_churn``.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import sys
import time
from dataclasses import dataclass, field
from typing import Any

import httpx

__all__ = ["ChurnResult", "ProcessSample", "main", "run_churn", "sample_process"]

WAYS = ("cancelled", "abandoned", "watched", "vanished")
SETTLE_S = 6.0  # before each sample: the server trims its heap within ~5 s of sessions ending


@dataclass(frozen=True)
class ProcessSample:
    rss_bytes: int
    fds: int
    threads: int
    server_tasks: int
    slabs_free: int
    slabs_capacity: int
    peers: int
    # the process's own memory (malloc, torch): RSS less file-backed pages (libraries, mmapped
    # weights), which the kernel drops and reads back with other processes' memory pressure
    rss_anon_bytes: int = 0


async def sample_process(base_url: str, pid: int) -> ProcessSample:
    status = open(f"/proc/{pid}/status").read()
    rss_kb = int(next(line for line in status.splitlines() if line.startswith("VmRSS")).split()[1])
    anon = [line for line in status.splitlines() if line.startswith("RssAnon")]
    metrics = await _metrics(base_url)
    return ProcessSample(
        rss_bytes=rss_kb * 1024,
        rss_anon_bytes=int(anon[0].split()[1]) * 1024 if anon else rss_kb * 1024,
        fds=len(os.listdir(f"/proc/{pid}/fd")),
        threads=len(os.listdir(f"/proc/{pid}/task")),
        server_tasks=int(metrics["dreamrt_server_tasks"]),
        slabs_free=int(metrics["dreamrt_kv_slabs_free"]),
        slabs_capacity=int(metrics["dreamrt_kv_slabs_capacity"]),
        peers=int(metrics.get("dreamrt_webrtc_peers", 0)),
    )


async def _metrics(base_url: str) -> dict[str, float]:
    out = {}
    async with httpx.AsyncClient(timeout=10) as http:
        text = (await http.get(f"{base_url}/metrics")).text
    for line in text.splitlines():
        if line and not line.startswith("#"):
            name, value = line.rsplit(" ", 1)
            out[name] = float(value)
    return out


def _idle(m: dict[str, float]) -> bool:
    live = sum(v for k, v in m.items() if k.startswith("dreamrt_sessions{"))
    return (
        live == 0
        and m["dreamrt_engine_running_loops"] == 0
        and m["dreamrt_server_tasks"] == 0
        and m["dreamrt_kv_slabs_free"] == m["dreamrt_kv_slabs_capacity"]
        and m.get("dreamrt_webrtc_peers", 0) == 0
    )


async def wait_idle(base_url: str, timeout_s: float) -> float:
    """Seconds until the server is idle; TimeoutError naming what is left."""
    start = time.monotonic()
    while not _idle(m := await _metrics(base_url)):
        if time.monotonic() - start > timeout_s:
            left = {k: v for k, v in m.items() if "sessions{" in k or "slabs" in k or "tasks" in k}
            raise TimeoutError(f"not idle after {timeout_s} s: {left}")
        await asyncio.sleep(0.2)
    return time.monotonic() - start


@dataclass
class ChurnResult:
    sessions: int = 0
    ways: dict[str, int] = field(default_factory=dict)
    refused: int = 0  # 503 answers (all slabs in use): retried
    first_frames: int = 0
    before: ProcessSample | None = None
    after: ProcessSample | None = None
    wall_s: float = 0.0
    idle_after_s: float = 0.0

    def ratios(self) -> dict[str, float]:
        b, a = self.before, self.after
        assert b is not None and a is not None
        return {
            "rss": a.rss_bytes / b.rss_bytes,
            "fds": a.fds / b.fds,
            "threads": a.threads / b.threads,
        }

    def table(self) -> str:
        b, a = self.before, self.after
        assert b is not None and a is not None
        rows = [
            f"sessions {self.sessions} ({', '.join(f'{k} {v}' for k, v in self.ways.items())}), "
            f"{self.refused} refused and retried, {self.first_frames} first frames, "
            f"{self.wall_s:.1f} s, idle {self.idle_after_s:.1f} s after the last",
            "              before      after   after/before",
            f"RSS MiB     {b.rss_bytes / 2**20:8.1f}   {a.rss_bytes / 2**20:8.1f}   "
            f"{a.rss_bytes / b.rss_bytes:6.3f}",
            f"fds         {b.fds:8d}   {a.fds:8d}   {a.fds / b.fds:6.3f}",
            f"threads     {b.threads:8d}   {a.threads:8d}   {a.threads / b.threads:6.3f}",
            f"tasks       {b.server_tasks:8d}   {a.server_tasks:8d}",
            f"slabs free  {b.slabs_free:5d}/{b.slabs_capacity}   "
            f"{a.slabs_free:5d}/{a.slabs_capacity}",
            f"peers       {b.peers:8d}   {a.peers:8d}",
        ]
        return "\n".join(rows)


async def _one(base_url: str, way: str, result: ChurnResult, token: str | None) -> None:
    from aiortc import RTCConfiguration, RTCPeerConnection, RTCSessionDescription

    headers = {"Authorization": f"Bearer {token}"} if token else {}
    async with httpx.AsyncClient(base_url=base_url, timeout=30, headers=headers) as http:
        while True:
            created = await http.post("/v1/sessions", json={"prompt": f"churn {way}"})
            if created.status_code != 503:
                break
            result.refused += 1  # every slab in use: a reclaim is on its way
            await asyncio.sleep(float(created.headers.get("retry-after", "1")) / 4)
        created.raise_for_status()
        sid = created.json()["id"]
        own = {"Authorization": f"Bearer {created.json()['token']}"}
        pc = RTCPeerConnection(RTCConfiguration(iceServers=[]))
        first_frame = asyncio.Event()

        @pc.on("track")
        def on_track(track: Any) -> None:
            async def pull() -> None:
                with contextlib.suppress(Exception):
                    await track.recv()
                    first_frame.set()

            asyncio.get_running_loop().create_task(pull())

        try:
            pc.addTransceiver("video", direction="recvonly")
            pc.createDataChannel("control")
            await pc.setLocalDescription(await pc.createOffer())
            answer = await http.post(
                f"/v1/sessions/{sid}/offer",
                json={"sdp": pc.localDescription.sdp, "type": "offer"},
                headers=own,
            )
            answer.raise_for_status()
            if way in ("watched", "vanished"):
                await pc.setRemoteDescription(RTCSessionDescription(**answer.json()))
                await asyncio.wait_for(first_frame.wait(), 30)
                result.first_frames += 1
        finally:
            await pc.close()
        if way in ("cancelled", "watched"):
            (await http.delete(f"/v1/sessions/{sid}", headers=own)).raise_for_status()
    result.ways[way] = result.ways.get(way, 0) + 1
    result.sessions += 1


async def run_churn(
    base_url: str,
    pid: int,
    *,
    sessions: int,
    concurrency: int = 4,
    token: str | None = None,
    idle_timeout_s: float = 60.0,
) -> ChurnResult:
    """Runs the churn (module docstring) and returns the before/after samples."""
    result = ChurnResult()

    # warm-up, not counted: every way, twice the concurrency at once, so the pools that grow on
    # demand up to a fixed size (the default executor's threads, codec contexts) have their
    # working size in the baseline
    await asyncio.gather(
        *(_one(base_url, WAYS[w % len(WAYS)], ChurnResult(), token) for w in range(2 * concurrency))
    )
    await wait_idle(base_url, idle_timeout_s)
    await asyncio.sleep(SETTLE_S)
    result.before = await sample_process(base_url, pid)
    start = time.monotonic()
    queue: asyncio.Queue[str] = asyncio.Queue()
    for i in range(sessions):
        queue.put_nowait(WAYS[i % len(WAYS)])

    async def worker() -> None:
        while not queue.empty():
            await _one(base_url, queue.get_nowait(), result, token)

    await asyncio.gather(*(worker() for _ in range(concurrency)))
    result.wall_s = time.monotonic() - start
    result.idle_after_s = await wait_idle(base_url, idle_timeout_s)
    await asyncio.sleep(SETTLE_S)
    result.after = await sample_process(base_url, pid)
    return result


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m infra.load.churn", description=__doc__)
    parser.add_argument("url")
    parser.add_argument("--pid", type=int, required=True, help="the server process (for /proc)")
    parser.add_argument("--sessions", type=int, default=200)
    parser.add_argument("--concurrency", type=int, default=4)
    parser.add_argument("--token", default=None)
    args = parser.parse_args(argv)
    import aioice.ice

    aioice.ice.get_host_addresses = lambda use_ipv4, use_ipv6: ["127.0.0.1"]
    result = asyncio.run(
        run_churn(
            args.url,
            args.pid,
            sessions=args.sessions,
            concurrency=args.concurrency,
            token=args.token,
        )
    )
    print(result.table())
    ratios, after = result.ratios(), result.after
    assert after is not None  # ratios() needs it too
    ok = all(r <= 1.10 for r in ratios.values()) and after.slabs_free == after.slabs_capacity
    print("within 10 %:", ok)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
