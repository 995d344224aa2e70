"""This node's own epoch (node-mode renewal, docs/renewal.md rules 1, 2, 5, 7).

One record per (node, epoch), written by compare-and-swap every interval: that
write is the renewal of every node-mode lease of the epoch, whose deadline is
the send time of the last successful write + the epoch's TTL - margin. A
refused write means a peer ended the epoch (it saw it unchanged for a TTL): the
shards of the epoch are fenced and a new epoch starts. What this node sees of
*other* nodes' epochs is `epochs.EpochWatch`; which shards are held is the
keeper's (`shards_of`). This module knows no lease.
"""

from __future__ import annotations

import asyncio
import functools
import hashlib
import logging
from collections.abc import Callable

from shardlease.calls import Calls
from shardlease.clock import Clock
from shardlease.errors import Conflict, StoreError
from shardlease.records import Epoch, encode_shards, new_write_id
from shardlease.runner import Runner
from shardlease.stores.base import LeaseStore
from shardlease.telemetry import EpochEnded, RenewFailed, Telemetry

logger = logging.getLogger("shardlease.loop")


class OwnEpoch:
    """This node's epoch: its id, its record's version, and the deadline its
    last successful write gives every shard of it."""

    def __init__(self, store: LeaseStore, calls: Calls, clock: Clock, telemetry: Telemetry,
                 runner: Runner, *, cluster: str, name: str, incarnation: str, ttl: float,
                 margin: Callable[[], float], next_ttl: Callable[[], float],
                 shards_of: Callable[[str], list[int]],
                 on_lost: Callable[[str], None]) -> None:
        self.store, self.calls, self.clock = store, calls, clock
        self.telemetry, self.runner = telemetry, runner
        self.cluster, self.name, self.incarnation = cluster, name, incarnation
        #: The options' margin, and the TTL a new epoch takes: both as of now.
        self.margin, self.next_ttl = margin, next_ttl
        #: The held node-mode shards of an epoch that are not closed (the keeper's).
        self.shards_of = shards_of
        #: Told when a peer ended one of our epochs (so that our watch knows it).
        self.on_lost = on_lost
        # -- mutable state
        self.epoch = incarnation
        self._count = 0
        #: Every epoch this node has had (its strays may name any of them).
        self.all: set[str] = {self.epoch}
        self._seq = 0
        self.version: str | None = None
        #: The TTL of the current epoch: fixed for the epoch, written in its leases.
        self.ttl = ttl
        #: Deadline of every node-mode shard of the current epoch (monotonic).
        self.deadline: float | None = None
        self.retired = False
        #: A graceful stop under `handoff: hold`: the end keeps the epoch's
        #: leases for this node's name this many seconds (`Epoch.hold`).
        self.hold = 0.0
        #: A create of the current epoch's record was sent and never answered
        #: (it may have landed): the epoch is never created again (below).
        self._created_unheard = False
        #: Epochs left after a create went unanswered: their records may
        #: exist (with no lease: none was claimed without an answer), and a
        #: graceful stop deletes them (`_delete_unheard`).
        self.unheard: list[str] = []
        self._lock = asyncio.Lock()

    def valid(self) -> bool:
        """Whether a claim may be tied to the epoch now (rule 2)."""
        return self.version is not None and self.deadline is not None \
            and self.deadline > self.clock.monotonic() and not self.retired

    async def beat(self, *, silent: bool = False) -> bool:
        """One write of the epoch record (rule 1). `silent`: write nothing
        while no shard depends on it (a withdrawn node: peers stop counting
        it). False after a failure, so that the next try comes sooner."""
        async with self._lock:
            if self.retired:
                return True
            epoch = self.epoch
            held = self.shards_of(epoch)
            if silent and not held:
                return True
            if self.version is None and self._created_unheard:
                # Its create may have landed unheard, and a peer may since
                # have ended and deleted that record as a silent epoch's: a
                # create now could bring an ended epoch back, one a peer takes
                # leases of at once. A new epoch id cannot be mistaken.
                logger.info("the create of epoch %s went unanswered: going on with a new one",
                            epoch)
                self.unheard.append(epoch)
                self._next(self.next_ttl())
                epoch, held = self.epoch, self.shards_of(self.epoch)
            self._seq += 1
            # The record says what it keeps (a peer that finds one of these
            # records damaged learns its keeper here), and its success extends
            # exactly that: a shard opened while it was in flight keeps the
            # deadline its claim gave it until a write names it.
            record = Epoch(cluster=self.cluster, node=self.name, epoch=epoch, seq=self._seq,
                           write_id=new_write_id(), at=self.clock.wall(), ttl=self.ttl,
                           keeps=encode_shards(held))
            sent = self.clock.monotonic()
            # Useful until the shards' deadline, like a renewal.
            budget = self.deadline - sent if held and self.deadline is not None else None
            version = self.version
            try:
                written = await self.calls.bounded(
                    "epoch renewal", lambda: self.store.write_epoch(record, version),
                    budget=budget)
            except Conflict:
                if await self._still_ours(epoch):
                    if version is None and self.version is None:
                        self._created_unheard = True  # (it exists; whose, unknown)
                    return False  # an earlier write of ours; its version is taken
                self._lost(epoch)
                return False
            except StoreError as e:
                if version is None:
                    self._created_unheard = True
                logger.warning("epoch renewal failed (%d shard(s) depend on it): %s",
                               len(held), e)
                if held:
                    self.telemetry.emit(RenewFailed(cluster=self.cluster, node=self.name,
                                                    shards=tuple(sorted(held)), error=str(e)))
                return False
            self.version = written
            self.deadline = sent + self.ttl - self.margin()
            still = set(self.shards_of(epoch))
            for shard in held:
                if shard in still:
                    self.runner.extend(shard, self.deadline)
            self.runner.flush()  # the host learns the moved deadlines, in one call
        return True

    async def _still_ours(self, epoch: str, budget: float | None = None) -> bool:
        """A write of our epoch conflicted: with an earlier write of ours whose
        answer was lost and never recognised (the record is ours, not ended:
        take its version, and write again next time; the deadline does not
        move, since when that write was sent is unknown), or with a peer's
        end (or a deletion). A record that cannot be read is not taken for an
        end either: raised as a failure."""
        try:
            current = await self.calls.bounded(
                "read of our epoch", functools.partial(self.store.get_epoch, self.cluster,
                                                       self.name, epoch), budget=budget)
        except StoreError as e:
            logger.warning("epoch renewal conflicted and our epoch could not be read: %s", e)
            return True  # unknown: retried, and fenced at the deadline if it stays so
        if current is None or current.record is None or current.record.ended_by is not None:
            return False
        logger.info("an earlier epoch write of ours had landed; resuming from it")
        self.version = current.version
        return True

    def _lost(self, epoch: str) -> None:
        """Our epoch record was ended (or deleted) by a peer, which saw it
        unchanged for a TTL: every lease of the epoch may be taken. Fence
        them all now and go on with a new epoch (rule 5)."""
        shards = self.shards_of(epoch)
        logger.error("epoch %s was ended by a peer (our renewals were not seen for a TTL): "
                     "fencing %d shard(s), starting a new epoch", epoch, len(shards))
        self.on_lost(epoch)
        self.runner.fence(shards)
        self.telemetry.emit(EpochEnded(cluster=self.cluster, node=self.name, owner=self.name,
                                       epoch=epoch, shards=tuple(sorted(shards))))
        self._next(self.next_ttl())

    async def give_up(self, why: str, close: Callable[[list[int]], None]) -> None:
        """Stop keeping the current epoch (after any write of it in flight) so
        that peers see it silent, end it and take its leases: `close` is
        given its shards (closed now, fenced at the epoch's deadline at the
        latest: the next epoch extends none of them)."""
        async with self._lock:
            if self.retired:
                return
            shards = self.shards_of(self.epoch)
            logger.error("%s: giving up epoch %s so that peers may take its leases "
                         "(closing %d shard(s))", why, self.epoch, len(shards))
            close(shards)
            self._next(self.next_ttl())

    def _next(self, ttl: float) -> None:
        # Derived, not random: unique per incarnation, and a simulation replays it.
        self._count += 1
        self.epoch = hashlib.blake2b(f"{self.incarnation}/{self._count}".encode(),
                                     digest_size=16).hexdigest()
        self.all.add(self.epoch)
        self.version = None
        self.deadline = None
        self.ttl = ttl
        self._created_unheard = False

    async def end(self) -> bool:
        """A graceful stop, once no shard of the epoch is open any more: write
        the epoch ended (by us) with one compare-and-swap, so that every lease
        of it may be taken at once (peers read an ended record as over, and
        a listing that shows it ended makes them read it: a round, not a TTL
        of silence). No further write of the epoch follows. True if it is
        ended; False if that could not be written (a failure, logged: peers
        then wait for the silence, as after a crash)."""
        async with self._lock:
            self.retired = True
            started = self.clock.monotonic()
            try:
                return await self._end(started)
            finally:
                # After the end, which peers wait for, not before it: the
                # records of creates that went unanswered (peers collect them
                # after two TTLs of silence anyway). Before it, on a slow store
                # they took the end past its TTL (sim (g), seed 3542864437).
                await self._delete_unheard()

    async def _end(self, started: float) -> bool:
        """The end itself (`end`, under the lock)."""
        if self.version is None:
            return False  # never written (or lost): nothing of it to end
        if (still := self.shards_of(self.epoch)):
            # (Not reached: the loop ends the epoch once nothing is held.)
            logger.error("not ending epoch %s: shard(s) %s not closed yet; their leases "
                         "are taken after a TTL of silence", self.epoch, sorted(still))
            return False
        self._seq += 1
        record = Epoch(cluster=self.cluster, node=self.name, epoch=self.epoch,
                       seq=self._seq, write_id=new_write_id(), at=self.clock.wall(),
                       ttl=self.ttl, ended_by=self.name, keeps="", hold=self.hold)
        for _ in range(2):
            version = self.version
            try:
                # Useful until peers would end it themselves: a TTL, not
                # one round's budget (cut there, a slow store left every
                # lease to a TTL of silence: the graceful-stop process
                # test on MinIO; sim (g) with the swarm's slow_stop kind).
                await self.calls.bounded("end of our epoch", functools.partial(
                    self.store.write_epoch, record, version), budget=self.ttl)
            except Conflict:
                # A beat of ours cut short by the stop may have landed
                # unheard: then ours, at a version we did not know.
                if not await self._still_ours(self.epoch, budget=self.ttl):
                    logger.info("our epoch %s was ended by a peer first", self.epoch)
                    return True
                continue
            except StoreError as e:
                logger.warning("could not end our epoch %s (version %s) in %.3gs: %s",
                               self.epoch, version, self.clock.monotonic() - started, e)
                break
            logger.info("ended our epoch %s in %.3gs: its leases may be taken at once",
                        self.epoch, self.clock.monotonic() - started)
            return True
        logger.warning("could not end our epoch %s: peers take its leases after a TTL "
                       "of silence", self.epoch)
        return False

    async def retire(self) -> None:
        """Stop renewing the epoch and delete its record (after any write of
        it in flight): leases of the epoch still held are then fenced at its
        deadline, and peers wait a TTL after they see it gone (rule 7)."""
        async with self._lock:
            self.retired = True
            if self._created_unheard:
                self.unheard.append(self.epoch)
            try:
                if self.version is not None:
                    await self.calls.bounded(
                        "epoch deletion",
                        lambda: self.store.delete_epoch(self.cluster, self.name, self.epoch),
                        budget=self.ttl)
                    self.version = None
            finally:
                await self._delete_unheard()  # (after: see `end`)

    async def _delete_unheard(self) -> None:
        """Delete the records that unanswered creates may have left (a stop:
        otherwise peers collect them after two TTLs of silence)."""
        for epoch in list(self.unheard):
            try:
                await self.calls.bounded(f"deletion of epoch {epoch}", functools.partial(
                    self.store.delete_epoch, self.cluster, self.name, epoch), budget=self.ttl)
            except StoreError as e:
                logger.info("could not delete epoch %s (its create went unanswered): %s",
                            epoch, e)
                continue
            self.unheard.remove(epoch)
