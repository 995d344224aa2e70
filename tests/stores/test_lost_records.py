"""Records edited or deleted behind the loop's back, end to end: the real
placement loop and runner on the memory store, in virtual time.

The generation is the fencing token: a claim that hands out a generation the
shard already passed lets a stale writer's writes through. These are the
faults of issue #8 item 5 as a node sees them.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable, Coroutine
from typing import Any

from shardlease.clock import LoopClock
from shardlease.loop import PlacementLoop
from shardlease.options import Options
from shardlease.records import encode, new_write_id
from shardlease.sim.fakes import StrictHost, recorder
from shardlease.sim.vloop import run_virtual
from shardlease.stores.memory import MemoryBackend, MemoryStore
from shardlease.telemetry import Claim, CorruptLease, Event, Telemetry

from .contract import make_lease

CLUSTER = "c"
TTL = 15.0


class Node:
    """One node's loop on a memory store of `backend`, recording its events."""

    def __init__(self, name: str, backend: MemoryBackend, shards: int = 1) -> None:
        self.store = MemoryStore(backend, name="lost-records")
        self.host = StrictHost()
        telemetry = Telemetry()
        self.events = recorder(telemetry)
        options = Options(shards=shards, name=name, cluster_name=CLUSTER, lease_ttl=TTL)
        self.loop = PlacementLoop(self.store, self.host, options, clock=LoopClock(),
                                  telemetry=telemetry)
        self.task = asyncio.create_task(self.loop.run())

    def of(self, kind: type[Event]) -> list[tuple[float, Any]]:
        return [(t, ev) for t, ev in self.events if isinstance(ev, kind)]

    async def stop(self) -> None:
        await self.loop.stop()
        await self.task
        assert self.host.problems == []


async def until_claimed(node: Node) -> None:
    """Until the node claims something, or ten TTLs of virtual time."""
    for _ in range(int(10 * TTL)):
        if node.of(Claim):
            return
        await asyncio.sleep(1)


def run(scenario: Callable[[], Coroutine[Any, Any, None]]) -> None:
    run_virtual(scenario())


def held_by_ghost(generation: int, **changes: Any) -> bytes:
    """A lease of shard 0 held by a node that never renews it."""
    record = json.loads(encode(make_lease(shard=0, owner="ghost", generation=generation,
                                          cluster=CLUSTER)))
    record.update(changes)
    return json.dumps({k: v for k, v in record.items() if v is not ...}).encode()


def test_a_fresh_node_claims_over_a_corrupt_record_above_its_generation() -> None:
    # A hand edit dropped the write id of a lease at generation 57.
    async def scenario() -> None:
        backend = MemoryBackend()
        MemoryStore(backend).put_raw_lease(CLUSTER, 0, held_by_ghost(57, write_id=...))
        node = Node("fresh", backend)
        await until_claimed(node)
        await node.stop()
        [(_, corrupt)] = node.of(CorruptLease)
        assert "write_id" in corrupt.error
        [(claimed_at, claim)] = node.of(Claim)
        assert claim.generation == 58
        assert claimed_at > TTL, "a corrupt record is held until it expires"

    run(scenario)


def test_a_record_with_a_huge_ttl_is_taken_over_after_the_readers_own_ttl() -> None:
    async def scenario() -> None:
        backend = MemoryBackend()
        MemoryStore(backend).put_raw_lease(CLUSTER, 0, held_by_ghost(3, ttl=1e12))
        node = Node("fresh", backend)
        await until_claimed(node)
        await node.stop()
        [(_, corrupt)] = node.of(CorruptLease)
        assert "ttl" in corrupt.error
        [(claimed_at, claim)] = node.of(Claim)
        assert claim.generation == 4
        assert TTL < claimed_at <= 2 * TTL

    run(scenario)


def test_a_lease_deleted_while_held_stays_held_for_a_ttl_after_it_vanished() -> None:
    async def scenario() -> None:
        backend = MemoryBackend()
        ghost = MemoryStore(backend)
        version = await ghost.create_lease(make_lease(shard=0, owner="ghost", generation=9,
                                                      cluster=CLUSTER))
        node = Node("watcher", backend)
        # The ghost keeps renewing while the watcher looks, then the lease is deleted.
        for _ in range(3):
            await asyncio.sleep(TTL / 3)
            current = await ghost.get_lease(CLUSTER, 0)
            assert current is not None and current.record is not None
            version = await ghost.update_lease(
                current.record.model_copy(update={"write_id": new_write_id()}), version)
        backend.leases.pop((CLUSTER, 0))
        deleted_at = asyncio.get_running_loop().time()
        await until_claimed(node)
        await node.stop()
        [(claimed_at, claim)] = node.of(Claim)
        assert claimed_at >= deleted_at + TTL, (claimed_at, deleted_at)
        assert claim.generation == 10
        [(_, vanished)] = node.of(CorruptLease)
        assert "deleted" in vanished.error and "ghost" in vanished.error

    run(scenario)
