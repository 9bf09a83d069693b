"""Session handoff through shared storage: what another engine needs to resume a session.

An engine started with ``--snapshot-dir DIR`` (a directory every engine of a fleet sees)
writes its sessions' replay snapshots there and, per session, one *manifest*: the session's id,
model, profile, seed, prompt, class and the hash of its session token (never the token)::

    DIR/sessions/<session id>.json          the manifest (written once, atomically)
    DIR/snapshots/<session id>/<step>.snap  replay snapshots (sessions.snapshot_keeper)

When the session's engine dies, the fleet router asks another engine to ``resume`` it: that
engine reads the manifest and the newest snapshot, admits the session like a new one (its own
chunk-KV slab and compute share) and starts its loop as a continuation of the snapshot's state
(``loop.fork`` with the session's own seed, so the stream goes on exactly as it would have
from that chunk boundary), under the same id, accepting the same token. A session that ends
while its engine runs (deleted, failed, timed out) loses its manifest: it is over, nobody
resumes it; one still live when its engine stops or dies keeps it. Its PTS go on from the
snapshot's chunk: the frames generated after the snapshot and before the crash are generated
again (the newest snapshot is at most ``--snapshot-every`` chunks old), and so is its prompt
(the loop state's active prompt). Inputs that were waiting unacknowledged are dropped (the
client sends them again). The event stream of the resumed session starts again at event 1 on
its new engine.

This is the minimal resume the fleet needs. The engine's own restart/resume
(``sessions.resume.restore_session``) does the same from the engine's own store row, which
another engine does not have: the manifest stands in for that row here.
"""

from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Literal

import msgspec

__all__ = [
    "HandoffError",
    "Resume",
    "SessionManifest",
    "forget_manifest",
    "load_resume",
    "read_manifest",
    "write_manifest",
]


class HandoffError(LookupError):
    """A session cannot be resumed from shared storage (no manifest, no snapshot)."""


@dataclass(frozen=True, slots=True)
class SessionManifest:
    """The static facts of a session another engine needs to resume it."""

    session_id: str
    model_id: str
    prompt: str
    seed: int
    fps: int
    width: int
    height: int
    priority_class: Literal["realtime", "batch"]
    token_sha256: str  # the session token's digest (server.edge.auth stores tokens hashed)
    token_expires_at: float
    engine_id: str  # the engine it was created on (for the logs and the operator)


@dataclass(frozen=True, slots=True)
class Resume:
    """A session to continue: its manifest, the restored loop state and the snapshot's step."""

    manifest: SessionManifest
    state: Any  # the loop's state type (e.g. ChunkRolloutState), tensors on the model's device
    step: int


def manifest_path(snapshot_dir: Path, session_id: str) -> Path:
    return Path(snapshot_dir) / "sessions" / f"{session_id}.json"


def write_manifest(snapshot_dir: Path, manifest: SessionManifest) -> Path:
    """Writes the manifest atomically (rename into place: a reader never sees half of it)."""
    path = manifest_path(snapshot_dir, manifest.session_id)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.partial")
    tmp.write_text(json.dumps(asdict(manifest)))
    os.replace(tmp, path)
    return path


def forget_manifest(snapshot_dir: Path, session_id: str) -> None:
    """The session ended for good: no engine may resume it (its snapshots stay for replay)."""
    manifest_path(snapshot_dir, session_id).unlink(missing_ok=True)


def read_manifest(snapshot_dir: Path, session_id: str) -> SessionManifest:
    path = manifest_path(snapshot_dir, session_id)
    try:
        return SessionManifest(**json.loads(path.read_text()))
    except FileNotFoundError:
        raise HandoffError(f"no manifest of session {session_id!r} under {snapshot_dir}") from None
    except (ValueError, TypeError) as exc:
        raise HandoffError(f"manifest {path} is unreadable: {exc}") from None


def newest_snapshot(snapshot_dir: Path, session_id: str) -> tuple[int, Path]:
    """(step, file) of the session's newest replay snapshot; ``HandoffError`` if none."""
    files = sorted((Path(snapshot_dir) / "snapshots" / session_id).glob("*.snap"))
    if not files:
        raise HandoffError(f"no snapshot of session {session_id!r} under {snapshot_dir}")
    return int(files[-1].stem), files[-1]


def load_resume(snapshot_dir: Path, session_id: str, loop: Any, *, device: Any) -> Resume:
    """The manifest and newest snapshot of ``session_id``, its state restored onto ``device``
    as ``loop``'s state type. Raises ``HandoffError`` (or ``runtime.snapshot.SnapshotError``
    for a corrupt file)."""
    from runtime.snapshot import resolve_state_type, restore_state

    manifest = read_manifest(snapshot_dir, session_id)
    step, path = newest_snapshot(snapshot_dir, session_id)
    blob = path.read_bytes()
    state = restore_state(blob, resolve_state_type(loop, blob, None), device=device)
    # inputs waiting unacknowledged belong to the dead engine's ledger: the client resends them
    state = msgspec.structs.replace(state, acks=[], next_acks=[])
    return Resume(manifest=manifest, state=state, step=step)
