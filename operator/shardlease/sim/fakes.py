"""Strict fakes for unit tests of the loop and the runner (virtual time).

`StrictHost` records every call with the loop's time and notes (in
`problems`, to assert empty at the end of a test) any call the runner must
never make: two calls at once for a shard, an open of a shard already open, a
close of a shard never opened. It does not raise on those: an exception from
the host would be taken by the runner as a failed open or close and hidden.

`ScriptedStore` is a `MemoryStore` whose calls can be made to fail (`fail`:
method name -> how many of the next calls fail; `broken`: methods that always
fail; `lose_reply`: method name -> how many of the next calls are applied and
then fail, as if the answer was lost), to be slow (`delay`: method name ->
seconds), or to be watched (`before`: method name -> hook called with the
arguments).
"""

from __future__ import annotations

import asyncio
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from shardlease.errors import HostError, StoreError
from shardlease.records import Epoch, Heartbeat, Lease, Stored
from shardlease.stores.base import Listed
from shardlease.stores.memory import MemoryBackend, MemoryStore
from shardlease.telemetry import Event, Telemetry


@dataclass(frozen=True)
class Call:
    t: float
    op: str  # open, opened, open_failed, open_cancelled, close, closed, close_failed,
    # close_cancelled
    shard: int
    generation: int | None = None


class StrictHost:
    def __init__(self) -> None:
        self.calls: list[Call] = []
        self.problems: list[str] = []
        self.open_now: dict[int, int] = {}
        self.in_call: dict[int, str] = {}
        self.opening = 0
        self.max_opening = 0
        #: open(shard) waits for this event when one is set for the shard.
        self.open_gates: dict[int, asyncio.Event] = {}
        #: open(shard) waits this long.
        self.open_delay: dict[int, float] = {}
        #: open(shard) raises this.
        self.open_errors: dict[int, BaseException] = {}
        #: close(shard) fails this many more times.
        self.close_failures: Counter[int] = Counter()
        #: close(shard) waits this long.
        self.close_delay: dict[int, float] = {}
        #: close(shard) raises this (once), instead of HostError.
        self.close_raises: dict[int, BaseException] = {}
        #: called at the start of each close (e.g. to look at the store then).
        self.on_close: Callable[[int], None] | None = None

    @staticmethod
    def _now() -> float:
        return asyncio.get_running_loop().time()

    def ops(self, shard: int | None = None) -> list[str]:
        return [c.op for c in self.calls if shard is None or c.shard == shard]

    def times(self, op: str, shard: int) -> list[float]:
        return [c.t for c in self.calls if c.op == op and c.shard == shard]

    async def open(self, shard: int, generation: int) -> None:
        if shard in self.in_call:
            self.problems.append(f"open({shard}) during its {self.in_call[shard]}")
        if shard in self.open_now:
            self.problems.append(f"open({shard}) while it is open")
        self.calls.append(Call(self._now(), "open", shard, generation))
        self.in_call[shard] = "open"
        self.opening += 1
        self.max_opening = max(self.max_opening, self.opening)
        try:
            if (gate := self.open_gates.get(shard)) is not None:
                await gate.wait()
            if (delay := self.open_delay.get(shard)) is not None:
                await asyncio.sleep(delay)
            if (error := self.open_errors.get(shard)) is not None:
                self.calls.append(Call(self._now(), "open_failed", shard, generation))
                raise error
            self.open_now[shard] = generation
            self.calls.append(Call(self._now(), "opened", shard, generation))
        except asyncio.CancelledError:
            self.calls.append(Call(self._now(), "open_cancelled", shard, generation))
            raise
        finally:
            self.opening -= 1
            self.in_call.pop(shard, None)

    async def close(self, shard: int) -> None:
        if shard in self.in_call:
            self.problems.append(f"close({shard}) during its {self.in_call[shard]}")
        if not any(c.op == "open" and c.shard == shard for c in self.calls):
            self.problems.append(f"close({shard}) of a shard never opened")
        self.calls.append(Call(self._now(), "close", shard))
        if self.on_close is not None:
            self.on_close(shard)
        self.in_call[shard] = "close"
        try:
            await asyncio.sleep(self.close_delay.get(shard, 0))
            if (exc := self.close_raises.pop(shard, None)) is not None:
                raise exc
            if self.close_failures[shard] > 0:
                self.close_failures[shard] -= 1
                self.calls.append(Call(self._now(), "close_failed", shard))
                raise HostError(f"close of {shard} failed")
            self.open_now.pop(shard, None)
            self.calls.append(Call(self._now(), "closed", shard))
        except asyncio.CancelledError:
            self.calls.append(Call(self._now(), "close_cancelled", shard))
            raise
        finally:
            self.in_call.pop(shard, None)


class ScriptedStore(MemoryStore):
    def __init__(self, backend: MemoryBackend | None = None, name: str = "scripted") -> None:
        super().__init__(backend, name)
        self.fail: Counter[str] = Counter()
        self.broken: set[str] = set()
        self.lose_reply: Counter[str] = Counter()
        self.delay: dict[str, float] = {}
        self.before: dict[str, Callable[..., None]] = {}
        self.calls: list[tuple[float, str]] = []

    async def _gate(self, method: str, *args: Any) -> None:
        self.calls.append((asyncio.get_running_loop().time(), method))
        if (hook := self.before.get(method)) is not None:
            hook(*args)
        if (d := self.delay.get(method)) is not None:
            await asyncio.sleep(d)
        if method in self.broken:
            raise StoreError(f"{method} is broken")
        if self.fail[method] > 0:
            self.fail[method] -= 1
            raise StoreError(f"{method} failed")

    def _after(self, method: str) -> None:
        if self.lose_reply[method] > 0:
            self.lose_reply[method] -= 1
            raise StoreError(f"{method}: the reply was lost")

    async def list_leases(self, cluster: str, *,
                          seen: Listed | None = None) -> dict[int, Stored[Lease]]:
        await self._gate("list_leases", cluster)
        return await super().list_leases(cluster, seen=seen)

    async def get_lease(self, cluster: str, shard: int) -> Stored[Lease] | None:
        await self._gate("get_lease", cluster, shard)
        return await super().get_lease(cluster, shard)

    async def create_lease(self, lease: Lease) -> str:
        await self._gate("create_lease", lease)
        version = await super().create_lease(lease)
        self._after("create_lease")
        return version

    async def update_lease(self, lease: Lease, version: str) -> str:
        await self._gate("update_lease", lease, version)
        new = await super().update_lease(lease, version)
        self._after("update_lease")
        return new

    async def list_heartbeats(self, cluster: str) -> dict[str, str]:
        await self._gate("list_heartbeats", cluster)
        return await super().list_heartbeats(cluster)

    async def get_heartbeat(self, cluster: str, node: str) -> Heartbeat | None:
        await self._gate("get_heartbeat", cluster, node)
        return await super().get_heartbeat(cluster, node)

    async def put_heartbeat(self, heartbeat: Heartbeat) -> None:
        await self._gate("put_heartbeat", heartbeat)
        await super().put_heartbeat(heartbeat)
        self._after("put_heartbeat")

    async def delete_heartbeat(self, cluster: str, node: str) -> None:
        await self._gate("delete_heartbeat", cluster, node)
        await super().delete_heartbeat(cluster, node)

    async def list_epochs(self, cluster: str) -> dict[tuple[str, str], str]:
        await self._gate("list_epochs", cluster)
        return await super().list_epochs(cluster)

    async def get_epoch(self, cluster: str, node: str, epoch: str) -> Stored[Epoch] | None:
        await self._gate("get_epoch", cluster, node, epoch)
        return await super().get_epoch(cluster, node, epoch)

    async def create_epoch(self, record: Epoch) -> str:
        await self._gate("create_epoch", record)
        version = await super().create_epoch(record)
        self._after("create_epoch")
        return version

    async def update_epoch(self, record: Epoch, version: str) -> str:
        await self._gate("update_epoch", record, version)
        new = await super().update_epoch(record, version)
        self._after("update_epoch")
        return new

    async def delete_epoch(self, cluster: str, node: str, epoch: str) -> None:
        await self._gate("delete_epoch", cluster, node, epoch)
        await super().delete_epoch(cluster, node, epoch)


def recorder(telemetry: Telemetry) -> list[tuple[float, Event]]:
    """Subscribe a list that collects (loop time, event)."""
    events: list[tuple[float, Event]] = []
    telemetry.subscribe(lambda ev: events.append((asyncio.get_running_loop().time(), ev)))
    return events
