"""Heartbeats: this node's own (shard mode), and which peers are live by theirs.

A shard-mode node writes its heartbeat every interval; a node-mode node writes
none (its epoch is its heartbeat) but still lists them, so that peers in shard
mode (a cluster switching modes) count for the share. A peer is live while its
heartbeat's version has changed within a TTL, judged on this node's monotonic
clock (`observed`); a deleted heartbeat is a graceful stop. A listing that
fails keeps the live set the last good one showed: a failed read must never
make this node think itself alone.

Each heartbeat also says how long its node may hold a lease (`holds_by`: the
longest TTL its held leases were last written with), which a node refused
as outdated reads afresh (`holds_by_all`) for how long to keep the shard
from every node (`keeper.refusal_hold`).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Mapping

from shardlease.calls import Calls
from shardlease.clock import Clock
from shardlease.errors import CorruptRecord, StoreError
from shardlease.observed import Observed
from shardlease.records import Heartbeat, new_write_id
from shardlease.stores.base import LeaseStore

logger = logging.getLogger("shardlease.loop")


class Heartbeats:
    def __init__(self, store: LeaseStore, calls: Calls, clock: Clock, *, cluster: str,
                 name: str, incarnation: str, ttl: Callable[[], float], writes: bool,
                 holds_by: Callable[[], float]) -> None:
        self.store, self.calls, self.clock = store, calls, clock
        self.cluster, self.name, self.incarnation, self.ttl = cluster, name, incarnation, ttl
        #: What each heartbeat says of this node's leases (`Heartbeat.holds_by`).
        self.holds_by = holds_by
        #: What the last heartbeat of this node that landed said (`holds_by`):
        #: no lease of this node is written with a longer TTL
        #: (`keeper.Keeper.writable_ttl`), so that a node refused as outdated,
        #: reading every heartbeat, never waits less than an owner holds by
        #: (regression seed-3062478051: a TTL raised in place landed in a
        #: lease before the heartbeat said it). 0: none landed yet.
        self.announced = 0.0
        # -- mutable state
        self._seen: Observed[str, None] = Observed()
        #: The nodes live by their heartbeats in the last good listing.
        self.live: set[str] = set()
        #: The last listing as the store gave it, for the lease listing to be
        #: told of (`stores.base.Listed`); None until one succeeded, and after
        #: one failed.
        self.listing: Mapping[str, str] | None = None
        self._seq = 0
        #: Whether this node has no heartbeat in the store (node mode writes none).
        self.deleted = not writes
        # Held by a heartbeat write and by its deletion: a graceful stop must
        # not delete the heartbeat while a write of it is on its way.
        self._lock = asyncio.Lock()

    async def read(self) -> set[str]:
        """The nodes live by their heartbeats (this node's own included, if it
        beats), or the last good listing's if this one fails."""
        try:
            beats = await self.calls.joined("heartbeats", "heartbeat listing",
                                            lambda: self.store.list_heartbeats(self.cluster))
        except StoreError as e:
            logger.warning("could not read heartbeats, keeping the last live set: %s", e)
            self.listing = None
            return self.live
        self.listing = beats
        now = self.clock.monotonic()
        for node, version in beats.items():
            self._seen.see(node, version, now)
        self._seen.forget_except(beats)  # deleted: a graceful stop
        ttl = self.ttl()
        self.live = {n for n, seen in self._seen.items() if now - seen.since <= ttl}
        return self.live

    async def beat(self, *, stopping: Callable[[], bool]) -> bool:
        """Write this node's heartbeat (not once a stop began); whether it landed."""
        async with self._lock:
            if stopping():
                return False
            self.deleted = False
            self._seq += 1
            hb = Heartbeat(cluster=self.cluster, node=self.name, incarnation=self.incarnation,
                           seq=self._seq, write_id=new_write_id(), at=self.clock.wall(),
                           holds_by=self.holds_by())
            try:
                await self.calls.joined("heartbeat", "heartbeat",
                                        lambda: self.store.put_heartbeat(hb))
            except StoreError as e:
                logger.warning("heartbeat failed: %s", e)
                return False
            self.announced = hb.holds_by
            return True

    def landed_holds_by(self) -> float:
        """What the last heartbeat that landed said of this node (`announced`)."""
        return self.announced

    async def holds_by_all(self) -> list[float] | None:
        """What every heartbeat of the cluster says now of how long its node
        may hold a lease (`Heartbeat.holds_by`; 0 for a heartbeat older than
        the field), read afresh (a listing, then each one), within one call
        budget; None if any of them could not be read (failed, corrupt, of a
        newer format): the caller cannot tell how long that node holds."""
        async def read() -> list[float]:
            beats = await self.store.list_heartbeats(self.cluster)
            found = await asyncio.gather(*(self.store.get_heartbeat(self.cluster, node)
                                           for node in sorted(beats)))
            # (Deleted since the listing: a graceful stop, or withdrawn with
            # nothing open.)
            return [hb.holds_by for hb in found if hb is not None]

        try:
            return await self.calls.bounded("heartbeat reads", read)
        except (StoreError, CorruptRecord) as e:
            logger.warning("could not read the heartbeats: %s", e)
            return None

    async def delete(self) -> None:
        """After any heartbeat write in flight, so that it cannot land after
        (also one its caller gave up waiting for: it goes on, up to a TTL)."""
        async with self._lock:
            await self.calls.settled("heartbeat")
            await self.store.delete_heartbeat(self.cluster, self.name)
            self.deleted = True
