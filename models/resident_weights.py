"""The weights of a resident model as a trainer changes them: weight updates, sleep and wake.

``WanInstance.weights`` is one ``ResidentWeights``. The serving side (``sessions.weight_sync``,
``sessions.model_sleep``) holds every loop of the model at a boundary before it calls
``apply`` / ``sleep`` / ``wake`` on a worker thread, so no step runs on half-written weights.

**Updates** (``prepare`` then ``apply``)::

    source ─read─► {name: CPU tensor} ─names: ours, a training wrapper's, diffusers'─►
        {module name: tensor} ─validate: keys, shapes, dtypes, finite─► (nothing touched yet)
        ─apply: copy_ (full) or add_ (delta) in place─► new weights_version

``source``: a safetensors file or directory in a layout ``models.checkpoint.load.resolve`` knows
(a diffusers ``transformer/`` directory, a pipeline root, a sharded index), or a mapping of
tensors (an in-process trainer's state dict). ``full`` names every parameter of the component;
``delta`` names some of them and is *added* to them (in float32, then cast). Tensors under
another component's prefix (``text_encoder.``, ``vae.``: a tiny-world checkpoint holds both)
are not the DiT's and are skipped. Every problem raises ``WeightUpdateError`` (or the
checkpoint's ``CheckpointError``) from ``prepare``, before a parameter is touched, so a bad
file changes nothing. ``apply`` writes in place: parameter storage keeps its address, so
compiled graphs and captured CUDA graphs stay valid.

The new ``weights_version`` is ``"b2:"`` + blake2b(previous version, component, mode, content
digest of the update): a pure function of the weights the model started from and the updates
applied since. The content digest is ``models.checkpoint.digest``'s for files, and blake2b over
names, shapes, dtypes and bytes for in-memory tensors. The text-embedding cache's entries of
the old version are dropped (its key holds the version, so they could not hit anyway; dropping
frees them); loops see the new version at their next chunk (``chunk_rollout``: re-encode,
re-cache).

**Sleep / wake** by component name (``"dit"``, ``"text_encoder"``, the codec's name): a sleeping
component's parameters and buffers move to host memory (pinned on CUDA) and its device memory
is returned to the allocator; its caches go too (the DiT's captured CUDA graphs, the text
encoder's embedding cache). ``wake`` copies them back, bit for bit. The sessions' chunk-KV
slabs are session state, not the component's, and stay resident.
"""

from __future__ import annotations

import hashlib
import logging
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import torch
from torch import nn

from models.checkpoint.digest import checkpoint_digest

__all__ = ["ResidentWeights", "WeightUpdate", "WeightUpdateError"]

log = logging.getLogger(__name__)

UpdateMode = Literal["full", "delta"]
_OTHER_COMPONENTS = ("text_encoder.", "vae.", "tiny_decoder.", "tokenizer.")


class WeightUpdateError(ValueError):
    """An update that does not fit the component (names what and why); nothing was changed."""


@dataclass(frozen=True, slots=True)
class WeightUpdate:
    """A validated update, ready to ``apply``: ``tensors`` by module name, copies on the host
    (or on the model's device when they came from there), in the parameter's dtype (float32
    for a delta)."""

    component: str
    mode: UpdateMode
    tensors: dict[str, torch.Tensor]
    digest: str  # content digest of the update itself
    source: str


class ResidentWeights:
    """The weights lifecycle of one ``WanInstance`` (module docstring)."""

    def __init__(self, instance: Any) -> None:
        self._m = instance
        self.asleep: dict[str, dict[str, torch.Tensor]] = {}  # component -> host copies
        self.updates = 0

    @property
    def version(self) -> str:
        return str(self._m.weights_digest)

    # ------------------------------------------------------------------------------ updates

    def prepare(
        self,
        source: str | Path | Mapping[str, torch.Tensor],
        *,
        mode: UpdateMode = "full",
        component: str = "dit",
    ) -> WeightUpdate:
        """Read and validate an update (module docstring); touches no parameter."""
        if mode not in ("full", "delta"):
            raise WeightUpdateError(f"mode {mode!r} is not 'full' or 'delta'")
        if component != "dit":
            raise WeightUpdateError(f"component {component!r} cannot be updated; only 'dit'")
        if getattr(self._m, "_fp8", False):
            raise WeightUpdateError("an instance with FP8 linears cannot take weight updates")
        if component in self.asleep:
            raise WeightUpdateError(f"component {component!r} is asleep; wake it first")
        if isinstance(source, Mapping):
            raw, digest, name = dict(source), _tensors_digest(source), "<tensors>"
        else:
            raw, digest, name = _read(Path(source))
        live = self._m.dit.state_dict(keep_vars=True)
        tensors = _validated(name, raw, live, mode)
        return WeightUpdate(component, mode, tensors, digest, name)

    def apply(self, update: WeightUpdate) -> str:
        """Write ``update`` into the component in place; -> the new weights_version. Run it
        with every loop of the model held (``sessions.weight_sync``)."""
        start_s = time.perf_counter()
        live = self._m.dit.state_dict(keep_vars=True)
        with torch.no_grad():
            for key, tensor in update.tensors.items():
                target = live[key]
                if update.mode == "full":
                    target.copy_(tensor, non_blocking=True)
                else:
                    target.copy_(target.float() + tensor.to(target.device))
        if self._m.device.type == "cuda":
            torch.cuda.synchronize(self._m.device)
        old = self.version
        body = f"{old}|{update.component}|{update.mode}|{update.digest}".encode()
        new = "b2:" + hashlib.blake2b(body, digest_size=8).hexdigest()
        self._m.weights_digest = new
        text = self._m.text
        text.weights_version = new
        drop = getattr(text.store, "drop_version", None)
        if drop is not None:
            drop(old)
        self.updates += 1
        log.info(
            "weights %s -> %s (%s %s of %d tensors from %s) in %.3f s",
            old,
            new,
            update.mode,
            update.component,
            len(update.tensors),
            update.source,
            time.perf_counter() - start_s,
        )
        return new

    # ------------------------------------------------------------------------- sleep / wake

    def sleep(self, components: Iterable[str]) -> int:
        """Move ``components`` to host memory and drop their caches; -> device bytes freed
        (as the allocator counts them; 0 off CUDA). Already asleep: left as it is."""
        names = self.check(components)
        before = _allocated(self._m.device)
        for name in names:
            if name in self.asleep:
                continue
            pin = self._m.device.type == "cuda"
            host: dict[str, torch.Tensor] = {}
            for key, tensor in _tensors_of(self._module(name)).items():
                copy = tensor.detach().to("cpu", copy=True)
                host[key] = copy.pin_memory() if pin else copy
                tensor.data = torch.empty(0, device=tensor.device, dtype=tensor.dtype)
            self.asleep[name] = host
            self._drop_caches(name)
        if self._m.device.type == "cuda":
            torch.cuda.synchronize(self._m.device)
            torch.cuda.empty_cache()
        return max(0, before - _allocated(self._m.device))

    def wake(self, components: Iterable[str]) -> float:
        """Copy sleeping ``components`` back to the device; -> seconds it took."""
        names = self.check(components)
        start_s = time.perf_counter()
        for name in names:
            host = self.asleep.pop(name, None)
            if host is None:
                continue
            for key, tensor in _tensors_of(self._module(name)).items():
                tensor.data = host[key].to(self._m.device, non_blocking=True)
        if self._m.device.type == "cuda":
            torch.cuda.synchronize(self._m.device)
        return time.perf_counter() - start_s

    def check(self, components: Iterable[str]) -> list[str]:
        names = list(dict.fromkeys(components))
        unknown = [n for n in names if n not in self._m.components]
        if not names or unknown:
            raise WeightUpdateError(
                f"components {unknown or names} are not among {sorted(self._m.components)}"
            )
        return names

    def _module(self, name: str) -> nn.Module:
        component = self._m.components[name]
        # the text encoder is served through its cache (CachedTextEncoder) and may wrap its
        # module (UMT5: ``.model``; tiny-world's word embedding is the module itself)
        while not isinstance(component, nn.Module):
            component = getattr(component, "encoder", None) or component.model
        return component

    def _drop_caches(self, name: str) -> None:
        if name == "dit" and getattr(self._m.dit, "chunk_graphs", None) is not None:
            # captured graphs hold the old addresses and their own memory pools
            self._m.dit.chunk_graphs = type(self._m.dit.chunk_graphs)()
        if name == "text_encoder":
            clear = getattr(self._m.text.store, "drop_version", None)
            if clear is not None:
                clear(self._m.text.weights_version)


def _tensors_of(module: nn.Module) -> dict[str, torch.Tensor]:
    return dict(module.named_parameters()) | dict(module.named_buffers())


def _allocated(device: torch.device) -> int:
    return torch.cuda.memory_allocated(device) if device.type == "cuda" else 0


def _read(path: Path) -> tuple[dict[str, torch.Tensor], str, str]:
    from models.checkpoint.load import DIT_LAYOUT, read_tensors, resolve

    found = resolve(path, DIT_LAYOUT)
    tensors, _ = read_tensors(found.files)
    root = found.config_dir
    digest = checkpoint_digest(root, [str(f.relative_to(root)) for f in found.files])
    return tensors, digest, str(path)


def _native(key: str, live: Mapping[str, torch.Tensor]) -> str | None:
    from models.wan.dit import keymaps

    short = key.removeprefix("dit.")
    short = keymaps.strip_prefix(short) or short
    if short in live:
        return short
    name = keymaps.to_native(short, keymaps.DIFFUSERS)
    return name if name in live else None


def _validated(
    source: str,
    raw: Mapping[str, torch.Tensor],
    live: Mapping[str, torch.Tensor],
    mode: UpdateMode,
) -> dict[str, torch.Tensor]:
    from models.checkpoint.load import map_keys

    ours = [k for k in raw if not k.startswith(_OTHER_COMPONENTS)]
    mapping = map_keys(ours, "dit", lambda key: _native(key, live))
    mapped = {name: raw[key] for name, key in mapping.native.items()}
    unexpected, twice = mapping.unexpected, mapping.ambiguous
    missing = [k for k in live if k not in mapped] if mode == "full" else []
    if unexpected or twice or missing or not mapped:
        raise WeightUpdateError(
            f"{source}: a {mode} update of the DiT needs its parameter names; "
            f"unexpected {_few(unexpected)}, given twice {_few(twice)}, missing {_few(missing)}"
            + ("" if mapped else " (no DiT tensor at all)")
        )
    wrong = [
        f"{k} {tuple(t.shape)} (wants {tuple(live[k].shape)})"
        for k, t in mapped.items()
        if tuple(t.shape) != tuple(live[k].shape)
    ]
    if wrong:
        raise WeightUpdateError(f"{source}: shapes do not fit the DiT: {_few(wrong)}")
    out: dict[str, torch.Tensor] = {}
    for key, tensor in mapped.items():
        if not tensor.is_floating_point():
            raise WeightUpdateError(f"{source}: {key} is {tensor.dtype}, not a float tensor")
        if not bool(torch.isfinite(tensor).all()):
            raise WeightUpdateError(f"{source}: {key} holds non-finite values")
        dtype = torch.float32 if mode == "delta" else live[key].dtype
        # a copy (the trainer may go on changing its tensors): on the model's device when the
        # tensor is there already (a co-located trainer), else on the host
        where = tensor.device if tensor.device == live[key].device else torch.device("cpu")
        out[key] = tensor.detach().to(where, dtype=dtype, copy=True).contiguous()
    return out


def _tensors_digest(tensors: Mapping[str, torch.Tensor]) -> str:
    h = hashlib.blake2b(digest_size=8)
    for key in sorted(tensors):
        t = tensors[key].detach().to("cpu").contiguous()
        h.update(f"{key}|{tuple(t.shape)}|{t.dtype}\0".encode())
        h.update(t.reshape(-1).view(torch.uint8).numpy().data)
    return "b2:" + h.hexdigest()


def _few(items: list[str], limit: int = 6) -> str:
    shown = ", ".join(items[:limit])
    return f"[{shown}{', ...' if len(items) > limit else ''}] ({len(items)})"
