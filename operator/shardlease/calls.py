"""Store calls within a budget: how the loop keeps a slow or throttling store
from taking its pace.

A budget is a share of the interval (`CALL_BUDGET`). Within it a failed call
(`StoreError`) is retried after a jittered, doubling pause that never sleeps
past the budget. A `Conflict` is an answer, returned at once. Past the budget
the caller gets a `StoreError`, and:

- `bounded` cancels the call (lease writes: a cancelled write that landed is
  recognised later by the record's incarnation, or freed as a stray);
- `joined` lets it go on, and the next caller with the same key joins it
  instead of starting another (reads and heartbeats: cancelling an HTTP
  request costs its connection, so the next one would be slower still). A
  joined call unanswered for a whole TTL is cancelled.
"""

from __future__ import annotations

import asyncio
import random
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

from shardlease.clock import Clock
from shardlease.errors import StoreError

T = TypeVar("T")

#: Share of the interval a store call (with its retries) may take before it is
#: abandoned: below 1, so the next renewal or round starts on time.
CALL_BUDGET = 0.95
#: First pause before retrying a failed store call, as a share of the interval
#: (doubling, with jitter, within the call's budget).
RETRY_FIRST = 0.05
#: Longest pause between two tries, as a share of the interval: doubling
#: without a cap leaves a renewal, whose budget runs to the deadline, a handful
#: of tries, and 30% failing calls then fence a shard now and then.
RETRY_MAX = 0.25


class Calls:
    def __init__(self, *, interval: float, ttl: float, clock: Clock,
                 rng: random.Random) -> None:
        self.clock = clock
        self.rng = rng
        self.configure(interval=interval, ttl=ttl)
        self._inflight: dict[str, asyncio.Task[Any]] = {}

    def configure(self, *, interval: float, ttl: float) -> None:
        """New budgets, for the calls that start from now on (a call running
        keeps the budget it started with, and a joined call the TTL cap it
        started with)."""
        self.interval = interval
        self.ttl = ttl
        #: Seconds a call (with its retries) may take before it is abandoned.
        self.budget = CALL_BUDGET * interval

    def in_flight(self) -> list[asyncio.Task[Any]]:
        """The joined calls still running (for the loop to cancel at its end)."""
        return [t for t in self._inflight.values() if not t.done()]

    async def settled(self, key: str) -> None:
        """Until the joined call `key` in flight (if any) has ended, however."""
        task = self._inflight.get(key)
        if task is not None and not task.done():
            await asyncio.wait({task})

    async def bounded(self, what: str, call: Callable[[], Awaitable[T]], *,
                      budget: float | None = None) -> T:
        """`call()` within `budget` (never less than the interval's), retried;
        cancelled past it."""
        async def attempt(left: float) -> T:
            async with asyncio.timeout(left):
                return await call()

        return await self._retried(what, self.budget if budget is None
                                   else max(self.budget, budget), attempt)

    async def joined(self, key: str, what: str, call: Callable[[], Awaitable[T]]) -> T:
        """`call()` within the budget, retried; past it the caller stops
        waiting, and the next caller with the same `key` joins the call."""
        async def attempt(left: float) -> T:
            task: asyncio.Task[T] | None = self._inflight.get(key)
            if task is None or task.done():
                task = asyncio.create_task(self._capped(call), name=f"shardlease-{key}")
                # Its failure may reach nobody (every caller gave up): it is
                # retrieved here, not reported at garbage collection.
                task.add_done_callback(_retrieve)
                self._inflight[key] = task
            # Not asyncio.wait_for: on Python 3.11 it drops a cancellation
            # that comes in the turn the call answers (the caller, a task of
            # the loop being aborted, then went on for ever).
            async with asyncio.timeout(left):
                return await asyncio.shield(task)

        return await self._retried(what, self.budget, attempt)

    async def _retried(self, what: str, budget: float,
                       attempt: Callable[[float], Awaitable[T]]) -> T:
        """Tries `attempt(seconds left)` until it answers or the budget ends:
        failures are retried after a pause doubling from RETRY_FIRST up to
        RETRY_MAX of the interval, jittered, never sleeping past the budget."""
        end = self.clock.monotonic() + budget
        pause = RETRY_FIRST * self.interval
        while True:
            try:
                return await attempt(max(0.0, end - self.clock.monotonic()))
            except TimeoutError:
                raise StoreError(f"{what}: no answer within {budget:.3g}s") from None
            except StoreError:
                wait = pause * self.rng.uniform(0.5, 1.5)
                if self.clock.monotonic() + wait >= end:
                    raise
            await asyncio.sleep(wait)
            pause = min(pause * 2, RETRY_MAX * self.interval)

    async def _capped(self, call: Callable[[], Awaitable[T]]) -> T:
        ttl = self.ttl
        try:
            async with asyncio.timeout(ttl):
                return await call()
        except TimeoutError:
            raise StoreError(f"no answer within a lease TTL ({ttl:g}s)") from None


def _retrieve(task: asyncio.Task[Any]) -> None:
    if not task.cancelled():
        task.exception()
