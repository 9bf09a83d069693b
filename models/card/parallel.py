"""ParallelPlan: how one model instance spreads over the GPUs of one node.

Three named axes, each a degree >= 1; their product is the world size (one process per GPU):

- ``sp``: Ulysses sequence parallelism. Each rank holds 1/sp of a chunk's tokens outside
  self-attention; an all-to-all over heads gives it every token of 1/sp of the heads inside
  (``models/wan/dit/sequence_parallel.py``), and its chunk-K/V cache holds only those heads.
- ``cfg``: the conditional and unconditional branches of classifier-free guidance on
  different ranks (degree 1 or 2).
- ``replica``: independent copies of the model, each serving its own sessions.

The plan is pure data and is checked before any weight loads (``problems`` / ``check``): the
product must equal the world size and the attention heads must divide by ``sp`` (a head is
never split). ``mesh()`` builds the ``torch.distributed.DeviceMesh`` of the three axes, ``sp``
innermost so its ranks are the nearest ones (one NVLink hop on an 8-GPU node).

What runs today: ``sp`` (the Wan DiT; its VAE decode split by rows) and ``cfg`` (the two
branches of a CFG step on two ranks: ``models/loops/cfg_branches.py``). ``replica`` is
validated and gets its mesh axis, but serving refuses a degree above 1 for it
(``serving_problems``) until an engine path exists: no silent fallback.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from models.card.errors import CardError

__all__ = ["AXES", "ParallelPlan", "ParallelPlanError"]

# mesh dimension order, outermost first: sp innermost (its all-to-alls are per layer)
AXES = ("replica", "cfg", "sp")


class ParallelPlanError(CardError):
    """A parallel plan that cannot run on the given world or model (lists every finding)."""


@dataclass(frozen=True, slots=True)
class ParallelPlan:
    """Degrees of the ``sp``, ``cfg`` and ``replica`` axes (module docstring)."""

    sp: int = 1
    cfg: int = 1
    replica: int = 1

    @property
    def world_size(self) -> int:
        return self.sp * self.cfg * self.replica

    @classmethod
    def parse(cls, text: str) -> ParallelPlan:
        """``"sp=2,cfg=1"`` -> ParallelPlan(sp=2); an unknown axis or a non-integer raises
        ``ParallelPlanError`` naming it."""
        degrees: dict[str, int] = {}
        problems = []
        for part in filter(None, (p.strip() for p in text.split(","))):
            axis, _, value = part.partition("=")
            axis = axis.strip()
            if axis not in AXES:
                problems.append(f"unknown parallel axis {axis!r} (axes: {', '.join(AXES)})")
            elif not value.strip().isdigit():
                problems.append(f"axis {axis!r} needs an integer degree, got {value!r}")
            else:
                degrees[axis] = int(value)
        if problems:
            raise ParallelPlanError(problems)
        plan = cls(**degrees)
        if found := plan._degree_problems():
            raise ParallelPlanError(found)
        return plan

    def problems(self, *, world_size: int, num_heads: int) -> list[str]:
        """Every reason this plan cannot run on ``world_size`` processes for a model whose
        attention has ``num_heads`` heads (empty: it can)."""
        found = self._degree_problems()
        if found:
            return found
        if self.world_size != world_size:
            found.append(
                f"parallel plan sp={self.sp} x cfg={self.cfg} x replica={self.replica} = "
                f"{self.world_size} processes, but the world has {world_size}"
            )
        if num_heads % self.sp:
            found.append(
                f"sp={self.sp} does not divide the model's {num_heads} attention heads "
                f"(Ulysses gives each rank whole heads)"
            )
        return found

    def serving_problems(self) -> list[str]:
        """Axes this build validates but cannot serve yet (see the module docstring)."""
        return [
            f"{axis}={getattr(self, axis)} is not served yet (sp and cfg run across ranks)"
            for axis in ("replica",)
            if getattr(self, axis) > 1
        ]

    def check(self, *, world_size: int, num_heads: int, model_id: str = "") -> ParallelPlan:
        """Raise ``ParallelPlanError`` listing ``problems`` and ``serving_problems``; return
        self when there are none."""
        found = self.problems(world_size=world_size, num_heads=num_heads)
        found += self.serving_problems() if not found else []
        if found:
            raise ParallelPlanError(found, model_id)
        return self

    def mesh(self, device_type: str) -> Any:
        """The ``DeviceMesh`` of this plan over the default process group (already
        initialised, of ``world_size`` ranks), dimensions named ``AXES``."""
        from torch.distributed.device_mesh import init_device_mesh

        shape = tuple(getattr(self, axis) for axis in AXES)
        return init_device_mesh(device_type, shape, mesh_dim_names=AXES)

    def _degree_problems(self) -> list[str]:
        found = [
            f"parallel degree {axis}={getattr(self, axis)} must be an int >= 1"
            for axis in AXES
            if not isinstance(getattr(self, axis), int) or getattr(self, axis) < 1
        ]
        if not found and self.cfg > 2:
            found.append(f"cfg={self.cfg}: guidance has two branches, so cfg is 1 or 2")
        return found
