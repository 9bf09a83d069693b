"""Bearer-token authorisation for ``/v1`` routes (docs/api.md "REST").

Modes: ``none`` (no checks; the default only when the server binds a loopback address, and
refused on any other address unless forced) and ``token``. In token mode every ``/v1`` request
carries ``Authorization: Bearer <token>`` where the token is one of:

- the server's **admin key** (scope ``admin``: everything, including ``POST /v1/tokens``);
- a token issued by ``POST /v1/tokens`` with scope ``admin`` or ``user`` (``user``: every
  route except issuing tokens), expiring after its ``ttl_s``;
- a **session token** returned by ``POST /v1/sessions`` (scope ``session:<id>``): the routes
  of that session only, expiring 7 days after it was issued (``SESSION_TOKEN_TTL_S``), however
  long the session runs (it is not revoked when the session ends).

Tokens are random (256 bits, ``drt_`` prefix); only their sha256 is stored (SQLite ``tokens``)
and cached in memory, so a stolen database does not leak usable tokens. Missing, unknown or
expired tokens answer 401, a valid token used outside its scope 403.

Comparisons are constant-time: the admin key is compared as sha256 digests with
``hmac.compare_digest`` (so neither its bytes nor its length leak through timing), and an
issued token is looked up by the sha256 of what the client sent (memory, then the store's
index): timing can at most tell a guess's hash from another hash, which says nothing about
any token. The admin key must be at least
``MIN_ADMIN_KEY_BYTES`` (32) bytes: a shorter one is refused at start (``WeakAdminKeyError``).
"""

from __future__ import annotations

import collections
import enum
import hashlib
import hmac
import ipaddress
import secrets
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

from sessions.store import Store

__all__ = [
    "AuthError",
    "AuthMode",
    "Authenticator",
    "Grant",
    "InsecureBindError",
    "MIN_ADMIN_KEY_BYTES",
    "WeakAdminKeyError",
    "check_admin_key",
    "is_loopback",
    "resolve_auth_mode",
]

SESSION_TOKEN_TTL_S = 7 * 24 * 3600.0  # seconds from issue
MIN_ADMIN_KEY_BYTES = 32


class AuthMode(str, enum.Enum):
    NONE = "none"
    TOKEN = "token"


class AuthError(Exception):
    """Refused: ``status`` is 401 (who are you?) or 403 (not allowed to do that)."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message


class InsecureBindError(ValueError):
    """``--auth none`` on a non-loopback address without ``--force-no-auth``."""


class WeakAdminKeyError(ValueError):
    """An admin key shorter than ``MIN_ADMIN_KEY_BYTES``."""


def check_admin_key(key: str, source: str = "the admin key") -> str:
    """``key`` if it is long enough to resist guessing; ``WeakAdminKeyError`` otherwise."""
    size = len(key.encode("utf-8"))
    if size < MIN_ADMIN_KEY_BYTES:
        raise WeakAdminKeyError(
            f"{source} is {size} bytes; an admin key needs at least {MIN_ADMIN_KEY_BYTES} "
            "(e.g. python -c 'import secrets; print(secrets.token_urlsafe(32))')"
        )
    return key


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def resolve_auth_mode(host: str, requested: str | None, *, force: bool = False) -> AuthMode:
    """``none`` by default on loopback, ``token`` elsewhere; refuses an unforced open bind."""
    if requested is None:
        return AuthMode.NONE if is_loopback(host) else AuthMode.TOKEN
    mode = AuthMode(requested)
    if mode is AuthMode.NONE and not is_loopback(host) and not force:
        raise InsecureBindError(
            f"--auth none on {host!r} would let anyone on the network drive this server; "
            "bind 127.0.0.1, use --auth token, or pass --force-no-auth"
        )
    return mode


@dataclass(frozen=True, slots=True)
class Grant:
    """What a request may do: ``scope`` is ``admin``, ``user`` or ``session:<id>``."""

    scope: str

    @property
    def is_admin(self) -> bool:
        return self.scope == "admin"

    def allows_session(self, session_id: str) -> bool:
        return self.scope in ("admin", "user") or self.scope == f"session:{session_id}"

    def allows_general(self) -> bool:
        """Routes not bound to one session (create, jobs, models)."""
        return self.scope in ("admin", "user")


def token_digest(token: str) -> str:
    """The SHA-256 hex digest a token is stored and looked up by."""
    return hashlib.sha256(token.encode("utf-8")).hexdigest()


_digest = token_digest


class Authenticator:
    """Checks bearer tokens and issues new ones (see the module docstring)."""

    def __init__(
        self,
        mode: AuthMode,
        *,
        store: Store | None,
        admin_key: str | None = None,
        clock: Callable[[], float] = time.time,
        cache_size: int = 65_536,
    ) -> None:
        if mode is AuthMode.TOKEN and not admin_key:
            raise ValueError("token auth needs an admin key")
        if admin_key is not None:
            check_admin_key(admin_key)
        self.mode = mode
        self._store = store
        self._admin_digest = None if admin_key is None else _digest(admin_key).encode()
        self._clock = clock
        # sha256 -> (scope, expires_at), the most recently used ``cache_size``; older ones are
        # read back from the store (a server that issues a token per session runs for months)
        self._cache: collections.OrderedDict[str, tuple[str, float]] = collections.OrderedDict()
        self.cache_size = cache_size
        self._lock = threading.Lock()  # the event loop and the store's thread both use the cache

    def issue(self, scope: str, ttl_s: float) -> tuple[str, float]:
        """A new token for ``scope``; returns ``(token, expires_at)``. Stored hashed."""
        if not (scope in ("admin", "user") or scope.startswith("session:")):
            raise ValueError(f"unknown scope {scope!r}; expected 'admin', 'user' or 'session:<id>'")
        if not ttl_s > 0:
            raise ValueError(f"ttl_s must be > 0, got {ttl_s}")
        token = "drt_" + secrets.token_urlsafe(32)
        expires_at = self._clock() + ttl_s
        digest = _digest(token)
        self._remember(digest, (scope, expires_at))
        if self._store is not None:
            self._store.defer(
                self._store.add_token, token_hash=digest, scope=scope, expires_at=expires_at
            )
        return token, expires_at

    def _remember(self, digest: str, entry: tuple[str, float]) -> None:
        with self._lock:
            self._cache[digest] = entry
            while len(self._cache) > self.cache_size:
                self._cache.popitem(last=False)

    def _cached(self, digest: str) -> tuple[str, float] | None:
        with self._lock:
            entry = self._cache.get(digest)
            if entry is not None:
                self._cache.move_to_end(digest)
            return entry

    def issue_session_token(self, session_id: str) -> str:
        return self.issue(f"session:{session_id}", SESSION_TOKEN_TTL_S)[0]

    def adopt(self, token_sha256: str, scope: str, expires_at: float) -> None:
        """Accept a token issued elsewhere, known by its digest (a session another engine of a
        fleet created and this one resumes: ``sessions.handoff``)."""
        self._remember(token_sha256, (scope, expires_at))
        if self._store is not None:
            self._store.defer(
                self._store.add_token, token_hash=token_sha256, scope=scope, expires_at=expires_at
            )

    def authenticate(self, authorization: str | None, *, lookup: bool = True) -> Grant | None:
        """The grant of an ``Authorization`` header value; ``AuthError(401)`` when invalid.
        ``lookup=False``: None where only the store could tell (the event loop then asks the
        store's thread, ``authenticate`` with ``lookup=True``, rather than touch SQLite)."""
        if self.mode is AuthMode.NONE:
            return Grant("admin")
        if not authorization or not authorization.startswith("Bearer "):
            raise AuthError(401, "missing 'Authorization: Bearer <token>' header")
        token = authorization[len("Bearer ") :].strip()
        digest = _digest(token)
        if self._admin_digest is not None and hmac.compare_digest(
            digest.encode(), self._admin_digest
        ):
            return Grant("admin")
        entry = self._cached(digest)
        if entry is None and self._store is not None:
            if not lookup:
                return None
            row = self._store.get_token(digest)
            if row is not None:
                entry = (row["scope"], row["expires_at"])
                self._remember(digest, entry)
        if entry is None:
            raise AuthError(401, "unknown token")
        scope, expires_at = entry
        if expires_at <= self._clock():
            raise AuthError(401, "token expired")
        return Grant(scope)
