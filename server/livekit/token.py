"""Credentials of the engine's LiveKit participant: API key/secret and the join tokens minted
from them with ``livekit-api`` (offline: a JWT signed with the secret, nothing is contacted).

The key and secret come from ``dreamrt serve --livekit-key/--livekit-secret`` or, failing
those, ``LIVEKIT_API_KEY`` / ``LIVEKIT_API_SECRET``. A token is minted only when the session's
``livekit`` block brings none: identity ``dreamrt-<session id>``, participant kind ``agent``,
the model's name, a grant to join exactly that room, publish video and data and subscribe to
the participants' audio, and a TTL (LiveKit checks it at join time only).
"""

from __future__ import annotations

import datetime
import os
from collections.abc import Mapping
from dataclasses import dataclass

from runtime.errors import DreamrtError

__all__ = [
    "AVATAR_ATTRIBUTE",
    "LiveKitCredentials",
    "LiveKitMissingError",
    "identity_for",
    "mint_join_token",
    "require_sdk",
]

DEFAULT_TTL = datetime.timedelta(hours=6)
# LiveKit Agents: the agent identity an avatar worker publishes on behalf of (livekit-agents
# ``ATTRIBUTE_PUBLISH_ON_BEHALF``)
AVATAR_ATTRIBUTE = "lk.publish_on_behalf"


class LiveKitMissingError(DreamrtError, RuntimeError):
    """The ``livekit`` extra is not installed (``pip install 'dreamrt[livekit]'``): 501."""

    code = "livekit_unavailable"
    status = 501


def require_sdk() -> None:
    """Raises ``LiveKitMissingError`` unless both SDK packages import."""
    try:
        import importlib

        importlib.import_module("livekit.api")
        importlib.import_module("livekit.rtc")
    except ImportError as exc:
        raise LiveKitMissingError(
            f"the LiveKit SDK is not installed ({exc}); install the extra: "
            "pip install 'dreamrt[livekit]'"
        ) from None


@dataclass(frozen=True, slots=True)
class LiveKitCredentials:
    """API key and secret of a LiveKit project (``None`` fields: not configured)."""

    api_key: str | None = None
    api_secret: str | None = None

    @property
    def complete(self) -> bool:
        return bool(self.api_key and self.api_secret)

    @classmethod
    def resolve(
        cls,
        api_key: str | None,
        api_secret: str | None,
        environ: Mapping[str, str] | None = None,
    ) -> LiveKitCredentials:
        """Flags first, then ``LIVEKIT_API_KEY`` / ``LIVEKIT_API_SECRET``."""
        env = os.environ if environ is None else environ
        return cls(
            api_key or env.get("LIVEKIT_API_KEY") or None,
            api_secret or env.get("LIVEKIT_API_SECRET") or None,
        )


def identity_for(session_id: str) -> str:
    return f"dreamrt-{session_id}"


def mint_join_token(
    credentials: LiveKitCredentials,
    *,
    room: str,
    identity: str,
    name: str,
    attributes: Mapping[str, str] | None = None,
    ttl: datetime.timedelta = DEFAULT_TTL,
) -> str:
    """A JWT that lets ``identity`` join ``room`` as an agent; ``ValueError`` without creds."""
    if not credentials.complete:
        raise ValueError(
            "no LiveKit API key/secret: pass --livekit-key/--livekit-secret, set "
            "LIVEKIT_API_KEY/LIVEKIT_API_SECRET, or send a token in the livekit block"
        )
    from livekit import api

    token = (
        api.AccessToken(credentials.api_key, credentials.api_secret)
        .with_identity(identity)
        .with_name(name)
        .with_kind("agent")
        .with_ttl(ttl)
        .with_grants(
            api.VideoGrants(
                room_join=True,
                room=room,
                can_publish=True,
                can_subscribe=True,
                can_publish_data=True,
                agent=True,
            )
        )
    )
    if attributes:
        token = token.with_attributes(dict(attributes))
    return token.to_jwt()
