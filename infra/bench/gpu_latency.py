"""``dreamrt bench gpu-latency``: the latency mode on the GPU.

``dreamrt bench latency`` with the H200 preset: ``wan2.1-1.3b-causal`` with seeded random
weights (the architecture's timing does not depend on them), ``--compile``, chunks of one latent
frame (``serve --chunk-frames 1``: 4 video frames = 0.25 s at 16 fps), the fast path only, one
session: key change -> first frame on the WebRTC track that reflects it, and the same for a
prompt switch, p50/p95, with the delivered fps. Arguments after the name are passed on and
override the preset (e.g. ``--chunk-frames 3`` for the default mode, ``--variants
fast,baseline``).

    python -m infra.bench.gpu_latency [--prompts 10 --actions 20] [--json out.json]
"""

from __future__ import annotations

import sys
from pathlib import Path

if __package__ in (None, ""):  # run as a script: make the repository importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from infra.bench import latency

__all__ = ["PRESET", "main"]

PRESET = (
    "--device", "cuda", "--model", "wan2.1-1.3b-causal", "--compile", "--random-weights",
    "--chunk-frames", "1", "--variants", "fast", "--prompts", "10", "--actions", "20",
    "--gap-s", "0.4",
)  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    # argparse keeps the last value of a repeated option: what the caller gives wins
    return latency.main([*PRESET, *(sys.argv[1:] if argv is None else argv)])


if __name__ == "__main__":
    sys.exit(main())
