"""The extensions the loops know, and how a loop turns a request's into hooks and state.

``EXTENSIONS`` names every interceptor by its extension name (``runtime.extensions``
declares the types and the pre-flight rules). A loaded model carries the deploy-scope set
(``WanInstance.extensions``: name -> validated default params, from ``dreamrt serve
--extension``) and its block observers (``WanInstance.block_observers``).

``LoopExtensions`` belongs to one loop object (one per model and loop id). ``start`` runs the
pre-flight rules for a request before its loop starts and returns the loop's initial
``plugin_state``: per active interceptor its version, params and per-branch state::

    plugin_state = {"fbcache": {"version": 1, "params": {...}, "branches": {"cond": {...}}}}

``call`` gives the step's ``StepHookCall`` (None when nothing is hooked: the plain forward
runs) from hooks assembled once per distinct configuration; ``fold`` puts a hooked step's
new branch states back. Everything per request stays in the state, so a snapshot carries it
and two sessions never share it.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, cast

import msgspec

from models.loops.ops import HookedStepOutput
from models.wan.dit.residual_caches import (
    FIRST_BLOCK_CACHE,
    STEP_CACHE,
    CacheParams,
    FirstBlockCache,
    ResidualCache,
    StepCache,
)
from models.wan.dit.step_hooks import StepHookCall, StepHooks
from runtime.contract import (
    ExtensionRejected,
    ExtensionSpec,
    ScheduleFacts,
    preflight,
)

__all__ = ["EXTENSIONS", "LoopExtensions", "deploy_extensions", "extension_summary"]

# name -> (its declaration, the policy class built from its params)
EXTENSIONS: dict[str, tuple[ExtensionSpec, type[ResidualCache]]] = {
    FIRST_BLOCK_CACHE.name: (FIRST_BLOCK_CACHE, FirstBlockCache),
    STEP_CACHE.name: (STEP_CACHE, StepCache),
}
SPECS: dict[str, ExtensionSpec] = {name: spec for name, (spec, _) in EXTENSIONS.items()}


def deploy_extensions(
    flags: Sequence[tuple[str, Mapping[str, Any]]],
) -> dict[str, msgspec.Struct]:
    """Deploy-scope extensions from parsed ``--extension`` flags -> name -> default params
    (``ExtensionRejected`` for an unknown name, a repeated one or invalid parameters: the
    server refuses to start)."""
    deployed: dict[str, msgspec.Struct] = {}
    for name, raw in flags:
        spec = SPECS.get(name)
        if spec is None:
            raise ExtensionRejected(f"unknown extension {name!r} (known: {sorted(SPECS)})")
        if name in deployed:
            raise ExtensionRejected(f"extension {name!r} is given twice")
        try:
            deployed[name] = msgspec.convert(dict(raw), spec.params)
        except msgspec.ValidationError as exc:
            raise ExtensionRejected(f"--extension {name}: {exc}") from None
    return deployed


class LoopExtensions:
    """A loop's view of its model's extensions (see the module docstring)."""

    def __init__(self, model: Any) -> None:
        # read when used: the server sets the model's extensions after its loops are built
        self._model = model
        self._assembled: dict[tuple, StepHooks] = {}

    def start(
        self, requested: Mapping[str, Mapping[str, Any]], facts: ScheduleFacts, *, exact: bool
    ) -> dict[str, object]:
        """The initial ``plugin_state`` of a request, or ``ExtensionRejected``."""
        deployed = getattr(self._model, "extensions", None) or {}
        active = preflight(SPECS, deployed, requested, facts, exact=exact)
        return {
            name: {
                "version": SPECS[name].version,
                "params": msgspec.structs.asdict(params),
                "branches": {},
            }
            for name, params in sorted(active.items())
        }

    def call(
        self, plugin_state: Mapping[str, Any], loop_id: str, step: int, steps: int
    ) -> StepHookCall | None:
        names = [n for n in plugin_state if n in EXTENSIONS]
        observers = tuple(getattr(self._model, "block_observers", None) or ())
        if not names and not observers:
            return None
        name = names[0] if names else ""  # the rules leave at most one (they share a claim)
        params = plugin_state[name]["params"] if name else {}
        key = (name, tuple(sorted(params.items())), tuple(map(id, observers)))
        hooks = self._assembled.get(key)
        if hooks is None:
            cache = None
            if name:
                spec, policy = EXTENSIONS[name]
                # a residual cache's spec declares its policy's parameters (CacheParams)
                cache = policy(cast(CacheParams, msgspec.convert(params, spec.params)))
            hooks = self._assembled[key] = StepHooks(cache, observers)
        branches = plugin_state[name]["branches"] if name else {}
        return StepHookCall(hooks, name, loop_id, step, steps, branches)

    @staticmethod
    def fold(plugin_state: dict[str, Any], output: Any) -> tuple[dict[str, Any], Any]:
        """-> (the new plugin_state, the latents) of a step's output."""
        if not isinstance(output, HookedStepOutput):
            return plugin_state, output
        if not output.name:
            return plugin_state, output.latents
        entry = {**plugin_state[output.name], "branches": output.branches}
        return {**plugin_state, output.name: entry}, output.latents


def extension_summary(plugin_state: Mapping[str, Any]) -> dict[str, dict[str, int]]:
    """Per active interceptor: how many steps reused cached work and how many computed
    (the cond branch's counts; every branch of a CFG batch decides together)."""
    summary = {}
    for name, entry in plugin_state.items():
        branch = entry.get("branches", {}).get("cond") or {}
        summary[name] = {
            "reused": int(branch.get("reused", 0)),
            "computed": int(branch.get("computed", 0)),
        }
    return summary
