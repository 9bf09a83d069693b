"""``/v1/workflows``: a ComfyUI API-format workflow compiles and runs as a job on the served
card, its compiled program is shown back, and a workflow with anything not covered is a 422
listing every node and parameter before a job exists."""

from __future__ import annotations

import io
import json
from pathlib import Path

import av
import pytest

from tests.server.conftest import make_client
from tests.server.test_routes_jobs import wait_done

WORKFLOWS = Path(__file__).resolve().parents[1] / "models" / "workflows"


@pytest.mark.slow
def test_a_workflow_runs_as_a_job_and_shows_its_program(tmp_path) -> None:
    body = json.loads((WORKFLOWS / "wan21_t2v_tiny.json").read_text())  # a /prompt body
    with make_client(tmp_path, model="wan2.1-t2v-tiny-random") as client:
        created = client.post("/v1/workflows", json=body)
        assert created.status_code == 202, created.text
        answer = created.json()
        workflow_id = answer["id"]
        assert answer["job"] == workflow_id and answer["model"] == "wan2.1-t2v-tiny-random"
        loop = answer["program"]["nodes"]["sampler_3"]
        assert (loop["prompt"], loop["negative_prompt"], loop["seed"]) == (
            "a red kite over a beach",
            "blurry",
            11,
        )
        assert answer["nodes"]["8"] == "decode node (full)"
        view = wait_done(client, workflow_id, timeout_s=120)
        assert view["state"] == "succeeded" and view["program"] == "comfyui"
        shown = client.get(f"/v1/workflows/{workflow_id}").json()
        assert shown["program"] == answer["program"] and shown["state"] == "succeeded"
        artifact = client.get(f"/v1/jobs/{workflow_id}/artifact")
        with av.open(io.BytesIO(artifact.content)) as container:
            assert sum(1 for _ in container.decode(video=0)) == 9

        stock = json.loads((WORKFLOWS / "wan21_t2v_comfyui_example.json").read_text())
        refused = client.post("/v1/workflows", json={"prompt": stock})
        assert refused.status_code == 422 and refused.json()["code"] == "workflow_not_covered"
        uncovered = {(u["node"], u["input"]) for u in refused.json()["uncovered"]}
        assert uncovered == {
            ("28", None),  # SaveAnimatedWEBP
            ("37", "unet_name"),  # the 1.3B file: not the served tiny card
            ("38", "clip_name"),
            ("39", "vae_name"),
            ("3", "steps"),
            ("3", "sampler_name"),
            ("48", "shift"),
            ("-", None),  # no covered save node
        }
        assert client.get("/v1/workflows/job_nope").status_code == 404
        plain = client.post("/v1/jobs", json={"task": "t2i", "prompt": "a", "seed": 1}).json()
        assert client.get(f"/v1/workflows/{plain['id']}").status_code == 404
        wait_done(client, plain["id"], timeout_s=120)
