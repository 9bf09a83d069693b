"""The compile cache: everything a compiled start needs, in a directory that outlives the machine.

``--compile-cache DIR`` (default ``DATA_DIR/compile-cache``) holds one directory per
``<key>``, named for what the artifacts depend on: the card, the torch version, the device (GPU
model and compute capability) and the serving levers that change compiled code
(``WanInstance.levers``: attention kernel, FP8, KV update, K/V cache dtype, ...; not CUDA
graphs, which replay the same compiled code and are captured at every start). Each holds:

- ``regions/``: the precompiled regions' artifacts (``models.precompiled``: guards, bytecode
  and Inductor's compiled code per call signature), loaded at start without tracing anything;
- ``inductor/``: Inductor's own on-disk caches (``$TORCHINDUCTOR_CACHE_DIR`` points here): the
  kernels the artifacts' code loads, autotuning results, the FX-graph and AOTAutograd caches.
  On a GPU the artifacts carry their Triton kernels, so ``inductor/`` may be left out of what
  is copied (``portable_bytes``: on the H200 the default set's ~110 MB of ~310 MB) and is written
  again at the first start; on the CPU keep it (without it the artifacts' C++ kernels build
  again, about 40 s for the tiny card's);
- ``cost.json``: the measured plan costs of the warm-up's calibration (``server.ops.warm_up``;
  ``cost-cuda-graphs.json`` for a server that replays CUDA graphs: its steps cost less);
- ``key.json``: what the directory holds.

A second start with the same DIR - on this machine or on another one of the same GPU model and
torch that mounts or copies it - traces and compiles nothing (``dreamrt compile`` builds it
without serving). Inductor's keys stay content hashes and every artifact is checked against
its call's signature, so a stale entry is never used wrongly; the directory key keeps the
cache of each configuration apart and easy to prune.

The environment variable is set before the first compile of the process (the warm-up), which
is when Inductor first reads it. An explicit ``$TORCHINDUCTOR_CACHE_DIR`` wins for Inductor's
caches; the regions and the calibration stay in DIR.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import platform
from pathlib import Path
from typing import Any

__all__ = [
    "INDUCTOR_DIR",
    "cache_bytes",
    "cache_key",
    "cost_file",
    "portable_bytes",
    "use_compile_cache",
]

INDUCTOR_DIR = "inductor"  # Inductor's own caches, inside a cache directory

# levers that change what a step costs but not the compiled code: left out of the key
RUNTIME_LEVERS = ("cuda_graphs",)

log = logging.getLogger(__name__)


def _device_name(device: Any) -> str:
    import torch

    device = torch.device(device)
    if device.type == "cuda":
        major, minor = torch.cuda.get_device_capability(device)
        return f"{torch.cuda.get_device_name(device)} sm{major}{minor}"
    return f"{device.type} {platform.machine()}"


def cache_key(model_id: str, device: Any, levers: dict[str, Any], precision: str) -> dict[str, Any]:
    """What the compiled artifacts of an instance depend on (JSON-able)."""
    import torch

    return {
        "model": model_id,
        "torch": torch.__version__,
        "device": _device_name(device),
        "precision": precision,
        "levers": {k: levers[k] for k in sorted(levers) if k not in RUNTIME_LEVERS},
    }


def cost_file(directory: Path, levers: dict[str, Any]) -> Path:
    """Where ``directory`` keeps the calibration of a server with ``levers``: one file per
    setting of the levers the key leaves out (``RUNTIME_LEVERS``)."""
    return directory / ("cost-cuda-graphs.json" if levers.get("cuda_graphs") else "cost.json")


def use_compile_cache(root: Path, key: dict[str, Any]) -> Path:
    """The directory ``root/<model>-<digest of key>`` (made, with its ``key.json``), Inductor's
    caches pointed at its ``inductor/`` unless ``$TORCHINDUCTOR_CACHE_DIR`` is already set (to
    other than torch's default, which torch writes into the environment once it has looked it
    up)."""
    from torch._inductor.runtime.cache_dir_utils import default_cache_dir

    text = json.dumps(key, sort_keys=True)
    digest = hashlib.sha256(text.encode()).hexdigest()[:16]
    directory = (root / f"{key['model']}-{digest}").resolve()
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "key.json").write_text(json.dumps(key, indent=2, sort_keys=True) + "\n")
    warm = any(p.name != "key.json" for p in directory.iterdir())
    log.info("compile cache: %s (%s)", directory, "has artifacts" if warm else "empty")
    explicit = os.environ.get("TORCHINDUCTOR_CACHE_DIR")
    if explicit and os.path.abspath(explicit) != os.path.abspath(default_cache_dir()):
        log.info("compile cache: Inductor's caches stay in $TORCHINDUCTOR_CACHE_DIR=%s", explicit)
    else:
        os.environ["TORCHINDUCTOR_CACHE_DIR"] = str(directory / INDUCTOR_DIR)
    return directory


def cache_bytes(directory: Path) -> int:
    """The bytes of every file under ``directory``."""
    return sum(p.stat().st_size for p in directory.rglob("*") if p.is_file())


def portable_bytes(directory: Path) -> int:
    """The bytes of a cache directory less its ``inductor/``: what a GPU start needs."""
    return sum(
        cache_bytes(p) if p.is_dir() else p.stat().st_size
        for p in directory.iterdir()
        if p.name != INDUCTOR_DIR
    )
