"""Loop-state snapshots: bytes that let a loop resume at a step boundary, here or elsewhere.

``write_snapshot`` streams the state into a file: its structure in msgspec msgpack, each tensor
replaced by a msgpack extension reference, then the tensors' raw bytes (dtype and bits kept
exactly), copied to the host a piece at a time (a Wan session's K/V cache is ~3.5 GB: it never
exists as one bytes object, and the event loop is not held while it moves);
``snapshot_state`` does the same into bytes. Fields annotated
``torch.Tensor``, ``torch.Tensor | None``, ``dict[str, torch.Tensor]``, ``list[torch.Tensor]``
and tensors inside ``Any``-typed plain data all round-trip. The same tensor object referenced
twice is stored once and restored as one object; distinct tensors that share storage are
restored as independent tensors. Anything else that is not plain data (generators, modules,
callables) is a ``SnapshotError``.

The envelope records the state type's ``module.QualName``; ``restore_state`` refuses a
different type. torch and safetensors are imported lazily.
"""

from __future__ import annotations

import io
import math
import sys
import warnings
from collections.abc import Iterator
from typing import TYPE_CHECKING, BinaryIO, TypeAlias, TypeVar

import msgspec

from runtime.loop_protocol import LoopState

if TYPE_CHECKING:
    import torch

__all__ = [
    "Device",
    "SnapshotError",
    "clone_state",
    "resolve_state_type",
    "restore_state",
    "snapshot_nbytes",
    "snapshot_state",
    "snapshot_type_name",
    "write_snapshot",
]

S = TypeVar("S", bound=LoopState)
# where restored tensors land: a torch.device, a name such as "cuda:0", or None for the CPU
Device: TypeAlias = "torch.device | str | None"

_TENSOR_EXT = 1
_SNAPSHOT_FORMAT = "dreamrt.loopstate"
_SNAPSHOT_VERSION = 2  # 1: one msgpack envelope with a safetensors blob (read, not written)
_MAGIC = b"DRTSNAP2"
_ALIGN = 64
PIECE_BYTES = 64 << 20  # host bytes per copy-and-write piece


class SnapshotError(ValueError):
    """A snapshot cannot be made (unserializable field) or restored (corrupt, wrong type)."""


class _Envelope(msgspec.Struct, frozen=True):  # version 1
    format: str
    version: int
    state_type: str
    structure: bytes
    tensors: bytes


class _TensorEntry(msgspec.Struct, frozen=True, array_like=True):
    dtype: str  # a torch dtype's name: "bfloat16"
    shape: list[int]
    offset: int  # from the start of the tensor bytes


class _Header(msgspec.Struct, frozen=True):  # version 2
    format: str
    version: int
    state_type: str
    structure: bytes
    tensors: list[_TensorEntry]


def _type_name(tp: type) -> str:
    return f"{tp.__module__}.{tp.__qualname__}"


def _encode_structure(state: LoopState) -> tuple[bytes, list[torch.Tensor]]:
    """The state's msgpack structure with each tensor replaced by a reference, and the
    tensors in reference order (one object referenced twice is listed once)."""
    import torch

    tensors: list[torch.Tensor] = []
    index_of: dict[int, int] = {}

    def enc_hook(obj: object) -> object:
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


def snapshot_nbytes(state: LoopState) -> int:
    """Bytes the tensors of ``state`` take in a snapshot (what a snapshot of it writes, but for
    its small structure and padding)."""
    _, tensors = _encode_structure(state)
    return sum(t.numel() * t.element_size() for t in tensors)


def snapshot_state(state: LoopState) -> bytes:
    """Serialize a loop state to bytes (``write_snapshot`` into memory: small states, tests)."""
    buffer = io.BytesIO()
    write_snapshot(state, buffer)
    return buffer.getvalue()


def write_snapshot(state: LoopState, fh: BinaryIO) -> int:
    """Stream a snapshot of ``state`` into ``fh`` -> bytes written.

    Layout: ``MAGIC``, the header's length (8 bytes, little-endian), the msgpack header
    (structure + one ``(dtype, shape, offset)`` entry per tensor), then each tensor's
    raw bytes at its offset from the first 64-byte boundary after the header. Tensors are
    copied to the host a piece at a time (on a side stream through one pinned buffer for CUDA
    tensors) and written from that buffer, so a state of many GiB never exists as one bytes
    object, the GIL is free while bytes move (copies and file writes release it), and the
    compute stream never waits for the copy."""
    structure, tensors = _encode_structure(state)
    entries, offset = [], 0
    for t in tensors:
        nbytes = t.numel() * t.element_size()
        entries.append(_TensorEntry(str(t.dtype).removeprefix("torch."), list(t.shape), offset))
        offset = _aligned(offset + nbytes)
    header = msgspec.msgpack.encode(
        _Header(
            format=_SNAPSHOT_FORMAT,
            version=_SNAPSHOT_VERSION,
            state_type=_type_name(type(state)),
            structure=structure,
            tensors=entries,
        )
    )
    fh.write(_MAGIC + len(header).to_bytes(8, "little") + header)
    written = len(_MAGIC) + 8 + len(header)
    base = _aligned(written)
    copier = _HostCopier(tensors)
    for t, entry in zip(tensors, entries, strict=True):
        fh.write(bytes(base + entry.offset - written))  # padding up to the tensor's offset
        written = base + entry.offset
        for piece in copier.pieces(t):
            fh.write(piece)
            written += len(piece)
    return written


class _HostCopier:
    """Host bytes of tensors, ``PIECE_BYTES`` at a time. CUDA tensors go through one pinned
    staging buffer on a side stream, after the device has finished the work queued so far
    (the clone this snapshot is of, and any op still writing state tensors on a second
    stream, such as the overlapped decode); the compute stream never waits for the copy."""

    def __init__(self, tensors: list[torch.Tensor]) -> None:
        import torch

        # (side stream, pinned staging buffer) when there are CUDA tensors
        self._staging: tuple[torch.cuda.Stream, torch.Tensor] | None = None
        cuda = [t for t in tensors if t.is_cuda]
        if cuda:
            device = cuda[0].device
            largest = max(t.numel() * t.element_size() for t in cuda)
            torch.cuda.synchronize(device)  # on this writer thread: no other thread waits
            size = min(PIECE_BYTES, largest)
            self._staging = (
                torch.cuda.Stream(device),
                torch.empty(size, dtype=torch.uint8, pin_memory=True),
            )

    def pieces(self, t: torch.Tensor) -> Iterator[memoryview]:
        import torch

        flat = t.detach().contiguous().reshape(-1).view(torch.uint8)
        staging = self._staging
        if not t.is_cuda or staging is None or t.device != staging[0].device:  # (another GPU)
            for start in range(0, flat.numel(), PIECE_BYTES):
                yield flat[start : start + PIECE_BYTES].cpu().numpy().data
            return
        stream, buffer = staging
        with torch.cuda.stream(stream):
            for start in range(0, flat.numel(), PIECE_BYTES):
                piece = flat[start : start + PIECE_BYTES]
                stage = buffer[: piece.numel()]
                stage.copy_(piece, non_blocking=True)
                stream.synchronize()
                yield stage.numpy().data


def _aligned(n: int) -> int:
    return -(-n // _ALIGN) * _ALIGN


def clone_state(state: S) -> S:
    """A copy of ``state`` whose tensors are clones on their own device (no host copy, no
    sync): taken at a step boundary it stays what the state was there while the loop goes on,
    so ``snapshot_state`` of it can run in a worker thread."""
    structure, tensors = _encode_structure(state)
    clones = [t.detach().clone() for t in tensors]

    def ext_hook(code: int, data: memoryview) -> torch.Tensor:
        return clones[int.from_bytes(data, "little")]

    def dec_hook(tp: type, obj: object) -> object:
        return obj

    decoder = msgspec.msgpack.Decoder(type(state), dec_hook=dec_hook, ext_hook=ext_hook)
    return decoder.decode(structure)


def snapshot_type_name(blob: bytes) -> str:
    """The ``module.QualName`` of the state type recorded in a snapshot."""
    return _decode_header(blob)[0].state_type


def restore_state(blob: bytes, state_type: type[S], *, device: Device = None) -> S:
    """Rebuild a state from snapshot bytes (``write_snapshot``'s layout, or version 1's
    safetensors envelope); tensors land on ``device`` (default CPU)."""
    import torch

    header, base = _decode_header(blob)
    if header.state_type != _type_name(state_type):
        raise SnapshotError(
            f"snapshot holds a {header.state_type}, asked to restore a {_type_name(state_type)}"
        )
    if isinstance(header, _Envelope):
        loaded = [t if device is None else t.to(device) for t in _v1_tensors(header)]
    else:
        loaded = _tensors(blob, header.tensors, base, device)

    def ext_hook(code: int, data: memoryview) -> torch.Tensor:
        index = int.from_bytes(data, "little")
        if code != _TENSOR_EXT or index >= len(loaded):
            raise SnapshotError(f"snapshot references unknown tensor {index} (ext code {code})")
        return loaded[index]

    def dec_hook(tp: type, obj: object) -> torch.Tensor:
        if tp is torch.Tensor and isinstance(obj, torch.Tensor):
            return obj
        raise NotImplementedError(f"cannot restore a {tp!r} from {type(obj).__qualname__}")

    decoder = msgspec.msgpack.Decoder(state_type, dec_hook=dec_hook, ext_hook=ext_hook)
    try:
        return decoder.decode(header.structure)
    except (msgspec.DecodeError, NotImplementedError) as exc:
        raise SnapshotError(f"cannot restore {_type_name(state_type)}: {exc}") from exc


def _tensors(
    blob: bytes, entries: list[_TensorEntry], base: int, device: Device
) -> list[torch.Tensor]:
    """The tensors of a version-2 snapshot, each owning its memory on ``device`` (CPU: None)."""
    import torch

    on_host = device is None or torch.device(device).type == "cpu"

    view = memoryview(blob)
    out = []
    for entry in entries:
        dtype = getattr(torch, entry.dtype, None)
        if not isinstance(dtype, torch.dtype):
            raise SnapshotError(f"snapshot tensor of unknown dtype {entry.dtype!r}")
        count = math.prod(entry.shape)
        nbytes = count * dtype.itemsize
        start = base + entry.offset
        if start + nbytes > len(view):
            raise SnapshotError("snapshot tensors are corrupt: the file is truncated")
        if count == 0:
            out.append(torch.empty(entry.shape, dtype=dtype, device=device))
            continue
        with warnings.catch_warnings():  # a read-only buffer: the copy below owns its bytes
            warnings.simplefilter("ignore", UserWarning)
            raw = torch.frombuffer(view[start : start + nbytes], dtype=torch.uint8)
        tensor = raw.view(dtype).reshape(entry.shape)
        out.append(tensor.clone() if on_host else tensor.to(device))
    return out


def _v1_tensors(envelope: _Envelope) -> list[torch.Tensor]:
    import safetensors.torch

    try:
        loaded = safetensors.torch.load(envelope.tensors)
    except Exception as exc:  # safetensors raises its own SafetensorError
        raise SnapshotError(f"snapshot tensors are corrupt: {exc}") from exc
    return [loaded[f"t{i}"] for i in range(len(loaded))]


def _decode_header(blob: bytes) -> tuple[_Envelope | _Header, int]:
    """(header, offset of the tensor bytes) of a snapshot; 0 for version 1, whose tensors are
    inside its envelope."""
    if bytes(blob[: len(_MAGIC)]) != _MAGIC:
        try:
            envelope = msgspec.msgpack.decode(blob, type=_Envelope)
        except msgspec.DecodeError as exc:
            raise SnapshotError(f"not a loop-state snapshot: {exc}") from exc
        _check_format(envelope.format, envelope.version, 1)
        return envelope, 0
    length = int.from_bytes(blob[len(_MAGIC) : len(_MAGIC) + 8], "little")
    start = len(_MAGIC) + 8
    try:
        header = msgspec.msgpack.decode(blob[start : start + length], type=_Header)
    except msgspec.DecodeError as exc:
        raise SnapshotError(f"snapshot header is corrupt: {exc}") from exc
    _check_format(header.format, header.version, _SNAPSHOT_VERSION)
    return header, _aligned(start + length)


def _check_format(fmt: str, version: int, expected: int) -> None:
    if fmt != _SNAPSHOT_FORMAT or version != expected:
        raise SnapshotError(
            f"snapshot format {fmt!r} v{version}, expected {_SNAPSHOT_FORMAT!r} v{expected}"
        )


def resolve_state_type(
    loop: object, blob: bytes, explicit: type[LoopState] | None = None
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
        obj: object = module
        for attr in parts[cut:]:
            obj = getattr(obj, attr, None)
        if isinstance(obj, type) and issubclass(obj, LoopState):
            return obj
    raise SnapshotError(
        f"cannot resolve snapshot state type {name!r}: pass state_type= or set loop.state_type"
    )
