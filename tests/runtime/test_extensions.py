"""Pre-flight rules of the extensions (runtime/extensions.py): pure, on hand-built specs."""

from __future__ import annotations

from typing import Annotated

import msgspec
import pytest

from runtime.extensions import (
    ExtensionRejected,
    ExtensionSpec,
    HookPoint,
    ScheduleFacts,
    parse_extension_arg,
    preflight,
)


class Params(msgspec.Struct, kw_only=True, forbid_unknown_fields=True, frozen=True):
    enabled: bool = True
    threshold: Annotated[float, msgspec.Meta(ge=0.0)] = 0.0

    def altering_fields(self) -> list[str]:
        return [f"threshold={self.threshold:g}"] if self.threshold > 0 else []


def spec(name: str, claims: str = "dit.blocks", **kw) -> ExtensionSpec:
    return ExtensionSpec(
        name=name,
        version=1,
        hook=kw.pop("hook", HookPoint.BLOCK),
        params=Params,
        claims=claims,
        loops=("diffusion_denoise",),
        **kw,
    )


SPECS = {
    "block": spec("block", reuses_steps=True),
    "step": spec("step", hook=HookPoint.STEP, reuses_steps=True, min_steps=20),
    "other": spec("other", claims="vae"),
}
MANY = ScheduleFacts(model_id="base", loop="diffusion_denoise", steps=50, step_skipping=True)
FEW = ScheduleFacts(model_id="distilled", loop="diffusion_denoise", steps=4, step_skipping=False)


def test_deploy_defaults_apply_and_requests_override_them() -> None:
    deployed = {"block": Params(threshold=0.1), "other": Params()}
    active = preflight(SPECS, deployed, {}, MANY)
    assert active == {"block": Params(threshold=0.1), "other": Params()}
    active = preflight(SPECS, deployed, {"block": {"threshold": 0.3}}, MANY)
    assert active["block"] == Params(threshold=0.3)
    active = preflight(SPECS, deployed, {"block": {"enabled": False}}, MANY)
    assert set(active) == {"other"}


def test_a_request_may_only_parameterize_enabled_extensions() -> None:
    with pytest.raises(ExtensionRejected, match="'step' is not enabled on this server"):
        preflight(SPECS, {"block": Params()}, {"step": {}}, MANY)


def test_request_parameters_are_validated_by_the_schema() -> None:
    deployed = {"block": Params()}
    with pytest.raises(ExtensionRejected, match="block.*>= 0"):
        preflight(SPECS, deployed, {"block": {"threshold": -1}}, MANY)
    with pytest.raises(ExtensionRejected, match="unknown field"):
        preflight(SPECS, deployed, {"block": {"treshold": 0.1}}, MANY)


def test_conflicting_interceptors_are_rejected_naming_both() -> None:
    deployed = {"block": Params(), "step": Params()}
    with pytest.raises(ExtensionRejected, match="'block' conflicts with 'step'.*dit.blocks"):
        preflight(SPECS, deployed, {}, MANY)
    # either one alone passes
    assert set(preflight(SPECS, deployed, {"step": {"enabled": False}}, MANY)) == {"block"}


def test_step_reuse_on_a_few_step_card_is_rejected_naming_both() -> None:
    with pytest.raises(ExtensionRejected, match="'block'.*model 'distilled'.*4-step"):
        preflight(SPECS, {"block": Params()}, {}, FEW)
    skipping_but_short = ScheduleFacts("short", "diffusion_denoise", 8, True)
    with pytest.raises(ExtensionRejected, match="'step' needs >= 20 steps; model 'short'"):
        preflight(SPECS, {"step": Params()}, {}, skipping_but_short)
    # an extension that reuses nothing is fine there
    assert set(preflight(SPECS, {"other": Params()}, {}, FEW)) == {"other"}


def test_an_exact_request_refuses_distribution_altering_parameters() -> None:
    deployed = {"block": Params(threshold=0.1)}
    with pytest.raises(ExtensionRejected, match="exact request refuses block.threshold=0.1"):
        preflight(SPECS, deployed, {}, MANY, exact=True)
    # threshold 0 is exact: allowed
    active = preflight(SPECS, deployed, {"block": {"threshold": 0}}, MANY, exact=True)
    assert active["block"] == Params(threshold=0.0)


def test_an_extension_of_another_loop_is_inactive_unless_requested() -> None:
    session = ScheduleFacts("base", "chunk_rollout", 50, True)
    assert preflight(SPECS, {"block": Params()}, {}, session) == {}
    with pytest.raises(ExtensionRejected, match="hooks \\['diffusion_denoise'\\], not 'chunk"):
        preflight(SPECS, {"block": Params()}, {"block": {}}, session)


def test_extension_flags_parse() -> None:
    assert parse_extension_arg("fbcache") == ("fbcache", {})
    assert parse_extension_arg("fbcache:threshold=0.05,enabled=false") == (
        "fbcache",
        {"threshold": 0.05, "enabled": False},
    )
    assert parse_extension_arg("x:mode=fast") == ("x", {"mode": "fast"})
    with pytest.raises(ExtensionRejected, match="not key=value"):
        parse_extension_arg("fbcache:0.05")
    with pytest.raises(ExtensionRejected, match="no extension name"):
        parse_extension_arg(":threshold=1")
