"""Read-only extensions beside Profiler/NaNWatch: ``ActivationTrace`` and ``ParityAligner``.

Both are an ``Observer`` (``runtime.observers``: they see every batch's outputs, keyed by
loop and by the how-manieth plan of its kind that loop ran) and a ``BlockObserver``
(``runtime.extensions``: they see every block's output of a *hooked* step, keyed by
``(loop_id, step, branch)`` and block index - a model calls them only where its hook points
are assembled, e.g. ``WanInstance.block_observers`` for ``diffusion_denoise``)::

    trace = ActivationTrace(keep=True)        # the reference run
    instance.block_observers = (trace,); Engine(observers=[trace]) ... run loop "ref"
    aligner = ParityAligner(trace, against={"run": "ref"})
    instance.block_observers = (aligner,); Engine(observers=[aligner]) ... run loop "run"
    aligner.first_divergence("run")  # -> Divergence(step=12, block=None, ...) or None

A step's blocks come before its output, so the first divergence the aligner records is the
earliest one: a block (``block`` set) or, when every block that ran agreed, the step's
output (``block`` None - e.g. a step whose blocks a cache skipped). Tensor summaries and
comparisons read the device (a sync per block): diagnostics, not for serving throughput.
They never change an output; state is per loop id in the observer (like Profiler's samples),
none in a model or loop. torch is imported lazily.
"""

from __future__ import annotations

import dataclasses
import threading
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from runtime.observers import BatchInfo, Observation

if TYPE_CHECKING:
    import torch

__all__ = ["ActivationTrace", "Divergence", "ParityAligner", "TraceRecord"]

# the plan kinds whose outputs are a loop's step-by-step intermediates
STEP_KINDS = ("diffusion_step", "chunk_step")


@dataclass(frozen=True, slots=True)
class TraceRecord:
    """One intermediate: ``block`` None is a step's output (``step``: the loop's n-th plan of
    that kind), else a block's output at the loop's ``step`` and CFG ``branch``."""

    loop_id: str
    step: int
    branch: str
    block: int | None
    mean_abs: float
    max_abs: float
    tensor: torch.Tensor | None = None  # a CPU clone, with ``keep``


@dataclass(frozen=True, slots=True)
class Divergence:
    """Where a loop first left its reference: ``max_abs`` difference beyond the tolerance."""

    loop_id: str
    step: int
    branch: str
    block: int | None
    max_abs: float

    def describe(self) -> str:
        where = "its output" if self.block is None else f"block {self.block}"
        return (
            f"loop {self.loop_id!r} diverges first at step {self.step}, {where} "
            f"({self.branch}): max-abs {self.max_abs:.3g}"
        )


def _first_tensor(value: object) -> torch.Tensor | None:
    """The first floating tensor in an output (a tensor, or nested in a dataclass/sequence)."""
    import torch

    if isinstance(value, torch.Tensor):
        return value if value.is_floating_point() else None
    items: Iterator[object] = iter(())
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        items = (getattr(value, f.name) for f in dataclasses.fields(value))
    elif isinstance(value, (list, tuple)):
        items = iter(value)
    for item in items:
        found = _first_tensor(item)
        if found is not None:
            return found
    return None


class _StepKeys:
    """Counts each loop's plans of the step kinds: the step index of a batch output."""

    def __init__(self) -> None:
        self._count: dict[tuple[str, str], int] = {}

    def next(self, loop_id: str, kind: str) -> int:
        n = self._count.get((loop_id, kind), 0)
        self._count[(loop_id, kind)] = n + 1
        return n


class _Intermediates:
    """Both observer faces; ``_seen`` gets every intermediate, keyed as ``TraceRecord``."""

    def __init__(self) -> None:
        self._steps = _StepKeys()
        self._lock = threading.Lock()

    def before_batch(self, info: BatchInfo) -> None:
        return None

    def after_batch(
        self, info: BatchInfo, outputs: Sequence[object], wall_s: float
    ) -> Observation | None:
        if info.kind not in STEP_KINDS:
            return None
        for loop_id, output in zip(info.loop_ids, outputs, strict=False):
            tensor = _first_tensor(output) if self._wants(loop_id) else None
            if tensor is not None:
                step = self._steps.next(loop_id, info.kind)
                self._seen(loop_id, step, "output", None, tensor)
        return None

    def on_block(self, key: tuple[str, int, str], block: int, hidden: torch.Tensor) -> None:
        loop_id, step, branch = key
        if self._wants(loop_id):
            self._seen(loop_id, step, branch, block, hidden)

    def _wants(self, loop_id: str) -> bool:
        return True

    def _seen(
        self, loop_id: str, step: int, branch: str, block: int | None, t: torch.Tensor
    ) -> None:
        raise NotImplementedError


class ActivationTrace(_Intermediates):
    """Records a summary (mean/max abs) of every step output and hooked block output, per
    loop; ``keep`` also keeps a CPU clone of each (a reference for ``ParityAligner``);
    ``loops``: record only these loop ids (None: all)."""

    def __init__(self, *, keep: bool = False, loops: Sequence[str] | None = None) -> None:
        super().__init__()
        self.keep = keep
        self.loops = None if loops is None else frozenset(loops)
        self._records: dict[tuple[str, int, str, int | None], TraceRecord] = {}

    def _wants(self, loop_id: str) -> bool:
        return self.loops is None or loop_id in self.loops

    def records(self, loop_id: str) -> list[TraceRecord]:
        """``loop_id``'s records in the order they were made."""
        with self._lock:
            return [r for r in self._records.values() if r.loop_id == loop_id]

    def record(self, loop_id: str, step: int, branch: str, block: int | None) -> TraceRecord | None:
        with self._lock:
            return self._records.get((loop_id, step, branch, block))

    def _seen(
        self, loop_id: str, step: int, branch: str, block: int | None, t: torch.Tensor
    ) -> None:
        value = t.detach().float()
        kept = value.cpu().clone() if self.keep else None
        record = TraceRecord(
            loop_id,
            step,
            branch,
            block,
            float(value.abs().mean()),
            float(value.abs().max()),
            kept,
        )
        with self._lock:
            self._records[(loop_id, step, branch, block)] = record


class ParityAligner(_Intermediates):
    """Compares a loop's intermediates with a reference ``ActivationTrace`` (made with
    ``keep=True``) as they happen and keeps the first divergence per loop: ``|a - b| >
    atol + rtol * |b|`` anywhere. ``against`` maps a loop id to its reference's loop id (by
    default the same id). An intermediate the reference lacks is not compared."""

    def __init__(
        self,
        reference: ActivationTrace,
        *,
        against: Mapping[str, str] | None = None,
        atol: float = 0.0,
        rtol: float = 0.0,
    ) -> None:
        if not reference.keep:
            raise ValueError("ParityAligner needs a reference ActivationTrace(keep=True)")
        super().__init__()
        self.reference = reference
        self.against = dict(against or {})
        self.atol = atol
        self.rtol = rtol
        self.compared = 0
        self._first: dict[str, Divergence] = {}

    def first_divergence(self, loop_id: str) -> Divergence | None:
        with self._lock:
            return self._first.get(loop_id)

    def _wants(self, loop_id: str) -> bool:
        return loop_id not in self._first  # the first divergence is what it names

    def _seen(
        self, loop_id: str, step: int, branch: str, block: int | None, t: torch.Tensor
    ) -> None:
        ref_id = self.against.get(loop_id, loop_id)
        ref = self.reference.record(ref_id, step, branch, block)
        if ref is None or ref.tensor is None:
            return
        value = t.detach().float().cpu()
        want = ref.tensor
        self.compared += 1
        if value.shape != want.shape:
            diff = float("inf")
        else:
            excess = (value - want).abs() - (self.atol + self.rtol * want.abs())
            if not bool((excess > 0).any()):
                return
            diff = float((value - want).abs().max())
        with self._lock:
            self._first.setdefault(loop_id, Divergence(loop_id, step, branch, block, diff))
