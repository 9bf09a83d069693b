"""``python -m infra.bench.load_time``: where a server's model load goes, before any compile.

Times the imports a server makes, then ``load_instance`` of a card (random weights by default)
under cProfile, and prints the functions that took longest (cumulative) - the part of a start
from the compile cache that is neither loading graphs nor the warm-up.

    python -m infra.bench.load_time --model wan2.1-1.3b-causal --device cuda
"""

from __future__ import annotations

import argparse
import cProfile
import io
import pstats
import sys
import time
from pathlib import Path

if __package__ in (None, ""):  # run as a script: make the repository importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="wan-tiny-random")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--checkpoint-dir", default=None)
    parser.add_argument("--top", type=int, default=30)
    args = parser.parse_args(argv)

    began = time.perf_counter()
    import torch

    torch_s = time.perf_counter() - began
    began = time.perf_counter()
    import server.app  # noqa: F401 - what `dreamrt serve` imports before it loads a model
    from models.instance import load_instance
    from models.registry import get

    imports_s = time.perf_counter() - began
    if args.device.startswith("cuda"):
        began = time.perf_counter()
        torch.zeros(1, device=args.device)
        torch.cuda.synchronize()
        cuda_s = time.perf_counter() - began
    else:
        cuda_s = 0.0
    profile = cProfile.Profile()
    began = time.perf_counter()
    profile.enable()
    instance = load_instance(
        get(args.model),
        device=args.device,
        random_weights=args.checkpoint_dir is None,
        checkpoint_dir=args.checkpoint_dir,
        compile=True,
    )
    if args.device.startswith("cuda"):
        torch.cuda.synchronize()
    profile.disable()
    load_s = time.perf_counter() - began
    text = io.StringIO()
    pstats.Stats(profile, stream=text).sort_stats("cumulative").print_stats(args.top)
    print(text.getvalue())
    print(
        f"import torch {torch_s:.1f} s, the server's imports {imports_s:.1f} s, CUDA context "
        f"{cuda_s:.1f} s, load_instance {load_s:.1f} s ({instance.card.model_id} on "
        f"{instance.device})"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
