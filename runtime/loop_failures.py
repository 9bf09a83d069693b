"""Failures a loop sees from ``ctx.execute`` (re-exported by ``runtime.contract``)."""

from __future__ import annotations

__all__ = ["Cancelled", "LoopFailed", "PlanWithdrawn"]


class Cancelled(Exception):
    """Raised from ``ctx.execute`` when the loop was cancelled; lands at a step boundary."""

    def __init__(self, loop_id: str, reason: str = "cancelled") -> None:
        super().__init__(f"loop {loop_id!r} cancelled: {reason}")
        self.loop_id = loop_id
        self.reason = reason


class PlanWithdrawn(Exception):
    """From ``ctx.execute``: the runtime took the queued plan back before it ran (inputs came);
    the driver returns to the step boundary, absorbs them and describes its next plan again."""

    def __init__(self, loop_id: str) -> None:
        super().__init__(f"loop {loop_id!r}: queued plan withdrawn for new inputs")
        self.loop_id = loop_id


class LoopFailed(Exception):
    """Raised from ``ctx.execute`` when this loop's step failed (exception or NaN).

    ``code`` is machine-readable (``"step_exception"``, ``"nan"``); other loops are unaffected.
    """

    def __init__(self, loop_id: str, code: str, message: str) -> None:
        super().__init__(f"loop {loop_id!r} failed ({code}): {message}")
        self.loop_id = loop_id
        self.code = code
        self.message = message
