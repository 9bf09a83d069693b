"""The ``dreamrt`` command line (docs/api.md "Command line"): serve, compile, models, watch, job,
bench.

Exit codes: 0 success, 1 the command failed (the message says why), 2 bad usage or a refused
configuration (e.g. ``--auth none`` on a public address without ``--force-no-auth``).
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import sys
from pathlib import Path

from server.config.groups import SCHEDULERS

__all__ = ["SCHEDULERS", "main"]


def _build_parser() -> argparse.ArgumentParser:
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument(
        "--log-level", default="info", choices=["debug", "info", "warning", "error"]
    )
    parser = argparse.ArgumentParser(prog="dreamrt", description="realtime generative video server")
    sub = parser.add_subparsers(dest="command", required=True)

    serve = sub.add_parser(
        "serve",
        help="run the server",
        parents=[common],
        description="every option is also a $DREAMRT_* variable and a key of --config FILE "
        "(docs/configuration.md)",
    )
    from server.config.sources import add_config_arguments

    add_config_arguments(serve)
    compile_parser = sub.add_parser(
        "compile",
        help="build the compile cache of a card's compiled set without serving",
        parents=[common],
        description="takes serve's settings (the card, device, levers, --compile-cache); "
        "exits 1 on a graph break (docs/api.md)",
    )
    add_config_arguments(compile_parser)
    from server.router import cli as fleet_cli

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

    run = sub.add_parser(
        "run",
        help="run a ComfyUI API-format workflow on a server and download its artifact",
        parents=[common],
    )
    run.add_argument("workflow", type=Path, help="ComfyUI API-format JSON (or a /prompt body)")
    run.add_argument("--url", default="http://127.0.0.1:8000")
    run.add_argument("--model", default=None)
    run.add_argument("--out", type=Path, default=None)
    run.add_argument("--token", default=None)
    from server.data import replay as replay_cli

    replay_cli.add_parser(sub, [common])
    from server.data import export as export_cli

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


def _run_workflow(args: argparse.Namespace) -> int:
    from clients.python.api import ApiCallError
    from clients.python.job import JobFailed
    from clients.python.workflow import run_workflow

    try:
        asyncio.run(
            run_workflow(args.url, args.workflow, model=args.model, out=args.out, token=args.token)
        )
    except (ApiCallError, JobFailed, TimeoutError, OSError, ValueError) as exc:
        sys.stderr.write(f"dreamrt run: {exc}\n")
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
    "fp8-ops": "infra.bench.fp8_ops",
    "quality-guard": "infra.bench.quality_guard",
    "latency": "infra.bench.latency",
    "gpu-latency": "infra.bench.gpu_latency",
    "extensions": "infra.bench.extensions",
    "capacity": "infra.bench.capacity",
    "warm-serving": "infra.bench.warm_serving",
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
    if args.command in ("watch", "job", "run") and args.log_level != "debug":
        # The clients print their own progress; per-request HTTP and ICE chatter would drown it.
        for noisy in ("httpx", "aioice", "aiortc"):
            logging.getLogger(noisy).setLevel(logging.WARNING)
    if args.command == "serve":
        from server.serve_cli import serve

        return serve(args, argv)
    if args.command == "compile":
        from server.compile_cli import compile_cache_command

        return compile_cache_command(argv[1:])
    if args.command == "router":
        from server.router import cli as fleet_cli

        return fleet_cli.main(args)
    if args.command == "models":
        return _models()
    if args.command == "watch":
        return _watch(args)
    if args.command == "job":
        return _job(args)
    if args.command == "run":
        return _run_workflow(args)
    if args.command == "export":
        from server.data import export as export_cli

        return export_cli.main(args)
    if args.command == "replay":
        from server.data import replay as replay_cli

        return replay_cli.main(args)
    if args.command in ("train", "eval"):  # models/recipe_cli.py
        return args.handler(args)
    raise SystemExit(f"unhandled command {args.command!r}")


if __name__ == "__main__":
    sys.exit(main())
