"""The trainer routes on the real app (engine and tiny-world model): weight sync, sleep, wake,
what admission answers meanwhile, and that only an admin may call them."""

from __future__ import annotations

import io
from pathlib import Path

import numpy as np
import torch
from fastapi.testclient import TestClient
from safetensors.torch import save_file

from tests.server.conftest import make_client

ADMIN = "admin-key-for-trainer-tests-32-bytes-long"


def _dit(client: TestClient):
    ctx = client.app.state.ctx
    return ctx.host.models[ctx.model_id].dit


def test_a_sync_moves_the_version_and_a_bad_file_changes_nothing(
    client: TestClient, tmp_path: Path
) -> None:
    start = client.get("/v1/weights").json()
    assert start["weights_version"].startswith("b2:") and start["asleep"] == []
    bias = _dit(client).state_dict()["head.head.bias"].clone()
    delta = tmp_path / "delta.safetensors"
    save_file({"dit.head.head.bias": torch.full_like(bias, 0.25)}, str(delta))
    broken = tmp_path / "broken.safetensors"
    broken.write_bytes(delta.read_bytes()[:20])
    for body in ({"path": str(broken)}, {"path": str(tmp_path / "absent")}, {"path": str(delta)}):
        answer = client.post("/v1/weights", json=body)  # full: the delta names one tensor
        assert answer.status_code == 422, answer.text
        assert client.get("/v1/weights").json()["weights_version"] == start["weights_version"]
    assert torch.equal(_dit(client).state_dict()["head.head.bias"], bias)
    synced = client.post("/v1/weights", json={"path": str(delta), "mode": "delta"})
    assert synced.status_code == 200, synced.text
    body = synced.json()
    assert body["previous"] == start["weights_version"] != body["weights_version"]
    assert body["tensors"] == 1 and body["mode"] == "delta"
    assert client.get("/v1/weights").json()["weights_version"] == body["weights_version"]
    assert torch.allclose(_dit(client).state_dict()["head.head.bias"], bias + 0.25)


def test_sleep_refuses_new_work_with_retry_after_until_wake(client: TestClient) -> None:
    assert client.post("/v1/sleep", json={"components": ["gpu"]}).status_code == 422
    slept = client.post("/v1/sleep", json={"components": ["dit"]})
    assert slept.status_code == 200 and slept.json()["asleep"] == ["dit"], slept.text
    session = client.post("/v1/sessions", json={"prompt": "a ball"})
    assert session.status_code == 503 and int(session.headers["Retry-After"]) >= 1
    assert session.json()["reason"] == "asleep"
    job = client.post("/v1/jobs", json={"task": "t2i", "prompt": "a ball"})
    assert job.status_code == 503 and "Retry-After" in job.headers, job.text
    conflict = client.post("/v1/weights", json={"path": "/nonexistent"})
    assert conflict.status_code == 409 and "asleep" in conflict.text
    assert client.get("/v1/weights").json()["asleep"] == ["dit"]
    woke = client.post("/v1/wake", json={"components": ["dit"]})
    assert woke.status_code == 200 and woke.json()["asleep"] == []
    assert client.post("/v1/sessions", json={"prompt": "a ball"}).status_code == 201


def test_only_an_admin_may_drive_the_trainer_routes(tmp_path: Path) -> None:
    with make_client(tmp_path, auth="token", admin_key=ADMIN) as client:
        admin = {"Authorization": f"Bearer {ADMIN}"}
        issued = client.post("/v1/tokens", json={"scope": "user"}, headers=admin)
        user = {"Authorization": f"Bearer {issued.json()['token']}"}
        for method, path, body in (
            ("GET", "/v1/weights", None),
            ("POST", "/v1/weights", {"path": "/x"}),
            ("POST", "/v1/sleep", {"components": ["dit"]}),
            ("POST", "/v1/wake", {"components": ["dit"]}),
        ):
            assert client.request(method, path, json=body, headers=user).status_code == 403
            assert client.request(method, path, json=body).status_code == 401
        assert client.get("/v1/weights", headers=admin).status_code == 200


def test_a_rollout_group_is_k_jobs_with_records_the_export_carries(tmp_path: Path) -> None:
    import time

    import pandas as pd

    from server.data.export import export

    with make_client(tmp_path, model="wan-tiny-random") as client:
        body = {"prompt": "a red ball", "k": 2, "seeds": [5, 6], "num_frames": 9, "latents": True}
        queued = client.post("/v1/rollouts", json=body)
        assert queued.status_code == 202, queued.text
        group_id, samples = queued.json()["id"], queued.json()["samples"]
        assert queued.json()["seeds"] == [5, 6] and len(samples) == 2
        deadline = time.monotonic() + 60
        while (view := client.get(f"/v1/rollouts/{group_id}").json())["state"] == "running":
            assert time.monotonic() < deadline, view
            time.sleep(0.1)
        assert view["state"] == "succeeded" and [s["seed"] for s in view["samples"]] == [5, 6]
        version = client.get("/v1/weights").json()["weights_version"]
        records = view["records"]
        assert {r["session_id"] for r in records} == set(samples)
        assert all(r["group_id"] == group_id and r["weights_version"] == version for r in records)
        assert {r["seed"] for r in records} == {5, 6} and all(r["attention"] for r in records)
        assert all(len(r["noise_seeds"]) == len(r["sigmas"]) == r["steps"] + 1 for r in records)
        for sample in samples:
            assert client.get(f"/v1/jobs/{sample}/artifact").status_code == 200
        assert [s["latents"] for s in view["samples"]] == [[0], [0]]
        npz = client.get(f"/v1/rollouts/{group_id}/latents/{samples[0]}/0")
        assert npz.status_code == 200, npz.text
        steps = np.load(io.BytesIO(npz.content))
        arrays = [steps[f"step_{i}"] for i in range(records[0]["steps"])]
        assert len(steps.files) == len(arrays) and arrays[0].ndim == 5
        assert not np.array_equal(arrays[0], arrays[-1]), "each step's own latents"
        assert client.get(f"/v1/rollouts/{group_id}/latents/{samples[0]}/9").status_code == 404
        assert client.post("/v1/rollouts", json={**body, "seeds": [1, 1]}).status_code == 422
        assert client.get("/v1/rollouts/grp_none").status_code == 404
    export(tmp_path / "data", tmp_path / "export")
    exported = pd.read_parquet(tmp_path / "export" / "records")
    mine = exported[exported.group_id == group_id]
    assert sorted(mine.session_id.unique()) == sorted(samples) and len(mine) == len(records)


def test_sessions_name_adapters_registered_at_deploy_scope_only(tmp_path: Path) -> None:
    from models.instance import load_instance
    from models.registry import get
    from tests.models.test_lora import lora_tensors, write_peft

    dit = load_instance(get("tiny-world"), device="cpu").dit
    path = write_peft(tmp_path / "style", lora_tensors(dit, ["blocks.0.self_attn.q"], seed=1), 2.0)
    with make_client(tmp_path, adapters=(f"style={path}",)) as client:
        ok = client.post("/v1/sessions", json={"prompt": "a ball", "adapters": [{"name": "style"}]})
        assert ok.status_code == 201, ok.text
        for adapters in ([{"name": "other"}], [{"name": str(path)}]):  # never a path
            refused = client.post("/v1/sessions", json={"prompt": "a", "adapters": adapters})
            assert refused.status_code == 422, refused.text
            assert refused.json()["detail"][0]["loc"][:2] == ["body", "adapters"]
