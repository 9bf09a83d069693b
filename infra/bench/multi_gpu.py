"""One realtime session's DiT spread over 1, 2 and 4 GPUs with Ulysses sequence parallelism.

For each model (``--models``, default ``wan2.1-1.3b,wan2.1-14b``) and each GPU count
(``--gpus``, default ``1,2,4``) the launcher starts ``torchrun --nproc-per-node N`` on this
module (``NCCL_NVLS_ENABLE=0`` and no other multicast, as the device README asks) and collects
one row per run; counts above ``torch.cuda.device_count()`` are listed as skipped, and runs not
started within ``--budget-s`` too. Inside torchrun, every rank builds the same DiT with random
bf16 weights (seeded, then broadcast from rank 0), enables ``models/wan/sequence_parallel.py``
over the world (sp = N) and runs one session at 832x480, chunks of 3 latent frames (4680
tokens), K/V window 9 + sink 3 frames, 4 denoising steps then the K/V update per chunk, and the
VAE decode of each chunk on rank 0 only (the other ranks wait at the next all-to-all: decode
on one rank, not split). Random cross-attention K/V stand in for the text encoder (not run).

Measured per run (eager PyTorch, no compile, no CUDA graphs):
- ``fps``: steady-state frames per second, decode included (12 frames per chunk);
- ``dit_fps``: the same without the decode (what sequence parallelism scales);
- ``first_frame_ms``: a fresh session's first chunk - 4 steps, then the decode of its first
  latent frame alone - from the start to the frame on the host;
- ``chunk_ms`` (median), ``rel_err`` of the last chunk's DiT output vs the 1-GPU run's.

    python -m infra.bench.multi_gpu [--models wan2.1-1.3b,wan2.1-14b] [--gpus 1,2,4]
        [--chunks 6] [--budget-s 420] [--json F]

CPU check (gloo, tiny preset at 64x64): ``python -m infra.bench.multi_gpu --device cpu
--models tiny --gpus 1,2 --size 64x64``. JSON: every row, rewritten after each run.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

CHUNK = 3  # latent frames per chunk
WINDOW, SINK = 9, 3  # K/V frames
STEPS = (1000.0, 750.0, 500.0, 250.0)


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _worker(args: argparse.Namespace) -> dict:
    """One rank of a torchrun world: the session of the module docstring."""
    import torch.distributed as dist

    from models.wan.config import WanDiTConfig
    from models.wan.kv_cache import ChunkKVCache
    from models.wan.sequence_parallel import enable, local_kv_config
    from models.wan.transformer import WanDiT, param_dtype
    from models.wan.vae import WanVAE
    from models.wan.vae_config import WanVAEConfig

    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    cuda = args.device == "cuda"
    device = torch.device(f"cuda:{int(os.environ['LOCAL_RANK'])}" if cuda else "cpu")
    if cuda:
        torch.cuda.set_device(device)
    dist.init_process_group("nccl" if cuda else "gloo", device_id=device if cuda else None)
    dtype = torch.bfloat16 if cuda else torch.float32
    config = WanDiTConfig.preset(args.model)
    torch.manual_seed(0)
    with device:
        dit = WanDiT(config).eval()
        vae = WanVAE(WanVAEConfig.preset("wan2.1" if cuda else "tiny")).eval()
    for name, p in dit.named_parameters():
        p.data = p.data.to(param_dtype(name, dtype))
        dist.broadcast(p.data, src=0)  # identical weights on every rank, whatever the RNG
    vae = vae.to(dtype)
    if world > 1:
        enable(dit, dist.group.WORLD)
    kv_config = local_kv_config(config, world)
    width, height = args.size
    lh, lw = height // 8, width // 8
    tokens_per_frame = config.tokens_per_frame(lh, lw)
    gen = torch.Generator(device).manual_seed(1)
    text = torch.randn(1, config.text_len, config.text_dim, generator=gen, device=device)
    with torch.no_grad():
        cross = dit.cross_kv(text.to(dtype))
    x = torch.randn(1, config.in_channels, CHUNK, lh, lw, generator=gen, device=device).to(dtype)

    def session() -> tuple[list[float], list[float], float, torch.Tensor]:
        cache = ChunkKVCache.allocate(
            kv_config,
            batch=1,
            sink_frames=SINK,
            window_frames=WINDOW,
            tokens_per_frame=tokens_per_frame,
            device=device,
            dtype=dtype,
        )
        dec = vae.new_decoder_cache(1, lh, lw)
        chunk_s, dit_s, first_s, out = [], [], 0.0, x
        for chunk in range(args.chunks):
            _sync(device)
            dist.barrier()
            t0 = time.perf_counter()
            z = x
            for t in STEPS:
                out = dit.forward_chunk(
                    z, torch.tensor([t], device=device), cross, cache, chunk * CHUNK
                )
                z = out.to(dtype)
            _sync(device)
            t_dit = time.perf_counter() - t0
            if rank == 0:
                if chunk == 0:  # the first picture leaves alone, then the chunk's rest
                    vae.decode_chunk(z[:, :, :1], dec).cpu()
                    first_s = time.perf_counter() - t0
                    vae.decode_chunk(z[:, :, 1:], dec).cpu()
                else:
                    vae.decode_chunk(z, dec).cpu()
            t1 = time.perf_counter()
            dit.forward_chunk(
                z, torch.zeros(1, device=device), cross, cache, chunk * CHUNK, write_cache=True
            )
            _sync(device)
            t_kv = time.perf_counter() - t1
            dist.barrier()
            chunk_s.append(time.perf_counter() - t0)
            dit_s.append(t_dit + t_kv)
        return chunk_s, dit_s, first_s, out

    with torch.no_grad():
        session()  # warm-up: kernels, allocator, the decode's cache shapes
        chunk_s, dit_s, first_s, out = session()
    steady = chunk_s[1:] or chunk_s
    steady_dit = dit_s[1:] or dit_s
    frames = 4 * CHUNK
    row = {
        "model": args.model,
        "gpus": world,
        "fps": frames / statistics.median(steady),
        "dit_fps": frames / statistics.median(steady_dit),
        "first_frame_ms": 1000 * first_s,
        "chunk_ms": 1000 * statistics.median(steady),
        "peak_gib": torch.cuda.max_memory_allocated(device) / 2**30 if cuda else 0.0,
    }
    if rank == 0:
        ref = Path(args.reference)
        last = out.float().cpu()
        if world == 1:
            torch.save(last, ref)
        elif ref.exists():
            base = torch.load(ref)
            row["rel_err"] = ((last - base).abs().max() / base.abs().max()).item()
        Path(args.row).write_text(json.dumps(row))
    dist.destroy_process_group()
    return row


def _launch(args: argparse.Namespace, model: str, gpus: int, tmp: Path) -> dict:
    row_file = tmp / f"{model}-{gpus}.json"
    env = dict(os.environ, NCCL_NVLS_ENABLE="0", OMP_NUM_THREADS="1")
    cmd = [
        sys.executable, "-m", "torch.distributed.run", "--standalone",
        f"--nproc-per-node={gpus}", "-m", "infra.bench.multi_gpu", "--worker",
        "--device", args.device, "--model", model, "--chunks", str(args.chunks),
        "--size", f"{args.size[0]}x{args.size[1]}", "--row", str(row_file),
        "--reference", str(tmp / f"{model}-ref.pt"),
    ]  # fmt: skip
    done = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=args.run_timeout_s)
    if done.returncode != 0 or not row_file.exists():
        tail = (done.stderr or done.stdout)[-1500:]
        return {"model": model, "gpus": gpus, "error": f"rc={done.returncode}: {tail}"}
    return json.loads(row_file.read_text())


def _table(rows: list[dict]) -> str:
    head = (
        "| model | GPUs | FPS (decode on rank 0) | DiT-only FPS | first frame ms | chunk ms "
        "| rel err vs 1 GPU | peak GiB |"
    )
    lines = [head, "|" + " --- |" * 8]
    for r in rows:
        if "fps" not in r:
            lines.append(
                f"| {r['model']} | {r['gpus']} | {r.get('error', r.get('skipped'))[:160]!r} |"
            )
            continue
        err = f"{r['rel_err']:.2e}" if "rel_err" in r else "-"
        lines.append(
            f"| {r['model']} | {r['gpus']} | {r['fps']:.2f} | {r['dit_fps']:.2f} | "
            f"{r['first_frame_ms']:.0f} | {r['chunk_ms']:.0f} | {err} | {r['peak_gib']:.1f} |"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default="wan2.1-1.3b,wan2.1-14b")
    parser.add_argument("--model", default="wan2.1-1.3b")
    parser.add_argument("--gpus", default="1,2,4")
    parser.add_argument("--device", default="cuda", choices=("cuda", "cpu"))
    parser.add_argument("--chunks", type=int, default=6)
    parser.add_argument("--size", default="832x480", type=lambda s: tuple(map(int, s.split("x"))))
    parser.add_argument("--budget-s", type=float, default=420.0)
    parser.add_argument("--run-timeout-s", type=float, default=300.0)
    parser.add_argument(
        "--json", default=os.path.join(os.environ.get("OUT", "."), "multi_gpu.json")
    )
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--row", default="", help=argparse.SUPPRESS)
    parser.add_argument("--reference", default="", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.worker:
        _worker(args)
        return 0
    available = torch.cuda.device_count() if args.device == "cuda" else 8
    start, rows = time.monotonic(), []
    with tempfile.TemporaryDirectory() as tmp:
        for model in args.models.split(","):
            for gpus in map(int, args.gpus.split(",")):
                if gpus > available:
                    rows.append({"model": model, "gpus": gpus, "skipped": f"{available} GPUs here"})
                elif time.monotonic() - start > args.budget_s:
                    rows.append({"model": model, "gpus": gpus, "skipped": "over --budget-s"})
                else:
                    rows.append(_launch(args, model, gpus, Path(tmp)))
                print(json.dumps(rows[-1]), flush=True)
                Path(args.json).write_text(json.dumps({"rows": rows}, indent=1))
    print(_table(rows))
    return 0 if all("error" not in r for r in rows) else 1


if __name__ == "__main__":
    raise SystemExit(main())
