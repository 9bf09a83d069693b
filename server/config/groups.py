"""The groups of ``ServerConfig`` (``server.config.serve``): the model served, the engine that
runs it, the recording of sessions and the fleet this engine joins (the fifth group, every bound
on client input, is ``server.config.limits.Limits``). Each field is a setting
(``server.config.fields``): flag, ``DREAMRT_*`` variable and config-file key from one declaration;
the checks of a group's values are its ``__post_init__``, the only place they are made.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from server.config.fields import ConfigError, check_choices, setting

__all__ = [
    "DEFAULT_MODEL",
    "SCHEDULERS",
    "EngineConfig",
    "FleetConfig",
    "ModelConfig",
    "RecordingConfig",
]

# runtime.policies.SCHEDULER_POLICIES, spelled out so the parser imports no runtime module
# (a test keeps the two equal)
SCHEDULERS = ("step-edf", "chunk-rr", "fifo")


def _at_least(value: float, floor: float, key: str) -> None:
    if not value >= floor:  # also refuses NaN
        raise ConfigError(f"{key} must be >= {floor}, got {value}")


# The card served when ``--model`` names none: trained weights shipped in the repository, real
# time on one CPU core (its evaluation: infra/bench/RESULTS.md, tiny-world).
DEFAULT_MODEL = "tiny-world"


@dataclass(frozen=True, slots=True)
class ModelConfig:
    """Which card is served, on what, and how its instance is built."""

    card: str | None = setting(
        None, "model card id (default: the embedded card)", key="model", metavar="ID"
    )
    device: str = setting("auto", "where the model runs", choices=("auto", "cpu", "cuda"))
    checkpoint_dir: Path | None = setting(
        None,
        "checkpoint directory of a card with external weights (laid out as its manifest says)",
        flag="--checkpoint",
        metavar="DIR",
    )
    adapters: tuple[str, ...] = setting(
        (),
        "register a LoRA adapter (a safetensors file; PEFT or diffusers keys) sessions may "
        "name; repeatable",
        flag="--adapter",
        metavar="NAME=PATH",
    )
    random_weights: bool = setting(
        False,
        "seeded random weights instead of the card's (benchmarks of a card whose "
        "checkpoint is not at hand; the picture is noise)",
    )
    chunk_frames: int | None = setting(
        None,
        "latent frames per chunk (default: the card's); 1 is the latency mode for "
        "world-model control (4 video frames per chunk on a Wan VAE)",
        metavar="N",
    )
    compile: bool = setting(
        False,
        "GPU serving: torch.compile the DiT blocks and the VAE decoder, decode on a second "
        "CUDA stream; one internal warm-up session compiles every graph before serving",
    )
    compile_cache: Path | None = setting(
        None,
        "with --compile: keep Inductor's compiled artifacts here, one directory per card, "
        "torch version, device and serving levers (default: DATA_DIR/compile-cache); a shared "
        "volume lets a fresh machine start warm",
        metavar="DIR",
    )
    compile_workers: int | None = setting(
        None,
        "with --compile, a start with nothing in the compile cache: N worker processes compile "
        "the graphs side by side while one eager warm-up finds them (default: the CPU cores "
        "up to 4; 0: one after another in the server's process)",
        metavar="N",
    )
    attention: str = setting(
        "auto",
        "with --compile: the self-attention kernel (auto: fa3 where fa3-fwd is installed, "
        "else sdpa; exact: sdpa, flash, cudnn, fa3; lossy: sage, fp8-triton, fp8qk-triton, "
        "fa3-fp8, cudnn-fp8; one that cannot run falls back to SDPA, logged)",
        metavar="NAME",
    )
    cuda_graphs: bool = setting(
        False,
        "with --compile: replay CUDA graphs of steady-state chunk forwards (the warm-up "
        "captures them for every slab)",
    )
    kv_cache: str = setting(
        "model",
        "the chunk-K/V cache's storage: model (the model's dtype) or fp8 (e4m3 with per-head "
        "scales, read by FA3's FP8 kernel on Hopper; half the bytes; lossy)",
        choices=("model", "fp8"),
    )
    fp8_linears: str = setting(
        "off",
        "with --compile: FP8 linears in the DiT blocks, row-wise or per-tensor scales (lossy)",
        choices=("off", "row", "tensor"),
    )
    # None: warm up when compiled; the flag can only turn it off
    warmup: bool | None = setting(
        None,
        "with --compile: skip the warm-up (the first session then pays compilation)",
        flag="--no-warmup",
        switch_value=False,
    )
    extensions: tuple[str, ...] = setting(
        (),
        "enable an extension for this server, its params the defaults of every request: "
        "fbcache, teacache (e.g. fbcache:threshold=0.05); jobs may override enabled ones",
        flag="--extension",
        metavar="NAME[:k=v,...]",
    )
    gpus: int = setting(
        1,
        "spread one instance over N processes of this node (Ulysses sequence parallelism; "
        "relaunches under torchrun)",
        metavar="N",
    )
    parallel: str = setting(
        "",
        "the parallel plan of --gpus N, e.g. 'cfg=2' or 'sp=2,cfg=2' (the degrees' product "
        "is N; default: the card's plan, else sp=N)",
        metavar="PLAN",
    )

    def __post_init__(self) -> None:
        check_choices(self)
        _at_least(self.gpus, 1, "gpus")
        if self.chunk_frames is not None:
            _at_least(self.chunk_frames, 1, "chunk_frames")
        if self.compile_workers is not None:
            _at_least(self.compile_workers, 0, "compile_workers")


@dataclass(frozen=True, slots=True)
class EngineConfig:
    """How the engine schedules, admits and paces the work of the sessions and jobs."""

    max_sessions: int = setting(4, "chunk-KV slabs, i.e. concurrent sessions", metavar="N")
    max_batch: int = setting(8, "at most N requests' steps in one batched plan", metavar="N")
    scheduler: str = setting(
        SCHEDULERS[0],
        "scheduling policy: step-edf (step-level earliest deadline first, default); "
        "chunk-rr (whole chunks, sessions in turn) and fifo (one request at a time, in "
        "arrival order) are request-level baselines to measure against",
        choices=SCHEDULERS,
        check=False,  # runtime.policies.make_scheduler checks it, naming the known ones
    )
    deterministic: bool = setting(
        False, "batched plans give bit-identical results to solo runs (slower batching)"
    )
    steering: str = setting(
        "fast",
        "fast (default): adaptive lead limit, queued plans withdrawn for new inputs, "
        "chunks restarted when regenerating is sooner; baseline: the simple input path "
        "(fixed lead, inputs wait for the chunk boundary), to measure against",
        choices=("fast", "baseline"),
    )
    chunk_restart: str = setting(
        "auto",
        "when a prompt switch, cut or key restarts the chunk in flight: "
        "regenerate-when-sooner (when that shows the input sooner than waiting), cuts-only "
        "(a cut only), or auto: the first with --steering fast, the second with baseline",
        choices=("auto", "regenerate-when-sooner", "cuts-only"),
    )
    compute_capacity: float | None = setting(
        None,
        "GPU-seconds per second of the device admission lets sessions reserve: the highest "
        "measured load at which the realtime SLO holds (default: 0.9)",
        metavar="GPU_S_PER_S",
    )
    batch_sessions: str = setting(
        "auto",
        "several sessions' denoising steps of one shape as one batched forward, admitted by "
        "the batch's measured cost: on, off, or auto (on a GPU, off with --deterministic or "
        "--gpus N)",
        choices=("auto", "on", "off"),
    )
    admission_cost: str = setting(
        "auto",
        "a session's compute share at admission: measured chunk costs once calibrated, "
        "or the analytic prior; auto (default): measured on a GPU, the prior on a CPU",
        choices=("auto", "measured", "prior"),
    )
    steering_cost: str = setting(
        "measured",
        "what admission adds for generated frames that steering flushes (a prompt switch "
        "shows at once; the backlog is regenerated): measured (default; each session's own "
        "flushed fraction, a new session the server's) or none",
        choices=("measured", "none"),
    )
    playout_buffer_s: float = setting(
        0.25,
        "seconds of video a session keeps ahead of its viewer",
        flag="--playout-buffer",
        metavar="SECONDS",
    )
    max_lead_s: float = setting(
        1.0,
        "at most this many seconds generated ahead of playout",
        flag="--max-lead",
        metavar="SECONDS",
    )
    steer_lead_s: float = setting(
        0.5,
        "with --steering fast, at most this many seconds generated ahead of playout while a "
        "viewer steers (an input within --steer-hold): what an input that changes the picture "
        "throws away, since its first frame flushes the older backlog",
        flag="--steer-lead",
        metavar="SECONDS",
    )
    steer_hold_s: float = setting(
        10.0,
        "with --steering fast, a session counts as steered this many seconds after its last "
        "input (then --max-lead again)",
        flag="--steer-hold",
        metavar="SECONDS",
    )
    fault_injection: bool = setting(
        False,
        "tests and drills only: POST /v1/faults (admin) makes a session's or job's next "
        "step fail with nan, exception or oom",
    )

    def batches_sessions(self, *, on_gpu: bool, spmd: bool) -> bool:
        """Whether sessions' denoising steps batch across sessions: ``batch_sessions`` on or
        off as set; auto: on an accelerator, whose small steps leave it underused (a CPU's are
        compute-bound already, and its admission prices by the prior, which knows no
        batches), not with ``deterministic`` (batched steps agree with solo ones within the
        interleave gate's tolerance only) nor across processes of one instance (``spmd``)."""
        if self.batch_sessions != "auto":
            return self.batch_sessions == "on"
        return on_gpu and not spmd and not self.deterministic

    def __post_init__(self) -> None:
        check_choices(self)
        _at_least(self.max_sessions, 1, "max_sessions")
        _at_least(self.max_batch, 1, "max_batch")
        _at_least(self.playout_buffer_s, 0.0, "playout_buffer_s")
        _at_least(self.max_lead_s, 0.0, "max_lead_s")
        _at_least(self.steer_lead_s, 0.0, "steer_lead_s")
        _at_least(self.steer_hold_s, 0.0, "steer_hold_s")


@dataclass(frozen=True, slots=True)
class RecordingConfig:
    """What of a session is kept to replay and resume it (``sessions.recording``)."""

    snapshot_every: int = setting(
        8,
        "replay snapshot of each session's loop every N chunks (0: none, no replay)",
        metavar="N",
    )
    snapshot_keep: int = setting(
        16,
        "newest replay snapshots kept per loop (older chunks can no longer be replayed)",
        metavar="K",
    )
    snapshot_mbps: float = setting(
        64.0,
        "at most MB megabytes of snapshots per second per loop: a big state (a Wan "
        "session's K/V cache, ~3.5 GB) is snapshotted less often than --snapshot-every (0: no "
        "limit)",
        metavar="MB",
    )
    snapshot_keep_gb: float = setting(
        8.0,
        "at most GB gigabytes of snapshots kept per loop, fewer than --snapshot-keep if "
        "need be; the newest is always kept (0: no limit)",
        metavar="GB",
    )
    # None: snapshots under data_dir, no handoff (sessions.handoff)
    snapshot_dir: Path | None = setting(
        None,
        "shared storage every engine of the fleet sees: replay snapshots and session "
        "manifests go there, so another engine can resume a session of a dead one",
        metavar="DIR",
    )
    resume_grace_s: float = setting(
        120.0,
        "a session of the previous process resumes on an offer within this after "
        "startup (0: never)",
        flag="--resume-grace",
        metavar="SECONDS",
    )

    def __post_init__(self) -> None:
        for key in ("snapshot_every", "snapshot_keep", "snapshot_mbps", "snapshot_keep_gb"):
            _at_least(getattr(self, key), 0, key)
        _at_least(self.resume_grace_s, 0.0, "resume_grace_s")


@dataclass(frozen=True, slots=True)
class FleetConfig:
    """The fleet (a Dynamo namespace, ``server.fleet.worker``) this engine joins, if any."""

    namespace: str | None = setting(
        None,
        "join this fleet (a Dynamo namespace): serve place/card/health endpoints on "
        "NVIDIA Dynamo's distributed runtime for `dreamrt router` (needs dreamrt[fleet])",
        key="fleet",
        metavar="NAMESPACE",
    )
    discovery: str | None = setting(
        None,
        "Dynamo discovery (default: $DYN_DISCOVERY_BACKEND, else file); etcd reads $ETCD_ENDPOINTS",
        key="fleet_discovery",
        choices=("file", "etcd", "kubernetes"),
    )
    discovery_dir: Path | None = setting(
        None,
        "file discovery's shared directory (default: $DYN_FILE_KV, else /tmp/dreamrt-fleet)",
        key="fleet_dir",
        metavar="DIR",
    )
    engine_id: str | None = setting(None, "default: <hostname>:<port>", metavar="ID")
    public_url: str | None = setting(
        None,
        "the base URL clients reach this engine at (default: http://HOST:PORT)",
        metavar="URL",
    )

    def __post_init__(self) -> None:
        check_choices(self)
