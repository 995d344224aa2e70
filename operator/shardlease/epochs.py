"""What one node sees of every node's epoch (node-mode renewal, docs/renewal.md).

Each epoch listed, and each epoch a node-mode lease names (missing ones too),
is tracked on this node's monotonic clock: its version and since when it has
been seen unchanged. From that: which nodes are live by their epoch, whether a
lease's epoch may be taken over (`over`), ending a silent epoch by a
compare-and-swap (`end`), reading the epochs that changed after a silence (a
peer may have ended them), and deleting the records of epochs that are over.
The loop owns its own epoch (its renewal); this class only watches.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable, Mapping

from shardlease.calls import Calls
from shardlease.clock import Clock
from shardlease.errors import Conflict, StoreError
from shardlease.observed import MISSING, Observed
from shardlease.records import MAX_LEASE_TTL, Epoch, Lease, Stored, new_write_id
from shardlease.stores.base import LeaseStore, ended_hints
from shardlease.telemetry import EpochEnded, Telemetry

logger = logging.getLogger("shardlease.loop")

#: An epoch is identified by a node name and an epoch id.
EpochKey = tuple[str, str]
#: Epoch records unchanged for this many TTLs, which no lease names, are
#: deleted by any node (crashed nodes' epochs), at most PER_ROUND a round.
EPOCH_GC_TTLS = 2.0
PER_ROUND = 4


class EpochWatch:
    def __init__(self, store: LeaseStore, calls: Calls, clock: Clock, telemetry: Telemetry, *,
                 cluster: str, name: str, ttl: Callable[[], float],
                 own: Callable[[], str]) -> None:
        self.store = store
        self.calls = calls
        self.clock = clock
        self.telemetry = telemetry
        self.cluster = cluster
        self.name = name
        #: This node's lease TTL now, and its current epoch id (both change).
        self.ttl = ttl
        self.own = own
        #: Each epoch tracked: its version (or MISSING) and since when.
        self.seen: Observed[EpochKey, None] = Observed()
        #: Epochs known to be over (ended by a compare-and-swap this node saw
        #: succeed, or read ended) after a TTL of silence judged against the
        #: TTL its leases carry: their leases may be claimed at once.
        self.ended: set[EpochKey] = set()
        #: Epochs read ended by their owner with a hold: (hold, since when
        #: this node knows it, monotonic). Their leases are kept for the
        #: owner's name that long (`over`).
        self.reserved: dict[EpochKey, tuple[float, float]] = {}
        #: Epochs this node ended as garbage (no lease named them then). Such
        #: an end is no licence to take a lease that names the epoch later: it
        #: waited for nothing a lease says (a claim of its owner's may have
        #: landed since), so such a lease waits out its TTL as if the epoch
        #: were silent (`over`).
        self.collected: set[EpochKey] = set()
        #: The TTL the record of an epoch says, read once per version when it
        #: is a garbage candidate: it is not collected before it has been
        #: silent for EPOCH_GC_TTLS times the longer of that and our own TTL.
        self._record_ttl: dict[EpochKey, tuple[str, float]] = {}
        #: Epochs whose version changed after a silence: perhaps ended by a
        #: peer (read to find out, so this node need not wait another TTL).
        self.suspects: dict[EpochKey, None] = {}  # ordered: simulations replay
        #: False until a listing succeeded, and after one failed.
        self.fresh = False
        #: Since when every listing has succeeded (None: the last one failed,
        #: or none was made), and when an epoch last vanished from them
        #: without being seen ended: deleted records say nothing of what they
        #: kept, so a damaged record nobody is known to keep waits a TTL past
        #: both (`LeaseView.attribute`).
        self.watching_since: float | None = None
        self.vanished_at = float("-inf")
        #: When the last listing was taken in (`observe`): what `live` judges by.
        self.observed_at: float | None = None

    async def read(self) -> dict[EpochKey, str] | None:
        """The epoch listing, or None (logged) if it failed."""
        try:
            epochs = await self.calls.joined("epochs", "epoch listing",
                                             lambda: self.store.list_epochs(self.cluster))
        except StoreError as e:
            logger.warning("could not read the epochs, no node-mode claims this round: %s", e)
            self.fresh = False
            self.watching_since = None
            return None
        if not self.fresh or self.watching_since is None:
            self.watching_since = self.clock.monotonic()
        self.fresh = True
        return epochs

    def unread(self) -> None:
        """No listing this round (none wanted): nothing is fresh."""
        self.fresh = False
        self.watching_since = None

    def observe(self, epochs: Mapping[EpochKey, str], named: Mapping[EpochKey, object]) -> None:
        """Track each listed epoch and each epoch a node-mode lease names
        (missing ones too)."""
        now = self.observed_at = self.clock.monotonic()
        # In listing order, then lease order: never a set's (hash) order, so
        # that a simulation replays the same way.
        for key in dict.fromkeys([*epochs, *named]):
            version = epochs.get(key, MISSING)
            seen = self.seen.get(key)
            if seen is None or seen.version != version:
                if seen is not None and key in named and MISSING not in (seen.version, version) \
                        and now - seen.since >= self.ttl() / 2 and key not in self.ended:
                    self.suspects[key] = None  # its owner writes every interval
                if seen is not None and version == MISSING and seen.version != MISSING \
                        and key not in self.ended and key not in self.collected:
                    # Gone unended while a lease (or a damaged record) names
                    # it: as for one that left the listing unnamed, what it
                    # kept is no longer said (regression seed-3834568044: an
                    # aborted node deleted its epoch with a shard unclosed,
                    # and a peer took that shard's deleted record 2.5 s on).
                    self.vanished_at = now
                self.seen.see(key, version, now)
        # Epochs the listing itself shows ended (a stopping node ends its own
        # once it has closed everything): read, and believed only then.
        for key in sorted(ended_hints(epochs)):  # (sorted: a simulation replays)
            if key not in self.ended and key != (self.name, self.own()):
                self.suspects[key] = None
        for key in set(self.seen.keys()) - set(epochs) - set(named):
            if key not in self.ended and key not in self.collected:
                self.vanished_at = now
            self.seen.forget(key)
            self.ended.discard(key)
            self.reserved.pop(key, None)
            self.collected.discard(key)
            self._record_ttl.pop(key, None)

    def live(self) -> set[str]:
        """The nodes with an epoch that is not over and had changed within a
        TTL when the last listing was taken in: the reads that follow it in a
        round (suspects, on a slow store) must not age what it showed."""
        now = self.observed_at if self.observed_at is not None else self.clock.monotonic()
        return {node for (node, epoch), seen in self.seen.items()
                if seen.version != MISSING and (node, epoch) not in self.ended
                and (node, epoch) not in self.collected and now - seen.since <= self.ttl()}

    async def collect(self, named: Mapping[EpochKey, object]) -> None:
        """Delete epoch records no lease names that are over, or unchanged for
        EPOCH_GC_TTLS times the longer of our TTL and the record's own
        (crashed nodes'; an epoch keeps the TTL it started with, which may be
        longer than ours after an in-place change, and its owner is valid for
        that long). One not known to be over is first ended by a
        compare-and-swap against the version seen: a view that is stale (the
        owner wrote since) fails it and deletes nothing, so a live node never
        loses its epoch to another node's garbage collection."""
        now = self.clock.monotonic()
        own_wait = EPOCH_GC_TTLS * self.ttl()
        dead = [key for key, seen in self.seen.items()
                if seen.version != MISSING and key not in named
                and key != (self.name, self.own())
                and (key in self.ended or key in self.collected
                     or now - seen.since > own_wait)]
        for key in dead[:PER_ROUND]:
            if key not in self.ended and key not in self.collected:
                if not await self._silent_for_its_ttl(key, now):
                    continue
                if not await self._end(key, garbage=True):
                    continue
            try:
                await self.calls.bounded(f"deletion of epoch {key[0]}/{key[1]}",
                                         functools.partial(self.store.delete_epoch,
                                                           self.cluster, *key))
            except StoreError as e:
                logger.info("could not delete the epoch %s/%s: %s", *key, e)

    async def _silent_for_its_ttl(self, key: EpochKey, now: float) -> bool:
        """Whether the epoch, seen unchanged for EPOCH_GC_TTLS of our TTL, has
        also been silent for EPOCH_GC_TTLS of the TTL its record says (read
        once per version)."""
        seen = self.seen.get(key)
        if seen is None:
            return False
        known = self._record_ttl.get(key)
        if known is None or known[0] != seen.version:
            read, stored = await self._read(key)
            if not read:
                return False
            if stored is None or stored.version != seen.version:
                return False  # gone or changed since the listing: the next one says
            # An unreadable record: nothing says how long its owner may be
            # valid, so it waits out the longest TTL any record may carry.
            ttl = stored.record.ttl if stored.record is not None else MAX_LEASE_TTL
            known = self._record_ttl[key] = (seen.version, ttl)
        return now - seen.since > EPOCH_GC_TTLS * max(self.ttl(), known[1])

    async def _read(self, key: EpochKey) -> tuple[bool, Stored[Epoch] | None]:
        """One epoch record read (within a call's budget): (False, None) if the
        read failed (logged), else (True, the record or None if missing)."""
        try:
            return True, await self.calls.bounded(
                f"read of epoch {key[0]}/{key[1]}",
                functools.partial(self.store.get_epoch, self.cluster, *key))
        except StoreError as e:
            logger.info("could not read the epoch %s/%s: %s", *key, e)
            return False, None

    async def keepers(self, own: set[str]) -> list[Epoch] | None:
        """Every epoch record of the cluster that is not ended, read afresh
        (a listing, then each one; not ours: `own`): who may keep a shard
        whose record is damaged, for a node that never saw it readable. None
        if any of it failed (nothing may be concluded then)."""
        try:
            listed = await self.calls.bounded("epoch listing",
                                              lambda: self.store.list_epochs(self.cluster))
        except StoreError as e:
            logger.info("could not list the epochs to find who keeps a damaged record: %s", e)
            return None
        records = []
        for key in listed:
            if key in self.ended or (key[0] == self.name and key[1] in own):
                continue
            read, stored = await self._read(key)
            if not read:
                return None
            if stored is None:
                continue  # deleted since the listing: retired or collected, over
            if stored.record is None:
                return None  # unreadable: it may keep anything, for a TTL nobody knows
            if stored.record.ended_by is None:
                records.append(stored.record)
        return records

    async def check_suspects(self) -> None:
        """Read the epochs that changed after a silence: one a peer ended is
        over, and its leases may be claimed now."""
        for key in list(self.suspects)[:PER_ROUND]:
            del self.suspects[key]
            read, stored = await self._read(key)
            if not read:
                continue
            if stored is not None and stored.record is not None and stored.record.ended_by:
                self._read_ended(key, stored.record)

    async def end(self, key: EpochKey) -> bool:
        """Take over a silent epoch (see `_end`)."""
        return await self._end(key)

    async def _end(self, key: EpochKey, garbage: bool = False) -> bool:
        """Take over a silent epoch: end it by a compare-and-swap against the
        version this node has seen unchanged for a TTL (or create it ended,
        if it has been missing that long). True once it is over. A garbage
        end (`collect`) goes into `collected`, not `ended`."""
        if key in self.ended or (garbage and key in self.collected):
            return True
        seen = self.seen.get(key)
        if seen is None or key == (self.name, self.own()):
            return False  # (never our own live epoch: that would fence us)
        node, epoch = key
        try:
            record = Epoch(cluster=self.cluster, node=node, epoch=epoch, seq=0,
                           write_id=new_write_id(), at=self.clock.wall(), ttl=self.ttl(),
                           ended_by=self.name)
        except ValueError:
            # Not an epoch any node writes (a hand-edited lease): nothing can
            # keep it alive, and it has been seen missing for a TTL.
            self.ended.add(key)
            return True
        version = None if seen.version == MISSING else seen.version
        try:
            await self.calls.bounded(f"end of epoch {node}/{epoch}",
                                     lambda: self.store.write_epoch(record, version))
        except Conflict:
            # Most often a peer that saw the same silence ended it first: read
            # once, so that this node takes its share of the leases in this
            # round, not the next (a record read ended is over, as in
            # `check_suspects`).
            read, stored = await self._read(key)
            if read and stored is not None and stored.record is not None \
                    and stored.record.ended_by is not None and not garbage:
                self._read_ended(key, stored.record)
                logger.info("epoch %s/%s was ended by %s first", node, epoch,
                            stored.record.ended_by)
                return True
            logger.info("epoch %s/%s changed since it was read: not taken over", node, epoch)
            return False
        except StoreError as e:
            logger.info("could not end the epoch %s/%s: %s", node, epoch, e)
            return False
        if garbage:  # (a crashed node's epoch nobody needs)
            self.collected.add(key)
            logger.info("ended the epoch %s of node %s, silent and holding nothing", epoch, node)
            return True
        self.ended.add(key)
        logger.warning("ended the epoch %s of node %s, silent for a TTL: taking its leases",
                       epoch, node)
        self.telemetry.emit(EpochEnded(cluster=self.cluster, node=self.name, owner=node,
                                       epoch=epoch))
        return True

    def reserved_for_owner(self, rec: Lease) -> bool:
        """Whether the lease's epoch was ended by its owner with a hold (its
        leases kept for the node of that name)."""
        return (rec.owner or "", rec.incarnation or "") in self.reserved

    def _read_ended(self, key: EpochKey, record: Epoch) -> None:
        """A record read ended: over; and if its owner ended it with a hold,
        its leases are kept for that node from now (this node's clock)."""
        self.ended.add(key)
        if record.hold > 0 and record.ended_by == record.node and key not in self.reserved:
            self.reserved[key] = (record.hold, self.clock.monotonic())

    def silent_for(self, key: EpochKey, now: float) -> float:
        """Seconds this node has seen the epoch unchanged (or missing); 0 if
        it is not tracked or no listing is fresh."""
        seen = self.seen.get(key)
        if not self.fresh or seen is None:
            return 0.0
        return now - seen.since

    def over(self, rec: Lease, now: float) -> bool:
        """A node-mode lease: claimable when its epoch is over, or has been
        seen unchanged (or missing) for a TTL, so that `end` may end it."""
        key = (rec.owner or "", rec.incarnation or "")
        if key in self.ended:
            if (held := self.reserved.get(key)) is not None and rec.owner != self.name:
                # Ended by its owner with a hold: kept for the node of that
                # name until this node has seen it ended for the hold.
                hold, since = held
                return now - since >= hold
            return True
        if rec.owner == self.name and rec.incarnation == self.own():
            return True  # our current epoch's, dropped after a failed open
        seen = self.seen.get(key)
        if not self.fresh or seen is None:
            return False
        return now - seen.since > max(self.ttl(), rec.ttl)
