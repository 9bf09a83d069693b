"""The fleet's command line: ``dreamrt router`` (docs/api.md "Command line", "Fleet");
``dreamrt serve``'s fleet options are ``server.config.groups.FleetConfig``. The router
imports no model, runtime or session code.
"""

from __future__ import annotations

import argparse

__all__ = ["add_router_parser", "main"]


def _add_discovery_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--fleet-discovery",
        choices=["file", "etcd", "kubernetes"],
        default=None,
        help="Dynamo discovery (default: $DYN_DISCOVERY_BACKEND, else file); etcd reads "
        "$ETCD_ENDPOINTS",
    )
    parser.add_argument(
        "--fleet-dir",
        default=None,
        metavar="DIR",
        help="file discovery's shared directory (default: $DYN_FILE_KV, else /tmp/dreamrt-fleet)",
    )


def add_router_parser(
    sub: argparse._SubParsersAction, parents: list[argparse.ArgumentParser]
) -> None:
    router = sub.add_parser(
        "router",
        help="the fleet's front door: place sessions and jobs on engines",
        parents=parents,
    )
    router.add_argument("--fleet", required=True, metavar="NAMESPACE")
    router.add_argument("--host", default="127.0.0.1")
    router.add_argument("--port", type=int, default=8080)
    _add_discovery_options(router)
    router.add_argument(
        "--key", default=None, help="bearer key of the router's /v1 routes ($DREAMRT_ROUTER_KEY)"
    )
    router.add_argument(
        "--poll", type=float, default=1.0, metavar="SECONDS", help="engine card refresh period"
    )


def main(args: argparse.Namespace) -> int:
    import os

    from server.router.app import RouterConfig, create_router_app

    config = RouterConfig(
        fleet=args.fleet,
        host=args.host,
        port=args.port,
        discovery=args.fleet_discovery,
        fleet_dir=args.fleet_dir,
        key=args.key or os.environ.get("DREAMRT_ROUTER_KEY"),
        poll_s=args.poll,
    )
    banner = f"dreamrt router: fleet {args.fleet} at http://{args.host}:{args.port}/"
    from server.serve_cli import run_app

    return run_app(create_router_app(config), args, banner)
