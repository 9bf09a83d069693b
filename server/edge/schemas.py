"""Request and response bodies of the REST API (docs/api.md "REST"), validated by pydantic at
the edge.

Unknown fields are refused (``extra="forbid"``): a typo such as ``"promt"`` is a 422 naming
the field rather than a silently ignored value. Nothing past this module sees pydantic.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field

__all__ = [
    "ActionsBody",
    "AdapterRef",
    "ChooseBody",
    "ComponentsBody",
    "ControlInfo",
    "FaultBody",
    "FeedbackBody",
    "ForkBody",
    "JobBody",
    "JobCreated",
    "LiveKitBody",
    "ModelInfo",
    "OfferBody",
    "PromptAccepted",
    "PromptBody",
    "RolloutBody",
    "SdpAnswer",
    "SessionBody",
    "SessionCreated",
    "TokenBody",
    "TokenIssued",
    "WeightsBody",
]

# Hard caps; the configured limits (``server.config.limits.Limits``: prompt length, SDP size) are
# checked by the routes on top of them, so they can be lowered without a schema change.
Text = Annotated[str, Field(min_length=1, max_length=16_000)]
Dimension = Annotated[int, Field(ge=8, le=4096)]
Seed = Annotated[int, Field(ge=0, le=2**63 - 1)]


class _Body(BaseModel):
    model_config = ConfigDict(extra="forbid", populate_by_name=True)


class LiveKitBody(_Body):
    url: Annotated[str, Field(min_length=1)]
    room: Annotated[str, Field(min_length=1)]
    token: str | None = None
    # only this participant's audio feeds the session (default: every participant's)
    audio_identity: str | None = None
    # LiveKit Agents avatar convention: the agent identity this engine publishes on behalf of
    avatar_of: str | None = None


class AdapterRef(_Body):
    name: Annotated[str, Field(min_length=1, max_length=64)]
    strength: Annotated[float, Field(ge=-10, le=10)] = 1.0


class SessionBody(_Body):
    prompt: Text
    model: str | None = None
    fps: Annotated[int, Field(ge=1, le=120)] | None = None
    width: Dimension | None = None
    height: Dimension | None = None
    seed: Seed | None = None
    priority_class: Literal["realtime", "batch"] = Field("realtime", alias="class")
    livekit: LiveKitBody | None = None
    # "now": the prompt encode and the first chunk start at create, beside the offer and ICE;
    # "viewer": nothing runs before the first pull of the video (no GPU time for no one)
    start: Literal["viewer", "now"] = "viewer"
    # LoRA adapters registered with ``dreamrt serve --adapter NAME=PATH``
    adapters: Annotated[list[AdapterRef], Field(max_length=8)] = []
    # "full" (the VAE) | "tiny" (a tiny streaming decoder); None: the model's default
    decoder: Literal["full", "tiny"] | None = None


class Profile(BaseModel):
    fps: int
    width: int
    height: int


class SessionCreated(BaseModel):
    id: str
    token: str
    state: str
    profile: Profile
    decoder: str = "full"


class OfferBody(_Body):
    sdp: Annotated[str, Field(min_length=1, max_length=256 * 1024)]
    type: Literal["offer"]


class SdpAnswer(BaseModel):
    sdp: str
    type: Literal["answer"]


class PromptBody(_Body):
    text: Text
    mode: Literal["switch", "cut"] = "switch"


class PromptAccepted(BaseModel):
    applies_at_chunk: int
    seq: int


class ActionsBody(_Body):
    keys: Annotated[list[Annotated[str, Field(min_length=1, max_length=32)]], Field(max_length=16)]
    mouse: (
        tuple[
            Annotated[float, Field(ge=-10_000, le=10_000)],
            Annotated[float, Field(ge=-10_000, le=10_000)],
        ]
        | None
    ) = None


class FeedbackBody(_Body):
    rating: Literal[-1, 0, 1]
    chunk: Annotated[int, Field(ge=0)] | None = None
    note: Annotated[str, Field(max_length=2000)] | None = None


class ForkBody(_Body):
    n: Annotated[int, Field(ge=2, le=8)]
    prompt: Text | None = None
    # one per candidate (default: derived from the parent's seed); equal seeds, equal streams
    seeds: Annotated[list[Seed], Field(min_length=2, max_length=8)] | None = None


class RenderBody(_Body):
    """``POST /v1/sessions/{id}/render``: the session continued offline for ``chunks`` more."""

    chunks: Annotated[int, Field(ge=1, le=256)]


class ChooseBody(_Body):
    candidate: Annotated[str, Field(min_length=1, max_length=64)]


class JobBody(_Body):
    task: Literal["t2v", "t2i"]
    prompt: Text
    model: str | None = None
    num_frames: Annotated[int, Field(ge=1, le=1024)] | None = None
    width: Dimension | None = None
    height: Dimension | None = None
    steps: Annotated[int, Field(ge=1, le=1000)] | None = None
    seed: Seed | None = None
    # overrides of extensions the server enabled (each checked by its own schema), and
    # exact: refuse distribution-altering extension parameters
    extensions: dict[str, dict[str, Any]] | None = None
    exact: bool = False
    # a built-in program's name ("preview_and_final") or a program graph (docs/api.md
    # "Programs"): the fields above are its loop nodes' defaults
    program: Annotated[str, Field(min_length=1, max_length=64)] | dict[str, Any] | None = None


class WorkflowBody(_Body):
    """``POST /v1/workflows``: the body ComfyUI's ``/prompt`` takes, plus the served model."""

    prompt: dict[str, Any]  # the API-format graph: {node id: {"class_type", "inputs"}}
    client_id: Annotated[str, Field(max_length=256)] | None = None  # accepted, unused
    extra_data: dict[str, Any] | None = None  # accepted, unused (ComfyUI's UI metadata)
    model: str | None = None


class JobCreated(BaseModel):
    id: str


class WeightsBody(_Body):
    """``POST /v1/weights``: a safetensors file or directory on the server's disk (admin)."""

    path: Annotated[str, Field(min_length=1, max_length=4096)]
    mode: Literal["full", "delta"] = "full"
    model: str | None = None


class ComponentsBody(_Body):
    """``POST /v1/sleep`` and ``/v1/wake``."""

    components: Annotated[list[Annotated[str, Field(min_length=1)]], Field(min_length=1)]
    model: str | None = None


class RolloutBody(_Body):
    """``POST /v1/rollouts``: K samples of one prompt as one batch (``sessions.rollout_groups``)."""

    prompt: Text
    k: Annotated[int, Field(ge=1, le=64)]
    seeds: list[Seed] | None = None
    steps: Annotated[int, Field(ge=1, le=1000)] | None = None
    num_frames: Annotated[int, Field(ge=1, le=1024)] | None = None
    width: Dimension | None = None
    height: Dimension | None = None
    model: str | None = None
    latents: bool = False  # keep each denoising step's latents (GET .../latents/{sample}/{chunk})


class TokenBody(_Body):
    scope: Annotated[str, Field(pattern=r"^(admin|user|session:[A-Za-z0-9_]+)$")]
    ttl_s: Annotated[float, Field(gt=0, le=365 * 24 * 3600)] = 3600.0


class TokenIssued(BaseModel):
    token: str
    scope: str
    expires_at: float


class ProfileBody(_Body):
    seconds: Annotated[float, Field(gt=0, le=30)] = 2.0


class FaultBody(_Body):
    target: Annotated[str, Field(min_length=1, max_length=64)]
    kind: Literal["nan", "exception", "oom"]


class ControlInfo(BaseModel):
    """One entry of a card's controls legend: the inputs it names and what they do."""

    kind: Literal["key", "mouse", "audio"]
    inputs: list[str]
    does: str


class ModelInfo(BaseModel):
    """One card as ``GET /v1/models`` serves it. The typed fields are what clients rely on;
    the card's other public fields (loops, parity, components, ...) pass through as they are."""

    model_config = ConfigDict(extra="allow")

    id: str
    family: str
    description: str
    capabilities: list[str]
    recipe: dict[str, Any]
    default_profile: dict[str, int]
    weights: str
    examples: list[str]
    controls: list[ControlInfo]
    served: bool
    label: str | None = None
    decoders: list[str] = []  # the decoders a session may pick ("full", "tiny")
    default_decoder: str | None = None
