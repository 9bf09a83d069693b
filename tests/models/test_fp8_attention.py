"""The Triton FP8 attention kernel on the CPU: ``fp8_attention_interpreted.py`` in a child pytest
under ``TRITON_INTERPRET=1`` (which must be set before Triton's first import, so not here)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("triton")

ROOT = Path(__file__).resolve().parents[2]


def test_the_fp8_kernel_under_triton_s_interpreter() -> None:
    inner = Path(__file__).with_name("fp8_attention_interpreted.py")
    env = {**os.environ, "TRITON_INTERPRET": "1", "OMP_NUM_THREADS": "1"}
    result = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", str(inner)],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-2000:]
    assert "4 passed" in result.stdout
