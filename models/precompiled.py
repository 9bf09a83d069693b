"""Precompiled regions: a module's forward compiled ahead of time once per call signature, kept
on disk, loaded at the next start without tracing anything.

``module.compile()`` (Dynamo's just-in-time path) traces a frame on its first call, compiles
it, and on every later start traces it again before it can look the compiled code up in
Inductor's cache: on the H200, 44.5 s of a 95.7-s start from the cache was that tracing, and
Dynamo's automatic dynamic shapes compiled each K/V-prefix graph twice (static at the first
length, then symbolic). A ``Region`` instead:

- compiles one *function* - an unbound ``forward`` that takes the module as its first argument
  - with ``torch.compile(fullgraph=True).aot_compile`` (torch >= 2.10), so one artifact serves
  every module of the region (all DiT blocks: they share code and parameter shapes, and their
  weights are inputs of the graph, not constants);
- marks the dimensions its ``dynamic`` rule names symbolic *before* the first compile (the
  DiT's K/V past length), so one graph covers every prefix length;
- keeps one artifact per call signature (``signature``: the tensors' shapes, dtypes, devices and
  inner strides with the dynamic dimensions left out, the structure of the other arguments and
  the grad mode), verified by the artifact's own guards on the first call of each signature;
- saves each artifact (``save_compiled_function``: the guards, the transformed bytecode and
  Inductor's compiled code) to ``store/<region>/<hash>-<n>.aot`` with the signature beside it, and
  loads them at the next start: a start from the cache traces nothing; Inductor's kernels come
  from its own cache in the same directory (``server.ops.compile_cache``).

After ``seal`` a signature with no artifact runs the module eagerly (same result), logged once
and counted by the ``CompileGuard`` (``dreamrt_compiles_after_ready_total{kind="outside_set"}``).
After ``defer`` a region hands each new signature's call to a compile pool
(``models.compile_pool``: worker processes) and runs it eagerly, until ``collect`` loads what
the pool saved.

Where torch has no ``aot_compile``, or a region's forward does not trace whole (a graph break),
the region falls back to ``module.compile()`` for its modules - the old path, counted in
``fallbacks`` (``dreamrt compile`` exits non-zero on one).
"""

from __future__ import annotations

import copy
import dataclasses
import json
import logging
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Protocol, TypedDict

import torch
from torch import nn

from models.aot_artifact import (
    Artifact,
    DynamicRule,
    aot_supported,
    check_guards_once,
    compile_artifact,
    first_line,
    load_artifact,
    quick_key,
    save_artifact,
    signature,
)
from models.compile_guard import CompileGuard

__all__ = [
    "Artifact",
    "CompilePool",
    "PoolResult",
    "Region",
    "RegionReport",
    "RegionStats",
    "aot_supported",
    "signature",
]

log = logging.getLogger(__name__)


class CompilePool(Protocol):
    """Where a deferring region hands its new calls (``models.compile_pool.CompilePool``)."""

    def submit(
        self,
        region: str,
        forward: Callable[..., object],
        full: tuple[object, ...],
        dynamic: DynamicRule | None,
        store: Path,
    ) -> None: ...


class PoolResult(Protocol):
    """One call a pool compiled (``models.compile_pool.PoolResult``): ``signature`` None if
    it failed, ``error`` why."""

    @property
    def region(self) -> str: ...

    @property
    def signature(self) -> str | None: ...

    @property
    def seconds(self) -> float: ...

    @property
    def error(self) -> str: ...


class RegionReport(TypedDict):
    """``Region.report``: what a region did in this process."""

    signatures: int
    compiled: int
    loaded: int
    compile_s: float
    load_s: float
    eager: int
    fallbacks: list[str]


@dataclasses.dataclass
class RegionStats:
    """What a region did in this process."""

    compiled: int = 0  # artifacts compiled here
    loaded: int = 0  # artifacts loaded from the store
    compile_s: float = 0.0  # seconds compiling them (tracing + Inductor)
    load_s: float = 0.0  # seconds loading them
    eager: int = 0  # calls run eagerly after the seal (no artifact for their signature)
    fallbacks: list[str] = dataclasses.field(default_factory=list)  # why JIT was used instead


class Region:
    """One precompiled region: ``forward`` (unbound, module first) for ``modules`` (module
    docstring). ``name`` names it in logs, the guard's counts and the store."""

    def __init__(
        self,
        name: str,
        forward: Callable[..., object],
        modules: Sequence[nn.Module],
        guard: CompileGuard,
        *,
        dynamic: DynamicRule | None = None,
        adapt: Callable[[tuple[object, ...]], tuple[object, ...]] | None = None,
    ) -> None:
        self.name = name
        self._forward = forward
        self._modules = list(modules)
        self._guard = guard
        self._dynamic = dynamic
        self._adapt = adapt
        self._entries: dict[str, list[Artifact]] = {}  # signature -> artifacts
        # ``quick_key`` of a call -> the artifact its calls use (the signature, unencoded)
        self._fast: dict[tuple[object, ...], Artifact] = {}
        self._store: Path | None = None
        self._lock = threading.RLock()
        self._jit = False
        self._pool: CompilePool | None = None  # ``defer``: new signatures go to worker processes
        self._deferred: set[str] = set()  # signatures handed to the pool
        self._paths: set[Path] = set()  # artifacts loaded from the store
        self.stats = RegionStats()
        for module in self._modules:
            eager = module._call_impl
            module._compiled_call_impl = self._caller(module, eager)

    # ---------------------------------------------------------------------------------------
    # the store

    def use_store(self, directory: Path) -> int:
        """Save new artifacts to ``directory/<name>/`` and load those already there -> how
        many were loaded. An artifact that does not load (another torch, a damaged file) is
        logged and skipped: its signature compiles again."""
        store = directory / self.name.replace("/", "_")
        store.mkdir(parents=True, exist_ok=True)
        with self._lock:
            self._store = store
            loaded = self._load_new()
            self.stats.loaded += loaded
        return loaded

    def _load_new(self) -> int:
        """Load the store's artifacts not loaded yet -> how many."""
        if self._jit or self._store is None:
            return 0
        loaded = 0
        for meta_path in sorted(self._store.glob("*.json")):
            if meta_path in self._paths:
                continue
            path = meta_path.with_suffix(".aot")
            began = time.perf_counter()
            try:
                key = json.loads(meta_path.read_text())["signature"]
                fn = load_artifact(path)
            except Exception as exc:  # noqa: BLE001 - any failure means: compile it again
                log.warning("%s: %s does not load (%s); it compiles again", self.name, path, exc)
                continue
            check_guards_once(fn)
            self.stats.load_s += time.perf_counter() - began
            self._entries.setdefault(key, []).append(fn)
            self._paths.add(meta_path)
            loaded += 1
        return loaded

    def defer(self, pool: CompilePool | None) -> None:
        """Hand each new signature's call to ``pool`` and run it eagerly meanwhile (None:
        compile in this process again); ``collect`` takes what the pool made."""
        with self._lock:
            self._pool = pool if self._store is not None and not self._jit else None

    def collect(self, results: Sequence[PoolResult]) -> int:
        """Load what the pool saved for this region (``results``: the pool's, every region's)
        and stop deferring -> artifacts loaded. A call the pool failed compiles here at its
        next call, as without a pool."""
        with self._lock:
            self._pool = None
            self._deferred.clear()
            self._fast.clear()
            mine = [r for r in results if r.region == self.name]
            for failed in (r for r in mine if r.signature is None):
                log.warning("%s: the compile pool failed a call (%s)", self.name, failed.error)
            loaded = self._load_new()
            self.stats.compiled += loaded
            self.stats.compile_s += sum(r.seconds for r in mine if r.signature is not None)
        return loaded

    def signatures(self) -> int:
        """Signatures with an artifact (compiled here or loaded)."""
        with self._lock:
            return len(self._entries)

    def report(self) -> RegionReport:
        """What the region did in this process (``RegionStats``, with its signatures)."""
        stats = self.stats
        return RegionReport(
            signatures=self.signatures(),
            compiled=stats.compiled,
            loaded=stats.loaded,
            compile_s=stats.compile_s,
            load_s=stats.load_s,
            eager=stats.eager,
            fallbacks=list(stats.fallbacks),
        )

    def reset(self) -> None:
        """Forget which artifact serves which signature (after a lever changed what the
        modules run: their next calls check the artifacts' guards again)."""
        with self._lock:
            self._fast.clear()

    # ---------------------------------------------------------------------------------------
    # calls

    def _caller(self, module: nn.Module, eager: Callable[..., object]) -> Callable[..., object]:
        def call(*args: object, **kwargs: object) -> object:
            if kwargs:  # positional calls only (the model's own); others run eagerly
                return eager(*args, **kwargs)
            full = (module, *args) if self._adapt is None else self._adapt((module, *args))
            marks = () if self._dynamic is None else self._dynamic(full)
            quick = quick_key(full[1:], marks)
            fn = self._fast.get(quick)
            if fn is None:
                fn = self._resolve(signature(full[1:], marks), full, marks)
                if fn is None:
                    return eager(*args)
                self._fast[quick] = fn
            return fn(*full)

        return call

    def _resolve(
        self,
        key: str,
        full: tuple[object, ...],
        marks: Sequence[tuple[torch.Tensor, int]],
    ) -> Artifact | None:
        """The artifact for a new signature: one whose guards accept the call, else a new one
        (unsealed) or None (sealed: the caller runs eagerly)."""
        with self._lock:
            for fn in self._entries.get(key, ()):
                check = getattr(fn, "guard_check", None)
                if check is None or check(*full):
                    return fn
            if self._guard.sealed:
                self.stats.eager += 1
                self._guard.ran_outside(self.name, full[1:])
                return None
            if self._jit:
                return None
            if self._pool is not None and (key in self._deferred or self._submit(key, full)):
                return None  # the pool compiles it; this call runs eagerly
            compiled = self._compile(key, full, marks)
            if compiled is None:
                return None
            key, fn = compiled
            self._entries.setdefault(key, []).append(fn)
            self._save(key, fn)
            return fn

    def _submit(self, key: str, full: tuple[object, ...]) -> bool:
        """Hand ``full`` to the pool -> whether it took it (a call that does not pickle is
        compiled here, and so is every later one of this region)."""
        assert self._pool is not None and self._store is not None
        module = copy.copy(full[0])  # the same parameters, without this region's caller
        module.__dict__["_compiled_call_impl"] = None
        try:
            self._pool.submit(
                self.name, self._forward, (module, *full[1:]), self._dynamic, self._store
            )
        except Exception as exc:  # noqa: BLE001 - pickling: any object a call may carry
            log.warning("%s: compiled here, not by the pool (%s)", self.name, first_line(exc))
            self._pool = None
            return False
        self._deferred.add(key)
        return True

    def _compile(
        self, key: str, full: tuple[object, ...], marks: Sequence[tuple[torch.Tensor, int]]
    ) -> tuple[str, Artifact] | None:
        """A new artifact for ``full`` -> (its signature, it); None after a fall-back."""
        began = time.perf_counter()
        try:
            got, fn = compile_artifact(self.name, self._forward, full, marks)
        except Exception as exc:  # noqa: BLE001 - a graph break, or a torch without aot_compile
            self._fall_back(f"{type(exc).__name__}: {first_line(exc)}")
            return None
        if got != key:  # the rule's dimensions were dropped: static from now on
            self._dynamic = None
        check_guards_once(fn)
        self.stats.compile_s += time.perf_counter() - began
        self.stats.compiled += 1
        return got, fn

    def _save(self, key: str, fn: Artifact) -> None:
        """``save_artifact`` to the store (none: nothing), as the signature's next artifact."""
        if self._store is not None:
            save_artifact(self._store, key, fn, len(self._entries.get(key, ())) - 1)

    def _fall_back(self, reason: str) -> None:
        """Compile the modules just in time from now on (``module.compile()``, guarded)."""
        log.warning(
            "%s: not precompiled (%s); falls back to torch.compile at first call", self.name, reason
        )
        self.stats.fallbacks.append(reason)
        self._jit = True
        for module in self._modules:
            module._compiled_call_impl = None
            module.compile()
            self._guard.wrap(module, self.name)
