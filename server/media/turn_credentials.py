"""Short-lived TURN credentials from a shared secret, and the ICE servers a client is told about.

The scheme is the one coturn implements as its "TURN REST API" (``use-auth-secret`` +
``static-auth-secret`` in ``turnserver.conf``): the username is the Unix time at which the
credential expires, optionally followed by ``:`` and a user id, and the password is
``base64(HMAC-SHA1(secret, username))``. A TURN server holding the same secret checks the HMAC
and the expiry by itself, so dreamrt never talks to it and stores nothing.

``advertised_ice_servers`` turns ``--client-ice-server`` (else ``--ice-server``) URLs into the
``IceServer`` values a WHEP answer advertises in ``Link: <url>; rel="ice-server"`` headers
(RFC 9725 section 4.6): credentials written in the URL (``turn:USER:PASS@host:port``) are kept,
a TURN URL without them gets freshly minted ones when a secret is configured, and STUN URLs go
out bare.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

__all__ = [
    "DEFAULT_TTL_S",
    "IceServer",
    "TurnCredentials",
    "advertised_ice_servers",
    "link_header",
    "split_ice_url",
]

DEFAULT_TTL_S = 3600.0


@dataclass(frozen=True, slots=True)
class IceServer:
    """One STUN/TURN server as a client should use it."""

    url: str  # without credentials, e.g. ``turn:turn.example.net:3478?transport=udp``
    username: str | None = None
    credential: str | None = None


class TurnCredentials:
    """Mints coturn REST-scheme credentials valid ``ttl_s`` seconds from ``clock()``."""

    def __init__(
        self, secret: str, *, ttl_s: float = DEFAULT_TTL_S, clock: Callable[[], float] = time.time
    ) -> None:
        if not secret:
            raise ValueError("the TURN shared secret is empty")
        if ttl_s <= 0:
            raise ValueError(f"turn ttl_s must be > 0, got {ttl_s}")
        self._secret = secret.encode()
        self.ttl_s = ttl_s
        self._clock = clock

    def mint(self, user: str = "") -> tuple[str, str]:
        """``(username, password)``: ``"<expiry>[:user]"`` and its base64 HMAC-SHA1."""
        expiry = int(self._clock() + self.ttl_s)
        username = f"{expiry}:{user}" if user else str(expiry)
        return username, self.password_for(username)

    def password_for(self, username: str) -> str:
        digest = hmac.new(self._secret, username.encode(), hashlib.sha1).digest()
        return base64.b64encode(digest).decode()


def split_ice_url(spec: str) -> IceServer:
    """``turn:USER:PASS@host:port?…`` -> the URL without credentials and the credentials
    (split at the last ``@``, like ``--ice-server``); a URL without ``@`` has none."""
    scheme, _, rest = spec.partition(":")
    if "@" not in rest:
        return IceServer(spec)
    credentials, _, address = rest.rpartition("@")
    username, _, password = credentials.partition(":")
    return IceServer(f"{scheme}:{address}", username, password)


def advertised_ice_servers(
    specs: Sequence[str], turn: TurnCredentials | None, *, user: str = ""
) -> list[IceServer]:
    """The ICE servers of ``specs`` for one client (module doc); ``user`` goes into minted
    usernames so a TURN server's logs can tell viewers apart."""
    out = []
    for spec in specs:
        server = split_ice_url(spec)
        is_turn = server.url.split(":", 1)[0].lower() in ("turn", "turns")
        if is_turn and server.username is None and turn is not None:
            username, password = turn.mint(user)
            server = IceServer(server.url, username, password)
        out.append(server)
    return out


def link_header(server: IceServer) -> str:
    """One ``Link`` value (RFC 9725 section 4.6; RFC 8288 quoting)."""
    value = f'<{server.url}>; rel="ice-server"'
    if server.username is not None:
        value += (
            f'; username="{_quoted(server.username)}"'
            f'; credential="{_quoted(server.credential or "")}"'
            '; credential-type="password"'
        )
    return value


def _quoted(text: str) -> str:
    return text.replace("\\", "\\\\").replace('"', '\\"')
