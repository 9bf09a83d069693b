"""CUDA graphs of the DiT's steady-state chunk forward: the denoise steps and the KV-update pass.

Once a stream's K/V cache is full, every denoising step of every chunk has the same shapes and
reads the same memory - the whole cache of its slab - so one graph replay can stand in for
the ~30 x 15 kernel launches of ``WanDiT._chunk_body`` (``WanInstance.compile(cuda_graphs=True)``
sets ``WanDiT.chunk_graphs`` to a ``ChunkGraphs``). Graphs bake in addresses, so they are keyed
by everything a replay reads or writes that is not copied in::

    slot  = (shape signature, the cache's K and V addresses)     static inputs of the slot:
            latents, timestep, RoPE cos/sin, cross-attention K/V, action, audio
    graph = slot + the K/V writes (``runs``: which ring slots the KV update overwrites)

    instance K/V buffer:   | slab 0 | slab 1 | slab 2 | ...
    session on slab 1  ->  slot (sig, &slab1.k, &slab1.v): graphs {(): denoise step,
                                                          (R0,): KV update into ring slots 0-2,
                                                          (R3,): ... (R6,): ...}

so sessions alternating between slabs each replay graphs that read and write exactly their own
slab, and a KV update into ring position 3 never replays the write of position 0. Per replay the
call's tensors are copied into the slot's static inputs (the cross-attention K/V only when the
call carries another prompt's: object identity, the slot holds a reference so the identity
cannot be recycled) and the output is cloned out of the graph's pool.

What runs eagerly instead (counted in ``stats``): non-CUDA devices, grad mode, masked attention
or a cache still filling (``past_tokens`` below its capacity: shapes change chunk by chunk),
and the first call of each shape signature, which runs on the capture stream so that
``torch.compile``, cuBLAS and the attention kernels initialise before any capture. A capture
that fails disables graphs for this runner (logged) and the call runs eagerly: never a crash.

A replay runs the kernels the eager call would have run on the same inputs: frames are
bit-identical (the GPU session bench checks it). All graphs share one memory pool: they run one
at a time on the executor's stream and keep their own static inputs and outputs.
"""

from __future__ import annotations

import logging
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Protocol

import torch

if TYPE_CHECKING:
    from torch.cuda import _POOL_HANDLE  # (torch's own name for a graph memory pool)

from models.wan.dit.transformer import ChunkCall, CrossKV

__all__ = ["ChunkGraphs", "GraphRecorder", "CudaRecorder", "ineligible"]

log = logging.getLogger(__name__)

Body = Callable[[ChunkCall], torch.Tensor]


class Graph(Protocol):
    def replay(self) -> torch.Tensor:
        """Run the captured work again; -> its (static) output."""
        ...


class GraphRecorder(Protocol):
    """How graphs are made: ``CudaRecorder`` in serving; tests substitute a recorder whose
    "graph" re-runs the body on the captured (static) call."""

    def supports(self, device: torch.device) -> bool: ...

    def warm(self, body: Body, call: ChunkCall) -> torch.Tensor: ...

    def capture(self, body: Body, call: ChunkCall) -> Graph: ...


@dataclass
class _CudaGraph:
    graph: torch.cuda.CUDAGraph
    out: torch.Tensor

    def replay(self) -> torch.Tensor:
        self.graph.replay()
        return self.out


class CudaRecorder:
    """``torch.cuda.CUDAGraph`` capture on a private stream, all graphs in one memory pool."""

    def __init__(self) -> None:
        self._stream: torch.cuda.Stream | None = None
        self._pool: _POOL_HANDLE | None = None

    def supports(self, device: torch.device) -> bool:
        return device.type == "cuda" and torch.cuda.is_available()

    def _side(self, device: torch.device) -> torch.cuda.Stream:
        if self._stream is None:
            self._stream = torch.cuda.Stream(device)
            self._pool = torch.cuda.graph_pool_handle()
        return self._stream

    def warm(self, body: Body, call: ChunkCall) -> torch.Tensor:
        # the eager call on the capture stream (lazy initialisation happens off-capture)
        side, main = self._side(call.x.device), torch.cuda.current_stream(call.x.device)
        side.wait_stream(main)
        with torch.cuda.stream(side):
            out = body(call)
        main.wait_stream(side)
        out.record_stream(main)
        return out

    def capture(self, body: Body, call: ChunkCall) -> Graph:
        side = self._side(call.x.device)
        graph = torch.cuda.CUDAGraph()
        # thread_local: other threads (the event loop polling a decode's event, say) stay free
        # to call CUDA while the executor thread captures
        with torch.cuda.graph(
            graph, pool=self._pool, stream=side, capture_error_mode="thread_local"
        ):
            out = body(call)
        return _CudaGraph(graph, out)


def ineligible(call: ChunkCall) -> str | None:
    """Why ``call`` runs eagerly rather than from a graph (None: it may be graphed)."""
    if torch.is_grad_enabled():
        return "grad mode"
    if call.mask is not None:
        return "masked attention"
    capacity = call.cache.capacity_frames * call.cache.tokens_per_frame
    if call.past_tokens != capacity:
        return "cache not full"
    return None


def _shape(t: torch.Tensor | None) -> tuple | None:
    return None if t is None else (tuple(t.shape), t.stride(), t.dtype)


def _signature(call: ChunkCall) -> tuple:
    return (
        _shape(call.x),
        _shape(call.timestep),
        _shape(call.cos),
        _shape(call.cross.k),
        _shape(call.action),
        _shape(call.audio),
        call.past_tokens,
        _shape(call.cache.k),
    )


def _static(t: torch.Tensor | None) -> torch.Tensor | None:
    return None if t is None else torch.empty_like(t)


@dataclass
class _Slot:
    """Static inputs of one (shape signature, cache) and its graphs, one per K/V-write plan."""

    call: ChunkCall  # the static call every graph of this slot was captured with
    graphs: dict[tuple, Graph] = field(default_factory=dict)
    cross_src: CrossKV | None = None

    @classmethod
    def for_call(cls, call: ChunkCall) -> _Slot:
        static = replace(
            call,
            x=torch.empty_like(call.x),
            timestep=torch.empty_like(call.timestep),
            cross=CrossKV(torch.empty_like(call.cross.k), torch.empty_like(call.cross.v)),
            cos=torch.empty_like(call.cos),
            sin=torch.empty_like(call.sin),
            action=_static(call.action),
            audio=_static(call.audio),
            runs=(),
        )
        return cls(static)

    def load(self, call: ChunkCall) -> None:
        s = self.call
        for dst, src in (
            (s.x, call.x),
            (s.timestep, call.timestep),
            (s.cos, call.cos),
            (s.sin, call.sin),
            (s.action, call.action),
            (s.audio, call.audio),
        ):
            if dst is not None:
                assert src is not None  # a slot's buffers are those its key's calls have
                dst.copy_(src)
        if call.cross is not self.cross_src:  # a new prompt (or the first call)
            s.cross.k.copy_(call.cross.k)
            s.cross.v.copy_(call.cross.v)
            self.cross_src = call.cross


class ChunkGraphs:
    """Captures and replays CUDA graphs of ``WanDiT._chunk_body`` (module docstring); implements
    ``models.wan.dit.transformer.ChunkRunner``. ``max_slots`` bounds the (shape, cache) slots kept
    (least recently used dropped first: caches outside a slab buffer come and go)."""

    def __init__(self, recorder: GraphRecorder | None = None, *, max_slots: int = 32) -> None:
        self.recorder = recorder or CudaRecorder()
        self.max_slots = max_slots
        self.disabled: str | None = None
        self.stats = {"eager": 0, "warm": 0, "captures": 0, "replays": 0, "unwarmed": 0}
        self.sealed = False
        self._warm: set[tuple] = set()
        self._slots: OrderedDict[tuple, _Slot] = OrderedDict()
        self._unwarmed: set[tuple] = set()

    def seal(self) -> None:
        """Capture nothing more (the server, at ready: ``models.compile_guard``): a call whose
        graph the warm-up did not capture runs eagerly, counted once per (slot, runs) in
        ``stats["unwarmed"]`` and logged once; no slot is made or dropped."""
        self.sealed = True
        self.max_slots = max(self.max_slots, len(self._slots))

    def unseal(self) -> None:
        self.sealed = False

    def run(self, body: Body, call: ChunkCall) -> torch.Tensor:
        if (
            self.disabled is not None
            or not self.recorder.supports(call.x.device)
            or ineligible(call) is not None
        ):
            self.stats["eager"] += 1
            return body(call)
        sig = _signature(call)
        if self.sealed:
            key = (sig, call.cache.k.data_ptr(), call.cache.v.data_ptr())
            slot = self._slots.get(key)
            if sig not in self._warm or slot is None or call.runs not in slot.graphs:
                self._miss(key, call.runs)
                return body(call)
        if sig not in self._warm:
            out = self.recorder.warm(body, call)
            self._warm.add(sig)
            self.stats["warm"] += 1
            return out
        slot = self._slot(sig, call)
        slot.load(call)
        graph = slot.graphs.get(call.runs)
        if graph is None:
            try:
                graph = self.recorder.capture(body, replace(slot.call, runs=call.runs))
            except Exception as exc:  # e.g. a kernel that cannot be captured
                self.disabled = f"capture failed: {type(exc).__name__}: {exc}"
                log.warning("CUDA graphs off for this instance (%s); running eagerly", exc)
                self.stats["eager"] += 1
                return body(call)
            slot.graphs[call.runs] = graph
            self.stats["captures"] += 1
        self.stats["replays"] += 1
        return graph.replay().clone()

    def _miss(self, key: tuple, runs: tuple) -> None:
        self.stats["eager"] += 1
        if (key, runs) not in self._unwarmed:
            self._unwarmed.add((key, runs))
            self.stats["unwarmed"] += 1
            log.warning("no CUDA graph was captured for %s (runs %s): running eagerly", key, runs)

    @property
    def num_graphs(self) -> int:
        return sum(len(s.graphs) for s in self._slots.values())

    def _slot(self, sig: tuple, call: ChunkCall) -> _Slot:
        key = (sig, call.cache.k.data_ptr(), call.cache.v.data_ptr())
        slot = self._slots.get(key)
        if slot is None:
            slot = self._slots[key] = _Slot.for_call(call)
            while len(self._slots) > self.max_slots:
                self._slots.popitem(last=False)
        self._slots.move_to_end(key)
        return slot
