"""What the fleet edge reads of the live server (``server.context.ServerContext`` is one; the
edge may not import it: the context holds every edge)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    from runtime.engine import Engine
    from server.config.serve import ServerConfig
    from server.edge.auth import Authenticator
    from sessions.host import SessionHost
    from sessions.job_host import JobHost
    from sessions.session import Session

__all__ = ["FleetContext", "SessionWatch"]


class SessionWatch(Protocol):
    """The metrics' hold on a session (``ServerMetrics.watch``): a resumed one is watched."""

    def watch(self, session: Session) -> None: ...


class FleetContext(Protocol):
    """The server's parts a fleet worker and the DeploymentCard read (read-only)."""

    @property
    def config(self) -> ServerConfig: ...
    @property
    def engine(self) -> Engine: ...
    @property
    def host(self) -> SessionHost: ...
    @property
    def jobs(self) -> JobHost: ...
    @property
    def auth(self) -> Authenticator: ...
    @property
    def metrics(self) -> SessionWatch: ...
    @property
    def device(self) -> str: ...
    @property
    def model_id(self) -> str: ...
    @property
    def engine_id(self) -> str: ...
    @property
    def public_url(self) -> str: ...
    @property
    def draining(self) -> bool: ...
