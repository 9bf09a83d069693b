"""``dreamrt bench gpu-session`` as a CPU dry run on the tiny card: lever variants run side by
side, a variant that cannot be set up is recorded and the others go on, ``+graphs`` is checked
for bit-identity with the same variant without graphs, and ``+taehv`` swaps the decoder for the
component ``--tiny-decoder`` names (here: one that hands back the card's own VAE)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from infra.bench import gpu_session

VARIANTS = "baseline,nomask+fp8attn,nomask+fp8attn+graphs,nomask+taehv,nomask+sage+fp8qk"


def same_decoder(instance, weights=None):
    """A ``--tiny-decoder`` factory: the card's own VAE (the hook's plumbing, not a decoder)."""
    assert weights == "w.safetensors"
    return instance.vae


@pytest.mark.slow
def test_cpu_dry_run_of_lever_variants(tmp_path: Path, capsys) -> None:
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    out = tmp_path / "gpu_session.json"
    try:
        code = gpu_session.main(
            [
                "--device",
                "cpu",
                "--model",
                "wan-tiny-random",
                "--window",
                "9",
                "--chunks",
                "4",
                "--variants",
                VARIANTS,
                "--tiny-decoder",
                f"{__name__}:same_decoder",
                "--tiny-decoder-weights",
                "w.safetensors",
                "--json",
                str(out),
            ]
        )
    finally:
        torch.set_num_threads(threads)
    assert code == 1  # one variant failed, and says why
    data = json.loads(out.read_text())
    results = data["results"]
    assert list(results) == VARIANTS.split(",")
    assert "names 2 attention backends" in results["nomask+sage+fp8qk"]["error"]
    ran = {k: v for k, v in results.items() if "error" not in v}
    assert all(r["fps"] > 0 and r["first_frame_s"] > 0 for r in ran.values())
    assert results["nomask+fp8attn"]["setup"]["attention"] == "fp8-triton"
    # on the CPU the FP8 kernel falls back to SDPA and graphs to eager: frames stay identical
    assert results["nomask+fp8attn+graphs"]["graphs_identical"] is True
    assert results["nomask+fp8attn"]["parity_vs_baseline"]["identical"]
    stats = results["nomask+fp8attn+graphs"]["setup"]["graph_stats"]
    assert stats["measured"]["replays"] == 0 and stats["measured"]["eager"] > 0
    assert results["nomask+taehv"]["setup"]["decoder"].endswith(":same_decoder")
    rows = data["attention_micro"]["rows"]
    assert [r["backend"] for r in rows] == [
        "auto",
        "cudnn",
        "flash",
        "sage",
        "fp8-triton",
        "fp8qk-triton",
    ]
    assert all(r["vs_fp32"]["rel_l2"] < 1e-5 for r in rows if "ms" in r)  # all SDPA here
    table = capsys.readouterr().out.rsplit("| variant | FPS incl. decode |", 1)[1]
    assert "| nomask+sage+fp8qk | failed: VariantError" in table
    assert "| nomask+fp8attn+graphs |" in table and "| yes | fp8-triton |" in table
