"""Sleep/wake and weight sync on the device: memory a sleeping component gives back, wake
time, and what a weight sync costs, for one resident model.

Loads the card with random weights (the serving precision: bf16 on CUDA) and runs, in one
process, each variant of ``--variants``:

- ``sleep_dit`` / ``sleep_dit_text`` / ``sleep_all``: ``ResidentWeights.sleep`` of the DiT /
  DiT + text encoder / every component -> device bytes freed (``torch.cuda.memory_allocated``
  before - after, and ``memory_reserved`` after ``empty_cache``), seconds; then ``wake`` ->
  seconds, and whether every tensor came back bit for bit (blake2b of each component's
  tensors before and after).
- ``sync_file``: the DiT written to one safetensors file (original names), then ``prepare``
  (read + validate + content digest) and ``apply`` (in-place copy) timed apart.
- ``sync_host`` / ``sync_device``: a full update from a state dict in host memory / on the
  device (a co-located trainer's tensors), prepare and apply timed apart.
- ``sync_delta``: a delta of one block's attention projections (4 tensors) from host memory.
- ``sync_graphs``: does an in-place sync reach captured CUDA graphs? A bounded session stream
  on slab 0 with CUDA graphs on (``--sync-chunks`` chunks: the graphs of its steady state are
  captured), a full sync (weights x 1.01), the same stream again (replaying the graphs captured
  before the sync), then once more with graphs off: the last two must be bit-identical (and
  differ from the first). The graph counters show the second run replayed without capturing.

Prints one table last and writes ``--json``. What the serving path adds on top (holding loops
at a chunk boundary, the re-encode and re-cache of each session's next chunk) is a chunk or two
of each session; ``tests/sessions/test_weight_sync.py`` checks it on the CPU.

    python -m infra.bench.sleep_wake --device cuda [--card wan2.1-1.3b-causal] [--json F]
    python -m infra.bench.sleep_wake --device cpu --card wan-tiny-random   # CPU smoke
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import tempfile
import time
import traceback
from pathlib import Path
from typing import Any

import torch

from models import registry
from models.checkpoint.load import save_original_format
from models.instance import load_instance

VARIANTS = (
    "sleep_dit",
    "sleep_dit_text",
    "sleep_all",
    "sync_file",
    "sync_host",
    "sync_device",
    "sync_delta",
    "sync_graphs",
)
_GIB = 2**30


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _digest(instance: Any) -> dict[str, str]:
    out = {}
    for name in instance.components:
        h = hashlib.blake2b(digest_size=8)
        module = instance.weights._module(name)
        for key, t in sorted(
            (dict(module.named_parameters()) | dict(module.named_buffers())).items()
        ):
            h.update(key.encode())
            h.update(t.detach().reshape(-1).view(torch.uint8).cpu().numpy().data)
        out[name] = h.hexdigest()
    return out


def _mem(device: torch.device) -> tuple[float, float]:
    if device.type != "cuda":
        return 0.0, 0.0
    return torch.cuda.memory_allocated(device) / _GIB, torch.cuda.memory_reserved(device) / _GIB


def run_sleep(instance: Any, components: list[str]) -> dict[str, Any]:
    device = instance.device
    before = _digest(instance)
    alloc0, reserved0 = _mem(device)
    start = time.perf_counter()
    freed = instance.weights.sleep(components)
    sleep_s = time.perf_counter() - start
    alloc1, reserved1 = _mem(device)
    wake_s = instance.weights.wake(components)
    alloc2, _ = _mem(device)
    return {
        "components": components,
        "allocated_gib_before": alloc0,
        "allocated_gib_asleep": alloc1,
        "reserved_gib_before": reserved0,
        "reserved_gib_asleep": reserved1,
        "freed_gib": freed / _GIB,
        "allocated_gib_woken": alloc2,
        "sleep_s": sleep_s,
        "wake_s": wake_s,
        "bit_identical": _digest(instance) == before,
    }


def run_sync(instance: Any, source: Any, mode: str) -> dict[str, Any]:
    start = time.perf_counter()
    update = instance.weights.prepare(source, mode=mode)
    prepared = time.perf_counter()
    old = instance.weights.version
    version = instance.weights.apply(update)
    _sync(instance.device)
    done = time.perf_counter()
    gib = sum(t.numel() * t.element_size() for t in update.tensors.values()) / _GIB
    return {
        "mode": mode,
        "tensors": len(update.tensors),
        "gib": gib,
        "prepare_s": prepared - start,
        "apply_s": done - prepared,
        "total_s": done - start,
        "apply_gib_per_s": gib / max(done - prepared, 1e-9),
        "version_changed": version != old,
    }


def _stream(instance: Any, chunks: int) -> list[Any]:
    import asyncio

    from models.loops.requests import SessionRequest
    from runtime.driver import run_inline

    request = SessionRequest(prompt="a red ball on grass", seed=0, max_chunks=chunks, kv_slab=0)
    _, emissions = asyncio.run(run_inline(instance.loop("chunk_rollout"), request, instance))
    frames = [e.output for e in emissions if e.spec.stream == "media"]
    return [f.result() if hasattr(f, "result") else f for f in frames]


def run_sync_graphs(instance: Any, chunks: int) -> dict[str, Any]:
    import numpy as np

    instance.reserve_kv_slabs(instance.card.default_profile, 1)
    instance.configure(cuda_graphs=True)
    graphs = instance.dit.chunk_graphs
    before = _stream(instance, chunks)
    captured = dict(graphs.stats)
    new = {k: v.detach() * 1.01 for k, v in instance.dit.state_dict().items()}
    instance.weights.apply(instance.weights.prepare(new))
    replayed = _stream(instance, chunks)
    after = dict(graphs.stats)
    instance.configure(cuda_graphs=False)
    eager = _stream(instance, chunks)
    same = len(replayed) == len(eager) and all(
        np.array_equal(np.asarray(a), np.asarray(b)) for a, b in zip(replayed, eager, strict=True)
    )
    return {
        "chunks": chunks,
        "captures_first": captured["captures"],
        "replays_first": captured["replays"],
        "captures_after_sync": after["captures"] - captured["captures"],
        "replays_after_sync": after["replays"] - captured["replays"],
        "bit_identical": same,
        "changed": not np.array_equal(np.asarray(before[-1]), np.asarray(replayed[-1])),
    }


def run_variant(instance: Any, variant: str, tmp: Path, chunks: int = 12) -> dict[str, Any]:
    dit = instance.dit
    if variant == "sleep_dit":
        return run_sleep(instance, ["dit"])
    if variant == "sleep_dit_text":
        return run_sleep(instance, ["dit", "text_encoder"])
    if variant == "sleep_all":
        return run_sleep(instance, list(instance.components))
    if variant == "sync_file":
        path = tmp / "transformer" / "model.safetensors"
        path.parent.mkdir(parents=True, exist_ok=True)
        start = time.perf_counter()
        save_original_format(dit, path)
        row = run_sync(instance, path.parent, "full")
        row["write_s"] = time.perf_counter() - start - row["total_s"]
        row["file_gib"] = path.stat().st_size / _GIB
        path.unlink()
        return row
    if variant == "sync_host":
        return run_sync(
            instance, {k: v.detach().cpu() for k, v in dit.state_dict().items()}, "full"
        )
    if variant == "sync_device":
        return run_sync(
            instance, {k: v.detach().clone() for k, v in dit.state_dict().items()}, "full"
        )
    if variant == "sync_delta":
        names = [f"blocks.0.self_attn.{p}.weight" for p in ("q", "k", "v", "o")]
        state = dit.state_dict()
        return run_sync(instance, {n: torch.zeros_like(state[n]).cpu() for n in names}, "delta")
    if variant == "sync_graphs":
        return run_sync_graphs(instance, chunks)
    raise ValueError(f"unknown variant {variant!r}; known: {VARIANTS}")


def _table(rows: list[dict[str, Any]]) -> str:
    lines = [
        "| variant | freed GiB | sleep s | wake s | bit-identical | prepare s | apply s | GiB "
        "| graphs after sync |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for r in rows:
        if "error" in r:
            lines.append(f"| {r['variant']} | error: {r['error']} | | | | | | | |")
            continue

        def f(key: str, r: dict[str, Any] = r) -> str:
            value = r.get(key)
            return (
                ""
                if value is None
                else (f"{value:.3f}" if isinstance(value, float) else str(value))
            )

        lines.append(
            f"| {r['variant']} | {f('freed_gib')} | {f('sleep_s')} | {f('wake_s')} | "
            f"{f('bit_identical')} | {f('prepare_s')} | {f('apply_s')} | {f('gib')} | "
            + (
                f"{r['captures_after_sync']} captures, {r['replays_after_sync']} replays |"
                if "replays_after_sync" in r
                else " |"
            )
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> list[dict[str, Any]]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--card", default="wan2.1-1.3b-causal")
    parser.add_argument("--variants", default=",".join(VARIANTS))
    parser.add_argument("--sync-chunks", type=int, default=0, help="sync_graphs stream (0: auto)")
    parser.add_argument(
        "--json", default=os.path.join(os.environ.get("OUT", "."), "sleep_wake.json")
    )
    args = parser.parse_args(argv)
    start = time.perf_counter()
    instance = load_instance(registry.get(args.card), device=args.device, random_weights=True)
    _sync(instance.device)
    header = {
        "card": args.card,
        "device": str(instance.device),
        "gpu": torch.cuda.get_device_name(instance.device)
        if instance.device.type == "cuda"
        else "",
        "precision": instance.precision,
        "torch": torch.__version__,
        "load_s": time.perf_counter() - start,
        "allocated_gib_loaded": _mem(instance.device)[0],
    }
    print(json.dumps(header), flush=True)
    rows: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory() as tmp:
        for variant in [v for v in args.variants.split(",") if v]:
            try:
                chunks = (
                    args.sync_chunks or instance.warmup_chunks(instance.card.default_profile) + 2
                )
                row = {"variant": variant, **run_variant(instance, variant, Path(tmp), chunks)}
            except Exception as exc:
                traceback.print_exc()
                row = {"variant": variant, "error": f"{type(exc).__name__}: {exc}"[:200]}
            rows.append(row)
            print(json.dumps(row), flush=True)
            Path(args.json).parent.mkdir(parents=True, exist_ok=True)
            Path(args.json).write_text(json.dumps({**header, "rows": rows}, indent=1))
    print(_table(rows))
    return rows


if __name__ == "__main__":
    main()
