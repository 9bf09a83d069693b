"""``POST /v1/jobs`` with a program, on the tiny card with both decoders: the job's event
stream carries the previews, the artifact is the final MP4, a program the model cannot run is
a 422 listing its problems before a job exists."""

from __future__ import annotations

import io
import json

import av
import pytest

from tests.server.conftest import make_client
from tests.server.test_routes_jobs import wait_done

MODEL = "wan-tiny-taehv-random"


def sse_events(text: str) -> list[tuple[str, dict]]:
    out = []
    for block in text.split("\n\n"):
        lines = dict(line.split(": ", 1) for line in block.splitlines() if ": " in line)
        if "event" in lines:
            out.append((lines["event"], json.loads(lines["data"])))
    return out


@pytest.mark.slow
def test_a_preview_and_final_job_streams_previews_and_serves_the_mp4(tmp_path) -> None:
    with make_client(tmp_path, model=MODEL) as client:
        body = {"task": "t2v", "prompt": "a kite", "num_frames": 17, "seed": 5}
        created = client.post("/v1/jobs", json={**body, "program": "preview_and_final"})
        assert created.status_code == 202, created.text
        job_id = created.json()["id"]
        view = wait_done(client, job_id, timeout_s=120)
        assert view["state"] == "succeeded" and view["program"] == "preview_and_final"
        events = sse_events(client.get(f"/v1/jobs/{job_id}/events").text)
        previews = [data for kind, data in events if kind == "job.preview"]
        # the stream's first frame alone (as a session's), the rest of chunk 0, chunk 1
        assert [(p["frame_start"], p["num_frames"]) for p in previews] == [(0, 1), (1, 8), (9, 12)]
        assert (previews[0]["width"], previews[0]["height"]) == (64, 64)
        kinds = [kind for kind, _ in events]
        assert kinds.index("job.preview") < kinds.index("job.artifact")
        after = sse_events(client.get(f"/v1/jobs/{job_id}/events?after=3").text)
        assert all(data["event_id"] > 3 for _, data in after)
        artifact = client.get(f"/v1/jobs/{job_id}/artifact")
        assert artifact.headers["content-type"] == "video/mp4"
        with av.open(io.BytesIO(artifact.content)) as container:
            assert sum(1 for _ in container.decode(video=0)) == 17

        bad = client.post(
            "/v1/jobs",
            json={
                **body,
                "program": {
                    "nodes": {
                        "denoise": {"kind": "loop"},
                        "final": {"kind": "decode", "decoder": "huge"},
                        "video": {"kind": "artifact"},
                    },
                    "edges": [{"from": "final.frames", "to": "video.frames", "kind": "artifact"}],
                },
            },
        )
        assert bad.status_code == 422
        answer = bad.json()
        assert answer["code"] == "invalid_program"
        assert answer["detail"][0]["loc"] == ["body", "program"]
        assert answer["problems"] == [
            "node 'final': required input 'latents' is unconnected",
            "node 'final': decoder 'huge' is not served by model 'wan-tiny-taehv-random' "
            "(its decoders: ['full', 'tiny'])",
        ]
        unknown = client.post("/v1/jobs", json={**body, "program": "nope"})
        assert unknown.status_code == 422 and "unknown program 'nope'" in unknown.text
        assert client.get("/v1/jobs/job_nope/events").status_code == 404


@pytest.mark.slow
def test_render_a_moment_of_a_running_session(tmp_path) -> None:
    with make_client(tmp_path, model=MODEL) as client:
        session = client.post(
            "/v1/sessions", json={"prompt": "a lighthouse", "seed": 3, "start": "now"}
        ).json()
        render = client.post(f"/v1/sessions/{session['id']}/render", json={"chunks": 2})
        assert render.status_code == 202, render.text
        answer = render.json()
        assert answer["session"] == session["id"] and answer["at_chunk"] >= 0
        view = wait_done(client, answer["id"], timeout_s=120)
        assert view["state"] == "succeeded" and view["program"] == "render_moment"
        artifact = client.get(f"/v1/jobs/{answer['id']}/artifact")
        with av.open(io.BytesIO(artifact.content)) as container:
            # two chunks through a fresh full decoder: 9 frames, then 12
            assert sum(1 for _ in container.decode(video=0)) == 21
        assert client.get(f"/v1/sessions/{session['id']}").json()["state"] != "failed"
        by_job = client.post(
            "/v1/jobs",
            json={
                "task": "t2v",
                "prompt": "unused: the session's prompt memory goes on",
                "program": {"preset": "render_moment", "session": session["id"], "chunks": 1},
            },
        )
        assert by_job.status_code == 202, by_job.text
        assert wait_done(client, by_job.json()["id"], timeout_s=120)["state"] == "succeeded"
        gone = client.post(
            "/v1/jobs",
            json={
                "task": "t2v",
                "prompt": "x",
                "program": {"preset": "render_moment", "session": "ses_none", "chunks": 1},
            },
        )
        assert gone.status_code == 422 and "is not running here" in gone.text
        assert client.post("/v1/sessions/ses_none/render", json={"chunks": 1}).status_code == 404
        client.delete(f"/v1/sessions/{session['id']}")


@pytest.mark.slow
def test_render_a_moment_of_a_closed_session_from_its_snapshot(tmp_path) -> None:
    with make_client(tmp_path, model=MODEL, snapshot_every=1) as client:
        session = client.post(
            "/v1/sessions", json={"prompt": "a lighthouse", "seed": 3, "start": "now"}
        ).json()
        client.delete(f"/v1/sessions/{session['id']}")
        render = client.post(
            "/v1/jobs",
            json={
                "task": "t2v",
                "prompt": "unused",
                "program": {"preset": "render_moment", "session": session["id"], "chunks": 1},
            },
        )
        assert render.status_code == 202, render.text
        view = wait_done(client, render.json()["id"], timeout_s=120)
        assert view["state"] == "succeeded" and view["program"] == "render_moment"
        artifact = client.get(f"/v1/jobs/{render.json()['id']}/artifact")
        with av.open(io.BytesIO(artifact.content)) as container:
            assert sum(1 for _ in container.decode(video=0)) == 9
