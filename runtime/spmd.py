"""SPMD execution over a process group: rank 0 schedules, every rank runs the same batches.

One model instance spans the ranks of a node (e.g. a DiT under sequence parallelism, whose
ops contain collectives). Only rank 0 runs an ``Engine``: loops, scheduler, admission and the
server live there. Each batch its executor is about to run is its *decision*; ``Leader``
publishes it, and every other rank's ``Follower`` receives it and runs the same op on the same
arguments, so the collectives inside meet::

    rank 0: Engine -> Leader.run_job(job) --publish(job)--> op(args) --agree--> outcome
    rank r: Follower.serve(): receive(job) ----------------> op(args) --agree--> (logged)

**Arguments travel as references where they can** (``Channel``): a tensor that is a view of
one of the model's rank-local buffers (``model.rank_local_buffers()``: name -> tensor, the same
names and shapes on every rank, e.g. the head-sharded K/V slabs) travels as (name, offset,
shape, stride) and resolves to the same view of the follower's own buffer; any other tensor on
the channel's device is sent once (``dist.broadcast``) and then by key while it lives on rank 0
unmodified (its ``_version``); a tensor freed on rank 0 is dropped on the followers with the
next message. Everything else is pickled. So a prompt's cross-attention K/V cross once, the
K/V cache never, a chunk's latents every step (small).

**Leader-only ops** (``op.spmd == "leader"``: decode, text encode - no collectives, and only
rank 0 emits) are not published; followers never run them.

**Failures agree** (``agree``): after every attempt each rank contributes its failure bits per
plan; any rank's failure is every rank's (message prefixed ``rank r:``), so the executor's
solo re-runs happen on all ranks alike and the engine fails the affected loop - one session -
while the others go on. A rank that dies or raises *inside* a collective cannot be agreed on:
the process group times out or aborts and the whole world stops (every session fails).

Layering: this module knows ``torch.distributed`` and the executor, nothing of models; the
model's buffers are duck-typed, its ops are ``StepOp``s found by ``name``.
"""

from __future__ import annotations

import io
import logging
import pickle
import threading
import time
import weakref
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Literal, Protocol

import torch
import torch.distributed as dist

from runtime.executor import ExecJob, Executor, JobOutcome, _Attempt
from runtime.observers import BatchInfo, Observer, PlanFault
from runtime.plans import StepOp

__all__ = ["Channel", "Follower", "Leader", "leader_only", "model_ops"]

logger = logging.getLogger(__name__)

_STOP = "stop"

# A tensor's persistent id in a published message: a view of a rank-local buffer (name, storage
# offset, shape, stride), one the followers hold already (key), or one sent after the message
# (key, its index among the message's tensors).
_LocalId = tuple[Literal["local"], str, int, tuple[int, ...], tuple[int, ...]]
_TensorId = _LocalId | tuple[Literal["ref"], int] | tuple[Literal["val"], int, int]
# What ``Leader.run_job`` publishes: the batch, its op's name, the plans' args and flops.
_Published = tuple[BatchInfo, str, tuple[object, ...], tuple[float, ...]]
# One rank's failures of an attempt (``Channel.agree``): its error and its plans' faults.
_Failures = tuple[tuple[str, str] | None, dict[int, tuple[str, str]]]


class _Engine(Protocol):
    """An engine whose executor ``Leader.install`` replaces (``runtime.engine.Engine``)."""

    executor: Executor


def leader_only(op: StepOp) -> bool:
    return op.spmd == "leader"


def _version(t: torch.Tensor) -> int:
    # inference tensors keep no version counter; torch forbids changing them in place outside
    # inference mode, i.e. outside ops - and ops change them alike on every rank
    return -1 if t.is_inference() else t._version


def model_ops(model: object) -> dict[str, StepOp]:
    """The step ops a model exposes (attributes named ``*_op``), by their ``name``."""
    return {op.name: op for key, op in vars(model).items() if key.endswith("_op")}


class _TensorPickler(pickle.Pickler):
    """A pickler that hands each object to ``ident`` first: a tuple it returns is written as
    the object's persistent id (``Channel._tensor_id``), ``None`` pickles it as usual."""

    def __init__(self, file: io.BytesIO, ident: Callable[[object], _TensorId | None]) -> None:
        super().__init__(file, protocol=pickle.HIGHEST_PROTOCOL)
        self._ident = ident

    def persistent_id(self, obj: object) -> _TensorId | None:
        return self._ident(obj)


class _TensorUnpickler(pickle.Unpickler):
    """The other end: ``resolve`` turns each persistent id back into its tensor."""

    def __init__(self, payload: bytes, resolve: Callable[[_TensorId], torch.Tensor]) -> None:
        super().__init__(io.BytesIO(payload))
        self._resolve = resolve

    def persistent_load(self, pid: _TensorId) -> torch.Tensor:
        return self._resolve(pid)


class Channel:
    """Broadcast of decisions from rank ``src`` (module docstring: how tensors travel)."""

    def __init__(
        self,
        *,
        group: dist.ProcessGroup | None = None,
        device: torch.device | str = "cpu",
        local_buffers: Mapping[str, torch.Tensor] | None = None,
        src: int = 0,
    ) -> None:
        self.group = group
        self.device = torch.device(device)
        self.src = src
        self.rank = dist.get_rank(group)
        self.size = dist.get_world_size(group)
        self.local = dict(local_buffers or {})
        self._ptrs = {b.untyped_storage().data_ptr(): n for n, b in self.local.items()}
        # leader: id(tensor) -> (key, weakref, version); follower: key -> tensor
        self._sent: dict[int, tuple[int, weakref.ref[torch.Tensor], int]] = {}
        self._held: dict[int, torch.Tensor] = {}
        self._dropped: list[int] = []
        self._lock = threading.RLock()  # weakref callbacks may fire inside _tensor_id
        self._next_key = 0

    # -- leader ----------------------------------------------------------------------------

    def publish(self, message: object) -> None:
        outgoing: list[torch.Tensor] = []
        buf = io.BytesIO()
        _TensorPickler(buf, lambda obj: self._tensor_id(obj, outgoing)).dump(message)
        with self._lock:
            dropped, self._dropped = self._dropped, []
        metas = [(tuple(t.shape), t.dtype) for t in outgoing]
        dist.broadcast_object_list([buf.getvalue(), metas, dropped], self.src, group=self.group)
        for t in outgoing:
            dist.broadcast(t.contiguous(), self.src, group=self.group)

    def _tensor_id(self, obj: object, outgoing: list[torch.Tensor]) -> _TensorId | None:
        if not isinstance(obj, torch.Tensor):
            return None
        name = self._ptrs.get(obj.untyped_storage().data_ptr())
        if name is not None:
            view: _LocalId = (
                "local",
                name,
                int(obj.storage_offset()),
                tuple(obj.shape),
                obj.stride(),
            )
            return view
        if obj.device.type != self.device.type:
            return None  # pickled inline (a CPU tensor on a CUDA channel)
        with self._lock:
            entry = self._sent.get(id(obj))
            if entry is not None and entry[1]() is obj and entry[2] == _version(obj):
                return ("ref", entry[0])
            if entry is not None:  # modified in place (or a new tensor at a reused id)
                self._forget(entry[0])
            key, self._next_key = self._next_key, self._next_key + 1
            ident = id(obj)
            ref = weakref.ref(obj, lambda _ref: self._freed(ident, key))
            self._sent[ident] = (key, ref, _version(obj))
        outgoing.append(obj)
        return ("val", key, len(outgoing) - 1)

    def _freed(self, ident: int, key: int) -> None:
        with self._lock:
            entry = self._sent.get(ident)
            if entry is not None and entry[0] == key:
                del self._sent[ident]
            self._forget(key)

    def _forget(self, key: int) -> None:
        with self._lock:
            self._dropped.append(key)

    # -- follower --------------------------------------------------------------------------

    def receive(self) -> object:  # what the leader published: the follower unpacks it
        box: list[object] = [None, None, None]
        dist.broadcast_object_list(box, self.src, group=self.group)
        payload, metas, dropped = box
        assert isinstance(payload, bytes) and isinstance(metas, list)
        assert isinstance(dropped, list)
        fresh = []
        for shape, dtype in metas:
            t = torch.empty(shape, dtype=dtype, device=self.device)
            dist.broadcast(t, self.src, group=self.group)
            fresh.append(t)
        for key in dropped:
            self._held.pop(key, None)
        return _TensorUnpickler(payload, lambda pid: self._resolve(pid, fresh)).load()

    def _resolve(self, pid: _TensorId, fresh: list[torch.Tensor]) -> torch.Tensor:
        match pid:
            case ("local", name, offset, shape, stride):
                return self.local[name].as_strided(shape, stride, offset)
            case ("val", key, index):
                self._held[key] = fresh[index]
                return self._held[key]
            case ("ref", key):
                return self._held[key]

    @property
    def held(self) -> int:
        """Tensors a follower holds for the leader (for tests and metrics)."""
        return len(self._held)

    # -- both --------------------------------------------------------------------------------

    def agree(self, attempt: _Attempt, plans: int) -> _Attempt:
        """Every rank's failures become everyone's (module docstring)."""
        flags = torch.zeros(plans + 1, dtype=torch.int32, device=self.device)
        flags[0] = attempt.error is not None
        for index in attempt.faults:
            flags[1 + index] = 1
        rows = [torch.empty_like(flags) for _ in range(self.size)]
        dist.all_gather(rows, flags, group=self.group)
        if not any(bool(r.any()) for r in rows):
            return attempt
        mine: _Failures = (
            attempt.error,
            {i: (f.code, f.message) for i, f in attempt.faults.items()},
        )
        theirs = [mine] * self.size  # every rank's, once gathered
        dist.all_gather_object(theirs, mine, group=self.group)
        for rank, (error, _) in enumerate(theirs):
            if error is not None:
                code, message = error
                return _Attempt(None, (code, f"rank {rank}: {message}"), {}, attempt.wall_s, None)
        faults: dict[int, PlanFault] = {}
        for rank, (_, found) in enumerate(theirs):
            for index, (code, message) in sorted(found.items()):
                faults.setdefault(index, PlanFault(index, code, f"rank {rank}: {message}"))
        return _Attempt(attempt.outputs, None, faults, attempt.wall_s, attempt.device_s)


class _AgreeingExecutor(Executor):
    """An executor whose attempts end with ``Channel.agree`` (for ops every rank runs)."""

    channel: Channel

    def _attempt(self, info: BatchInfo, op: StepOp, args: Sequence[object]) -> _Attempt:
        attempt = super()._attempt(info, op, args)
        return attempt if leader_only(op) else self.channel.agree(attempt, len(args))


class Leader(_AgreeingExecutor):
    """Rank 0's executor: publishes each batch before running it, and a stop when it stops.
    ``Leader.install(engine, channel)`` swaps it into an engine that has not started."""

    def __init__(
        self,
        channel: Channel,
        *,
        observers: Sequence[Observer] = (),
        deterministic: bool = False,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        super().__init__(observers=observers, deterministic=deterministic, clock=clock)
        self.channel = channel
        self.published: list[tuple[int, str, tuple[str, ...]]] = []

    @classmethod
    def install(cls, engine: _Engine, channel: Channel) -> Leader:
        old = engine.executor
        leader = cls(
            channel, observers=old.observers, deterministic=old.deterministic, clock=old._clock
        )
        engine.executor = leader
        return leader

    def run_job(self, job: ExecJob) -> JobOutcome:
        if not leader_only(job.op):
            name = job.op.name
            published: _Published = (job.info, name, job.args, job.plan_flops)
            self.channel.publish(published)
            self.published.append((job.info.batch_id, name, job.info.loop_ids))
        return super().run_job(job)

    def _main(self) -> None:
        try:
            super()._main()
        finally:
            self.channel.publish(_STOP)


@dataclass(frozen=True, slots=True)
class FollowedBatch:
    """What a follower ran: the batch and, per plan, the agreed failure (None: succeeded)."""

    batch_id: int
    op_name: str
    loop_ids: tuple[str, ...]
    failures: tuple[tuple[str, str] | None, ...]


class Follower(_AgreeingExecutor):
    """A rank other than 0: runs what the leader publishes until it publishes a stop.

    ``ops``: the model's step ops by name (``model_ops``). ``on_batch`` hears every batch run
    (the log of decisions and agreed failures)."""

    def __init__(
        self,
        channel: Channel,
        ops: Mapping[str, StepOp],
        *,
        observers: Sequence[Observer] = (),
        on_batch: Callable[[FollowedBatch], None] | None = None,
        deterministic: bool = False,
    ) -> None:
        super().__init__(observers=observers, deterministic=deterministic)
        self.channel = channel
        self.ops = dict(ops)
        self.on_batch = on_batch

    def serve(self) -> int:
        """Run published batches until the stop; returns how many ran."""
        count = 0
        while (message := self.channel.receive()) != _STOP:
            info, name, args, flops = _published(message)
            job = ExecJob(info, self.ops[name], args, flops)
            outcome = self.run_job(job)
            count += 1
            if self.on_batch is not None:
                failures = tuple(p.failure for p in outcome.plans)
                self.on_batch(FollowedBatch(info.batch_id, name, info.loop_ids, failures))
        logger.info("rank %d: the leader stopped after %d batches", self.channel.rank, count)
        return count


def _published(message: object) -> _Published:
    """A received message as the batch ``Leader.run_job`` published."""
    match message:
        case (BatchInfo() as info, str(name), tuple(args), tuple(flops)):
            return info, name, args, flops
    raise TypeError(f"the leader published {type(message).__name__}, not a batch")
