"""The virtual-time loop."""

from __future__ import annotations

import asyncio
import contextvars
import time

import pytest

from shardlease.sim.vloop import SimulationStuck, VirtualTimeLoop, run_virtual


def test_sleeping_an_hour_takes_no_real_time() -> None:
    async def main() -> float:
        loop = asyncio.get_running_loop()
        await asyncio.sleep(3600)
        with pytest.raises(TimeoutError):
            await asyncio.wait_for(asyncio.Event().wait(), 10)
        return loop.time()

    started = time.perf_counter()
    assert run_virtual(main(), start=5.0) == 3615.0
    assert time.perf_counter() - started < 2


def test_timers_run_in_time_order() -> None:
    async def main() -> list[tuple[float, str]]:
        loop = asyncio.get_running_loop()
        seen: list[tuple[float, str]] = []

        async def at(t: float, name: str) -> None:
            await asyncio.sleep(t)
            seen.append((loop.time(), name))

        await asyncio.gather(at(3, "c"), at(1, "a"), at(2, "b"), at(2, "b2"))
        return seen

    assert run_virtual(main()) == [(1, "a"), (2, "b"), (2, "b2"), (3, "c")]


def test_nothing_to_wait_for_is_reported_instead_of_hanging() -> None:
    async def main() -> None:
        await asyncio.Event().wait()

    with pytest.raises(SimulationStuck):
        run_virtual(main())


def test_a_wait_until_a_deadline_does_not_spin_short_of_it() -> None:
    # asyncio runs timers due within 1 ns early; the clock must have reached
    # the timer when it runs, or `while time() < deadline` never ends.
    async def main() -> int:
        loop = asyncio.get_running_loop()
        await asyncio.sleep(61.85989904786381)
        deadline = loop.time() + 4e-10
        turns = 0
        while loop.time() < deadline:
            turns += 1
            assert turns < 10
            await asyncio.sleep(deadline - loop.time())
        return turns

    assert run_virtual(main()) == 1


def test_the_task_hook_sees_every_task_and_its_context() -> None:
    var: contextvars.ContextVar[str] = contextvars.ContextVar("var", default="-")
    seen: list[str] = []

    async def child() -> None:
        await asyncio.sleep(1)

    async def parent() -> None:
        await asyncio.gather(child(), child())

    async def main() -> None:
        loop = asyncio.get_running_loop()
        assert isinstance(loop, VirtualTimeLoop)
        loop.task_hook = lambda task, ctx: seen.append(
            ctx.get(var, "-") if ctx is not None else var.get())
        ctx = contextvars.copy_context()
        ctx.run(var.set, "node")
        await loop.create_task(parent(), context=ctx)

    run_virtual(main())
    # (then asyncio.Runner's own shutdown tasks, outside any node)
    assert seen[:3] == ["node", "node", "node"] and "node" not in seen[3:]
