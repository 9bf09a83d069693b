"""What ``models.checkpoint`` refuses with: errors that name the checkpoint and every
offending key at once (re-exported from ``models.checkpoint.load``).

``CheckpointFormatError``: nothing found, unreadable, or names in neither known format;
``CheckpointKeyError``: missing / unexpected / ambiguous keys; ``CheckpointShapeError``: shapes
that do not fit the config (checked once the keys match).
"""

from __future__ import annotations

from collections.abc import Iterable

__all__ = [
    "CheckpointError",
    "CheckpointFormatError",
    "CheckpointKeyError",
    "CheckpointShapeError",
    "listing",
]

_MAX_LISTED = 64


def listing(items: Iterable[str]) -> str:
    """``(count): [names]``, the first ``_MAX_LISTED`` names and how many more."""
    items = list(items)
    shown = ", ".join(items[:_MAX_LISTED])
    more = f" ... and {len(items) - _MAX_LISTED} more" if len(items) > _MAX_LISTED else ""
    return f"({len(items)}): [{shown}{more}]"


class CheckpointError(Exception):
    """A checkpoint that cannot be turned into the requested module."""


class CheckpointFormatError(CheckpointError):
    """No weights found, an unreadable layout, or names in neither known format."""


class CheckpointKeyError(CheckpointError):
    """The checkpoint's names do not fit the module; lists every offending key.

    ``missing``: what the checkpoint lacks, named as it would be in the checkpoint's naming
    ``fmt`` (``"diffusers"``, ``"original"``; wrappers left out); ``unexpected``: checkpoint keys
    that map onto no parameter; ``ambiguous``: module names several checkpoint keys map onto.
    """

    def __init__(
        self,
        source: str,
        component: str,
        fmt: str,
        missing: Iterable[str],
        unexpected: Iterable[str],
        ambiguous: Iterable[str] = (),
    ) -> None:
        self.source, self.component, self.fmt = source, component, fmt
        self.missing, self.unexpected = sorted(missing), sorted(unexpected)
        self.ambiguous = sorted(ambiguous)
        parts = [f"missing {listing(self.missing)}", f"unexpected {listing(self.unexpected)}"]
        if self.ambiguous:
            parts.append(f"ambiguous (pass prefix=...) {listing(self.ambiguous)}")
        super().__init__(
            f"checkpoint {source} ({fmt} naming) does not fit {component}: " + "; ".join(parts)
        )


class CheckpointShapeError(CheckpointError):
    """Tensors whose shapes differ from the module built from the config (lists them all).

    ``mismatches``: ``(checkpoint key, file shape, module shape)``.
    """

    def __init__(
        self,
        source: str,
        component: str,
        mismatches: list[tuple[str, tuple[int, ...], tuple[int, ...]]],
    ) -> None:
        self.source, self.component, self.mismatches = source, component, sorted(mismatches)
        listed = [f"{k}: file {c} vs module {m}" for k, c, m in self.mismatches]
        super().__init__(
            f"checkpoint {source} has wrongly shaped tensors for {component} "
            f"(wrong config?) {listing(listed)}"
        )
