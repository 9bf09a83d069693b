"""How a stream's latent frames are cut into decodes: its first latent frame alone, then pieces
of at most a decode's chunk (``decode_pieces``), per piece fed (``fed_pieces``: a rollout's
chunks reach a program's decode node one at a time)."""

from __future__ import annotations

__all__ = ["decode_pieces", "fed_pieces"]


def decode_pieces(done: int, total: int, chunk: int) -> list[tuple[int, int]]:
    """(start, stop) of each decode of a stream's latent frames ``done .. total``, in order:
    the stream's first latent frame alone (one picture), then pieces of at most ``chunk``.
    A session's first chunk decodes so (its first frame out soonest), and a job's or a
    program's decodes do the same, so every decode after a stream's first frame continues a
    stream: they run the compiled decoder graphs sessions run (``decoder_dynamic`` in
    ``models.wan.vae.cache``), where a first piece of ``chunk`` frames needed one more graph."""
    pieces: list[tuple[int, int]] = []
    start = done
    while start < total:
        stop = 1 if start == 0 else min(total, start + chunk)
        pieces.append((start, stop))
        start = stop
    return pieces


def fed_pieces(done: int, total: int, feed: int, chunk: int) -> list[tuple[int, int]]:
    """The decodes (start, stop) of latent frames ``done .. total`` fed ``feed`` at a time (a
    rollout's chunks; 0: all at once) in pieces of at most ``chunk`` (``LatentDecode.feed``)."""
    step = feed or max(total - done, 1)
    return [
        piece
        for start in range(done, total, step)
        for piece in decode_pieces(start, min(start + step, total), chunk)
    ]
