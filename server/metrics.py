"""Prometheus metrics (``GET /metrics``), collected from live state at scrape time.

Nothing is counted twice: at each scrape a ``MetricsSnapshot`` is taken from the sessions,
jobs and engine (the composition root supplies ``snapshot_fn``) and rendered into a private
``CollectorRegistry``, so several apps in one process (tests) never share series.

Series (all prefixed ``dreamrt_``): ``sessions{state}``, ``jobs{state}``,
``frames_sent_total``, ``stalls_total``, ``media_dropped_frames_total``,
``admission_rejections_total{reason}``, ``scheduler_queue_depth``, ``engine_running_loops``, ``engine_executing``,
``engine_plans_executed_total``, ``engine_deadline_misses_total``,
``step_latency_seconds{kind,quantile}`` (median and p95 of the engine's recent samples) with
``steps_total{kind}``, ``kv_slabs_free`` / ``kv_slabs_capacity``, and ``server_tasks`` (background
tasks the server owns: 0 when idle).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

__all__ = ["CONTENT_TYPE", "MetricsSnapshot", "ServerMetrics"]

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"


@dataclass(frozen=True, slots=True)
class MetricsSnapshot:
    sessions_by_state: Mapping[str, int] = field(default_factory=dict)
    jobs_by_state: Mapping[str, int] = field(default_factory=dict)
    frames_sent: int = 0
    stalls: int = 0
    media_dropped: int = 0
    admission_rejections: Mapping[str, int] = field(default_factory=dict)
    queue_depth: int = 0
    running_loops: int = 0
    executing: bool = False
    plans_executed: int = 0
    deadline_misses: int = 0
    step_latency_s: Mapping[str, Sequence[float]] = field(
        default_factory=dict
    )  # kind -> recent samples
    steps_by_kind: Mapping[str, int] = field(default_factory=dict)
    kv_slabs_free: int | None = None
    kv_slabs_capacity: int | None = None
    server_tasks: int = 0


def _quantile(samples: Sequence[float], q: float) -> float:
    ordered = sorted(samples)
    index = min(len(ordered) - 1, max(0, round(q * (len(ordered) - 1))))
    return ordered[index]


class _SnapshotCollector:
    def __init__(self, snapshot_fn: Callable[[], MetricsSnapshot]) -> None:
        self._snapshot_fn = snapshot_fn

    def collect(self) -> Iterator[Metric]:
        s = self._snapshot_fn()
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
        yield CounterMetricFamily(
            "dreamrt_frames_sent",
            "Video frames put on the wire (fresh and repeated)",
            value=s.frames_sent,
        )
        yield CounterMetricFamily(
            "dreamrt_stalls", "Frames repeated because generation was late", value=s.stalls
        )
        yield CounterMetricFamily(
            "dreamrt_media_dropped_frames",
            "Frames dropped by full media queues",
            value=s.media_dropped,
        )
        rejections = CounterMetricFamily(
            "dreamrt_admission_rejections", "Sessions refused by admission", labels=["reason"]
        )
        for reason, count in sorted(s.admission_rejections.items()):
            rejections.add_metric([reason], count)
        yield rejections
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
        yield CounterMetricFamily(
            "dreamrt_engine_plans_executed", "Plans executed", value=s.plans_executed
        )
        yield CounterMetricFamily(
            "dreamrt_engine_deadline_misses",
            "Realtime plans that finished late",
            value=s.deadline_misses,
        )
        latency = GaugeMetricFamily(
            "dreamrt_step_latency_seconds",
            "Step latency of recent plans",
            labels=["kind", "quantile"],
        )
        for kind, samples in sorted(s.step_latency_s.items()):
            if samples:
                latency.add_metric([kind, "0.5"], _quantile(samples, 0.5))
                latency.add_metric([kind, "0.95"], _quantile(samples, 0.95))
        yield latency
        steps = CounterMetricFamily("dreamrt_steps", "Plans executed by kind", labels=["kind"])
        for kind, count in sorted(s.steps_by_kind.items()):
            steps.add_metric([kind], count)
        yield steps
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


class ServerMetrics:
    """A private registry rendering ``snapshot_fn()`` at every scrape."""

    def __init__(self, snapshot_fn: Callable[[], MetricsSnapshot]) -> None:
        self.registry = CollectorRegistry(auto_describe=False)
        self.registry.register(_SnapshotCollector(snapshot_fn))

    def render(self) -> bytes:
        return generate_latest(self.registry)
