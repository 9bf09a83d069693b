"""``TaskSet`` (runtime.task_set): tasks leave the set when they end, a failure is logged, close
cancels and awaits what is left, also when called from one of its own tasks."""

from __future__ import annotations

import asyncio
import logging

from runtime.task_set import TaskSet


def test_close_cancels_and_awaits_every_task_and_failures_are_logged(caplog) -> None:
    async def main() -> None:
        tasks = TaskSet(logging.getLogger("test.tasks"), "peer p1")
        started = asyncio.Event()
        cancelled: list[str] = []

        async def forever(name: str) -> None:
            started.set()
            try:
                await asyncio.Event().wait()
            except asyncio.CancelledError:
                cancelled.append(name)
                raise

        async def fails() -> None:
            raise RuntimeError("boom")

        async def quick() -> None:
            return None

        tasks.spawn(forever("a"), "p1-a")
        tasks.spawn(forever("b"), "p1-b")
        done = tasks.spawn(quick(), "p1-quick")
        broken = tasks.spawn(fails(), "p1-broken")
        await started.wait()
        await asyncio.gather(done, broken, return_exceptions=True)
        await asyncio.sleep(0)  # the done callbacks run
        assert sorted(t.get_name() for t in tasks) == ["p1-a", "p1-b"]
        await tasks.close()
        assert len(tasks) == 0 and sorted(cancelled) == ["a", "b"]
        others = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
        assert others == []

    with caplog.at_level(logging.ERROR, logger="test.tasks"):
        asyncio.run(main())
    failed = [r for r in caplog.records if r.name == "test.tasks"]
    assert [r.getMessage() for r in failed] == ["peer p1: p1-broken failed"]
    assert "boom" in str(failed[0].exc_info[1])


def test_close_from_one_of_its_own_tasks_waits_for_the_others() -> None:
    async def main() -> list[str]:
        tasks = TaskSet()
        ended: list[str] = []

        async def sibling() -> None:
            try:
                await asyncio.Event().wait()
            finally:
                ended.append("sibling")

        async def closer() -> None:
            await asyncio.sleep(0)
            await tasks.close()
            ended.append("closer")

        tasks.spawn(sibling(), "sibling")
        closing = tasks.spawn(closer(), "closer")
        await asyncio.wait_for(closing, timeout=30)
        return ended

    assert asyncio.run(main()) == ["sibling", "closer"]
