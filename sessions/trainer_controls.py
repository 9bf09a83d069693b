"""What a trainer co-located with dreamrt drives: weight syncs, sleep/wake, group rollouts.

``TrainerControls.build(host, jobs, engine)`` wires them on one server's objects (the
composition root keeps the result as ``ServerContext.trainer``; an in-process trainer calls
it directly: ``await ctx.trainer.weights.sync(state_dict)``). Every control stops the model
through one ``ModelHold`` over the model's live loops (sessions and jobs) and shares one lock,
so a sync never overlaps a sleep.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import Any

from sessions.host import SessionHost
from sessions.job_host import JobHost
from sessions.loop_handle import LoopHandleLike
from sessions.model_hold import ModelHold
from sessions.model_sleep import ModelSleep
from sessions.rollout_groups import RolloutGroups
from sessions.weight_sync import WeightSync

__all__ = ["TrainerControls"]


@dataclass(frozen=True, slots=True)
class TrainerControls:
    weights: WeightSync
    sleep: ModelSleep
    rollouts: RolloutGroups

    async def close(self) -> None:
        """Writes the rollout samples' last records (before the store closes)."""
        await self.rollouts.close()

    @classmethod
    def build(cls, host: SessionHost, jobs: JobHost, engine: Any) -> TrainerControls:
        def loops(model_id: str) -> list[tuple[object, LoopHandleLike]]:
            out: list[tuple[object, LoopHandleLike]] = [
                (s, s.handle)
                for s in host.sessions()
                if s.config.model_id == model_id and s.handle is not None
            ]
            for job in jobs.jobs():
                handle = engine.handle(job.id) if job.config.model_id == model_id else None
                if handle is not None:
                    out.append((job, handle))
            return out

        hold = ModelHold(host.models, loops)
        lock = asyncio.Lock()
        return cls(
            weights=WeightSync(host.models, hold, lock=lock),
            sleep=ModelSleep(host.models, hold, lock=lock),
            rollouts=RolloutGroups(jobs, host.store),
        )
