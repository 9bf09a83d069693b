"""Auth everywhere, proven: every ``/v1`` route the served OpenAPI schema lists refuses a
missing token (401), an expired one (401) and one outside its scope (403), in token mode.

The routes come from ``/openapi.json`` of the running app (with ``--fault-injection``, so the
admin-only fault route is listed too): a route added later without a body here fails the
coverage check instead of going unchecked. Each request carries a body that validates, so
the answer is about the token, not the body.
"""

from __future__ import annotations

import time

import openai
import pytest

from server.config.limits import Limits
from server.edge.auth import Authenticator, AuthMode, WeakAdminKeyError, check_admin_key
from tests.server.conftest import make_client

ADMIN = "admin-key-for-tests-0123456789abcdef"
SID = "{session_id}"

# (method, path) -> JSON body (None: no body); {session_id} / {job_id} are filled in.
BODIES = {
    ("GET", "/v1/models"): None,
    ("GET", "/v1/models/{model_id}"): None,
    ("POST", "/v1/videos"): {"prompt": "a kite", "seconds": "1"},
    ("GET", "/v1/videos"): None,
    ("GET", "/v1/videos/{video_id}"): None,
    ("DELETE", "/v1/videos/{video_id}"): None,
    ("GET", "/v1/videos/{video_id}/content"): None,
    ("POST", "/v1/images/generations"): {"prompt": "a kite"},
    ("POST", "/v1/tokens"): {"scope": "user", "ttl_s": 60},
    ("POST", "/v1/sessions"): {"prompt": "a red ball on grass"},
    ("GET", "/v1/sessions/{session_id}"): None,
    ("DELETE", "/v1/sessions/{session_id}"): None,
    ("POST", "/v1/sessions/{session_id}/offer"): {"sdp": "v=0\r\n", "type": "offer"},
    ("POST", "/v1/sessions/{session_id}/whep"): b"v=0\r\n",
    ("POST", "/v1/sessions/{session_id}/prompt"): {"text": "a blue square"},
    ("POST", "/v1/sessions/{session_id}/actions"): {"keys": ["w"]},
    ("POST", "/v1/sessions/{session_id}/audio"): b"\x00\x00" * 160,
    ("POST", "/v1/sessions/{session_id}/feedback"): {"rating": 1},
    ("POST", "/v1/sessions/{session_id}/fork"): {"n": 2},
    ("POST", "/v1/sessions/{session_id}/choose"): {"candidate": "x"},
    ("POST", "/v1/sessions/{session_id}/pause"): None,
    ("POST", "/v1/sessions/{session_id}/resume"): None,
    ("GET", "/v1/sessions/{session_id}/events"): None,
    ("POST", "/v1/sessions/{session_id}/render"): {"chunks": 1},
    ("POST", "/v1/jobs"): {"task": "t2i", "prompt": "a kite"},
    ("GET", "/v1/jobs/{job_id}"): None,
    ("GET", "/v1/jobs/{job_id}/artifact"): None,
    ("DELETE", "/v1/jobs/{job_id}"): None,
    ("GET", "/v1/jobs/{job_id}/events"): None,
    ("POST", "/v1/jobs/{job_id}/preview"): {"sdp": "v=0\r\n", "type": "offer"},
    ("POST", "/v1/workflows"): {"prompt": {}},
    ("GET", "/v1/workflows/{workflow_id}"): None,
    ("POST", "/v1/faults"): {"target": "ses_x", "kind": "nan"},
    ("POST", "/v1/profile"): {"seconds": 0.1},
    ("GET", "/v1/weights"): None,
    ("POST", "/v1/weights"): {"path": "/nonexistent/weights.safetensors"},
    ("POST", "/v1/sleep"): {"components": ["dit"]},
    ("POST", "/v1/wake"): {"components": ["dit"]},
    ("POST", "/v1/rollouts"): {"prompt": "a kite", "k": 2},
    ("GET", "/v1/rollouts/{group_id}"): None,
    ("GET", "/v1/rollouts/{group_id}/latents/{sample_id}/{chunk}"): None,
    ("GET", "/v1/deployment"): None,
    ("POST", "/v1/deployment/drain"): None,
}
ADMIN_ONLY = {
    ("POST", "/v1/tokens"),
    ("POST", "/v1/faults"),
    ("POST", "/v1/profile"),
    ("GET", "/v1/weights"),
    ("POST", "/v1/weights"),
    ("POST", "/v1/sleep"),
    ("POST", "/v1/wake"),
    ("POST", "/v1/deployment/drain"),
}


def served_routes(client) -> list[tuple[str, str]]:
    schema = client.get("/openapi.json").json()
    return sorted(
        (method.upper(), path)
        for path, operations in schema["paths"].items()
        if path.startswith("/v1")
        for method in operations
    )


def call(client, method: str, path: str, token: str | None, **ids: str):
    body = BODIES[(method, path)]
    headers = {} if token is None else {"Authorization": f"Bearer {token}"}
    kwargs = {"content": body} if isinstance(body, bytes) else {"json": body}
    if body is None:
        kwargs = {}
    return client.request(method, path.format(**ids), headers=headers, **kwargs)


def test_every_v1_route_refuses_missing_expired_and_wrong_scope_tokens(tmp_path) -> None:
    limits = Limits(rest_rate_per_s=1000, rest_burst=1000)
    with make_client(
        tmp_path, auth="token", admin_key=ADMIN, fault_injection=True, limits=limits
    ) as client:
        admin = {"Authorization": f"Bearer {ADMIN}"}
        routes = served_routes(client)
        assert set(routes) == set(BODIES), "a /v1 route without a body in BODIES (or gone)"
        mine = client.post("/v1/sessions", json={"prompt": "mine"}, headers=admin).json()
        other = client.post("/v1/sessions", json={"prompt": "other"}, headers=admin).json()
        job = client.post("/v1/jobs", json={"task": "t2i", "prompt": "k"}, headers=admin).json()
        user = client.post("/v1/tokens", json={"scope": "user", "ttl_s": 600}, headers=admin)
        expiring = client.post("/v1/tokens", json={"scope": "admin", "ttl_s": 0.3}, headers=admin)
        assert user.status_code == expiring.status_code == 201
        time.sleep(0.4)
        ids = {"session_id": other["id"], "job_id": job["id"], "group_id": "grp_x"}
        ids.update(sample_id="job_x", chunk="0", model_id="tiny-world", video_id=job["id"])
        ids.update(workflow_id=job["id"])
        checked = 0
        for method, path in routes:
            missing = call(client, method, path, None, **ids)
            assert missing.status_code == 401, (method, path, missing.text)
            assert missing.headers["www-authenticate"] == "Bearer"
            expired = call(client, method, path, expiring.json()["token"], **ids)
            assert expired.status_code == 401 and "expired" in message_of(expired), (method, path)
            # another session's token; for routes not bound to a session, a session token; for
            # admin routes a user token
            wrong = user.json()["token"] if (method, path) in ADMIN_ONLY else mine["token"]
            refused = call(client, method, path, wrong, **ids)
            assert refused.status_code == 403, (method, path, refused.text)
            checked += 1
        assert checked == len(BODIES) == 43
        # and the right token gets past auth on a session route (the contrast that makes the
        # 403s above about scope): the session's own token reads it
        own = {"Authorization": f"Bearer {mine['token']}"}
        assert client.get(f"/v1/sessions/{mine['id']}", headers=own).status_code == 200


def message_of(response) -> str:
    """The error message of either body shape: dreamrt's ``detail``, OpenAI's ``error``."""
    body = response.json()
    return body["error"]["message"] if "error" in body else body["detail"]


def test_the_openai_client_maps_token_refusals_to_its_exceptions(tmp_path) -> None:
    with make_client(tmp_path, auth="token", admin_key=ADMIN) as client:
        admin = {"Authorization": f"Bearer {ADMIN}"}
        session = client.post("/v1/sessions", json={"prompt": "x"}, headers=admin).json()
        for key, error in [
            ("not-a-token", openai.AuthenticationError),
            (session["token"], openai.PermissionDeniedError),  # a session's token: its routes only
        ]:
            sdk = openai.OpenAI(base_url="http://testserver/v1", api_key=key, http_client=client)
            with pytest.raises(error) as refused:
                sdk.models.list()
            assert refused.value.body["type"] in ("authentication_error", "permission_error")
        sdk = openai.OpenAI(base_url="http://testserver/v1", api_key=ADMIN, http_client=client)
        assert "tiny-world" in [m.id for m in sdk.models.list()]


def test_admin_key_must_have_32_bytes(tmp_path) -> None:
    with pytest.raises(WeakAdminKeyError, match="at least 32"):
        check_admin_key("short-key")
    with pytest.raises(WeakAdminKeyError, match="31 bytes"):
        Authenticator(AuthMode.TOKEN, store=None, admin_key="k" * 31)
    assert check_admin_key("k" * 32) == "k" * 32
    with pytest.raises(WeakAdminKeyError), make_client(tmp_path, auth="token", admin_key="k" * 8):
        pass


def test_a_weak_admin_key_file_or_variable_is_refused_by_serve(tmp_path, monkeypatch) -> None:
    from server.cli import main

    monkeypatch.setenv("DREAMRT_ADMIN_KEY", "too-short")
    code = main(["serve", "--auth", "token", "--data-dir", str(tmp_path), "--port", "1"])
    assert code == 2
    monkeypatch.delenv("DREAMRT_ADMIN_KEY")
    (tmp_path / "admin_key").write_text("also-short\n")
    code = main(["serve", "--auth", "token", "--data-dir", str(tmp_path), "--port", "1"])
    assert code == 2


def test_auth_none_stays_loopback_only(tmp_path, capsys) -> None:
    from server.cli import main

    code = main(["serve", "--host", "0.0.0.0", "--auth", "none", "--data-dir", str(tmp_path)])
    assert code == 2 and "--force-no-auth" in capsys.readouterr().err
    # no flag on a public address means token auth (a key is generated, >= 32 bytes)
    from server.app import ServerConfig, resolve_admin_key
    from server.edge.auth import resolve_auth_mode

    mode = resolve_auth_mode("0.0.0.0", None)
    key = resolve_admin_key(ServerConfig(host="0.0.0.0", data_dir=tmp_path / "d"), mode)
    assert mode is AuthMode.TOKEN and len(key.encode()) >= 32
