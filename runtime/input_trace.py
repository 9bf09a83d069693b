"""``InputTrace``: where one loop's live inputs spend their time inside the runtime.

For every input pushed to a loop (``LoopHandle.push_input``) the trace records, on the engine
clock::

    pushed     the server handed it to the engine
    latched    the loop first described work reflecting it: the first plan whose
               ``WorkPlan.inputs`` names its seq was submitted (a chunk boundary, or the step
               boundary at which the in-flight chunk restarted for it)
    started    that first plan started executing (a text encode or re-cache included)
    generated  the plan that acknowledges it (an ``applied`` emission naming its seq) started:
               the last plan reflecting it before that one had finished (the chunk's last
               denoising step)
    decoded    the acknowledging emission reached the sink (the frames are on the host; a
               decode on a second stream has finished)

``timing(seq)`` turns them into an ``InputTiming`` (seconds after ``pushed``) and forgets the
input. An input the loop never lists (a held key repeated, audio) has only ``decoded``.
Bounded: the oldest of more than ``max_inputs`` tracked inputs are dropped (a superseded input
is never acknowledged). ``pending(seqs)`` says whether any of ``seqs`` is pushed and not yet
acknowledged: the adaptive lead limit (``runtime.lead``) runs such plans at once.

Event-loop thread only; pure Python (no torch, no asyncio).
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Iterable
from dataclasses import dataclass

from runtime.emissions import EmitSpec, InputTiming, Stream

__all__ = ["InputTrace", "applied_seqs"]


@dataclass(slots=True)
class _Stages:
    pushed_s: float
    latched_s: float | None = None
    started_s: float | None = None
    last_finished_s: float | None = None
    generated_s: float | None = None


def applied_seqs(emits: Iterable[EmitSpec]) -> tuple[int, ...]:
    """Sequence numbers a plan's ``applied`` emissions acknowledge."""
    return tuple(
        seq
        for spec in emits
        if spec.stream == Stream.APPLIED and isinstance(seq := getattr(spec.meta, "seq", None), int)
    )


class InputTrace:
    """The stages of one loop's inputs (see module docstring)."""

    def __init__(self, clock: Callable[[], float], *, max_inputs: int = 256) -> None:
        self._clock = clock
        self._max_inputs = max_inputs
        self._stages: OrderedDict[int, _Stages] = OrderedDict()
        self.last_pushed_s: float | None = None

    def pushed(self, seq: int) -> None:
        now = self._clock()
        self.last_pushed_s = now
        self._stages[seq] = _Stages(now)
        while len(self._stages) > self._max_inputs:
            self._stages.popitem(last=False)

    def pending(self, seqs: Iterable[int]) -> bool:
        return any(seq in self._stages for seq in seqs)

    def planned(self, seqs: Iterable[int]) -> None:
        """A plan naming ``seqs`` was submitted."""
        now = None
        for seq in seqs:
            stages = self._stages.get(seq)
            if stages is not None and stages.latched_s is None:
                stages.latched_s = now = self._clock() if now is None else now

    def started(self, seqs: Iterable[int], acknowledges: Iterable[int]) -> None:
        """A plan naming ``seqs`` and acknowledging ``acknowledges`` started executing."""
        now = None
        for seq in seqs:
            stages = self._stages.get(seq)
            if stages is not None and stages.started_s is None:
                stages.started_s = now = self._clock() if now is None else now
        for seq in acknowledges:
            stages = self._stages.get(seq)
            if stages is not None and stages.generated_s is None:
                stages.generated_s = stages.last_finished_s

    def finished(self, seqs: Iterable[int]) -> None:
        """A plan naming ``seqs`` finished."""
        now = None
        for seq in seqs:
            stages = self._stages.get(seq)
            if stages is not None:
                stages.last_finished_s = now = self._clock() if now is None else now

    def timing(self, seq: int) -> InputTiming | None:
        """The input's stages, ``decoded`` = now; forgets it. None for an untracked seq."""
        stages = self._stages.pop(seq, None)
        if stages is None:
            return None
        t0 = stages.pushed_s

        def since(t: float | None) -> float | None:
            return None if t is None else max(0.0, t - t0)

        return InputTiming(
            seq=seq,
            latched_s=since(stages.latched_s),
            started_s=since(stages.started_s),
            generated_s=since(stages.generated_s),
            decoded_s=since(self._clock()),
        )
