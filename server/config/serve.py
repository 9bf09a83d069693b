"""``ServerConfig``: everything ``dreamrt serve`` can set, as one frozen value.

Its own fields are the server's edge (address, auth, WebRTC, shutdown); the rest is in its
groups: ``model``, ``engine``, ``recording``, ``fleet`` (``server.config.groups``) and
``limits`` (``server.config.limits``). Every field is declared once, as a setting
(``server.config.fields``), and ``server.config.sources`` reads it from the flags, the
``DREAMRT_*`` environment and a TOML file (docs/configuration.md). ``ServerConfig.of`` builds
one from flat keys (``max_sessions=2``), the way every source and the tests name a setting.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from server.config.fields import ConfigError, check_choices, setting
from server.config.groups import EngineConfig, FleetConfig, ModelConfig, RecordingConfig
from server.config.limits import Limits

__all__ = ["GROUPS", "ServerConfig"]

_WEB_DIR = Path(__file__).resolve().parents[2] / "clients" / "web"


@dataclass(frozen=True, slots=True)
class ServerConfig:
    """Everything ``dreamrt serve`` can set. Units in names; ``None`` means "decide"."""

    host: str = setting("127.0.0.1", "the address to listen on", metavar="ADDRESS")
    port: int = setting(8000, "the port to listen on", metavar="PORT")
    data_dir: Path = setting(
        Path("data"), "the store, artifacts, recordings, admin key", metavar="DIR"
    )
    # none | token; None: none on loopback, token elsewhere (server.edge.auth.resolve_auth_mode)
    auth: str | None = setting(
        None, "default: none on a loopback address, token elsewhere", choices=("none", "token")
    )
    force_no_auth: bool = setting(False, "allow --auth none on a non-loopback address")
    admin_key: str | None = setting(None, "admin key for --auth token", metavar="KEY")
    ice_hosts: tuple[str, ...] = setting(
        (),
        "offer ICE host candidates only on this address (repeatable)",
        flag="--ice-host",
        metavar="IP",
    )
    ice_servers: tuple[str, ...] = setting(
        (),
        "STUN/TURN server URL for the server's peers, TURN credentials as "
        "turn:USER:PASSWORD@host:port (default: none)",
        flag="--ice-server",
        metavar="URL",
    )
    client_ice_servers: tuple[str, ...] = setting(
        (),
        "STUN/TURN server URL advertised to WHEP players (repeatable; default: the "
        "--ice-server list)",
        flag="--client-ice-server",
        metavar="URL",
    )
    turn_secret: str | None = setting(
        None,
        "TURN shared secret (coturn static-auth-secret): WHEP players get short-lived "
        "credentials for TURN URLs given without any",
        metavar="SECRET",
    )
    turn_ttl_s: float = setting(
        3600.0, "lifetime of a minted TURN credential", flag="--turn-ttl", metavar="SECONDS"
    )
    video_bitrate_bps: int | None = setting(
        None, "video encoder bitrate cap", flag="--bitrate", metavar="BPS"
    )
    unwatched_timeout_s: float = setting(
        300.0,
        "close sessions without a viewer for this long (0: never)",
        flag="--unwatched-timeout",
        metavar="SECONDS",
    )
    shutdown_timeout_s: float = setting(
        10.0,
        "SIGTERM: snapshot, close every session and exit 0 within this",
        flag="--shutdown-timeout",
        metavar="SECONDS",
    )
    livekit_key: str | None = setting(
        None,
        "LiveKit API key that mints the engine's join tokens (default: $LIVEKIT_API_KEY)",
        metavar="KEY",
    )
    livekit_secret: str | None = setting(
        None, "LiveKit API secret (default: $LIVEKIT_API_SECRET)", metavar="SECRET"
    )
    # the web client's files (None: no page at /); code and tests set it, no source does
    web_dir: Path | None = setting(_WEB_DIR, "", flag=None)
    model: ModelConfig = ModelConfig()
    engine: EngineConfig = EngineConfig()
    recording: RecordingConfig = RecordingConfig()
    fleet: FleetConfig = FleetConfig()
    limits: Limits = Limits()

    def __post_init__(self) -> None:
        check_choices(self)
        if not 0 <= self.port <= 65535:
            raise ConfigError(f"port must be in 0..65535, got {self.port}")
        if not self.turn_ttl_s > 0:
            raise ConfigError(f"turn_ttl_s must be > 0, got {self.turn_ttl_s}")
        for key in ("unwatched_timeout_s", "shutdown_timeout_s"):
            if not getattr(self, key) >= 0:
                raise ConfigError(f"{key} must be >= 0, got {getattr(self, key)}")

    @classmethod
    def of(cls, **values: object) -> ServerConfig:
        """A config from flat keys (``max_sessions=2``, ``model="tiny-world"``) or whole groups
        (``limits=Limits(...)``); ``ConfigError`` names an unknown key."""
        return cls().replace(**values)

    def replace(self, **values: object) -> ServerConfig:
        """This config with the settings of ``values`` (keys as in ``of``) replaced."""
        # dataclasses.replace takes the values as given: each group's __post_init__ checks them
        own: dict[str, Any] = {}
        grouped: dict[str, dict[str, Any]] = {}
        for key, value in values.items():
            if key in GROUPS and isinstance(value, GROUPS[key]):
                own[key] = value
                continue
            place = KEYS.get(key)
            if place is None:
                raise ConfigError(f"unknown setting {key!r}")
            group, name = place
            if group:
                grouped.setdefault(group, {})[name] = value
            else:
                own[name] = value
        for group, changes in grouped.items():
            own[group] = dataclasses.replace(own.get(group, getattr(self, group)), **changes)
        return dataclasses.replace(self, **own)

    def flat(self) -> dict[str, object]:
        """Every setting by its key (what ``of`` takes back)."""
        out: dict[str, object] = {}
        for key, (group, name) in KEYS.items():
            holder = getattr(self, group) if group else self
            out[key] = getattr(holder, name)
        return out


# the groups by attribute name; a group's field is keyed by its own name unless it says
GROUPS: dict[str, type] = {
    "model": ModelConfig,
    "engine": EngineConfig,
    "recording": RecordingConfig,
    "fleet": FleetConfig,
    "limits": Limits,
}


def _keys() -> dict[str, tuple[str, str]]:
    """key -> (group attribute or "", field name); keys are unique over every group."""
    keys: dict[str, tuple[str, str]] = {}
    owners = [("", ServerConfig), *GROUPS.items()]
    for group, cls in owners:
        for f in dataclasses.fields(cls):
            if group == "" and f.name in GROUPS:
                continue
            key = f.metadata.get("key") or f.name
            if key in keys:
                raise TypeError(f"setting key {key!r} is declared twice")
            keys[key] = (group, f.name)
    return keys


KEYS = _keys()
