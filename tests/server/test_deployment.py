"""``GET /v1/deployment``: the DeploymentCard reads the engine's live state
(server.fleet.deployment)."""

from __future__ import annotations

import json
from pathlib import Path

from fastapi.testclient import TestClient

from tests.server.conftest import make_client


def test_the_card_describes_models_slo_classes_cost_model_and_an_idle_load(
    client: TestClient,
) -> None:
    card = client.get("/v1/deployment").json()
    assert card["version"] == 1 and card["health"] == "ok" and card["device"] == "cpu"
    assert card["url"] == "http://127.0.0.1:8000" and card["engine_id"].endswith(":8000")
    (model,) = card["models"]
    assert model["id"] == "tiny-world" and model["default"] is True
    assert "session.realtime" in model["capabilities"] and model["default_profile"]["fps"] == 12
    assert 0 < model["session_share"] < 0.9
    assert [c["name"] for c in card["slo_classes"]] == ["realtime", "batch"]
    assert card["cost_model"]["method"] == "ewma" and card["cost_model"]["device"]["name"] == "cpu"
    load = card["load"]
    assert load["compute_gpu_s_per_s"] == 0 and load["headroom"] == load["compute_capacity"] == 0.9
    assert load["steering_gpu_s_per_s"] == 0.0  # nothing flushed yet
    assert (load["kv_slabs_free"], load["kv_slabs_capacity"], load["sessions"]) == (2, 2, 0)
    assert card["sessions"] == [] and card["snapshot_dir"] is None


def test_a_session_takes_its_share_and_a_slab_from_the_card_and_gives_them_back(
    client: TestClient,
) -> None:
    share = client.get("/v1/deployment").json()["models"][0]["session_share"]
    created = client.post("/v1/sessions", json={"prompt": "a red ball"}).json()
    load = client.get("/v1/deployment").json()
    assert load["sessions"] == [created["id"]]
    assert abs(load["load"]["compute_gpu_s_per_s"] - share) < 1e-9
    assert abs(load["load"]["headroom"] - (0.9 - share)) < 1e-9
    assert (load["load"]["kv_slabs_free"], load["load"]["sessions"]) == (1, 1)
    assert client.delete(f"/v1/sessions/{created['id']}").status_code == 204
    after = client.get("/v1/deployment").json()
    assert after["sessions"] == [] and after["load"]["kv_slabs_free"] == 2


def test_the_card_needs_a_general_token_like_other_system_routes(tmp_path: Path) -> None:
    with make_client(tmp_path, auth="token", admin_key="k" * 40) as client:
        assert client.get("/v1/deployment").status_code == 401
        created = client.post(
            "/v1/sessions", json={"prompt": "x"}, headers={"Authorization": "Bearer " + "k" * 40}
        ).json()
        session_only = {"Authorization": f"Bearer {created['token']}"}
        assert client.get("/v1/deployment", headers=session_only).status_code == 403
        admin = {"Authorization": "Bearer " + "k" * 40}
        assert client.get("/v1/deployment", headers=admin).json()["sessions"] == [created["id"]]


def test_with_a_snapshot_dir_a_session_leaves_a_manifest_without_its_token(tmp_path: Path) -> None:
    shared = tmp_path / "shared"
    with make_client(tmp_path, snapshot_dir=shared, engine_id="e1") as client:
        created = client.post("/v1/sessions", json={"prompt": "a red ball", "seed": 5}).json()
        assert client.get("/v1/deployment").json()["snapshot_dir"] == str(shared)
    manifest = json.loads((shared / "sessions" / f"{created['id']}.json").read_text())
    assert manifest["session_id"] == created["id"] and manifest["engine_id"] == "e1"
    assert (manifest["seed"], manifest["model_id"], manifest["prompt"]) == (
        5,
        "tiny-world",
        "a red ball",
    )
    assert created["token"] not in json.dumps(manifest) and len(manifest["token_sha256"]) == 64


def test_a_session_that_ends_loses_its_manifest_one_live_at_shutdown_keeps_it(
    tmp_path: Path,
) -> None:
    shared = tmp_path / "shared"
    with make_client(tmp_path, snapshot_dir=shared) as client:
        ended = client.post("/v1/sessions", json={"prompt": "over"}).json()["id"]
        live = client.post("/v1/sessions", json={"prompt": "still on"}).json()["id"]
        assert (shared / "sessions" / f"{ended}.json").exists()
        assert client.delete(f"/v1/sessions/{ended}").status_code == 204
        assert not (shared / "sessions" / f"{ended}.json").exists()  # nobody may resume it
    assert (shared / "sessions" / f"{live}.json").exists()  # another engine may


def test_drain_marks_the_card_and_needs_the_admin(tmp_path: Path) -> None:
    admin = {"Authorization": "Bearer " + "k" * 40}
    with make_client(tmp_path, auth="token", admin_key="k" * 40) as client:
        created = client.post("/v1/sessions", json={"prompt": "x"}, headers=admin).json()
        session_only = {"Authorization": f"Bearer {created['token']}"}
        assert client.post("/v1/deployment/drain", headers=session_only).status_code == 403
        assert client.get("/v1/deployment", headers=admin).json()["health"] == "ok"
        drained = client.post("/v1/deployment/drain", headers=admin)
        assert drained.status_code == 202 and drained.json() == {
            "health": "draining",
            "sessions": 1,
        }
        assert client.get("/v1/deployment", headers=admin).json()["health"] == "draining"
