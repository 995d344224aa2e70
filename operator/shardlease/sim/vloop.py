"""A virtual-time asyncio event loop: the real code runs, the clock is simulated.

Why our own loop rather than `looptime`: looptime (0.9) is built for pytest
tests that may also do real I/O. It spends a number of no-op cycles before
every jump of the clock, and when the loop idles it waits in *real* time steps
for outside I/O. A simulation has no outside I/O at all, and wants exactly one
behaviour: when nothing is ready to run, jump to the next timer at once. That
is a dozen lines over the standard `SelectorEventLoop`, through its public
`selector` argument, and it makes the run a pure function of the code and the
seed (no real time leaks in anywhere).

How: `asyncio`'s `BaseEventLoop._run_once` asks the selector to wait for
`timeout` seconds exactly when no callback is ready, `timeout` being the time
until the earliest timer. Our selector polls (for the loop's own self-pipe;
nothing else is registered) and, if nothing is ready, advances the virtual
clock by `timeout` instead of sleeping, so the timer becomes due. (And it
moves the clock onto timers asyncio is about to run within its 1 ns
resolution: see `_reach_due_timers`.) When there
is no timer either (every task waits for something that can never come), a
real loop would sleep forever; ours raises `SimulationStuck`.

`loop.time()` is the virtual clock, so `asyncio.sleep`, `wait_for`, timeouts
and `shardlease.clock.LoopClock.monotonic()` all run on it.
"""

from __future__ import annotations

import asyncio
import contextvars
import selectors
from collections.abc import Callable, Coroutine
from typing import Any, TypeVar

T = TypeVar("T")

#: Called with every task created on a `VirtualTimeLoop` and the context it
#: runs in (the simulation uses it to know which node a task belongs to).
TaskHook = Callable[["asyncio.Task[Any]", contextvars.Context | None], None]


class SimulationStuck(RuntimeError):
    """Nothing is ready and no timer is scheduled: virtual time cannot advance."""


class _VirtualClock:
    def __init__(self, start: float) -> None:
        self.now = start


class _VirtualSelector(selectors.DefaultSelector):
    def __init__(self, clock: _VirtualClock) -> None:
        super().__init__()
        self._clock = clock
        self.loop: asyncio.BaseEventLoop | None = None

    def select(self, timeout: float | None = None) -> list[tuple[selectors.SelectorKey, int]]:
        ready = super().select(0)
        if ready:
            return ready
        if timeout is None:
            raise SimulationStuck(
                "every task is waiting and no timer is scheduled: the simulation is stuck")
        if timeout > 0:
            self._clock.now += timeout
        self._reach_due_timers()
        return []

    def _reach_due_timers(self) -> None:
        """Right after this call, the loop runs every timer due before
        now + its clock resolution (1 ns): some a hair early. A real clock
        has moved on by then; move the virtual one onto the latest of them, so
        that code woken by a timer at `t` sees `loop.time() >= t` (or a wait
        until `deadline <= loop.time()` would spin at one instant forever).
        Reads two private attributes of asyncio's BaseEventLoop (_scheduled,
        _clock_resolution): stable across CPython 3.8-3.13."""
        loop = self.loop
        if loop is None:
            return
        resolution: float = loop._clock_resolution  # type: ignore[attr-defined]
        scheduled: list[asyncio.TimerHandle] = loop._scheduled  # type: ignore[attr-defined]
        while scheduled:
            now = self._clock.now
            if scheduled[0].when() >= now + resolution:  # the heap's earliest
                return
            due = [h.when() for h in scheduled if now < h.when() < now + resolution]
            if not due:
                return
            self._clock.now = max(due)


class VirtualTimeLoop(asyncio.SelectorEventLoop):
    """A `SelectorEventLoop` whose `time()` is virtual and which never sleeps."""

    def __init__(self, start: float = 0.0) -> None:
        self._vclock = _VirtualClock(start)
        selector = _VirtualSelector(self._vclock)
        super().__init__(selector)
        selector.loop = self
        self.task_hook: TaskHook | None = None

    def time(self) -> float:
        return self._vclock.now

    def create_task(  # type: ignore[override]
        self,
        coro: Coroutine[Any, Any, T],
        *,
        name: str | None = None,
        context: contextvars.Context | None = None,
    ) -> asyncio.Task[T]:
        task = super().create_task(coro, name=name, context=context)
        if self.task_hook is not None:
            self.task_hook(task, context)
        return task


def run_virtual(main: Coroutine[Any, Any, T], *, start: float = 0.0) -> T:
    """Run `main` to completion on a fresh `VirtualTimeLoop` (then close it)."""
    with asyncio.Runner(loop_factory=lambda: VirtualTimeLoop(start)) as runner:
        return runner.run(main)
