"""``ServerConfig``: everything ``dreamrt serve`` can set, as one frozen value (``server/cli.py``
builds it from the flags, ``server.app.create_app`` serves it; docs/api.md lists the flags).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from server.limits import Limits

__all__ = ["ServerConfig"]

_WEB_DIR = Path(__file__).resolve().parent.parent / "clients" / "web"


@dataclass(frozen=True, slots=True)
class ServerConfig:
    """Everything ``dreamrt serve`` can set. Units in names; ``None`` means "decide"."""

    host: str = "127.0.0.1"
    port: int = 8000
    model: str | None = None
    device: str = "auto"
    data_dir: Path = Path("data")
    ice_hosts: tuple[str, ...] = ()
    ice_servers: tuple[str, ...] = ()
    auth: str | None = None  # none | token; None: none on loopback, token elsewhere
    force_no_auth: bool = False
    admin_key: str | None = None
    max_sessions: int = 4
    video_bitrate_bps: int | None = None
    playout_buffer_s: float = 0.25
    max_lead_s: float = 1.0
    max_batch: int = 8
    # step-edf (default) | chunk-rr | fifo: the request-level baselines exist to be measured
    scheduler: str = "step-edf"
    deterministic: bool = False  # batched plans bit-identical to solo runs (replay, A/B tests)
    compile: bool = False  # GPU serving: WanInstance.compile()
    compile_cache: Path | None = None  # Inductor's caches (server.compile_cache); None: data_dir's
    attention: str = "auto"  # with ``compile``: the kernel (models.wan.attention_kernels)
    cuda_graphs: bool = False  # with ``compile``: CUDA graphs of the steady chunk forward
    warmup: bool | None = None  # a session before serving compiles every graph (None: if compiled)
    checkpoint_dir: Path | None = None  # weights of a card with external weights
    adapters: tuple[str, ...] = ()  # "NAME=PATH": LoRA adapters sessions may name
    random_weights: bool = False  # seeded random weights whatever the card says (benchmarks)
    chunk_frames: int | None = None  # latent frames per chunk (1: the latency mode); None: card's
    gpus: int = 1  # processes of one instance (Ulysses over them; server/spmd_serving.py)
    parallel: str = ""  # the plan of those processes, e.g. "cfg=2" ("": the card's, else sp=N)
    # "fast": the time-to-steer cuts (adaptive lead, queued plans withdrawn for inputs, chunks
    # restarted when regenerating is sooner); "baseline": the plain input path
    steering: str = "fast"
    admission_cost: str = "auto"  # sessions.host.ADMISSION_COSTS
    unwatched_timeout_s: float = 300.0  # close sessions nobody watched this long (0: never)
    limits: Limits = Limits()  # every bound on client input (server.limits, docs/api.md)
    # ops/test hook: a FaultInjector observer and POST /v1/faults (never on by default)
    fault_injection: bool = False
    shutdown_timeout_s: float = 10.0  # SIGTERM: drained and exited within this (server.shutdown)
    resume_grace_s: float = 120.0  # sessions of the previous process may resume this long
    snapshot_every: int = 8  # chunks between a loop's replay snapshots (0: none)
    snapshot_keep: int = 16  # newest replay snapshots kept per loop
    snapshot_mbps: float = 64.0  # at most this many MB of snapshots per second per loop
    snapshot_keep_gb: float = 8.0  # and at most this many GB of them kept per loop
    # a fleet's shared storage: snapshots and session manifests there (sessions.handoff);
    # None: snapshots under data_dir, no handoff
    snapshot_dir: Path | None = None
    fleet: str | None = None  # join this Dynamo namespace (server.fleet_worker); None: alone
    fleet_discovery: str | None = None  # file | etcd | kubernetes; None: $DYN_DISCOVERY_BACKEND
    fleet_dir: Path | None = None  # file discovery's shared directory; None: $DYN_FILE_KV
    engine_id: str | None = None  # None: "<hostname>:<port>"
    public_url: str | None = None  # the URL clients reach this engine at; None: from host/port
    livekit_key: str | None = None  # None: LIVEKIT_API_KEY (to mint join tokens)
    livekit_secret: str | None = None  # None: LIVEKIT_API_SECRET
    extensions: tuple[str, ...] = ()  # --extension NAME[:k=v,...] (models/loops/extensions.py)
    web_dir: Path | None = field(default=_WEB_DIR)
