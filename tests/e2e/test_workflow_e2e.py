"""A ComfyUI workflow end to end on a real server: ``dreamrt run workflow.json`` against
``dreamrt serve --model wan2.1-t2v-tiny-random`` on 127.0.0.1 compiles it, runs it and writes
the MP4; ComfyUI's own example is refused with the list of what is not covered."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from pathlib import Path

import av
import httpx
import pytest

from infra.browser_harness import ServerProcess

WORKFLOWS = Path(__file__).resolve().parents[1] / "models" / "workflows"


@pytest.mark.slow
def test_dreamrt_run_compiles_and_runs_a_comfyui_workflow(tmp_path: Path) -> None:
    server = ServerProcess(
        tmp_path / "data", tmp_path / "server.log", extra_args=("--model", "wan2.1-t2v-tiny-random")
    ).start()
    try:
        out = tmp_path / "fox.mp4"
        run = subprocess.run(
            [
                sys.executable,
                "-m",
                "server",
                "run",
                str(WORKFLOWS / "wan21_t2v_tiny.json"),
                "--url",
                server.url,
                "--out",
                str(out),
            ],
            capture_output=True,
            text=True,
            timeout=180,
            check=False,
        )
        assert run.returncode == 0, run.stderr[-3000:]
        assert "node 3: loop node (the card's diffusion_denoise)" in run.stdout
        assert "succeeded" in run.stdout
        with av.open(str(out)) as container:
            assert sum(1 for _ in container.decode(video=0)) == 9
        stock = tmp_path / "stock.json"
        stock.write_text((WORKFLOWS / "wan21_t2v_comfyui_example.json").read_text())
        refused = subprocess.run(
            [sys.executable, "-m", "server", "run", str(stock), "--url", server.url],
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
        assert refused.returncode == 1
        assert "workflow_not_covered" in refused.stderr and "SaveAnimatedWEBP" in refused.stderr
        job_id = json.loads(
            httpx.get(f"{server.url}/v1/jobs/{run.stdout.split('job ')[1].split()[0]}").text
        )["id"]
        shown = httpx.get(f"{server.url}/v1/workflows/{job_id}").json()
        assert shown["program"]["nodes"]["decode_3"] == {"kind": "decode", "decoder": "full"}
    finally:
        server.stop(timeout_s=20.0)
    log = server.log_path.read_text(errors="replace")
    assert "Traceback" not in log, log[-6000:]


@pytest.mark.slow
async def test_a_program_jobs_previews_play_over_webrtc(tmp_path: Path) -> None:
    """``POST /v1/jobs/{id}/preview``: a WebRTC viewer of a preview_and_final job receives
    the tiny decoder's frames, those previewed before it connected first, until the job ends."""
    from aiortc import RTCConfiguration, RTCPeerConnection, RTCSessionDescription
    from aiortc.mediastreams import MediaStreamError

    server = ServerProcess(
        tmp_path / "data", tmp_path / "server.log", extra_args=("--model", "wan-tiny-taehv-random")
    ).start()
    pc = RTCPeerConnection(RTCConfiguration(iceServers=[]))
    try:
        async with httpx.AsyncClient(base_url=server.url, timeout=30) as http:
            body = {"task": "t2v", "prompt": "a kite", "num_frames": 41, "seed": 5}
            job = await http.post("/v1/jobs", json={**body, "program": "preview_and_final"})
            job_id = job.json()["id"]
            pc.addTransceiver("video", direction="recvonly")
            await pc.setLocalDescription(await pc.createOffer())
            video = asyncio.get_running_loop().create_future()
            pc.on("track", lambda track: video.done() or video.set_result(track))
            answer = await http.post(
                f"/v1/jobs/{job_id}/preview", json={"sdp": pc.localDescription.sdp, "type": "offer"}
            )
            assert answer.status_code == 200, answer.text
            await pc.setRemoteDescription(RTCSessionDescription(**answer.json()))
            track = await asyncio.wait_for(video, 30)
            frames = []
            while True:
                try:
                    frame = await asyncio.wait_for(track.recv(), 20)
                except (MediaStreamError, TimeoutError):
                    break
                frames.append(frame)
            assert (frames[0].width, frames[0].height) == (64, 64)
            # four chunks previewed: 9 + 3 x 12 frames, paced at 8 fps (a few may be lost)
            assert 40 <= len(frames) <= 45
            view = (await http.get(f"/v1/jobs/{job_id}")).json()
            assert view["state"] == "succeeded"
            done = await http.post(
                f"/v1/jobs/{job_id}/preview", json={"sdp": pc.localDescription.sdp, "type": "offer"}
            )
            assert done.status_code == 409 and "its previews are in its events" in done.text
    finally:
        await pc.close()
        server.stop(timeout_s=20.0)
    log = server.log_path.read_text(errors="replace")
    assert "Traceback" not in log, log[-6000:]
