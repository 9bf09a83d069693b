import datetime
import time

import jwt
import pytest
from livekit import api

from server.livekit.token import (
    AVATAR_ATTRIBUTE,
    LiveKitCredentials,
    identity_for,
    mint_join_token,
)

CREDS = LiveKitCredentials("devkey", "a-secret-long-enough-for-hs256-signing")


def test_minted_token_verifies_with_the_room_grant_identity_kind_and_expiry() -> None:
    before = int(time.time())
    token = mint_join_token(
        CREDS,
        room="lobby",
        identity=identity_for("ses_1"),
        name="tiny-world",
        ttl=datetime.timedelta(minutes=5),
    )
    claims = api.TokenVerifier(CREDS.api_key, CREDS.api_secret).verify(token)
    assert claims.identity == "dreamrt-ses_1" and claims.name == "tiny-world"
    assert claims.kind == "agent"
    grants = claims.video
    assert grants.room_join is True and grants.room == "lobby"
    assert grants.can_publish and grants.can_subscribe and grants.can_publish_data
    assert grants.agent is True and not grants.room_admin
    exp = jwt.decode(token, options={"verify_signature": False})["exp"]
    assert before + 290 <= exp <= int(time.time()) + 310
    with pytest.raises(jwt.InvalidSignatureError):
        api.TokenVerifier(CREDS.api_key, "another-secret-of-sufficient-length-xx").verify(token)


def test_an_avatar_token_carries_the_publish_on_behalf_attribute() -> None:
    token = mint_join_token(
        CREDS,
        room="r",
        identity="dreamrt-x",
        name="m",
        attributes={AVATAR_ATTRIBUTE: "agent-7"},
    )
    claims = api.TokenVerifier(CREDS.api_key, CREDS.api_secret).verify(token)
    assert claims.attributes == {"lk.publish_on_behalf": "agent-7"}


def test_credentials_come_from_flags_first_then_the_environment() -> None:
    env = {"LIVEKIT_API_KEY": "k", "LIVEKIT_API_SECRET": "s"}
    assert LiveKitCredentials.resolve(None, None, env) == LiveKitCredentials("k", "s")
    assert LiveKitCredentials.resolve("k2", None, env) == LiveKitCredentials("k2", "s")
    assert not LiveKitCredentials.resolve(None, None, {}).complete
    with pytest.raises(ValueError, match="LIVEKIT_API_KEY"):
        mint_join_token(LiveKitCredentials(), room="r", identity="i", name="n")
