"""LoRA adapters for the DiT, per session, without copying the base weights.

Adapters are registered at deploy scope (``dreamrt serve --adapter NAME=PATH``; never a path
from a request): ``LoRAAdapters.register(name, path)`` reads a safetensors file, maps its keys
onto the DiT's linears and checks every shape before the adapter is usable. A session names
adapters with strengths (``SessionRequest.adapters``); its loop's plans then run through an
``AdaptedOp`` (``LoRAAdapters.bind``), which makes those adapters active on the executor thread
for the duration of the call. Every adaptable linear carries one forward hook, installed once::

    y = base(x)                                          the base weights, untouched, shared
      + sum over active adapters a touching this linear:
            strength_a * (alpha_a / r_a) * (x @ A_a^T) @ B_a^T      A: [r, in], B: [out, r]

so sessions with different adapters (or none) interleave on one model, step by step; their
steps never share a batch (the batch key holds the op object: one ``AdaptedOp`` per adapter
set), and an adapted step bypasses the captured CUDA graphs (they hold the base forward). The
KV updates, re-caches and cross-attention K/V of an adapted session run adapted too: its
caches are its adapted model's. The text-embedding cache is shared rightly: adapters change
DiT linears only, never the text encoder's output.

Key layouts (``lora_A``/``lora_B`` or ``lora_down``/``lora_up``, optional ``alpha`` tensors):
PEFT (``base_model.model.blocks.0.self_attn.q.lora_A.weight``, alpha from the
``adapter_config.json`` beside the file, ``lora_alpha``), diffusers (``transformer.blocks.0.
attn1.to_q.lora_A.weight``: module names mapped through the DiT's diffusers key map) and
kohya-style ``.lora.down.weight``/``.lora.up.weight``/``.alpha``. No alpha anywhere: alpha = r.
An adapter's ``version`` is the content digest of its file (``models.checkpoint.digest``).
"""

from __future__ import annotations

import json
import re
import threading
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from safetensors import safe_open
from torch import nn

from models.checkpoint.digest import checkpoint_digest

__all__ = ["AdaptedOp", "AdapterError", "LoRAAdapter", "LoRAAdapters"]

_WRAPPERS = ("base_model.model.", "transformer.", "diffusion_model.", "model.", "dit.")
_KEY = re.compile(
    r"^(?P<module>.+?)\.(?:(?P<a>lora_A|lora_down|lora\.down)|(?P<b>lora_B|lora_up|lora\.up))"
    r"(?:\.default)?\.weight$|^(?P<amodule>.+?)\.alpha$"
)


class AdapterError(ValueError):
    """An adapter that does not fit the DiT, or a name nobody registered (names which/why)."""


@dataclass(frozen=True, slots=True)
class LoRAAdapter:
    """One registered adapter: ``layers`` maps a DiT module name to (A [r, in], B [out, r],
    alpha / r), on the model's device and dtype."""

    name: str
    version: str
    layers: dict[str, tuple[torch.Tensor, torch.Tensor, float]]


_active = threading.local()  # the executor thread's adapters during an AdaptedOp call


class AdaptedOp:
    """``op`` with ``adapters`` (``[(LoRAAdapter, strength)]``) active while it runs."""

    def __init__(self, op: Any, adapters: Sequence[tuple[LoRAAdapter, float]], dit: Any) -> None:
        self.op = op
        self.adapters = tuple(adapters)
        self.name = op.name
        self.batchable = op.batchable
        self.spmd = op.spmd  # a leader-only op stays leader-only with adapters
        self._dit = dit

    def __call__(self, args: Sequence[Any], *, deterministic: bool = False) -> list[Any]:
        graphs, self._dit.chunk_graphs = self._dit.chunk_graphs, None  # they hold the base
        with _activate(self.adapters):
            try:
                return self.op(args, deterministic=deterministic)
            finally:
                self._dit.chunk_graphs = graphs


@contextmanager
def _activate(adapters: tuple[tuple[LoRAAdapter, float], ...]) -> Iterator[None]:
    previous = getattr(_active, "adapters", ())
    _active.adapters = adapters
    try:
        yield
    finally:
        _active.adapters = previous


class LoRAAdapters:
    """The adapters registered for one model (module docstring)."""

    def __init__(self, dit: nn.Module, *, device: torch.device, dtype: torch.dtype) -> None:
        self._dit = dit
        self._device, self._dtype = device, dtype
        self.adapters: dict[str, LoRAAdapter] = {}
        self._bound: dict[tuple[int, tuple[tuple[str, float], ...]], AdaptedOp] = {}
        self._hooked: set[str] = set()
        self._diffusers = _diffusers_names(dit)

    def register(self, name: str, path: str | Path) -> LoRAAdapter:
        """Read, map and check ``path`` (a safetensors file); ``AdapterError`` on any problem,
        leaving the registered set as it was."""
        if not re.fullmatch(r"[A-Za-z0-9_.-]{1,64}", name):
            raise AdapterError(f"adapter name {name!r}: 1-64 of [A-Za-z0-9_.-]")
        path = Path(path)
        if not path.is_file():
            raise AdapterError(f"adapter {name!r}: {path} is not a file")
        with safe_open(str(path), framework="pt") as f:
            tensors = {k: f.get_tensor(k) for k in f.keys()}  # noqa: SIM118 - no iter
        alpha = _config_alpha(path.parent / "adapter_config.json")
        layers = self._layers(name, tensors, alpha)
        adapter = LoRAAdapter(name, checkpoint_digest(path.parent, [path.name]), layers)
        for module_name in layers:
            self._hook(module_name)
        self.adapters[name] = adapter
        return adapter

    def register_specs(self, specs: Sequence[str]) -> None:
        """``register`` each ``"NAME=PATH"`` of ``specs`` (``dreamrt serve --adapter``)."""
        for spec in specs:
            name, sep, path = spec.partition("=")
            if not sep:
                raise AdapterError(f"adapter {spec!r}: expected NAME=PATH")
            self.register(name, path)

    def check(self, requested: Sequence[tuple[str, float]]) -> None:
        """``AdapterError`` unless every name is registered and each strength is finite."""
        unknown = [n for n, _ in requested if n not in self.adapters]
        if unknown:
            raise AdapterError(
                f"adapters {unknown} are not registered here; registered: {sorted(self.adapters)}"
            )
        if len({n for n, _ in requested}) != len(requested):
            raise AdapterError(f"adapters {[n for n, _ in requested]} name one twice")
        bad = [s for _, s in requested if not -10.0 <= float(s) <= 10.0]
        if bad:
            raise AdapterError(f"adapter strengths {bad} are outside [-10, 10]")

    def bind(self, op: Any, requested: Sequence[tuple[str, float]]) -> Any:
        """``op`` with ``requested`` active (one ``AdaptedOp`` per (op, adapter set), so a set's
        steps may batch among themselves); ``op`` itself when nothing is requested."""
        if not requested:
            return op
        key = (id(op), tuple((n, float(s)) for n, s in requested))
        bound = self._bound.get(key)
        if bound is None:
            self.check(requested)
            pairs = [(self.adapters[n], float(s)) for n, s in requested]
            bound = self._bound[key] = AdaptedOp(op, pairs, self._dit)
        return bound

    def versions(self, requested: Sequence[tuple[str, float]]) -> list[str]:
        """``name@version:strength`` of each requested adapter (behaviour records)."""
        return [f"{n}@{self.adapters[n].version}:{float(s):g}" for n, s in requested]

    # ---------------------------------------------------------------------------------------

    def _layers(
        self, name: str, tensors: dict[str, torch.Tensor], alpha: float | None
    ) -> dict[str, tuple[torch.Tensor, torch.Tensor, float]]:
        parts: dict[str, dict[str, torch.Tensor]] = {}
        unexpected = []
        for key, tensor in tensors.items():
            short = key
            for wrapper in _WRAPPERS:
                short = short.removeprefix(wrapper)
            match = _KEY.match(short)
            if match is None:
                unexpected.append(key)
                continue
            module = match["module"] or match["amodule"]
            part = "a" if match["a"] else "b" if match["b"] else "alpha"
            parts.setdefault(self._diffusers.get(module, module), {})[part] = tensor
        modules = dict(self._dit.named_modules())
        wrong = [m for m in parts if not isinstance(modules.get(m), nn.Linear)]
        if unexpected or wrong or not parts:
            raise AdapterError(
                f"adapter {name!r}: keys not LoRA {unexpected[:4]}, not a DiT linear "
                f"{wrong[:4]}{'' if parts else ', no LoRA tensor at all'}"
            )
        layers = {}
        for module, p in parts.items():
            a, b, linear = p.get("a"), p.get("b"), modules[module]
            if a is None or b is None:
                raise AdapterError(f"adapter {name!r}: {module} lacks its A or B matrix")
            rank = a.shape[0]
            if tuple(a.shape) != (rank, linear.in_features) or tuple(b.shape) != (
                linear.out_features,
                rank,
            ):
                raise AdapterError(
                    f"adapter {name!r}: {module} A {tuple(a.shape)} / B {tuple(b.shape)} do not "
                    f"fit a {linear.in_features} -> {linear.out_features} linear"
                )
            scale = float(p["alpha"]) if "alpha" in p else alpha if alpha is not None else rank
            layers[module] = (
                a.to(self._device, self._dtype).contiguous(),
                b.to(self._device, self._dtype).contiguous(),
                scale / rank,
            )
        return layers

    def _hook(self, module_name: str) -> None:
        if module_name in self._hooked:
            return
        module = dict(self._dit.named_modules())[module_name]
        module.register_forward_hook(_lora_hook(module_name))
        self._hooked.add(module_name)


def _lora_hook(module_name: str) -> Callable[[nn.Module, tuple[Any, ...], torch.Tensor], Any]:
    def hook(module: nn.Module, args: tuple[Any, ...], output: torch.Tensor) -> torch.Tensor:
        adapters = getattr(_active, "adapters", ())
        if not adapters:
            return output
        x = args[0]  # [..., in]
        for adapter, strength in adapters:
            layer = adapter.layers.get(module_name)
            if layer is not None:
                a, b, scale = layer
                output = output + (x.to(a.dtype) @ a.T @ b.T).to(output.dtype) * (strength * scale)
        return output  # [..., out]

    return hook


def _config_alpha(path: Path) -> float | None:
    if not path.is_file():
        return None
    value = json.loads(path.read_text()).get("lora_alpha")
    return None if value is None else float(value)


def _diffusers_names(dit: nn.Module) -> dict[str, str]:
    """Diffusers module names of the DiT's linears -> ours (``blocks.0.attn1.to_q`` ->
    ``blocks.0.self_attn.q``), through the DiT's checkpoint key map."""
    from models.wan.dit import keymaps

    out = {}
    for name, module in dit.named_modules():
        if isinstance(module, nn.Linear):
            theirs = keymaps.from_native(f"{name}.weight", keymaps.DIFFUSERS)
            if theirs is not None:
                out[theirs.removesuffix(".weight")] = name
    return out
