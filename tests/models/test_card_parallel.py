"""ParallelPlan (models/card/parallel.py; the plan of a world: models/spmd/plan.py): parsing,
validation before load, the 14B preset's sizes. The DeviceMesh it builds is checked on a gloo
world in test_sequence_parallel.py."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from models.card import ParallelPlan, ParallelPlanError
from models.instance import InstanceError
from models.registry import get as get_card
from models.spmd.plan import plan_for
from models.wan.components import CPU_RANDOM_PARAM_LIMIT, build_components, dit_param_count
from models.wan.dit.config import WanDiTConfig
from models.wan.dit.flops import dit_flops


def test_parse_and_world_size() -> None:
    plan = ParallelPlan.parse("sp=4, replica=2")
    assert (plan.sp, plan.cfg, plan.replica, plan.world_size) == (4, 1, 2, 8)
    assert ParallelPlan.parse("") == ParallelPlan()


@pytest.mark.parametrize(
    ("text", "needle"),
    [
        ("tp=2", "unknown parallel axis 'tp'"),
        ("sp=two", "needs an integer degree"),
        ("sp=0", "sp=0 must be an int >= 1"),
        ("cfg=3", "cfg is 1 or 2"),
    ],
)
def test_parse_rejects(text: str, needle: str) -> None:
    with pytest.raises(ParallelPlanError, match=needle):
        ParallelPlan.parse(text)


def test_problems_name_world_and_heads() -> None:
    plan = ParallelPlan(sp=3)
    found = plan.problems(world_size=4, num_heads=40)
    assert found == [
        "parallel plan sp=3 x cfg=1 x replica=1 = 3 processes, but the world has 4",
        "sp=3 does not divide the model's 40 attention heads (Ulysses gives each rank whole heads)",
    ]
    assert ParallelPlan(sp=4).problems(world_size=4, num_heads=40) == []
    # Wan2.1-1.3B has 12 heads: sp 8 cannot split them, sp 4 can
    heads = WanDiTConfig.preset("wan2.1-1.3b").num_heads
    assert ParallelPlan(sp=8).problems(world_size=8, num_heads=heads)
    assert not ParallelPlan(sp=4).problems(world_size=4, num_heads=heads)


def test_check_refuses_axes_not_served() -> None:
    with pytest.raises(ParallelPlanError, match="replica=2 is not served yet") as err:
        ParallelPlan(sp=2, replica=2).check(world_size=4, num_heads=12, model_id="m")
    assert "model card 'm'" in str(err.value)
    assert ParallelPlan(sp=2).check(world_size=2, num_heads=12) == ParallelPlan(sp=2)
    assert ParallelPlan(cfg=2).check(world_size=2, num_heads=12) == ParallelPlan(cfg=2)


def test_cards_default_to_one_process() -> None:
    card = get_card("wan2.1-1.3b-causal")
    assert card.parallel == ParallelPlan()
    assert dataclasses.replace(card, parallel=ParallelPlan(sp=2)).validate().parallel.sp == 2


def test_14b_preset_sizes_and_flops() -> None:
    cfg = WanDiTConfig.preset("wan2.1-14b")
    assert (cfg.dim, cfg.num_layers, cfg.num_heads, cfg.ffn_dim, cfg.head_dim) == (
        5120,
        40,
        40,
        13824,
        128,
    )
    params = dit_param_count(cfg)  # meta device: nothing allocated
    assert 14.0e9 < params < 14.5e9
    # one 832x480 chunk of 3 latent frames (4680 tokens) over a full 12-frame cache
    q, kv = 3 * 1560, 12 * 1560 + 3 * 1560
    flops = dit_flops(cfg, q, kv, 512)
    linear = 40 * 2 * q * (6 * 5120 * 5120 + 2 * 5120 * 13824)
    attention = 40 * 4 * q * (kv + 512) * 5120
    assert flops == pytest.approx(linear + attention, rel=1e-3)
    small = dit_flops(WanDiTConfig.preset("wan2.1-1.3b"), q, kv, 512)
    assert 6 < flops / small < 7


def test_14b_random_build_refused_on_cpu() -> None:
    card = get_card("wan2.1-1.3b-causal")
    dit = dataclasses.replace(card.components["dit"], preset="wan2.1-14b")
    big = dataclasses.replace(card, components={**card.components, "dit": dit})
    with pytest.raises(InstanceError, match=r"14\.3B parameters: random weights build on cuda"):
        build_components(
            big,
            device=torch.device("cpu"),
            dtype=torch.bfloat16,
            seed=0,
            random_weights=True,
            checkpoint_dir=None,
        )
    assert dit_param_count(WanDiTConfig.preset("wan2.1-1.3b")) < CPU_RANDOM_PARAM_LIMIT


def test_plan_for_checks_tokens_and_uses_the_cards_plan() -> None:
    tiny = get_card("wan-tiny-random")  # 64x64: 4 x 4 = 16 tokens per latent frame, 2 heads
    assert plan_for(tiny, 2) == ParallelPlan(sp=2)
    with pytest.raises(ParallelPlanError, match="sp=4 does not divide the model's 2"):
        plan_for(tiny, 4)
    wan = get_card("wan2.1-1.3b-causal")  # 832x480: 1560 tokens per frame, 12 heads
    assert plan_for(wan, 4).sp == 4
    with pytest.raises(ParallelPlanError, match="the 1590 tokens of a latent frame at 848x480"):
        plan_for(dataclasses.replace(wan, default_profile=dataclasses.replace(
            wan.default_profile, width=848)), 4)  # fmt: skip
    own = dataclasses.replace(wan, parallel=ParallelPlan(sp=2, replica=2))
    with pytest.raises(ParallelPlanError, match="replica=2 is not served yet"):
        plan_for(own, 4)
