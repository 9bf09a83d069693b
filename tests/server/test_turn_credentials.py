import base64
import hashlib
import hmac

import pytest

from server.media.turn_credentials import (
    IceServer,
    TurnCredentials,
    advertised_ice_servers,
    link_header,
    split_ice_url,
)


def coturn_password(secret: str, username: str) -> str:
    """What coturn's use-auth-secret computes for a username (written out independently)."""
    return base64.b64encode(
        hmac.new(secret.encode(), username.encode(), hashlib.sha1).digest()
    ).decode()


def test_minted_credentials_expire_after_the_ttl_and_carry_the_hmac() -> None:
    turn = TurnCredentials("s3cret", ttl_s=600, clock=lambda: 1_700_000_000.4)
    username, password = turn.mint("ses_1")
    assert username == "1700000600:ses_1"
    assert password == coturn_password("s3cret", username)
    assert turn.mint() == ("1700000600", coturn_password("s3cret", "1700000600"))


def test_bad_secret_or_ttl_is_refused() -> None:
    with pytest.raises(ValueError, match="secret"):
        TurnCredentials("")
    with pytest.raises(ValueError, match="ttl"):
        TurnCredentials("x", ttl_s=0)


def test_only_turn_urls_without_credentials_get_minted_ones() -> None:
    turn = TurnCredentials("k", ttl_s=60, clock=lambda: 100.0)
    servers = advertised_ice_servers(
        ["stun:stun.example.net", "turn:t.example.net:3478?transport=udp", "turns:u:p@t2:5349"],
        turn,
        user="v",
    )
    assert servers[0] == IceServer("stun:stun.example.net")
    assert servers[1] == IceServer(
        "turn:t.example.net:3478?transport=udp", "160:v", coturn_password("k", "160:v")
    )
    assert servers[2] == IceServer("turns:t2:5349", "u", "p")
    assert advertised_ice_servers(["turn:t:3478"], None) == [IceServer("turn:t:3478")]


def test_link_header_values() -> None:
    assert link_header(IceServer("stun:s:3478")) == '<stun:s:3478>; rel="ice-server"'
    assert link_header(IceServer("turn:t:3478", 'a"b', "c\\d")) == (
        '<turn:t:3478>; rel="ice-server"; username="a\\"b"; credential="c\\\\d"; '
        'credential-type="password"'
    )
    assert split_ice_url("turn:user:pa:ss@host:1") == IceServer("turn:host:1", "user", "pa:ss")
