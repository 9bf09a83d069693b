"""Prometheus metrics (``GET /metrics``) in a private ``CollectorRegistry`` per app, so several
apps in one process (tests) never share series.

Two sources, each counted once:

- **The engine** reports every finished batch to ``ServerMetrics.batch_done`` (it is one of
  the engine's batch listeners, ``runtime.observers.BatchListener``): prometheus ``Counter``s
  ``steps_total{kind}`` (plans that ran), ``engine_plans_executed_total``,
  ``engine_plan_failures_total``, ``engine_deadline_misses_total``, the executor's calls and
  their wall seconds ``engine_batches_total{kind}`` / ``engine_batch_seconds_total{kind}`` (a
  batch of several plans once), and the ``Histogram``
  ``step_latency_seconds{kind}`` (wall time of the run that produced each plan's output,
  buckets 1 ms .. 2 s). These are unbounded totals, not a window of recent samples.
- **Time to steer**, from each session's event stream (``watch(session)``: a sink on it): the
  ``Histogram``s ``input_latency_seconds{kind,stage}`` (an input's receipt -> ``latched``,
  ``started``, ``generated``, ``decoded``, ``enqueued``, ``sent``; observed at ``input.shown``)
  and ``first_frame_seconds{stage}`` (session creation -> ``offer``, ``answered``,
  ``connected``, ``generated``, ``sent``; observed at ``viewer.first_frame``), buckets 5 ms ..
  10 s.
- **Live state**, read at scrape time from a ``MetricsSnapshot`` (the composition root supplies
  ``snapshot_fn``): gauges ``sessions{state}``, ``jobs{state}``, ``scheduler_queue_depth``,
  ``engine_running_loops``, ``engine_executing``, ``kv_slabs_free`` / ``kv_slabs_capacity``,
  ``server_tasks`` (background tasks the server owns: 0 when idle), ``sse_streams`` (open
  event streams), ``webrtc_peers`` (viewer peer connections); and the session-side
  totals ``frames_sent_total``, ``stalls_total``, ``media_dropped_frames_total``,
  ``media_flushed_frames_total``, ``admission_rejections_total{reason}``. Sessions count those
  themselves (including ended sessions); the ``Counter``s here are advanced to their totals at
  each scrape. And
  ``compiles_after_ready_total{kind}``: what a compiled instance compiled or captured after
  ready, or ran eagerly outside its compiled set (``models.compile_guard``; kinds ``dynamo``,
  ``outside_set``, ``cuda_graph``; all 0 when serving compiled nothing).

Every series is prefixed ``dreamrt_``.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

from sessions.events import Event, InputShown, ViewerFirstFrame

__all__ = [
    "COMPILE_KINDS",
    "CONTENT_TYPE",
    "FIRST_FRAME_STAGES",
    "INPUT_STAGES",
    "STEER_LATENCY_BUCKETS_S",
    "STALL_BUCKETS_S",
    "STEP_LATENCY_BUCKETS_S",
    "MetricsSnapshot",
    "ServerMetrics",
]

log = logging.getLogger(__name__)

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
# 1 ms .. 2 s: a tiny-model step on CPU is a few ms, a large DiT step on a GPU tens to hundreds
# of ms, a first-chunk decode or a compile-cold step up to seconds.
STEP_LATENCY_BUCKETS_S = (
    0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1.0, 2.0, float("inf")
)  # fmt: skip
# 0.5 s .. 30 s: a stall the watchdog reports (server/ops/loop_watchdog.py) is at least its
# threshold.
STALL_BUCKETS_S = (0.5, 1.0, 2.0, 5.0, 10.0, 30.0, float("inf"))
# 5 ms .. 10 s: a key on a GPU in the latency mode is ~0.2 s, a prompt on a busy CPU seconds.
STEER_LATENCY_BUCKETS_S = (
    0.005, 0.01, 0.025, 0.05, 0.1, 0.15, 0.2, 0.3, 0.5, 0.75, 1.0, 1.5, 2.0, 3.0, 5.0, 10.0,
    float("inf"),
)  # fmt: skip
INPUT_STAGES = ("latched", "started", "generated", "decoded", "enqueued", "sent")
FIRST_FRAME_STAGES = ("offer", "answered", "connected", "generated", "sent")
COMPILE_KINDS = ("dynamo", "outside_set", "cuda_graph")  # models.compile_guard.after_ready


@dataclass(frozen=True, slots=True)
class MetricsSnapshot:
    """Live state and session-side totals at one instant (see the module docstring)."""

    sessions_by_state: Mapping[str, int] = field(default_factory=dict)
    jobs_by_state: Mapping[str, int] = field(default_factory=dict)
    frames_sent: int = 0
    stalls: int = 0
    media_dropped: int = 0
    media_flushed: int = 0
    admission_rejections: Mapping[str, int] = field(default_factory=dict)
    queue_depth: int = 0
    running_loops: int = 0
    executing: bool = False
    kv_slabs_free: int | None = None
    kv_slabs_capacity: int | None = None
    server_tasks: int = 0
    sse_streams: int = 0
    peers: int = 0
    compiles_after_ready: Mapping[str, int] = field(default_factory=dict)


class BatchReport(Protocol):
    """What the engine reports per finished batch (``runtime.observers.BatchReport``)."""

    @property
    def kind(self) -> str: ...

    @property
    def wall_s(self) -> float: ...

    @property
    def step_wall_s(self) -> Sequence[float]: ...

    @property
    def failed(self) -> int: ...

    @property
    def deadlines_missed(self) -> int: ...


class _Totals:
    """Session-side totals as ``Counter``s: each scrape advances them to the sessions' own
    totals. Not registered in the registry: the snapshot collector yields them after the
    advance, so a scrape never shows a stale total."""

    def __init__(self) -> None:
        self.frames_sent = Counter(
            "dreamrt_frames_sent",
            "Video frames put on the wire (fresh and repeated)",
            registry=None,
        )
        self.stalls = Counter(
            "dreamrt_stalls", "Frames repeated because generation was late", registry=None
        )
        self.media_dropped = Counter(
            "dreamrt_media_dropped_frames", "Frames dropped by full media queues", registry=None
        )
        self.media_flushed = Counter(
            "dreamrt_media_flushed_frames",
            "Frames generated but never shown: the backlog an input that changes the picture "
            "flushed so it shows at once (generation thrown away: steering's price)",
            registry=None,
        )
        self.rejections = Counter(
            "dreamrt_admission_rejections",
            "Sessions refused by admission",
            ["reason"],
            registry=None,
        )
        self._seen: dict[tuple[str, str], float] = {}

    def advance(self, s: MetricsSnapshot) -> None:
        self._advance("frames_sent", "", self.frames_sent, s.frames_sent)
        self._advance("stalls", "", self.stalls, s.stalls)
        self._advance("media_dropped", "", self.media_dropped, s.media_dropped)
        self._advance("media_flushed", "", self.media_flushed, s.media_flushed)
        for reason, count in sorted(s.admission_rejections.items()):
            self._advance("rejections", reason, self.rejections.labels(reason), count)

    def collect(self) -> Iterator[Metric]:
        counters = (
            self.frames_sent,
            self.stalls,
            self.media_dropped,
            self.media_flushed,
            self.rejections,
        )
        for counter in counters:
            yield from counter.collect()

    def _advance(self, name: str, label: str, counter: Counter, total: float) -> None:
        seen = self._seen.get((name, label), 0.0)
        if total < seen:  # a session total never decreases; a drop is a bug upstream
            log.warning("metrics: %s%s went down from %s to %s", name, label, seen, total)
            return
        if total > seen:
            counter.inc(total - seen)
            self._seen[(name, label)] = total


class _SnapshotCollector:
    def __init__(self, snapshot_fn: Callable[[], MetricsSnapshot], totals: _Totals) -> None:
        self._snapshot_fn = snapshot_fn
        self._totals = totals

    def collect(self) -> Iterator[Metric]:
        s = self._snapshot_fn()
        self._totals.advance(s)
        yield from self._totals.collect()
        sessions = GaugeMetricFamily(
            "dreamrt_sessions", "Sessions by lifecycle state", labels=["state"]
        )
        for state, count in sorted(s.sessions_by_state.items()):
            sessions.add_metric([state], count)
        yield sessions
        jobs = GaugeMetricFamily("dreamrt_jobs", "Jobs by lifecycle state", labels=["state"])
        for state, count in sorted(s.jobs_by_state.items()):
            jobs.add_metric([state], count)
        yield jobs
        yield GaugeMetricFamily(
            "dreamrt_scheduler_queue_depth", "Plans waiting in the scheduler", value=s.queue_depth
        )
        yield GaugeMetricFamily(
            "dreamrt_engine_running_loops", "Loops the engine is driving", value=s.running_loops
        )
        yield GaugeMetricFamily(
            "dreamrt_engine_executing",
            "1 while a batch runs on the executor",
            value=int(s.executing),
        )
        if s.kv_slabs_capacity is not None:
            yield GaugeMetricFamily(
                "dreamrt_kv_slabs_capacity", "Chunk-KV slabs in the pool", value=s.kv_slabs_capacity
            )
            yield GaugeMetricFamily(
                "dreamrt_kv_slabs_free", "Free chunk-KV slabs", value=s.kv_slabs_free or 0
            )
        yield GaugeMetricFamily(
            "dreamrt_server_tasks", "Background tasks owned by the server", value=s.server_tasks
        )
        yield GaugeMetricFamily(
            "dreamrt_sse_streams", "Open Server-Sent Event streams", value=s.sse_streams
        )
        yield GaugeMetricFamily("dreamrt_webrtc_peers", "Viewer peer connections", value=s.peers)
        compiles = CounterMetricFamily(
            "dreamrt_compiles_after_ready",
            "Compiles and CUDA-graph captures after ready, and calls run eagerly outside the "
            "compiled set (distinct shapes)",
            labels=["kind"],
        )
        for kind in COMPILE_KINDS:
            compiles.add_metric([kind], s.compiles_after_ready.get(kind, 0))
        yield compiles


class ServerMetrics:
    """One app's registry: engine-fed counters and histogram (``batch_done``, called by the
    engine on the event loop) plus live state rendered from ``snapshot_fn()`` at every scrape."""

    def __init__(self, snapshot_fn: Callable[[], MetricsSnapshot]) -> None:
        self.registry = CollectorRegistry(auto_describe=False)
        r = self.registry
        self.steps = Counter("dreamrt_steps", "Plans executed by kind", ["kind"], registry=r)
        self.step_latency = Histogram(
            "dreamrt_step_latency_seconds",
            "Wall time of the run that produced each executed plan's output",
            ["kind"],
            buckets=STEP_LATENCY_BUCKETS_S,
            registry=r,
        )
        self.plans_executed = Counter("dreamrt_engine_plans_executed", "Plans executed", registry=r)
        self.batches = Counter(
            "dreamrt_engine_batches",
            "Executor calls by plan kind (several plans run as one batch count once)",
            ["kind"],
            registry=r,
        )
        self.batch_seconds = Counter(
            "dreamrt_engine_batch_seconds",
            "Wall seconds of the executor's calls by plan kind, each batch once: where the "
            "device's time goes",
            ["kind"],
            registry=r,
        )
        self.plan_failures = Counter(
            "dreamrt_engine_plan_failures", "Plans that failed (exception or NaN)", registry=r
        )
        self.deadline_misses = Counter(
            "dreamrt_engine_deadline_misses", "Realtime plans that finished late", registry=r
        )
        self.input_latency = Histogram(
            "dreamrt_input_latency_seconds",
            "Seconds from an input's receipt to each stage until its first frame was sent",
            ["kind", "stage"],
            buckets=STEER_LATENCY_BUCKETS_S,
            registry=r,
        )
        self.first_frame = Histogram(
            "dreamrt_first_frame_seconds",
            "Seconds from a session's creation to each stage until its first frame was sent",
            ["stage"],
            buckets=STEER_LATENCY_BUCKETS_S,
            registry=r,
        )
        self.loop_stalls = Histogram(
            "dreamrt_event_loop_stall_seconds",
            "Times the event loop stood still for 0.5 s or more, and for how long",
            buckets=STALL_BUCKETS_S,
            registry=r,
        )
        r.register(_SnapshotCollector(snapshot_fn, _Totals()))

    def loop_stalled(self, seconds: float) -> None:
        """The event loop stood still for ``seconds`` (``server.ops.loop_watchdog``; on the
        loop)."""
        self.loop_stalls.observe(seconds)

    def watch(self, session: Any) -> None:
        """Observe ``session``'s time-to-steer events (a sink on its event stream)."""
        session.events.add_sink(self.session_event)

    def session_event(self, event: Event) -> None:
        """An event of a watched session (event loop; must not block)."""
        if isinstance(event, InputShown):
            for stage in INPUT_STAGES:
                value = getattr(event.latency, f"{stage}_s")
                if value is not None:
                    self.input_latency.labels(event.kind, stage).observe(value)
        elif isinstance(event, ViewerFirstFrame):
            for stage in FIRST_FRAME_STAGES:
                value = getattr(event.latency, f"{stage}_s")
                if value is not None:
                    self.first_frame.labels(stage).observe(value)

    def batch_done(self, report: BatchReport) -> None:
        """The engine finished a batch (event loop; must not block)."""
        steps = len(report.step_wall_s)
        self.batches.labels(report.kind).inc()
        self.batch_seconds.labels(report.kind).inc(max(report.wall_s, 0.0))
        if steps:
            self.steps.labels(report.kind).inc(steps)
            self.plans_executed.inc(steps)
            latency = self.step_latency.labels(report.kind)
            for wall_s in report.step_wall_s:
                latency.observe(wall_s)
        if report.failed:
            self.plan_failures.inc(report.failed)
        if report.deadlines_missed:
            self.deadline_misses.inc(report.deadlines_missed)

    def render(self) -> bytes:
        return generate_latest(self.registry)
