"""The live objects of one running server (``ServerContext``), built by the lifespan
(``server.app``) and reached by the routes through ``request.app.state.ctx``
(``server.api.deps.ctx_of``)."""

from __future__ import annotations

import asyncio
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from server.config.serve import ServerConfig
from server.edge.auth import Authenticator
from server.live.frame_pacer import FramePacer
from server.livekit.participant import LiveKitParticipant
from server.livekit.room import LiveKitRoom, RoomConnection
from server.livekit.token import LiveKitCredentials
from server.media.job_preview import JobPreviewPeer
from server.media.webrtc import ViewerPeer
from server.ops.heap_trim import HeapTrim
from server.ops.memory_watch import MemoryWatch
from server.ops.metrics import MetricsSnapshot, ServerMetrics
from sessions.forks import Forks
from sessions.host import SessionHost
from sessions.job_host import JobHost
from sessions.resume import Resumer
from sessions.session import Session
from sessions.store import Store
from sessions.trainer_controls import TrainerControls

if TYPE_CHECKING:
    from runtime.engine import Engine
    from runtime.faults import FaultInjector
    from server.fleet.worker import FleetWorker
    from server.media.whep import WhepResources
    from server.ops.trace import ExecutorTrace

__all__ = ["ServerContext"]


@dataclass
class ServerContext:
    """The live objects of one running server (built by the lifespan)."""

    config: ServerConfig
    store: Store
    engine: Engine
    host: SessionHost
    jobs: JobHost
    auth: Authenticator
    metrics: ServerMetrics
    device: str
    model_id: str
    forks: Forks  # a ForkRegistry; under --gpus N a stand-in that refuses forks
    trainer: TrainerControls
    resumer: Resumer
    faults: FaultInjector | None = None  # with --fault-injection
    trace: ExecutorTrace | None = None  # POST /v1/profile (server.ops.trace)
    heap: HeapTrim | None = None
    memory: MemoryWatch | None = None  # $DREAMRT_DEBUG_MEMORY: the heap's growers, logged
    peers: dict[str, ViewerPeer] = field(default_factory=dict)
    job_peers: set[JobPreviewPeer] = field(default_factory=set)
    undo: list[Callable[[], None]] = field(default_factory=list)
    rooms: dict[str, LiveKitParticipant] = field(default_factory=dict)
    pacers: dict[str, FramePacer] = field(default_factory=dict)
    sse_streams: Counter[str] = field(default_factory=Counter)  # open event streams by session
    room_factory: Callable[[], RoomConnection] = LiveKitRoom
    engine_id: str = ""
    public_url: str = ""
    draining: bool = False  # leaving the fleet: the card says so, the fleet worker unregistered
    fleet: FleetWorker | None = None  # with --fleet
    whep: WhepResources | None = None  # made by the first WHEP request
    # what the instance compiled after ready (models.compile_guard; {} for a non-Wan instance)
    compiles_after_ready: Callable[[], dict[str, int]] = dict

    @property
    def livekit_credentials(self) -> LiveKitCredentials:
        return LiveKitCredentials.resolve(self.config.livekit_key, self.config.livekit_secret)

    def pacer_for(self, session: Session) -> FramePacer:
        """The one pacer of ``session``'s video, shared by its WebRTC viewer and LiveKit sink."""
        for sid in [sid for sid, p in self.pacers.items() if p.session.terminal]:
            del self.pacers[sid]
        pacer = self.pacers.get(session.id)
        if pacer is None or pacer.session is not session:
            pacer = self.pacers[session.id] = FramePacer(session)
            # gone with the session, not at the next pacer_for: it holds the session (its event
            # history, its last frame) and the node may stay idle for hours
            session.loop_watch.on_finished(lambda: self._pacer_ended(pacer))
        return pacer

    def _pacer_ended(self, pacer: FramePacer) -> None:
        if self.pacers.get(pacer.session.id) is pacer:
            del self.pacers[pacer.session.id]

    def open_room(
        self, session: Session, *, url: str, room: str, token: str, **options: Any
    ) -> LiveKitParticipant:
        """Starts ``session``'s LiveKit participant (joins in the background)."""
        participant = LiveKitParticipant(
            session,
            self.room_factory(),
            url=url,
            room_name=room,
            token=token,
            pacer=self.pacer_for(session),
            store=self.store,
            control_rate_per_s=self.config.limits.control_rate_per_s,
            on_closed=self._room_closed,
            **options,
        )
        self.rooms[session.id] = participant
        participant.start()
        return participant

    def _room_closed(self, participant: LiveKitParticipant) -> None:
        if self.rooms.get(participant.session.id) is participant:
            del self.rooms[participant.session.id]

    def open_peer(self, session: Session) -> ViewerPeer:
        """A new viewer peer for ``session`` (the caller closes any previous one first)."""
        peer = ViewerPeer(
            session,
            store=self.store,
            ice_servers=self.config.ice_servers,
            limits=self.config.limits,
            on_closed=self._peer_closed,
            pacer=self.pacer_for(session),
        )
        self.peers[session.id] = peer
        return peer

    def _peer_closed(self, peer: ViewerPeer) -> None:
        if self.peers.get(peer.session.id) is peer:
            del self.peers[peer.session.id]

    def metrics_snapshot(self) -> MetricsSnapshot:
        counts = self.host.counts()
        stats = self.engine.stats()
        slabs_free, slabs_capacity = self.host.slab_counts()
        return MetricsSnapshot(
            sessions_by_state=counts["sessions_by_state"],
            jobs_by_state=self.jobs.counts(),
            frames_sent=counts["frames_sent"],
            stalls=counts["stalls"],
            media_dropped=counts["media_dropped"],
            media_flushed=counts["media_flushed"],
            admission_rejections=counts["rejections"],
            queue_depth=stats.queue_depth,
            running_loops=stats.running_loops,
            executing=stats.executing,
            kv_slabs_free=slabs_free,
            kv_slabs_capacity=slabs_capacity,
            server_tasks=self.server_tasks(),
            sse_streams=sum(self.sse_streams.values()),
            peers=len(self.peers),
            compiles_after_ready=self.compiles_after_ready(),
        )

    def server_tasks(self) -> int:
        """Background tasks the server owns now: peers' tasks, loop drivers, session watchers."""
        names = ("dreamrt-loop-", "session-", "job-", "peer-")
        try:
            tasks = asyncio.all_tasks()
        except RuntimeError:
            return 0
        return sum(1 for t in tasks if not t.done() and t.get_name().startswith(names))
