"""The action probe: a quarter turn of the keys, and 0 exactly when the DiT ignores the action."""

from __future__ import annotations

import torch

from models.loops.inputs import ACTION_DIM, ACTION_KEYS
from models.tinyworld.components import new_components
from models.tinyworld.training.probe import ActionProbe, rotate_keys


def _action(*keys: str) -> torch.Tensor:
    return torch.tensor([float(k in keys) for k in ACTION_KEYS] + [0.25, -0.5])


def test_rotate_keys_turns_directions_clockwise_and_keeps_the_rest() -> None:
    pairs = [
        (("w",), ("d",)),
        (("d",), ("s",)),
        (("s",), ("a",)),
        (("a",), ("w",)),
        (("w", "d", "shift"), ("d", "s", "shift")),
        (("space",), ("space",)),
        ((), ()),
    ]
    got = rotate_keys(torch.stack([_action(*k) for k, _ in pairs]))
    assert torch.equal(got, torch.stack([_action(*k) for _, k in pairs]))
    assert got.shape[-1] == ACTION_DIM


def _probe() -> ActionProbe:
    return ActionProbe(pairs=24, height=32, width=32, text_len=8, device="cpu", reach_px=6)


def test_probe_is_zero_for_a_dit_that_ignores_the_action_and_not_otherwise() -> None:
    probe = _probe()
    assert 8 <= probe.size <= 24  # only pairs whose target holds a direction key
    dit, _, text = new_components("tinyworld-test", seed=0)  # action hook starts as a no-op
    deaf = probe.measure(dit, text)
    assert deaf["probe"] == 0.0 and deaf["probe_rest"] == 0.0
    assert deaf["err_true"] > 0.0 and deaf["pairs"] == probe.size
    g = torch.Generator().manual_seed(2)
    for p in dit.action_embedding.parameters():
        p.data.copy_(torch.randn(p.shape, generator=g))
    dit.train()
    hearing = probe.measure(dit, text)
    assert hearing["probe"] != 0.0
    assert dit.training  # measure restores the mode it found
    assert hearing == probe.measure(dit, text)  # a fixed batch and fixed noise
