"""The loop of one rollout group: K samples of one prompt whose denoising steps run batched.

A group's K samples are ordinary loops of the card (``chunk_rollout`` for a chunk-causal card)
with their own seeds, spawned together, so their plans queue side by side with equal shapes
and stream positions. What makes them one homogeneous batch is the denoising-step op: the
group's loops see the model through ``GroupModel``, which is the instance itself (weights,
caches, every other op, the live ``weights_version``) except for a ``ChunkDenoiseOp`` of its
own that is batchable, whatever ``WanInstance.batch_sessions`` says for sessions. The engine
then runs the K samples' step ``i`` as one DiT forward (``WanDiT.forward_chunks``); the text
encode runs once (the K encodes of one prompt are one cache key: one miss); the KV updates and
decodes run per sample. Batched steps agree with solo ones within the batched tolerance
(``tests/models/test_batched_steps.py``); in ``--deterministic`` mode every step runs alone,
bit-identical to K single samples.
"""

from __future__ import annotations

import weakref
from typing import Any

from models.loops.ops import ChunkDenoiseOp
from models.loops.registry import build_loop
from runtime.contract import Loop

__all__ = ["GroupModel", "group_loop"]


class GroupModel:
    """``instance`` as one group's loops see it (module docstring)."""

    def __init__(self, instance: Any) -> None:
        self._instance = instance
        self.chunk_step_op = ChunkDenoiseOp(instance.dit)
        # compiled: each sample's steps run alone, at the batch-1 shapes the warm-up compiled
        # (a batch of K is a shape per K outside the compiled set, models/compiled_set.py)
        self.chunk_step_op.batchable = not instance.levers.get("compiled", False)

    def __getattr__(self, name: str) -> Any:  # everything but the step op: the instance's own
        return getattr(self._instance, name)


# one GroupModel per instance: the batch key holds the op object, so every sample of every
# group must see the same one (samples of two groups of one shape may batch together too)
_GROUP_MODELS: weakref.WeakKeyDictionary[Any, GroupModel] = weakref.WeakKeyDictionary()


def group_loop(instance: Any, capability: str) -> Loop[Any] | None:
    """A loop serving ``capability`` (e.g. ``"text_to_video"``) for a rollout group's sample;
    ``None`` when the card has no loop for it."""
    spec = instance.card.loop_for(capability)
    if spec is None:
        return None
    instance.card.check_serving(spec.loop_id, instance.precision)
    model = _GROUP_MODELS.get(instance)
    if model is None:
        model = _GROUP_MODELS[instance] = GroupModel(instance)
    return build_loop(model, spec)
