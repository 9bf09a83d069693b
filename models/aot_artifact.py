"""One graph compiled ahead of time: the call signature it serves, its compile and its file.

``signature`` names what one compiled graph serves: the tensors' shapes, dtypes, devices and
inner strides with the dynamic dimensions left out, the structure of the other arguments and
the grad and inference modes - a string that is the same in every process. ``compile_artifact``
compiles an unbound ``forward`` (the module its first argument) for one call with
``torch.compile(fullgraph=True).aot_compile``, the dynamic dimensions marked first;
``save_artifact`` / ``load_artifact`` keep it on disk beside its signature. A
``models.precompiled.Region`` keeps one artifact per signature in this process, and a
``models.compile_pool`` worker makes them in another.
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import json
import logging
import os
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Protocol

import torch

if TYPE_CHECKING:
    from torch._dynamo.types import GuardFilterEntry

__all__ = [
    "Artifact",
    "DynamicRule",
    "aot_supported",
    "check_guards_once",
    "compile_artifact",
    "first_line",
    "load_artifact",
    "quick_key",
    "save_artifact",
    "signature",
]

log = logging.getLogger(__name__)

# (tensor, dimension) pairs of a call's arguments that one compiled graph keeps symbolic
DynamicRule = Callable[[tuple[object, ...]], Sequence[tuple[torch.Tensor, int]]]


class Artifact(Protocol):
    """One compiled graph with its guards (torch's ``AOTCompiledFunction``)."""

    def __call__(self, *args: object) -> object: ...

    def save_compiled_function(self, path: str) -> object: ...


def aot_supported() -> bool:
    """Whether this torch compiles ahead of time (``torch.compile(...).aot_compile``)."""
    with _aot_enabled():
        return hasattr(torch.compile(lambda: None), "aot_compile")


def _aot_enabled() -> contextlib.AbstractContextManager[object]:
    """Dynamo's switch for ``aot_compile`` on (torch 2.10-2.12 keep it behind
    ``torch._dynamo.config.enable_aot_compile``; later torch has no switch)."""
    import torch._dynamo.config as dynamo_config

    if hasattr(dynamo_config, "enable_aot_compile"):
        return dynamo_config.patch(enable_aot_compile=True)
    return contextlib.nullcontext()


def load_artifact(path: Path) -> Artifact:
    """An artifact ``save_compiled_function`` wrote (``torch.compiler.load_compiled_function``,
    or the class method it wraps where torch does not export it)."""
    load = getattr(torch.compiler, "load_compiled_function", None)
    with path.open("rb") as file:
        if load is not None:
            return load(file)
        from torch._dynamo.aot_compile import AOTCompiledFunction

        return AOTCompiledFunction.deserialize(file.read(), None, None)


def quick_key(args: tuple[object, ...], dynamic: Sequence[tuple[torch.Tensor, int]]) -> tuple:
    """The call signature as a hashable tuple: the per-call lookup (``signature`` encodes it,
    once per new signature)."""
    dims: dict[int, list[int]] = {}
    for tensor, dim in dynamic:
        dims.setdefault(id(tensor), []).append(dim)
    return (
        tuple(_quick(a, dims) for a in args),
        torch.is_grad_enabled(),
        torch.is_inference_mode_enabled(),
    )


def _quick(value: object, dims: dict[int, list[int]]) -> object:
    if isinstance(value, torch.Tensor):
        marked = dims.get(id(value))
        shape: tuple[object, ...] = value.shape
        strides: tuple[object, ...] = value.stride()
        if marked:
            inner = max(marked)
            shape = tuple(None if i in marked else n for i, n in enumerate(value.shape))
            strides = tuple(None if i <= inner else n for i, n in enumerate(strides))
        return (shape, strides, value.dtype, value.device.type, value.requires_grad)
    if value is None or isinstance(value, (bool, int, float, str)):
        return (type(value), value)
    if isinstance(value, (tuple, list)):
        return (type(value), *(_quick(v, dims) for v in value))
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        fields = dataclasses.fields(value)
        return (type(value), *(_quick(getattr(value, f.name), dims) for f in fields))
    if hasattr(value, "__struct_fields__"):  # a msgspec.Struct
        names = value.__struct_fields__
        return (type(value), *(_quick(getattr(value, n), dims) for n in names))
    return (type(value),)


def signature(args: tuple[object, ...], dynamic: Sequence[tuple[torch.Tensor, int]] = ()) -> str:
    """The call signature of ``args`` (the module docstring) as a stable string: the same in every
    process for calls that one compiled graph serves (``quick_key``, encoded)."""
    return json.dumps(_plain(quick_key(args, dynamic)))


def _plain(value: object) -> object:
    """``quick_key``'s parts as JSON data: classes and dtypes by name, ``None`` for a dynamic
    size (and a ``None`` argument), tuples as lists."""
    if isinstance(value, tuple):
        return [_plain(v) for v in value]
    if isinstance(value, type):
        return value.__qualname__
    if isinstance(value, torch.dtype):
        return str(value)
    return value


def compile_artifact(
    name: str,
    forward: Callable[..., object],
    full: tuple[object, ...],
    marks: Sequence[tuple[torch.Tensor, int]],
) -> tuple[str, Artifact]:
    """``forward`` compiled ahead of time for the call ``full`` (the module first), ``marks``
    symbolic -> (the call's signature, the artifact). If the code specialises a marked dimension
    (a constraint violation) the call compiles static and the signature is the static one.
    Raises on a graph break or a torch without ``aot_compile``. A region's compile, and a
    ``models.compile_pool`` worker's."""
    try:
        return signature(full[1:], marks), _aot_compile(forward, full, marks)
    except Exception as exc:
        if not (marks and type(exc).__name__ == "ConstraintViolationError"):
            raise
        log.warning("%s: dynamic dimensions dropped (%s)", name, first_line(exc))
        return signature(full[1:]), _aot_compile(forward, full, ())


def _aot_compile(
    forward: Callable[..., object],
    full: tuple[object, ...],
    marks: Sequence[tuple[torch.Tensor, int]],
) -> Artifact:
    for tensor, dim in marks:
        torch._dynamo.mark_dynamic(tensor, dim)
    try:
        with _aot_enabled():
            compiler = torch.compile(
                forward, fullgraph=True, options={"guard_filter_fn": _serializable_guards}
            )
            aot_compile: Callable[..., Artifact] = getattr(compiler, "aot_compile")  # noqa: B009 - not in torch's stubs
            return aot_compile((full, {}))
    finally:
        for tensor, _ in marks:
            _unmark(tensor)


def save_artifact(store: Path, key: str, fn: Artifact, nth: int = 0) -> Path | None:
    """Write ``fn`` and its signature ``key`` to ``store`` as ``<hash>-<nth>.aot`` and
    ``.json``, each file whole or not at all (servers that share a volume may write the same
    signature: the names are the signature's hash and the artifact's place among its
    signature's, and the last whole write wins) -> the artifact's path (None: not saved)."""
    name = hashlib.sha256(key.encode()).hexdigest()[:16]
    path = store / f"{name}-{nth}.aot"
    partial = path.with_suffix(f".aot.{os.getpid()}.tmp")
    try:
        fn.save_compiled_function(str(partial))
        os.replace(partial, path)
    except Exception as exc:  # noqa: BLE001 - serving goes on; the next start compiles it
        log.warning("%s: could not save a compiled graph (%s); not cached", store.name, exc)
        partial.unlink(missing_ok=True)
        return None
    meta = path.with_suffix(f".json.{os.getpid()}.tmp")
    meta.write_text(json.dumps({"signature": key, "bytes": path.stat().st_size}) + "\n")
    os.replace(meta, path.with_suffix(".json"))
    return path


def first_line(exc: BaseException) -> str:
    text = str(exc)
    return text.splitlines()[0] if text else ""


def check_guards_once(fn: Artifact) -> None:
    """Calls of an artifact skip its guards: ``Region._resolve`` checked them once for the
    call's signature (the signature holds what they would check per call)."""
    disable = getattr(fn, "disable_guard_check", None)
    if disable is not None:
        disable()


def _serializable_guards(entries: Sequence[GuardFilterEntry]) -> list[bool]:
    """The guards an artifact keeps: those torch can save (as ``aot_compile``'s own filter:
    no globals, no object identities), less the per-tensor checks (``TENSOR_MATCH``), which the
    region's ``signature`` makes already (shape, strides, dtype, device, grad) but for the
    dispatch keys: whether a tensor was made under inference mode changes nothing compiled, and
    checking it would split one signature's calls between artifacts. (Every module of a region
    has the same parameter shapes: its parameters' checks go with them.)"""
    from torch._dynamo.guards import CheckFunctionManager

    unsupported = getattr(CheckFunctionManager, "UNSUPPORTED_SERIALIZATION_GUARD_TYPES", ())
    return [
        not (e.is_global or e.guard_type in unsupported or e.guard_type == "TENSOR_MATCH")
        for e in entries
    ]


_MARKINGS = (
    "_dynamo_dynamic_indices",
    "_dynamo_dynamic_range",
    "_dynamo_hint_overrides",
    "_specialize_on",
    "_has_dynamo_dim_marking",
)


def _unmark(tensor: torch.Tensor) -> None:
    """Undo ``mark_dynamic`` on a live tensor (it may be a session's buffer, seen again: a
    marking left on it would fail the guards of an artifact compiled without it)."""
    for attr in _MARKINGS:
        if attr in tensor.__dict__:
            delattr(tensor, attr)
