"""A ComfyUI workflow end to end on a real server: ``dreamrt run workflow.json`` against
``dreamrt serve --model wan2.1-t2v-tiny-random`` on 127.0.0.1 compiles it, runs it and writes
the MP4; ComfyUI's own example is refused with the list of what is not covered."""

from __future__ import annotations

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
