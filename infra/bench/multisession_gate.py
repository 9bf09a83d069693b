"""The interleave gate on the device, for ``infra.bench.multisession``.

Session ``s0`` of every run has the same prompt and seed on the same profile, so until its first
input is applied its frames must not depend on what else the engine ran beside it: with the
sessions interleaved step by step (unbatched) they must equal the frames of ``s0`` alone
(``n1``) bit for bit, whatever the scheduler; with cross-session batching they must agree within
the batched tolerance (batched GEMMs may accumulate in another order).

``FrameGate.observe(run_key, profile_key, viewer)`` takes the chunks ``s0``'s ``SimViewer``
kept (``keep_chunks`` of them, cut at the first chunk that reflects an input) and compares them
with the reference of that profile, which the first ``n1`` run sets. The verdict per run::

    {"reference": "n1/step-edf", "chunks": 3, "identical": true,
     "max_abs": 0, "mean_abs": 0.0}           # uint8 levels over the compared chunks

``None`` where no reference exists yet or no chunk could be compared.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from infra.bench.sim_viewer import SimViewer

__all__ = ["FrameGate"]


class FrameGate:
    """Reference frames per profile and the comparison of every later run against them."""

    def __init__(self) -> None:
        self._reference: dict[str, tuple[str, dict[int, np.ndarray]]] = {}

    def observe(
        self, run_key: str, profile_key: str, viewer: SimViewer, *, reference: bool
    ) -> dict[str, Any] | None:
        chunks = viewer.gate_chunks()
        if reference and profile_key not in self._reference:
            self._reference[profile_key] = (run_key, chunks)
            return {"reference": run_key, "chunks": len(chunks), "role": "reference"}
        if profile_key not in self._reference:
            return None
        ref_key, ref = self._reference[profile_key]
        common = sorted(set(ref) & set(chunks))
        if not common:
            return {"reference": ref_key, "chunks": 0, "identical": None}
        diffs = []
        for chunk in common:
            a, b = ref[chunk], chunks[chunk]
            if a.shape != b.shape:
                return {
                    "reference": ref_key,
                    "chunks": len(common),
                    "identical": False,
                    "error": f"chunk {chunk}: shape {b.shape} vs {a.shape}",
                }
            diffs.append(np.abs(a.astype(np.int16) - b.astype(np.int16)))
        stacked = np.concatenate([d.reshape(-1) for d in diffs])
        return {
            "reference": ref_key,
            "chunks": len(common),
            "identical": bool(stacked.max() == 0),
            "max_abs": int(stacked.max()),
            "mean_abs": float(stacked.mean()),
        }
