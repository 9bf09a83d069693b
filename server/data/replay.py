"""``dreamrt replay``: regenerate one recorded chunk and check it against its record.

    dreamrt replay --data-dir DIR --session ID --chunk K [--segment S] [--out FILE.mp4]

The record of chunk K names its replay key: a snapshot of the engine loop that made it,
taken at a boundary before the chunk (``sessions.snapshot_keeper``). The loop is restored from
that snapshot on the record's model, at the record's precision and with its restart policy
(``--steering``: when a changing input restarts the chunk in flight), and driven alone on this
thread; at every boundary it is handed exactly the inputs the input log says it was handed
there in the live run (same step), until chunk K's frames are out. Their digest is compared
with the record's: equal means bit-identical frames.

A second composition root beside ``server.app`` (it loads a model and drives a loop), so it
touches ``models/`` and ``runtime/`` by design. Bit identity holds on the device type,
precision and build that generated the chunk (``--device`` should name the same kind).

Exit codes: 0 the digests match, 1 they differ, 2 bad usage, 3 the chunk cannot be replayed
here (no record, no replay key, snapshot gone by retention, other weights).
"""

from __future__ import annotations

import argparse
import asyncio
import copy
import sys
from collections import defaultdict
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    import torch

    from models.instance import WanInstance
    from runtime.contract import InputEvent
    from sessions.store_rows import InputRow, RecordRow

__all__ = ["ReplayError", "ReplayResult", "add_parser", "load_model", "main", "replay_chunk"]


class ReplayError(RuntimeError):
    """The chunk cannot be replayed here (the message says why)."""


@dataclass(frozen=True, slots=True)
class ReplayResult:
    session_id: str
    chunk: int
    segment: int
    recorded: str
    replayed: str
    replay_key: str
    plans_run: int
    frames: np.ndarray  # uint8 [n, H, W, 3]
    # torch [1, C, f, h, w]: the chunk's final latents (what was decoded)
    latents: torch.Tensor | None = None
    step_batch: int = 1  # the largest batch its steps ran in live (> 1: equal within tolerance)

    @property
    def matches(self) -> bool:
        return self.recorded == self.replayed


def replay_chunk(
    data_dir: Path,
    session_id: str,
    chunk: int,
    *,
    segment: int | None = None,
    device: str = "cpu",
    instance: WanInstance | None = None,
) -> ReplayResult:
    """Regenerate ``chunk`` of ``session_id`` (see the module docstring). ``instance``: an
    already loaded model to use (it must be the record's, with the same weights)."""
    from sessions.recording import snapshot_path
    from sessions.store import Store

    store = Store(data_dir / "dreamrt.sqlite3")
    try:
        try:
            record = store.record(session_id, chunk, segment)
        except KeyError as exc:
            raise ReplayError(str(exc.args[0])) from None
        key = record.get("replay_key") or ""
        if "@" not in key:
            raise ReplayError(
                f"chunk {chunk} of {session_id!r} has no replay key "
                "(the server ran with --snapshot-every 0?)"
            )
        loop_id, step = key.rpartition("@")[0], int(key.rpartition("@")[2])
        path = snapshot_path(data_dir, key)
        if not path.is_file():
            raise ReplayError(
                f"snapshot {key} of chunk {chunk} is gone ({path}): older than the newest "
                "--snapshot-keep of its loop, or its write failed"
            )
        inputs = store.inputs(loop_id, from_step=step)
    finally:
        store.close()
    if instance is None:
        instance = load_model(record, device)
    instance = _serving_as_recorded(instance, record)
    digest = instance.weights_digest
    if digest and record["weights_version"] and digest != record["weights_version"]:
        raise ReplayError(
            f"the loaded weights are {digest}, chunk {chunk} was made with "
            f"{record['weights_version']}"
        )
    frames, latents, plans = asyncio.run(_drive(instance, path.read_bytes(), inputs, record))
    from sessions.records import frames_digest

    return ReplayResult(
        session_id=session_id,
        chunk=chunk,
        segment=record["segment"],
        recorded=record["digest"],
        replayed=frames_digest(frames),
        replay_key=key,
        plans_run=plans,
        frames=frames,
        latents=latents,
        step_batch=int(record.get("step_batch") or 1),
    )


def load_model(record: Mapping[str, object], device: str = "cpu") -> WanInstance:
    """The model a record was generated with, at its precision, on ``device`` (``record``: a
    ``records`` row, decoded (``Store.records``) or as stored (the export's)."""
    from models import registry
    from models.instance import load_instance

    card = registry.get(str(record["model_id"]))
    return load_instance(card, device=device, precision=str(record["precision"]))


def _serving_as_recorded(instance: WanInstance, record: RecordRow) -> WanInstance:
    """``instance`` latching inputs as the live run did: with the restart policy the chunk's
    record names (``dreamrt serve --steering``; older records name none: the instance's)."""
    name = record.get("restart_policy")
    if not name:
        return instance
    from models.loops.chunk_rollout.restart import restart_policy

    try:
        policy = restart_policy(name)
    except ValueError as exc:
        raise ReplayError(f"chunk {record['chunk']}: {exc}") from None
    served = copy.copy(instance)  # the caller's instance keeps its own policy
    served.chunk_restart = policy
    return served


async def _drive(
    instance: WanInstance, blob: bytes, rows: list[InputRow], record: RecordRow
) -> tuple[np.ndarray, torch.Tensor | None, int]:
    from runtime.contract import Stream
    from runtime.driver import Driver, InlineContext
    from runtime.snapshot import resolve_state_type
    from sessions.input_log import decode_input

    by_step: dict[int, list[InputEvent]] = defaultdict(list)
    for row in rows:
        by_step[row["step"]].append(decode_input(row))
    loop = instance.loop(record["loop_id"])
    ctx = InlineContext(f"replay-{record['session_id']}", deterministic=False)
    state_type = resolve_state_type(loop, blob)
    driver = Driver.from_snapshot(loop, ctx, blob, state_type, device=instance.device)
    parts: list[np.ndarray] = []
    latents: list[torch.Tensor] = []
    target = (record["segment"], record["chunk"])
    while True:
        for event in by_step.pop(driver.state.step, []):
            ctx.push_input(event)
        seen = len(ctx.emissions)
        if not await driver.step():
            raise ReplayError(f"the loop ended before chunk {record['chunk']}")
        for emission in ctx.emissions[seen:]:
            meta = emission.spec.meta
            if emission.spec.stream != Stream.MEDIA or (meta.segment, meta.chunk) != target:
                continue
            parts.append(np.asarray(emission.output))
            decoded = getattr(ctx.executed[-1].args, "latents", None)  # the plan that emitted
            if decoded is not None:
                latents.append(decoded.detach().cpu().clone())
            if meta.final:
                import torch

                stacked = torch.cat(latents, dim=2) if latents else None
                return np.concatenate(parts), stacked, driver.steps_run
        ctx.emissions.clear()


def add_parser(sub: argparse._SubParsersAction, parents: list[argparse.ArgumentParser]) -> None:
    replay = sub.add_parser(
        "replay", help="regenerate a recorded chunk and check its digest", parents=parents
    )
    replay.add_argument("--data-dir", required=True, type=Path)
    replay.add_argument("--session", required=True)
    replay.add_argument("--chunk", required=True, type=int)
    replay.add_argument("--segment", type=int, default=None)
    replay.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    replay.add_argument("--out", type=Path, default=None, metavar="FILE.mp4")


def main(args: argparse.Namespace) -> int:
    try:
        result = replay_chunk(
            args.data_dir, args.session, args.chunk, segment=args.segment, device=args.device
        )
    except ReplayError as exc:
        sys.stderr.write(f"dreamrt replay: {exc}\n")
        return 3
    if args.out is not None:
        from sessions.artifacts import write_mp4

        fps = _fps(args.data_dir, args.session)
        write_mp4(result.frames, args.out, fps=fps)
    verdict = "match: bit-identical" if result.matches else "MISMATCH"
    if not result.matches and result.step_batch > 1:
        verdict += (
            f" (expected: its steps ran batched with {result.step_batch - 1} other session(s), "
            "which agrees with a solo run within the batched tolerance, not bit for bit; "
            "serve with --no-batch-sessions or --deterministic for bit-exact replays)"
        )
    sys.stdout.write(
        f"session {result.session_id} chunk {result.chunk} (segment {result.segment}) from "
        f"{result.replay_key}: recorded {result.recorded}, replayed {result.replayed} "
        f"({result.plans_run} plans): {verdict}\n"
    )
    return 0 if result.matches else 1


def _fps(data_dir: Path, session_id: str) -> int:
    from sessions.store import Store

    store = Store(data_dir / "dreamrt.sqlite3")
    try:
        row = store.get_session(session_id)
    finally:
        store.close()
    return int(row["fps"]) if row else 12
