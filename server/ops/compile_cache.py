"""The compile cache: Inductor's on-disk caches in a directory that outlives the machine.

A compiled instance's warm-up spends most of its time in Inductor (code generation, the C++ /
Triton compiler, autotuning). Inductor caches all of it on disk, content-keyed: the FX-graph
cache (compiled graphs), the AOTAutograd cache and, on a GPU, the Triton kernels and the
autotuning results (all on by default in torch >= 2.6). By default those live in
``/tmp/torchinductor_<user>``, which a fresh machine does not have. ``--compile-cache DIR``
(default ``DATA_DIR/compile-cache``) points them at ``DIR/<key>/`` instead, where ``<key>``
names what the artifacts depend on: the card, the torch version, the device (GPU model and
compute capability) and the serving levers (``WanInstance.levers``: attention kernel, FP8, CUDA
graphs, KV update, K/V cache dtype, ...). A second start with the same DIR - on this machine or
on another one mounting the same volume - finds every graph compiled and only re-traces with
Dynamo. Inductor's own keys stay content hashes, so a stale entry is never used wrongly; the
directory key keeps the cache of each configuration apart and easy to prune. ``key.json`` in
each directory says what it holds.

The environment variable is set before the first compile of the process (the warm-up), which
is when Inductor first reads it. An explicit ``$TORCHINDUCTOR_CACHE_DIR`` wins.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import platform
from pathlib import Path
from typing import Any

__all__ = ["cache_key", "use_compile_cache"]

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
        "levers": {k: levers[k] for k in sorted(levers)},
    }


def use_compile_cache(root: Path, key: dict[str, Any]) -> Path | None:
    """Point Inductor's caches at ``root/<digest of key>`` -> that directory; None (and
    nothing changed) when ``$TORCHINDUCTOR_CACHE_DIR`` is already set (to other than torch's
    default, which torch writes into the environment once it has looked it up)."""
    from torch._inductor.runtime.cache_dir_utils import default_cache_dir

    explicit = os.environ.get("TORCHINDUCTOR_CACHE_DIR")
    if explicit and os.path.abspath(explicit) != os.path.abspath(default_cache_dir()):
        log.info(
            "compile cache: $TORCHINDUCTOR_CACHE_DIR=%s is set; --compile-cache not used",
            os.environ["TORCHINDUCTOR_CACHE_DIR"],
        )
        return None
    text = json.dumps(key, sort_keys=True)
    digest = hashlib.sha256(text.encode()).hexdigest()[:16]
    directory = (root / f"{key['model']}-{digest}").resolve()
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "key.json").write_text(json.dumps(key, indent=2, sort_keys=True) + "\n")
    warm = any(p.name != "key.json" for p in directory.iterdir())
    os.environ["TORCHINDUCTOR_CACHE_DIR"] = str(directory)
    log.info("compile cache: %s (%s)", directory, "has artifacts" if warm else "empty")
    return directory
