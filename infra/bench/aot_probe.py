"""Whether this torch precompiles regions (``models.precompiled``): the APIs it has, and one
small region compiled, saved, loaded in a fresh process and run on the device. Exit 0 when a
region round-trips.

    python -m infra.bench.aot_probe [--device cuda]
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

from models.compile_guard import CompileGuard
from models.precompiled import Region, aot_supported


class _Block(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.a, self.b = torch.nn.Linear(64, 256), torch.nn.Linear(256, 64)

    def forward(self, x: torch.Tensor, past: torch.Tensor) -> torch.Tensor:
        h = torch.cat([past, x], dim=1)
        return x + self.b(torch.nn.functional.gelu(self.a(h)))[:, -x.shape[1] :]


def _past_length(args: tuple[object, ...]) -> list[tuple[torch.Tensor, int]]:
    past = args[2]
    return [(past, 1)] if isinstance(past, torch.Tensor) else []


def _run(device: str, store: Path) -> dict[str, object]:
    torch.manual_seed(0)
    blocks = [_Block().to(device) for _ in range(3)]
    region = Region("probe", _Block.forward, blocks, CompileGuard(), dynamic=_past_length)
    loaded = region.use_store(store)
    x = torch.randn(1, 8, 64, device=device)
    worst = 0.0
    with torch.inference_mode():
        for length in (16, 24, 40):
            past = torch.randn(1, length, 64, device=device)
            for block in blocks:
                got = block(x, past)
                want = _Block.forward(block, x, past)
                worst = max(worst, (got - want).abs().max().item())
    return {
        "loaded": loaded,
        "signatures": region.signatures(),
        "max_err": worst,
        "stats": region.stats,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--store", type=Path, default=None)
    args = parser.parse_args(argv)
    compiler = getattr(torch, "compiler", None)
    print(
        f"torch {torch.__version__}: aot_supported={aot_supported()} "
        f"load_compiled_function={hasattr(compiler, 'load_compiled_function')} "
        f"aot_compile={hasattr(torch.compile(lambda: None), 'aot_compile')}",
        flush=True,
    )
    try:
        import torch._dynamo.aot_compile as aot

        print("torch._dynamo.aot_compile:", sorted(n for n in dir(aot) if not n.startswith("__")))
    except ImportError as exc:
        print("no torch._dynamo.aot_compile:", exc)
    print("torch.compiler:", sorted(n for n in dir(torch.compiler) if not n.startswith("_")))
    if args.store is not None:  # the second process: load and run
        print(_run(args.device, args.store), flush=True)
        return 0
    with tempfile.TemporaryDirectory() as tmp:
        began = time.perf_counter()
        first = _run(args.device, Path(tmp))
        print(f"compiled in {time.perf_counter() - began:.1f} s: {first}", flush=True)
        began = time.perf_counter()
        again = subprocess.run(
            [
                sys.executable,
                "-m",
                "infra.bench.aot_probe",
                "--device",
                args.device,
                "--store",
                tmp,
            ],
            capture_output=True,
            text=True,
        )
        print(
            f"fresh process {time.perf_counter() - began:.1f} s: {again.stdout.strip()}"
            f"{again.stderr.strip()[-1500:]}",
            flush=True,
        )
        ok = "'loaded': 3" in again.stdout or "'loaded': 1" in again.stdout
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
