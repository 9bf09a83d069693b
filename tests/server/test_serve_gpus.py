"""``dreamrt serve --gpus 2`` on the CPU: torchrun relaunch, rank 0 serves, rank 1 follows.

A real server (uvicorn on loopback, gloo between the two processes) runs a text-to-video job to
success, twice: the tiny causal Wan card under sp=2 (every step's all-to-alls and the split
decode's halo exchanges needed rank 1 executing the same plans) and the tiny bidirectional card
under ``--parallel cfg=2`` (each rank one guidance branch of 50 CFG steps). The frames
themselves are compared with one process in tests/models/test_spmd_rollout.py and
tests/models/test_cfg_branches.py. About 15-25 s each: two processes load the model.
"""

from __future__ import annotations

import asyncio
import os
import signal
import socket
import subprocess
import sys
import time

import httpx
import pytest

pytestmark = pytest.mark.slow


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_forks_are_refused_under_gpus() -> None:
    from server.spmd_serving import NoForks
    from sessions.forks import ForkError

    with pytest.raises(ForkError, match="not supported under --gpus") as err:
        asyncio.run(NoForks().fork(None, 2, None, None))
    assert err.value.field == "n"


@pytest.mark.parametrize(
    ("model", "parallel", "plan"),
    [
        ("wan-tiny-random", "", "sp=2 cfg=1, VAE decode split by rows"),
        ("wan2.1-t2v-tiny-random", "cfg=2", "sp=1 cfg=2, VAE decode on rank 0"),
    ],
)
def test_job_runs_across_two_processes(tmp_path, model: str, parallel: str, plan: str) -> None:
    port = _port()
    cmd = [sys.executable, "-m", "server.cli", "serve", "--gpus", "2", "--device", "cpu"]
    cmd += ["--model", model, "--port", str(port), "--data-dir", str(tmp_path)]
    cmd += ["--parallel", parallel] if parallel else []
    env = dict(os.environ, MASTER_ADDR="127.0.0.1")
    log = (tmp_path / "serve.log").open("w")
    proc = subprocess.Popen(
        cmd, stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True
    )
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 120
        while True:
            assert proc.poll() is None, (tmp_path / "serve.log").read_text()[-3000:]
            try:
                if httpx.get(f"{base}/v1/models", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            assert time.monotonic() < deadline, "server did not come up"
            time.sleep(0.5)
        job = httpx.post(
            f"{base}/v1/jobs", json={"task": "t2v", "prompt": "a red kite", "num_frames": 9}
        ).json()["id"]
        while (state := httpx.get(f"{base}/v1/jobs/{job}").json())["state"] not in (
            "succeeded",
            "failed",
        ):
            assert time.monotonic() < deadline, state
            time.sleep(0.2)
        assert state["state"] == "succeeded", state
        assert httpx.get(f"{base}/v1/jobs/{job}/artifact").content[4:8] == b"ftyp"  # an mp4
    finally:
        os.killpg(proc.pid, signal.SIGTERM)  # torchrun and its two workers
        proc.wait(timeout=30)
        log.close()
    text = (tmp_path / "serve.log").read_text()
    for rank in (0, 1):
        assert f"rank {rank} of 2: {model} under {plan}" in text


def test_a_plan_that_cannot_run_is_refused_before_any_process_starts(capsys) -> None:
    from server.cli import main

    argv = ["serve", "--gpus", "3", "--device", "cpu", "--model", "wan-tiny-random"]
    assert main(argv) == 2  # 2 heads: sp=3 cannot split them; nothing was launched
    assert "sp=3 does not divide the model's 2 attention heads" in capsys.readouterr().err


def test_a_parallel_plan_must_span_the_gpus(capsys) -> None:
    from server.cli import main

    argv = ["serve", "--gpus", "2", "--device", "cpu", "--model", "wan2.1-t2v-tiny-random"]
    assert main([*argv, "--parallel", "sp=2,cfg=2"]) == 2
    assert "--parallel 'sp=2,cfg=2' spans 4 processes, --gpus is 2" in capsys.readouterr().err
    assert main([*argv, "--parallel", "replica=2"]) == 2
    assert "replica=2 is not served yet" in capsys.readouterr().err
