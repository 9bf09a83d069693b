"""The scenarios of ``infra.bench.multisession`` (see its docstring for what each measures)."""

from __future__ import annotations

import argparse
from dataclasses import dataclass

from models.card import ModelCard, Profile

__all__ = ["SCENARIOS", "Scenario", "parse_profile", "scenarios"]

SCENARIOS = ("n1", "n2", "n3", "n2job", "n2switch", "small")


@dataclass(frozen=True, slots=True)
class Scenario:
    name: str
    profile: Profile
    sessions: int
    job: bool = False
    switch_every_s: float | None = None
    admitted: bool = False  # sessions go through admission (small)
    one_more: bool = False  # after the ramp, ask admission for one more (small+1)
    ramp_s: float = 0.0


def parse_profile(text: str) -> tuple[int, int, int]:
    size, _, fps = text.partition("@")
    width, _, height = size.partition("x")
    return int(width), int(height), int(fps)


def scenarios(
    card: ModelCard, args: argparse.Namespace, names: list[str], small_limit: int
) -> list[Scenario]:
    """The scenarios ``names`` on ``card`` (``small`` admits ``small_limit`` sessions)."""
    default = card.default_profile
    table = {
        "n1": Scenario("n1", default, 1),
        "n2": Scenario("n2", default, 2),
        "n3": Scenario("n3", default, 3),
        "n2job": Scenario("n2job", default, 2, job=True),
        "n2switch": Scenario("n2switch", default, 2, switch_every_s=args.switch_every),
    }
    out = []
    for name in names:
        if name == "small":
            w, h, fps = parse_profile(args.small_profile)
            small = card.resolve_profile(width=w, height=h, fps=fps)
            out.append(Scenario("small", small, small_limit, admitted=True, ramp_s=args.ramp))
        elif name in table:
            out.append(table[name])
        else:
            raise SystemExit(f"multisession: unknown scenario {name!r}; known: {SCENARIOS}")
    return out
