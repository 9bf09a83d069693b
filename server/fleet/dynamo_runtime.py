"""NVIDIA Dynamo's ``DistributedRuntime`` as dreamrt's fleet processes build it.

Engines (``server.fleet.worker``) and the router (``server.router.app``) join the same runtime
configuration: discovery from ``--fleet-discovery`` or ``$DYN_DISCOVERY_BACKEND`` (``file``
by default: a directory every process sees, ``--fleet-dir`` or ``$DYN_FILE_KV``, default
/tmp/dreamrt-fleet; ``etcd`` at ``$ETCD_ENDPOINTS``; ``kubernetes``), the TCP request plane
(``$DYN_TCP_RPC_HOST`` picks the address it binds and advertises) and the ZMQ event plane, so
one machine needs neither etcd nor NATS. Dynamo is an optional extra (``dreamrt[fleet]``),
imported only here and only when a fleet process starts.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Protocol

__all__ = [
    "DEFAULT_FLEET_DIR",
    "DynamoClient",
    "DynamoEndpoint",
    "DynamoRuntime",
    "EndpointHandler",
    "dynamo_runtime",
]

# An endpoint's handler: (the request, Dynamo's context) -> its answers (one, here).
EndpointHandler = Callable[[object, object], AsyncIterator[dict[str, object]]]


class DynamoClient(Protocol):
    """What dreamrt calls of a Dynamo endpoint's client (the router's)."""

    def instance_ids(self) -> list[int]: ...

    async def direct(
        self, request: object, instance_id: int, *, annotated: bool
    ) -> AsyncIterator[dict[str, object]]: ...


class DynamoEndpoint(Protocol):
    """What dreamrt calls of a Dynamo endpoint (``DistributedRuntime.endpoint``)."""

    def serve_endpoint(
        self, handler: EndpointHandler, *, graceful_shutdown: bool
    ) -> Awaitable[None]: ...

    def connection_id(self) -> int: ...

    def unregister_endpoint_instance(self) -> Awaitable[None]: ...

    def client(self) -> Awaitable[DynamoClient]: ...


class DynamoRuntime(Protocol):
    """What dreamrt calls of Dynamo's ``DistributedRuntime``."""

    def endpoint(self, path: str) -> DynamoEndpoint: ...

    def shutdown(self) -> None: ...


DEFAULT_FLEET_DIR = "/tmp/dreamrt-fleet"  # file discovery's directory when none is given


def dynamo_runtime(discovery: str | None, fleet_dir: str | Path | None) -> DynamoRuntime:
    """A Dynamo ``DistributedRuntime`` on the running loop: discovery ``file`` (the
    directory ``fleet_dir``, else ``$DYN_FILE_KV``, else /tmp/dreamrt-fleet), ``etcd``
    (``$ETCD_ENDPOINTS``) or ``kubernetes``; TCP requests, ZMQ events."""
    # Dynamo logs every routed request (a span event at info); dreamrt logs what it decides
    os.environ.setdefault("DYN_LOG", "warn")
    os.environ.setdefault("DYN_LOGGING_SPAN_EVENTS", "0")
    try:
        from dynamo.runtime import DistributedRuntime
    except ImportError as exc:  # the optional extra
        raise RuntimeError(
            "fleet mode needs NVIDIA Dynamo's runtime: pip install 'dreamrt[fleet]' "
            f"(ai-dynamo-runtime): {exc}"
        ) from exc
    backend = discovery or os.environ.get("DYN_DISCOVERY_BACKEND") or "file"
    if backend == "file":
        directory = str(fleet_dir or os.environ.get("DYN_FILE_KV") or DEFAULT_FLEET_DIR)
        os.makedirs(directory, exist_ok=True)
        os.environ["DYN_FILE_KV"] = directory  # read by the runtime when it is built
    loop = asyncio.get_running_loop()
    return DistributedRuntime(loop, backend, "tcp", event_plane="zmq")
