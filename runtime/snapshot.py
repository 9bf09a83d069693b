"""Loop-state snapshots: bytes that let a loop resume at a step boundary, here or elsewhere.

``snapshot_state`` encodes the state's structure with msgspec msgpack, each tensor replaced by
a msgpack extension reference, and the tensors themselves as one safetensors blob (moved to
CPU, made contiguous and cloned; dtype and bits are kept exactly). Fields annotated
``torch.Tensor``, ``torch.Tensor | None``, ``dict[str, torch.Tensor]``, ``list[torch.Tensor]``
and tensors inside ``Any``-typed plain data all round-trip. The same tensor object referenced
twice is stored once and restored as one object; distinct tensors that share storage are
restored as independent tensors. Anything else that is not plain data (generators, modules,
callables) is a ``SnapshotError``.

The envelope records the state type's ``module.QualName``; ``restore_state`` refuses a
different type. torch and safetensors are imported lazily.
"""

from __future__ import annotations

import sys
from typing import Any, TypeVar

import msgspec

from runtime.contract import LoopState

__all__ = [
    "SnapshotError",
    "clone_state",
    "resolve_state_type",
    "restore_state",
    "snapshot_state",
    "snapshot_type_name",
]

S = TypeVar("S", bound=LoopState)

_TENSOR_EXT = 1
_SNAPSHOT_FORMAT = "dreamrt.loopstate"
_SNAPSHOT_VERSION = 1


class SnapshotError(ValueError):
    """A snapshot cannot be made (unserializable field) or restored (corrupt, wrong type)."""


class _Envelope(msgspec.Struct, frozen=True):
    format: str
    version: int
    state_type: str
    structure: bytes
    tensors: bytes


def _type_name(tp: type) -> str:
    return f"{tp.__module__}.{tp.__qualname__}"


def _encode_structure(state: LoopState) -> tuple[bytes, list[Any]]:
    """The state's msgpack structure with each tensor replaced by a reference, and the
    tensors in reference order (one object referenced twice is listed once)."""
    import torch

    tensors: list[Any] = []
    index_of: dict[int, int] = {}

    def enc_hook(obj: Any) -> Any:
        if isinstance(obj, torch.Tensor):
            index = index_of.get(id(obj))
            if index is None:
                index = index_of[id(obj)] = len(tensors)
                tensors.append(obj)
            return msgspec.msgpack.Ext(_TENSOR_EXT, index.to_bytes(4, "little"))
        raise NotImplementedError(
            f"{type(obj).__qualname__} in {type(state).__qualname__} is not snapshottable; "
            "LoopState fields hold plain data and torch.Tensor only"
        )

    try:
        return msgspec.msgpack.Encoder(enc_hook=enc_hook).encode(state), tensors
    except (TypeError, NotImplementedError) as exc:
        raise SnapshotError(str(exc)) from exc


def snapshot_state(state: LoopState) -> bytes:
    """Serialize a loop state (msgspec structure + safetensors tensors) to bytes."""
    import safetensors.torch
    import torch

    structure, tensors = _encode_structure(state)
    if any(t.is_cuda for t in tensors):
        torch.cuda.synchronize()  # ops may still write state tensors on a second stream
    named = {f"t{i}": t.detach().to("cpu").contiguous().clone() for i, t in enumerate(tensors)}
    envelope = _Envelope(
        format=_SNAPSHOT_FORMAT,
        version=_SNAPSHOT_VERSION,
        state_type=_type_name(type(state)),
        structure=structure,
        tensors=safetensors.torch.save(named),
    )
    return msgspec.msgpack.encode(envelope)


def clone_state(state: S) -> S:
    """A copy of ``state`` whose tensors are clones on their own device (no host copy, no
    sync): taken at a step boundary it stays what the state was there while the loop goes on,
    so ``snapshot_state`` of it can run in a worker thread."""
    structure, tensors = _encode_structure(state)
    clones = [t.detach().clone() for t in tensors]

    def ext_hook(code: int, data: memoryview) -> Any:
        return clones[int.from_bytes(data, "little")]

    def dec_hook(tp: type, obj: Any) -> Any:
        return obj

    decoder = msgspec.msgpack.Decoder(type(state), dec_hook=dec_hook, ext_hook=ext_hook)
    return decoder.decode(structure)


def snapshot_type_name(blob: bytes) -> str:
    """The ``module.QualName`` of the state type recorded in a snapshot."""
    return _decode_envelope(blob).state_type


def restore_state(blob: bytes, state_type: type[S], *, device: Any = None) -> S:
    """Rebuild a state from ``snapshot_state`` bytes; tensors land on ``device`` (default CPU)."""
    import safetensors.torch
    import torch

    envelope = _decode_envelope(blob)
    if envelope.state_type != _type_name(state_type):
        raise SnapshotError(
            f"snapshot holds a {envelope.state_type}, asked to restore a {_type_name(state_type)}"
        )
    try:
        loaded = safetensors.torch.load(envelope.tensors)
    except Exception as exc:  # safetensors raises its own SafetensorError
        raise SnapshotError(f"snapshot tensors are corrupt: {exc}") from exc
    if device is not None:
        loaded = {name: t.to(device) for name, t in loaded.items()}

    def ext_hook(code: int, data: memoryview) -> Any:
        name = f"t{int.from_bytes(data, 'little')}"
        if code != _TENSOR_EXT or name not in loaded:
            raise SnapshotError(f"snapshot references unknown tensor {name} (ext code {code})")
        return loaded[name]

    def dec_hook(tp: type, obj: Any) -> Any:
        if tp is torch.Tensor and isinstance(obj, torch.Tensor):
            return obj
        raise NotImplementedError(f"cannot restore a {tp!r} from {type(obj).__qualname__}")

    decoder = msgspec.msgpack.Decoder(state_type, dec_hook=dec_hook, ext_hook=ext_hook)
    try:
        return decoder.decode(envelope.structure)
    except (msgspec.DecodeError, NotImplementedError) as exc:
        raise SnapshotError(f"cannot restore {_type_name(state_type)}: {exc}") from exc


def _decode_envelope(blob: bytes) -> _Envelope:
    try:
        envelope = msgspec.msgpack.decode(blob, type=_Envelope)
    except msgspec.DecodeError as exc:
        raise SnapshotError(f"not a loop-state snapshot: {exc}") from exc
    if envelope.format != _SNAPSHOT_FORMAT or envelope.version != _SNAPSHOT_VERSION:
        raise SnapshotError(
            f"snapshot format {envelope.format!r} v{envelope.version}, "
            f"expected {_SNAPSHOT_FORMAT!r} v{_SNAPSHOT_VERSION}"
        )
    return envelope


def resolve_state_type(
    loop: Any, blob: bytes, explicit: type[LoopState] | None = None
) -> type[LoopState]:
    """The state type to restore ``blob`` as: ``explicit``, else ``loop.state_type``, else the
    type recorded in the snapshot if its module is already imported (nothing is imported
    because a snapshot names it)."""
    if explicit is not None:
        return explicit
    declared = getattr(loop, "state_type", None)
    if isinstance(declared, type) and issubclass(declared, LoopState):
        return declared
    name = snapshot_type_name(blob)
    parts = name.split(".")
    for cut in range(len(parts) - 1, 0, -1):
        module = sys.modules.get(".".join(parts[:cut]))
        if module is None:
            continue
        obj: Any = module
        for attr in parts[cut:]:
            obj = getattr(obj, attr, None)
        if isinstance(obj, type) and issubclass(obj, LoopState):
            return obj
    raise SnapshotError(
        f"cannot resolve snapshot state type {name!r}: pass state_type= or set loop.state_type"
    )
