"""The rows ``sessions.store.Store`` reads back, one ``TypedDict`` per table (the columns of
``sessions.store_schema``; JSON columns decoded), and a job's parameters (``JobParams``: the
``params`` column, what a resumed job is queued again from)."""

from __future__ import annotations

from typing import Literal, NotRequired, TypedDict

__all__ = [
    "EventRow",
    "FeedbackRow",
    "ForkRow",
    "InputRow",
    "JobMoment",
    "JobOrigin",
    "JobParams",
    "JobRow",
    "PreferenceRow",
    "RecordActions",
    "RecordRow",
    "SessionRow",
    "TokenRow",
]


# functional syntax: the priority class's column is named ``class``
SessionRow = TypedDict(
    "SessionRow",
    {
        "id": str,
        "model_id": str,
        "prompt": str,
        "seed": int,
        "fps": int,
        "width": int,
        "height": int,
        "class": str,
        "state": str,
        "segment": int,
        "frames_sent": int,
        "stalls": int,
        "fps_measured": float,
        "error": str | None,
        "fork_of": str | None,
        "created_at": float,
        "updated_at": float,
        "event_id_ceiling": int | None,
    },
)


class JobMoment(TypedDict):
    """Where a rendered moment starts (``sessions.moments``)."""

    session: str
    chunk: int


class JobOrigin(TypedDict, total=False):
    """What a job was made from (``JobHost.submit_job``'s ``origin``), kept in its params."""

    workflow: dict[str, str]
    moment: JobMoment


class JobParams(JobOrigin, total=False):
    """A job's parameters as stored (``sessions.job_host``): its request's fields, its program
    (``Program.to_dict``) and what it was made from (``workflow``: a compiled workflow's node
    mapping; ``moment``: the session state it continues)."""

    num_frames: int | None
    width: int
    height: int
    steps: int
    seed: int | None
    extensions: dict[str, dict[str, object]]
    exact: bool
    program: dict[str, object]


class JobRow(TypedDict):
    id: str
    task: Literal["t2v", "t2i"]
    model_id: str
    prompt: str
    params: JobParams
    state: str
    progress: float
    error: str | None
    artifact_path: str | None
    media_type: str | None
    created_at: float
    updated_at: float


class EventRow(TypedDict):
    event_id: int
    type: str
    body: str
    time_s: float


class RecordActions(TypedDict):
    """The inputs a chunk reflects: the action's payload (with its ``seq``) and audio seqs."""

    action: dict[str, object] | None
    audio_seqs: list[int]


class RecordRow(TypedDict):
    """One behaviour record (``sessions.records``); the columns added since schema version 1
    may be absent from a record as written and are None in one read back without them."""

    session_id: str
    segment: int
    chunk: int
    seed: int
    model_id: str
    weights_version: str
    loop_id: str
    sampler: str
    steps: int
    timesteps: list[float]
    precision: str
    prompt: str
    prompt_seq: int
    actions: RecordActions
    pts_start: int
    pts_end: int
    num_frames: int
    digest: str
    replay_key: str
    created_at: NotRequired[float]
    recipe_id: NotRequired[str | None]
    weights_label: NotRequired[str | None]
    loop_ref: NotRequired[str | None]
    rng: NotRequired[str | None]
    noise_seeds: NotRequired[list[int] | None]
    sigmas: NotRequired[list[float] | None]
    prompt_digest: NotRequired[str | None]
    action_digest: NotRequired[str | None]
    audio_digest: NotRequired[str | None]
    kv_window: NotRequired[dict[str, int] | None]
    latent_frame_start: NotRequired[int | None]
    fps: NotRequired[int | None]
    width: NotRequired[int | None]
    height: NotRequired[int | None]
    media_ref: NotRequired[str | None]
    restart_policy: NotRequired[str | None]
    attention: NotRequired[str | None]
    decoder: NotRequired[str | None]
    step_batch: NotRequired[int | None]
    group_id: NotRequired[str | None]
    adapters: NotRequired[list[dict[str, object]] | None]


class InputRow(TypedDict):
    step: int
    seq: int
    kind: str
    payload: bytes
    received_s: float


class FeedbackRow(TypedDict):
    id: int
    session_id: str
    chunk: int | None
    rating: int
    note: str | None
    created_at: float


class ForkRow(TypedDict):
    id: int
    session_id: str
    n: int
    prompt: str | None
    candidates: list[str]
    chosen: str | None
    created_at: float
    seeds: str | None  # JSON, as stored
    context_ref: str | None


class PreferenceRow(TypedDict):
    id: int
    context_ref: str
    chosen_ref: str
    rejected_ref: str
    source: str
    created_at: float
    session_id: str | None
    model_id: str | None
    weights_version: str | None


class TokenRow(TypedDict):
    hash: str
    scope: str
    expires_at: float
    created_at: float
