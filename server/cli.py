"""The ``dreamrt`` command line (docs/api.md "Command line"): serve, models, watch, job, bench.

Exit codes: 0 success, 1 the command failed (the message says why), 2 bad usage or a refused
configuration (e.g. ``--auth none`` on a public address without ``--force-no-auth``).
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import sys
from pathlib import Path

__all__ = ["SCHEDULERS", "main"]

# runtime.policies.SCHEDULER_POLICIES, spelled out so the parser imports no runtime module
# (a test keeps the two equal)
SCHEDULERS = ("step-edf", "chunk-rr", "fifo")


def _build_parser() -> argparse.ArgumentParser:
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument(
        "--log-level", default="info", choices=["debug", "info", "warning", "error"]
    )
    parser = argparse.ArgumentParser(prog="dreamrt", description="realtime generative video server")
    sub = parser.add_subparsers(dest="command", required=True)

    serve = sub.add_parser("serve", help="run the server", parents=[common])
    serve.add_argument("--host", default="127.0.0.1")
    serve.add_argument("--port", type=int, default=8000)
    serve.add_argument("--model", default=None, help="model card id (default: the embedded card)")
    serve.add_argument("--device", default="auto", choices=["auto", "cpu", "cuda"])
    serve.add_argument("--data-dir", default="data", type=Path)
    serve.add_argument(
        "--ice-host",
        action="append",
        default=[],
        metavar="IP",
        help="offer ICE host candidates only on this address (repeatable)",
    )
    serve.add_argument(
        "--ice-server",
        action="append",
        default=[],
        metavar="URL",
        help="STUN/TURN server URL for the server's peers, TURN credentials as "
        "turn:USER:PASSWORD@host:port (default: none)",
    )
    serve.add_argument(
        "--auth",
        choices=["none", "token"],
        default=None,
        help="default: none on a loopback address, token elsewhere",
    )
    serve.add_argument(
        "--force-no-auth", action="store_true", help="allow --auth none on a non-loopback address"
    )
    serve.add_argument(
        "--admin-key", default=None, help="admin key for --auth token (or $DREAMRT_ADMIN_KEY)"
    )
    serve.add_argument(
        "--max-sessions", type=int, default=4, help="chunk-KV slabs, i.e. concurrent sessions"
    )
    serve.add_argument(
        "--bitrate", type=int, default=None, metavar="BPS", help="video encoder bitrate cap"
    )
    serve.add_argument(
        "--unwatched-timeout",
        type=float,
        default=300.0,
        metavar="SECONDS",
        help="close sessions without a viewer for this long (0: never)",
    )
    serve.add_argument(
        "--scheduler",
        choices=SCHEDULERS,
        default=SCHEDULERS[0],
        help="scheduling policy: step-edf (step-level earliest deadline first, default); "
        "chunk-rr (whole chunks, sessions in turn) and fifo (one request at a time, in "
        "arrival order) are request-level baselines to measure against",
    )
    serve.add_argument(
        "--deterministic",
        action="store_true",
        help="batched plans give bit-identical results to solo runs (slower batching)",
    )
    serve.add_argument(
        "--checkpoint",
        type=Path,
        default=None,
        metavar="DIR",
        help="checkpoint directory of a card with external weights (laid out as its manifest says)",
    )
    serve.add_argument(
        "--adapter",
        action="append",
        default=[],
        metavar="NAME=PATH",
        help="register a LoRA adapter (a safetensors file; PEFT or diffusers keys) sessions may "
        "name; repeatable",
    )
    serve.add_argument(
        "--compile",
        action="store_true",
        help="GPU serving: torch.compile the DiT blocks and the VAE decoder, decode on a second "
        "CUDA stream; one internal warm-up session compiles every graph before serving",
    )
    serve.add_argument(
        "--attention",
        default="auto",
        metavar="NAME",
        help="with --compile: the self-attention kernel (auto: fa3 where fa3-fwd is installed, "
        "else sdpa; exact: sdpa, flash, cudnn, fa3; lossy: sage, "
        "fp8-triton, fp8qk-triton, fa3-fp8, cudnn-fp8; one that cannot run falls back to "
        "SDPA, logged)",
    )
    serve.add_argument(
        "--cuda-graphs",
        action="store_true",
        help="with --compile: replay CUDA graphs of steady-state chunk forwards (the warm-up "
        "captures them for every slab)",
    )
    serve.add_argument(
        "--compile-cache",
        type=Path,
        default=None,
        metavar="DIR",
        help="with --compile: keep Inductor's compiled artifacts here, one directory per card, "
        "torch version, device and serving levers (default: DATA_DIR/compile-cache); a shared "
        "volume lets a fresh machine start warm",
    )
    serve.add_argument(
        "--no-warmup",
        action="store_true",
        help="with --compile: skip the warm-up (the first session then pays compilation)",
    )
    from server.limits import add_limit_arguments

    add_limit_arguments(serve)
    serve.add_argument(
        "--fault-injection",
        action="store_true",
        help="tests and drills only: POST /v1/faults (admin) makes a session's or job's next "
        "step fail with nan, exception or oom",
    )
    serve.add_argument(
        "--chunk-frames",
        type=int,
        default=None,
        metavar="N",
        help="latent frames per chunk (default: the card's); 1 is the latency mode for "
        "world-model control (4 video frames per chunk on a Wan VAE)",
    )
    serve.add_argument(
        "--gpus",
        type=int,
        default=1,
        metavar="N",
        help="spread one instance over N processes of this node (Ulysses sequence parallelism; "
        "relaunches under torchrun; untested on GPUs so far)",
    )
    serve.add_argument(
        "--parallel",
        default="",
        metavar="PLAN",
        help="the parallel plan of --gpus N, e.g. 'cfg=2' or 'sp=2,cfg=2' (the degrees' product "
        "is N; default: the card's plan, else sp=N)",
    )
    serve.add_argument(
        "--random-weights",
        action="store_true",
        help="seeded random weights instead of the card's (benchmarks of a card whose "
        "checkpoint is not at hand; the picture is noise)",
    )
    serve.add_argument(
        "--steering",
        choices=["fast", "baseline"],
        default="fast",
        help="fast (default): adaptive lead limit, queued plans withdrawn for new inputs, "
        "chunks restarted when regenerating is sooner; baseline: the plain input "
        "path, to measure against",
    )
    serve.add_argument(
        "--admission-cost",
        choices=["auto", "measured", "prior"],
        default="auto",
        help="a session's compute share at admission: measured chunk costs once calibrated, "
        "or the analytic prior; auto (default): measured on a GPU, the prior on a CPU",
    )
    serve.add_argument(
        "--snapshot-every",
        type=int,
        default=8,
        metavar="N",
        help="replay snapshot of each session's loop every N chunks (0: none, no replay)",
    )
    serve.add_argument(
        "--snapshot-keep",
        type=int,
        default=16,
        metavar="K",
        help="newest replay snapshots kept per loop (older chunks can no longer be replayed)",
    )
    serve.add_argument(
        "--snapshot-mbps",
        type=float,
        default=64.0,
        metavar="MB",
        help="at most MB megabytes of snapshots per second per loop: a big state (a Wan "
        "session's K/V cache, ~3.5 GB) is snapshotted less often than --snapshot-every (0: no "
        "limit)",
    )
    serve.add_argument(
        "--snapshot-keep-gb",
        type=float,
        default=8.0,
        metavar="GB",
        help="at most GB gigabytes of snapshots kept per loop, fewer than --snapshot-keep if "
        "need be; the newest is always kept (0: no limit)",
    )
    serve.add_argument(
        "--extension",
        action="append",
        default=[],
        metavar="NAME[:k=v,...]",
        help="enable an extension for this server, its params the defaults of every request: "
        "fbcache, teacache (e.g. fbcache:threshold=0.05); jobs may override enabled ones",
    )
    serve.add_argument(
        "--shutdown-timeout",
        type=float,
        default=10.0,
        metavar="SECONDS",
        help="SIGTERM: snapshot, close every session and exit 0 within this",
    )
    serve.add_argument(
        "--resume-grace",
        type=float,
        default=120.0,
        metavar="SECONDS",
        help="a session of the previous process resumes on an offer within this after "
        "startup (0: never)",
    )
    serve.add_argument(
        "--livekit-key",
        default=None,
        help="LiveKit API key that mints the engine's join tokens (default: $LIVEKIT_API_KEY)",
    )
    serve.add_argument(
        "--livekit-secret",
        default=None,
        help="LiveKit API secret (default: $LIVEKIT_API_SECRET)",
    )

    from server import fleet_cli

    fleet_cli.add_serve_options(serve)
    fleet_cli.add_router_parser(sub, [common])

    sub.add_parser("models", help="list the model cards", parents=[common])
    _add_bench_parser(sub)

    watch = sub.add_parser("watch", help="watch a session over WebRTC", parents=[common])
    watch.add_argument("url")
    watch.add_argument("--prompt", default="a quiet forest at dawn")
    watch.add_argument("--seconds", type=float, default=5.0)
    watch.add_argument("--out", type=Path, default=None, metavar="FILE.mp4")
    watch.add_argument(
        "--action", nargs="+", default=None, metavar="KEYS", help="keys to hold, e.g. w a"
    )
    watch.add_argument("--model", default=None)
    watch.add_argument("--token", default=None)
    watch.add_argument("--ice-host", action="append", default=[], metavar="IP")

    job = sub.add_parser(
        "job", help="submit an offline job and download its artifact", parents=[common]
    )
    job.add_argument("url")
    job.add_argument("--task", required=True, choices=["t2v", "t2i"])
    job.add_argument("--prompt", required=True)
    job.add_argument("--out", type=Path, default=None)
    job.add_argument("--model", default=None)
    job.add_argument("--num-frames", type=int, default=None)
    job.add_argument("--width", type=int, default=None)
    job.add_argument("--height", type=int, default=None)
    job.add_argument("--steps", type=int, default=None)
    job.add_argument("--seed", type=int, default=None)
    job.add_argument("--token", default=None)
    from server import replay as replay_cli

    replay_cli.add_parser(sub, [common])
    from server import export as export_cli

    export_cli.add_parser(sub, [common])
    from models.recipe_cli import add_parsers as add_recipe_parsers  # train / eval RECIPE

    add_recipe_parsers(sub, parents=[common])
    return parser


def _models() -> int:
    from models import registry

    for card in registry.list_cards():
        label = "  (random weights)" if card.weights.value == "random" else ""
        sys.stdout.write(card.summary_line() + label + "\n")
        # Indented detail lines under each card: what to type and which inputs it obeys.
        if card.ui.examples:
            sys.stdout.write("    examples: " + " | ".join(card.ui.examples) + "\n")
        for control in card.ui.controls:
            sys.stdout.write(f"    {control.describe()}\n")
    return 0


def _watch(args: argparse.Namespace) -> int:
    from clients.python.api import ApiCallError
    from clients.python.watch import watch

    try:
        asyncio.run(
            watch(
                args.url,
                prompt=args.prompt,
                seconds=args.seconds,
                out=args.out,
                actions=args.action,
                token=args.token,
                ice_hosts=args.ice_host or None,
                model=args.model,
            )
        )
    except (ApiCallError, TimeoutError, OSError) as exc:
        sys.stderr.write(f"dreamrt watch: {exc}\n")
        return 1
    return 0


def _job(args: argparse.Namespace) -> int:
    from clients.python.api import ApiCallError
    from clients.python.job import JobFailed, run_job

    try:
        asyncio.run(
            run_job(
                args.url,
                task=args.task,
                prompt=args.prompt,
                out=args.out,
                token=args.token,
                model=args.model,
                num_frames=args.num_frames,
                width=args.width,
                height=args.height,
                steps=args.steps,
                seed=args.seed,
            )
        )
    except (ApiCallError, JobFailed, TimeoutError, OSError) as exc:
        sys.stderr.write(f"dreamrt job: {exc}\n")
        return 1
    return 0


# ``dreamrt bench NAME`` -> module under infra/bench with ``main(argv)``; each prints one table.
BENCHMARKS = {
    "scheduler-overhead": "infra.bench.scheduler_overhead",
    "gpu-smoke": "infra.bench.gpu_smoke",
    "gpu-session": "infra.bench.gpu_session",
    "multisession": "infra.bench.multisession",
    "vae-decode": "infra.bench.vae_decode",
    "tiny-decoder": "infra.bench.tiny_decoder",
    "browser-latency": "infra.bench.browser_latency",
    "attention": "infra.bench.attention_bench",
    "attention-libs": "infra.bench.attention_libs",
    "quality-guard": "infra.bench.quality_guard",
    "latency": "infra.bench.latency",
    "gpu-latency": "infra.bench.gpu_latency",
    "extensions": "infra.bench.extensions",
}


def _add_bench_parser(sub: argparse._SubParsersAction) -> None:
    bench = sub.add_parser(
        "bench",
        help="run a benchmark from infra/bench and print its table",
        description="benchmarks: " + ", ".join(BENCHMARKS) + "; arguments after NAME go to it "
        "(dreamrt bench NAME --help lists them)",
    )
    bench.add_argument("name", choices=sorted(BENCHMARKS))
    bench.add_argument("bench_args", nargs=argparse.REMAINDER)


def _bench(args: argparse.Namespace) -> int:
    import importlib

    module = importlib.import_module(BENCHMARKS[args.name])
    code = module.main(args.bench_args)
    return 0 if code is None else int(code)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["bench"]:  # everything after NAME belongs to the benchmark
        bench_parser = argparse.ArgumentParser(prog="dreamrt")
        _add_bench_parser(bench_parser.add_subparsers(dest="command", required=True))
        logging.basicConfig(level=logging.WARNING)
        return _bench(bench_parser.parse_args(argv))
    args = _build_parser().parse_args(argv)
    logging.basicConfig(
        level=args.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    if args.command in ("watch", "job") and args.log_level != "debug":
        # The clients print their own progress; per-request HTTP and ICE chatter would drown it.
        for noisy in ("httpx", "aioice", "aiortc"):
            logging.getLogger(noisy).setLevel(logging.WARNING)
    if args.command == "serve":
        from server.serve_cli import serve

        return serve(args, argv)
    if args.command == "router":
        from server import fleet_cli

        return fleet_cli.main(args)
    if args.command == "models":
        return _models()
    if args.command == "watch":
        return _watch(args)
    if args.command == "job":
        return _job(args)
    if args.command == "export":
        from server import export as export_cli

        return export_cli.main(args)
    if args.command == "replay":
        from server import replay as replay_cli

        return replay_cli.main(args)
    if args.command in ("train", "eval"):  # models/recipe_cli.py
        return args.handler(args)
    raise SystemExit(f"unhandled command {args.command!r}")


if __name__ == "__main__":
    sys.exit(main())
