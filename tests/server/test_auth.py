import pytest

from server.edge.auth import (
    Authenticator,
    AuthError,
    AuthMode,
    InsecureBindError,
    is_loopback,
    resolve_auth_mode,
)
from sessions.store import Store
from tests.server.conftest import make_client

ADMIN = "admin-key-for-tests-0123456789abcdef"  # >= 32 bytes


def test_loopback_detection() -> None:
    assert [is_loopback(h) for h in ("127.0.0.1", "::1", "localhost", "127.8.0.1")] == [True] * 4
    assert [is_loopback(h) for h in ("0.0.0.0", "10.0.0.2", "example.com", "")] == [False] * 4


def test_auth_mode_defaults_and_refuses_an_open_public_bind() -> None:
    assert resolve_auth_mode("127.0.0.1", None) is AuthMode.NONE
    assert resolve_auth_mode("0.0.0.0", None) is AuthMode.TOKEN
    assert resolve_auth_mode("127.0.0.1", "token") is AuthMode.TOKEN
    with pytest.raises(InsecureBindError, match="--force-no-auth"):
        resolve_auth_mode("0.0.0.0", "none")
    assert resolve_auth_mode("0.0.0.0", "none", force=True) is AuthMode.NONE


def test_tokens_scopes_and_expiry(tmp_path) -> None:
    now = [1000.0]
    store = Store(tmp_path / "db.sqlite3")
    auth = Authenticator(AuthMode.TOKEN, store=store, admin_key=ADMIN, clock=lambda: now[0])
    assert auth.authenticate(f"Bearer {ADMIN}").is_admin
    user, expires = auth.issue("user", 60)
    assert expires == 1060.0 and auth.authenticate(f"Bearer {user}").allows_general()
    session_token = auth.issue_session_token("ses_a")
    grant = auth.authenticate(f"Bearer {session_token}")
    assert (
        grant.allows_session("ses_a")
        and not grant.allows_session("ses_b")
        and not grant.allows_general()
    )
    for header, message in [
        (None, "missing"),
        ("Basic abc", "missing"),
        ("Bearer nope", "unknown"),
    ]:
        with pytest.raises(AuthError, match=message) as info:
            auth.authenticate(header)
        assert info.value.status == 401
    now[0] = 1061.0
    with pytest.raises(AuthError, match="expired"):
        auth.authenticate(f"Bearer {user}")
    with pytest.raises(ValueError, match="scope"):
        auth.issue("root", 10)
    store.close()
    # tokens are stored hashed and survive a restart
    reopened = Store(tmp_path / "db.sqlite3")
    again = Authenticator(AuthMode.TOKEN, store=reopened, admin_key=ADMIN, clock=lambda: 1001.0)
    assert again.authenticate(f"Bearer {session_token}").scope == "session:ses_a"
    assert session_token not in (tmp_path / "db.sqlite3").read_bytes().decode("latin-1")
    reopened.close()


def test_token_mode_guards_every_v1_route(tmp_path) -> None:
    with make_client(tmp_path, auth="token", admin_key=ADMIN) as client:
        admin = {"Authorization": f"Bearer {ADMIN}"}
        assert client.get("/healthz").status_code == 200
        assert client.get("/v1/models").status_code == 401
        assert (
            client.get("/v1/models", headers={"Authorization": "Bearer wrong"}).status_code == 401
        )
        assert client.get("/metrics").status_code == 401  # the test client is not on loopback
        assert client.get("/metrics", headers=admin).status_code == 200
        issued = client.post("/v1/tokens", json={"scope": "user", "ttl_s": 60}, headers=admin)
        assert issued.status_code == 201 and issued.json()["scope"] == "user"
        user = {"Authorization": f"Bearer {issued.json()['token']}"}
        assert client.post("/v1/tokens", json={"scope": "user"}, headers=user).status_code == 403
        created = client.post("/v1/sessions", json={"prompt": "a"}, headers=user).json()
        other = client.post("/v1/sessions", json={"prompt": "b"}, headers=user).json()
        own = {"Authorization": f"Bearer {created['token']}"}
        assert client.get(f"/v1/sessions/{created['id']}", headers=own).status_code == 200
        assert (
            client.post(
                f"/v1/sessions/{created['id']}/prompt", json={"text": "x"}, headers=own
            ).status_code
            == 202
        )
        assert client.get(f"/v1/sessions/{other['id']}", headers=own).status_code == 403
        assert client.post("/v1/sessions", json={"prompt": "c"}, headers=own).status_code == 403
        assert (
            client.post("/v1/jobs", json={"task": "t2i", "prompt": "c"}, headers=own).status_code
            == 403
        )
        assert client.delete(f"/v1/sessions/{created['id']}", headers=own).status_code == 204
        bad_scope = client.post("/v1/tokens", json={"scope": "root"}, headers=admin)
        assert bad_scope.status_code == 422 and bad_scope.json()["detail"][0]["loc"] == [
            "body",
            "scope",
        ]
