"""One realtime session's DiT spread over 1, 2 and 4 GPUs with Ulysses sequence parallelism,
and the Wan VAE decode alone split by rows over 1, 2 and 4 GPUs (halo exchange).

For each model (``--models``, default ``wan2.1-1.3b,wan2.1-14b``) and each GPU count
(``--gpus``, default ``1,2,4``) the launcher starts ``torchrun --nproc-per-node N`` on this
module (``NCCL_NVLS_ENABLE=0`` and no other multicast, as the device README asks) and collects
one row per run; counts above ``torch.cuda.device_count()`` are listed as skipped, and runs not
started within ``--budget-s`` too. Inside torchrun, every rank builds the same DiT with random
bf16 weights (seeded, then broadcast from rank 0), enables ``models/wan/dit/sequence_parallel.py``
over the world (sp = N) and runs one session at 832x480, chunks of 3 latent frames (4680
tokens), K/V window 9 + sink 3 frames, 4 denoising steps then the K/V update per chunk, and the
VAE decode of each chunk either on rank 0 only (``rank0``: the other ranks wait at the next
all-to-all) or split by rows over every rank (``split``: ``models/wan/vae/split.py``), each
GPU count above 1 once per ``--decodes`` mode. Random cross-attention K/V stand in for the text
encoder (not run).

Measured per session run (eager PyTorch, no compile, no CUDA graphs):
- ``fps``: steady-state frames per second, decode included (12 frames per chunk);
- ``dit_fps``: the same without the decode (what sequence parallelism scales);
- ``first_frame_ms``: a fresh session's first chunk - 4 steps, then the decode of its first
  latent frame alone - from the start to the frame on the host;
- ``chunk_ms`` (median), ``rel_err`` of the last chunk's DiT output vs the 1-GPU run's.

Decode rows (``--decode-gpus``, default ``1,2,4``; empty: none): the Wan2.1 VAE (random bf16
weights, broadcast) decodes a stream of ``--chunks`` chunks of 3 latent frames at ``--size``,
split by rows over N ranks (N = 1: the plain decoder). ``decode_ms``: median steady chunk, on
rank 0's host as whole frames (the gather included); ``first_frame_ms``: the first latent frame
alone; ``exchanges``: collectives per decode call; ``rel_err``: the last chunk's frames vs 1 GPU.

    python -m infra.bench.multi_gpu [--models wan2.1-1.3b,wan2.1-14b] [--gpus 1,2,4]
        [--decodes rank0,split] [--decode-gpus 1,2,4] [--chunks 6] [--budget-s 420] [--json F]

CPU check (gloo, tiny presets at 64x64): ``python -m infra.bench.multi_gpu --device cpu
--models tiny --gpus 1,2 --decode-gpus 1,2 --size 64x64``. JSON: every row, rewritten after
each run.
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
from typing import Any

import torch

CHUNK = 3  # latent frames per chunk
WINDOW, SINK = 9, 3  # K/V frames
STEPS = (1000.0, 750.0, 500.0, 250.0)


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _join(args: argparse.Namespace) -> tuple[int, int, torch.device, torch.dtype]:
    """This rank of the torchrun world: (rank, world size, device, dtype)."""
    import torch.distributed as dist

    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    cuda = args.device == "cuda"
    device = torch.device(f"cuda:{int(os.environ['LOCAL_RANK'])}" if cuda else "cpu")
    if cuda:
        torch.cuda.set_device(device)
    dist.init_process_group("nccl" if cuda else "gloo", device_id=device if cuda else None)
    return rank, world, device, torch.bfloat16 if cuda else torch.float32


def _vae(device: torch.device, dtype: torch.dtype) -> Any:
    """The Wan2.1 VAE (tiny preset on the CPU), random weights identical on every rank."""
    import torch.distributed as dist

    from models.wan.vae.autoencoder import WanVAE
    from models.wan.vae.config import WanVAEConfig

    torch.manual_seed(0)
    with device:
        vae = WanVAE(WanVAEConfig.preset("wan2.1" if device.type == "cuda" else "tiny")).eval()
    vae = vae.to(dtype)
    for p in vae.parameters():
        dist.broadcast(p.data, src=0)
    return vae


def _record(args: argparse.Namespace, rank: int, world: int, row: dict, last: torch.Tensor) -> None:
    """Rank 0: ``rel_err`` of ``last`` vs the 1-GPU run's (which saves it), then the row."""
    if rank != 0:
        return
    ref = Path(args.reference)
    last = last.float().cpu()
    if world == 1:
        torch.save(last, ref)
    elif ref.exists():
        base = torch.load(ref)
        row["rel_err"] = ((last - base).abs().max() / base.abs().max()).item()
    Path(args.row).write_text(json.dumps(row))


def _peak_gib(device: torch.device) -> float:
    return torch.cuda.max_memory_allocated(device) / 2**30 if device.type == "cuda" else 0.0


def _worker(args: argparse.Namespace) -> dict:
    """One rank of a torchrun world: the session of the module docstring."""
    import torch.distributed as dist

    from models.wan.dit.config import WanDiTConfig
    from models.wan.dit.sequence_parallel import enable, local_kv_config
    from models.wan.dit.transformer import WanDiT, param_dtype
    from models.wan.kv.cache import ChunkKVCache
    from models.wan.vae.split import RowSplitVAE

    rank, world, device, dtype = _join(args)
    config = WanDiTConfig.preset(args.model)
    torch.manual_seed(0)
    with device:
        dit = WanDiT(config).eval()
    for name, p in dit.named_parameters():
        p.data = p.data.to(param_dtype(name, dtype))
        dist.broadcast(p.data, src=0)  # identical weights on every rank, whatever the RNG
    vae = _vae(device, dtype)
    if world > 1:
        enable(dit, dist.group.WORLD)
    split = args.decode == "split" and world > 1
    codec = RowSplitVAE(vae, dist.group.WORLD) if split else vae
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
        dec = codec.new_decoder_cache(1, lh, lw)
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
            if rank == 0 or split:
                if chunk == 0:  # the first picture leaves alone, then the chunk's rest
                    codec.decode_chunk(z[:, :, :1], dec).cpu()
                    first_s = time.perf_counter() - t0
                    codec.decode_chunk(z[:, :, 1:], dec).cpu()
                else:
                    codec.decode_chunk(z, dec).cpu()
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
        "decode": "split" if split else "rank0",
        "fps": frames / statistics.median(steady),
        "dit_fps": frames / statistics.median(steady_dit),
        "first_frame_ms": 1000 * first_s,
        "chunk_ms": 1000 * statistics.median(steady),
        "peak_gib": _peak_gib(device),
    }
    _record(args, rank, world, row, out)
    dist.destroy_process_group()
    return row


def _decode_worker(args: argparse.Namespace) -> dict:
    """One rank of a torchrun world: the decode rows of the module docstring."""
    import torch.distributed as dist

    from models.wan.vae.split import RowSplitVAE

    rank, world, device, dtype = _join(args)
    vae = _vae(device, dtype)
    codec = RowSplitVAE(vae, dist.group.WORLD) if world > 1 else vae
    width, height = args.size
    lh, lw = height // 8, width // 8
    gen = torch.Generator(device).manual_seed(1)  # the same latents on every rank
    z_dim = vae.config.z_dim
    zs = [torch.randn(1, z_dim, CHUNK, lh, lw, generator=gen, device=device).to(dtype)]
    zs *= args.chunks

    def stream() -> tuple[list[float], float, torch.Tensor]:
        cache = codec.new_decoder_cache(1, lh, lw)
        chunk_s, first_s, frames = [], 0.0, zs[0]
        for chunk, z in enumerate(zs):
            _sync(device)
            dist.barrier()
            t0 = time.perf_counter()
            if chunk == 0:
                codec.decode_chunk(z[:, :, :1], cache).cpu()
                first_s = time.perf_counter() - t0
                frames = codec.decode_chunk(z[:, :, 1:], cache).cpu()
            else:
                frames = codec.decode_chunk(z, cache).cpu()
            chunk_s.append(time.perf_counter() - t0)
        return chunk_s, first_s, frames

    with torch.no_grad():
        stream()  # warm-up
        before = codec.bands.exchanges if world > 1 else 0
        chunk_s, first_s, frames = stream()
        # per decode call (the first chunk is two: its first latent frame, then the rest)
        exchanges = (codec.bands.exchanges - before) / (args.chunks + 1) if world > 1 else 0
    row = {
        "model": "wan2.1-vae" if device.type == "cuda" else "tiny-vae",
        "gpus": world,
        "decode_ms": 1000 * statistics.median(chunk_s[1:] or chunk_s),
        "first_frame_ms": 1000 * first_s,
        "exchanges": exchanges,
        "peak_gib": _peak_gib(device),
    }
    _record(args, rank, world, row, frames)
    dist.destroy_process_group()
    return row


def _launch(args: argparse.Namespace, model: str, gpus: int, decode: str, tmp: Path) -> dict:
    """One torchrun run; ``decode``: the session's decode mode, or ``"vae"`` (a decode row)."""
    row_file = tmp / f"{model}-{gpus}-{decode}.json"
    env = dict(os.environ, NCCL_NVLS_ENABLE="0", OMP_NUM_THREADS="1")
    cmd = [
        sys.executable, "-m", "torch.distributed.run", "--standalone",
        f"--nproc-per-node={gpus}", "-m", "infra.bench.multi_gpu", "--worker",
        "--device", args.device, "--model", model, "--chunks", str(args.chunks),
        "--size", f"{args.size[0]}x{args.size[1]}", "--row", str(row_file),
        "--reference", str(tmp / f"{model}-{'vae' if decode == 'vae' else 'dit'}-ref.pt"),
        "--decode", decode,
    ]  # fmt: skip
    done = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=args.run_timeout_s)
    if done.returncode != 0 or not row_file.exists():
        tail = (done.stderr or done.stdout)[-1500:]
        return {
            "model": model,
            "gpus": gpus,
            "decode": decode,
            "error": f"rc={done.returncode}: {tail}",
        }
    return json.loads(row_file.read_text())


def _failed(r: dict) -> str:
    reason = str(r["error"] if "error" in r else r.get("skipped"))
    return f"| {r['model']} | {r['gpus']} | {reason[:160]!r} |"


def _table(rows: list[dict]) -> str:
    head = (
        "| model | GPUs | decode | FPS | DiT-only FPS | first frame ms | chunk ms "
        "| rel err vs 1 GPU | peak GiB |"
    )
    lines = [head, "|" + " --- |" * 9]
    decode_head = (
        "| VAE | GPUs | decode ms / chunk | first frame ms | collectives / decode "
        "| rel err vs 1 GPU | peak GiB |"
    )
    decode_lines = [decode_head, "|" + " --- |" * 7]
    for r in rows:
        err = f"{r['rel_err']:.2e}" if "rel_err" in r else "-"
        if r.get("decode") == "vae" or "decode_ms" in r:
            if "decode_ms" not in r:
                decode_lines.append(_failed(r))
                continue
            decode_lines.append(
                f"| {r['model']} | {r['gpus']} | {r['decode_ms']:.1f} | {r['first_frame_ms']:.1f} "
                f"| {r['exchanges']:.0f} | {err} | {r['peak_gib']:.1f} |"
            )
        elif "fps" not in r:
            lines.append(_failed(r))
        else:
            lines.append(
                f"| {r['model']} | {r['gpus']} | {r['decode']} | {r['fps']:.2f} | "
                f"{r['dit_fps']:.2f} | {r['first_frame_ms']:.0f} | {r['chunk_ms']:.0f} | {err} | "
                f"{r['peak_gib']:.1f} |"
            )
    tables = [lines] if len(lines) > 2 else []
    tables += [decode_lines] if len(decode_lines) > 2 else []
    return "\n\n".join("\n".join(t) for t in tables)


def _runs(args: argparse.Namespace) -> list[tuple[str, int, str]]:
    """(model, GPUs, decode) of every run, in order: the decode rows first (short), then the
    sessions."""
    vae = "wan2.1-vae" if args.device == "cuda" else "tiny-vae"
    runs = [(vae, g, "vae") for g in map(int, filter(None, args.decode_gpus.split(",")))]
    for model in filter(None, args.models.split(",")):
        for gpus in map(int, filter(None, args.gpus.split(","))):
            modes = args.decodes.split(",") if gpus > 1 else ["rank0"]
            runs += [(model, gpus, mode) for mode in modes]
    return runs


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default="wan2.1-1.3b,wan2.1-14b")
    parser.add_argument("--model", default="wan2.1-1.3b")
    parser.add_argument("--gpus", default="1,2,4")
    parser.add_argument("--decodes", default="rank0,split")
    parser.add_argument("--decode-gpus", default="1,2,4")
    parser.add_argument("--device", default="cuda", choices=("cuda", "cpu"))
    parser.add_argument("--chunks", type=int, default=6)
    parser.add_argument("--size", default="832x480", type=lambda s: tuple(map(int, s.split("x"))))
    parser.add_argument("--budget-s", type=float, default=420.0)
    parser.add_argument("--run-timeout-s", type=float, default=300.0)
    parser.add_argument(
        "--json", default=os.path.join(os.environ.get("OUT", "."), "multi_gpu.json")
    )
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--decode", default="rank0", help=argparse.SUPPRESS)
    parser.add_argument("--row", default="", help=argparse.SUPPRESS)
    parser.add_argument("--reference", default="", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.worker:
        (_decode_worker if args.decode == "vae" else _worker)(args)
        return 0
    available = torch.cuda.device_count() if args.device == "cuda" else 8
    start, rows = time.monotonic(), []
    with tempfile.TemporaryDirectory() as tmp:
        for model, gpus, decode in _runs(args):
            if gpus > available:
                row = {"model": model, "gpus": gpus, "skipped": f"{available} GPUs here"}
            elif time.monotonic() - start > args.budget_s:
                row = {"model": model, "gpus": gpus, "skipped": "over --budget-s"}
            else:
                row = _launch(args, model, gpus, decode, Path(tmp))
            rows.append({"decode": decode, **row})
            print(json.dumps(rows[-1]), flush=True)
            Path(args.json).write_text(json.dumps({"rows": rows}, indent=1))
    print(_table(rows))
    return 0 if all("error" not in r for r in rows) else 1


if __name__ == "__main__":
    raise SystemExit(main())
