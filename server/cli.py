"""The ``dreamrt`` command line (API.md "Command line")."""

from __future__ import annotations

import argparse
import sys


def _build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="dreamrt", description="realtime generative video server")
    sub = parser.add_subparsers(dest="command", required=True)

    serve = sub.add_parser("serve", help="run the server")
    serve.add_argument("--host", default="127.0.0.1")
    serve.add_argument("--port", type=int, default=8000)
    serve.add_argument("--model", default=None, help="model card id (default: the embedded card)")
    serve.add_argument("--device", default="auto", choices=["auto", "cpu", "cuda"])
    serve.add_argument("--data-dir", default="data")
    serve.add_argument("--ice-host", action="append", default=None, metavar="IP")
    return parser


def _serve(args: argparse.Namespace) -> int:
    import uvicorn

    from server.app import create_app

    app = create_app(model=args.model, device=args.device)
    print(f"dreamrt: open http://{args.host}:{args.port}/", flush=True)
    uvicorn.run(app, host=args.host, port=args.port, log_level="info")
    return 0


def main(argv: list[str] | None = None) -> int:
    args = _build_parser().parse_args(argv)
    if args.command == "serve":
        return _serve(args)
    raise AssertionError(f"unhandled command {args.command!r}")


if __name__ == "__main__":
    sys.exit(main())
