"""``--compile-cache``: one Inductor cache directory per card, torch, device and levers."""

from __future__ import annotations

import json
import os

import torch

from server.ops.compile_cache import cache_key, cost_file, portable_bytes, use_compile_cache


def test_the_cache_directory_is_keyed_by_card_torch_device_and_levers(tmp_path, monkeypatch):
    monkeypatch.delenv("TORCHINDUCTOR_CACHE_DIR", raising=False)
    levers = {"attention": "sdpa", "compiled": True, "kv_cache": "model"}
    key = cache_key("wan-tiny-random", "cpu", levers, "fp32")
    assert key["torch"] == torch.__version__ and key["device"].startswith("cpu ")
    first = use_compile_cache(tmp_path, key)
    assert first is not None and first.parent == tmp_path.resolve()
    assert first.name.startswith("wan-tiny-random-")
    assert json.loads((first / "key.json").read_text()) == key
    assert os.environ["TORCHINDUCTOR_CACHE_DIR"] == str(first / "inductor")
    monkeypatch.delenv("TORCHINDUCTOR_CACHE_DIR")
    again = use_compile_cache(tmp_path, cache_key("wan-tiny-random", "cpu", dict(levers), "fp32"))
    assert again == first  # the same configuration finds the same directory
    monkeypatch.delenv("TORCHINDUCTOR_CACHE_DIR")
    fp8 = use_compile_cache(
        tmp_path, cache_key("wan-tiny-random", "cpu", {**levers, "kv_cache": "fp8"}, "fp32")
    )
    assert fp8 is not None and fp8 != first  # another lever: its own artifacts


def test_an_explicit_inductor_cache_dir_wins_for_inductors_caches_only(tmp_path, monkeypatch):
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path / "mine"))
    directory = use_compile_cache(tmp_path / "flag", cache_key("m", "cpu", {}, "fp32"))
    assert os.environ["TORCHINDUCTOR_CACHE_DIR"] == str(tmp_path / "mine")
    # the precompiled regions and the calibration still have their directory
    assert directory.parent == (tmp_path / "flag").resolve() and (directory / "key.json").exists()


def test_cuda_graphs_share_the_compiled_artifacts_and_keep_their_own_calibration(tmp_path):
    """CUDA graphs replay the same compiled code: one directory, two calibrations."""
    levers = {"attention": "sdpa", "compiled": True, "cuda_graphs": False}
    plain = cache_key("m", "cpu", levers, "bf16")
    assert plain == cache_key("m", "cpu", {**levers, "cuda_graphs": True}, "bf16")
    assert "cuda_graphs" not in plain["levers"]
    assert cost_file(tmp_path, levers) != cost_file(tmp_path, {**levers, "cuda_graphs": True})


def test_what_a_gpu_start_needs_leaves_out_inductors_own_caches(tmp_path):
    (tmp_path / "regions" / "dit.blocks").mkdir(parents=True)
    (tmp_path / "regions" / "dit.blocks" / "a.aot").write_bytes(b"x" * 100)
    (tmp_path / "key.json").write_text("{}")
    (tmp_path / "inductor" / "triton").mkdir(parents=True)
    (tmp_path / "inductor" / "triton" / "k.cubin").write_bytes(b"y" * 1000)
    assert portable_bytes(tmp_path) == 102
