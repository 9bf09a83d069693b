"""What a compiled instance compiles after it is ready: nothing, by construction, and counted.

The warm-up compiles the instance's compiled set (``models.compiled_set``); then the server
*seals* the instance (``WanInstance.seal``):

- a precompiled region (``models.precompiled``) whose artifacts do not fit a call's signature
  runs it eagerly (the module uncompiled, same result) and reports it here (``ran_outside``):
  logged once per module and shapes, counted.
- torch's compiler stance becomes ``fail_on_recompile``: a module compiled just in time (a
  region that fell back to ``module.compile()``) whose cached graphs do not fit a call no longer
  compiles (seconds of Dynamo tracing and Inductor autotuning on the executor thread, felt by
  every session) but raises before it runs. The guard's wrapper (``wrap``) catches that and runs
  the call eagerly, reported the same way. ``eager_on_recompile`` would run eagerly too, but
  silently: the wrapper is what makes a shape outside the set visible.
- ``ChunkGraphs`` captures no new CUDA graph: a call without a captured graph runs eagerly
  (``models.wan.dit.cuda_graphs``).

``after_ready()`` counts, since the seal: Dynamo compiles that still started (a compiled region
outside the wrapped modules), distinct calls that fell outside the set (module + shapes, each
once), and CUDA-graph captures plus distinct calls that found no captured graph. The server
exports them as ``dreamrt_compiles_after_ready_total{kind}``; all zero means serving compiled
nothing and ran nothing outside the set.

A call that misses after a graph break inside the module has run part of its body compiled
before the eager rerun; the blocks' bodies write only their own outputs and K/V slots at the
call's positions, which the rerun writes again with the same values.
"""

from __future__ import annotations

import logging
import threading
import weakref
from collections.abc import Callable, Iterable
from typing import Protocol

import torch

__all__ = ["CompileGuard", "GraphCapture"]

log = logging.getLogger(__name__)

# the message torch raises under the "fail_on_recompile" stance (torch._dynamo.eval_frame)
_RECOMPILE = "Detected recompile when torch.compile stance is 'fail_on_recompile'"

_GUARDS: weakref.WeakSet[CompileGuard] = weakref.WeakSet()
_HOOKED = False
_HOOK_LOCK = threading.Lock()


class GraphCapture(Protocol):
    """What the guard reads and seals of an instance's CUDA graphs (``ChunkGraphs``)."""

    stats: dict[str, int]

    def seal(self) -> None: ...

    def unseal(self) -> None: ...


def _on_dynamo_compile(args: object) -> None:
    for guard in list(_GUARDS):
        guard.dynamo_compile_started()


def _hook_dynamo() -> None:
    """Register (once per process) a Dynamo compile-start callback feeding every live guard."""
    global _HOOKED
    with _HOOK_LOCK:
        if not _HOOKED:
            from torch._dynamo.callback import callback_handler

            callback_handler.register_start_callback(_on_dynamo_compile)
            _HOOKED = True


def _shapes(values: Iterable[object]) -> tuple[object, ...]:
    out: list[object] = []
    for v in values:
        if isinstance(v, torch.Tensor):
            out.append(tuple(v.shape))
        elif isinstance(v, (tuple, list)):
            out.append(_shapes(v))
        elif hasattr(v, "__dataclass_fields__"):
            out.append(_shapes(getattr(v, f) for f in v.__dataclass_fields__))
    return tuple(out)


class CompileGuard:
    """Wraps an instance's compiled modules and counts compiles after the seal (docstring)."""

    def __init__(self) -> None:
        self.sealed = False  # a miss runs eagerly instead of compiling
        self.counting = False  # compiles are counted (from ready on)
        self._lock = threading.Lock()
        self._dynamo = 0
        self._outside: set[tuple] = set()
        self._graphs: GraphCapture | None = None  # the instance's ChunkGraphs, if any
        self._captures_at_seal = 0
        _GUARDS.add(self)

    def wrap(self, module: torch.nn.Module, name: str) -> None:
        """Route ``module``'s compiled calls (after ``module.compile()``) through the guard."""
        compiled: Callable[..., object] | None = module._compiled_call_impl
        if compiled is None:
            raise ValueError(f"module {name!r} is not compiled (call module.compile() first)")
        eager = module._call_impl

        def call(*args: object, **kwargs: object) -> object:
            if not self.sealed:
                return compiled(*args, **kwargs)
            try:
                return compiled(*args, **kwargs)
            except RuntimeError as exc:
                if not str(exc).startswith(_RECOMPILE):
                    raise
            self.ran_outside(name, (*args, *kwargs.values()))
            return eager(*args, **kwargs)

        module._compiled_call_impl = call

    def seal(self, graphs: GraphCapture | None = None, *, enforce: bool = True) -> None:
        """From now on nothing compiles or captures (module docstring); ``graphs``: the
        instance's ``ChunkGraphs`` or None. ``enforce=False`` (nothing was warmed up): count
        what compiles from now on, but let it compile."""
        _hook_dynamo()
        with self._lock:
            self.counting = True
            self._graphs = graphs
            self._captures_at_seal = graphs.stats["captures"] if graphs is not None else 0
        if not enforce:
            return
        torch.compiler.set_stance("fail_on_recompile")
        with self._lock:
            self.sealed = True
        if graphs is not None:
            graphs.seal()

    def unseal(self) -> None:
        """Compile again on demand (the default stance; tests and tools that reuse a process)."""
        torch.compiler.set_stance("default")
        with self._lock:
            self.sealed = self.counting = False
        if self._graphs is not None:
            self._graphs.unseal()

    def dynamo_compile_started(self) -> None:
        with self._lock:
            if self.counting:
                self._dynamo += 1

    def after_ready(self) -> dict[str, int]:
        """Counts since the seal: ``dynamo`` compiles, ``outside_set`` calls run eagerly,
        ``cuda_graph`` captures and calls that found no captured graph."""
        graphs = self._graphs
        cuda = 0
        if graphs is not None:
            cuda = graphs.stats["captures"] - self._captures_at_seal + graphs.stats["unwarmed"]
        with self._lock:
            return {"dynamo": self._dynamo, "outside_set": len(self._outside), "cuda_graph": cuda}

    def ran_outside(self, name: str, args: tuple) -> None:
        """A call of ``name`` with ``args`` ran eagerly after the seal: count it, log it once."""
        key = (name, _shapes(args))
        with self._lock:
            new = key not in self._outside
            self._outside.add(key)
        if new:
            log.warning(
                "%s: a call outside the compiled set (shapes %s) runs eagerly; the warm-up "
                "compiles the card's default profile and compiled_sizes only",
                name,
                key[1],
            )
