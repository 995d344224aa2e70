"""The keeping of the leases this node holds: renew, hand over, free, lose.

Every write of a held lease goes through one step (`_write_step`): a
compare-and-swap on the version this node last wrote, within a budget up to
the shard's deadline; a conflict that is not this node's own earlier write
(a lost answer, recognised by the record still naming us with our generation)
means another node took it: the shard is lost at once. A renewal's deadline is
the time its first attempt was sent + the TTL it wrote - margin
(docs/renewal.md, "Changing the TTL"). Node-mode leases are renewed by the
node's epoch (`own_epoch.py`), not here; here are only their hand-overs and
frees.

Also here, because they are about this node's own leases: a lease whose record
changed under its node-mode owner (`check_held`), strays (leases naming this
process that it does not hold), and whether the node can write leases at all
(`withdrawn`). The keeper knows no placement and no listing but the one it is
given.
"""

from __future__ import annotations

import asyncio
import contextlib
import enum
import functools
import logging
import math
from collections.abc import Awaitable, Callable, Coroutine
from dataclasses import dataclass, field
from typing import Any

from shardlease.calls import Calls
from shardlease.clock import Clock
from shardlease.errors import Conflict, StoreError
from shardlease.options import Options
from shardlease.own_epoch import OwnEpoch
from shardlease.records import MAX_HOLD, MAX_LEASE_TTL, Lease, Stored, new_write_id
from shardlease.runner import Ended, Reason, Runner
from shardlease.stores.base import VANISHED, LeaseStore
from shardlease.telemetry import LeftToExpire, Lost, Release, RenewFailed, Telemetry

logger = logging.getLogger("shardlease.loop")

#: Store writes in flight at once for renewals, hand-overs and claims.
WRITE_CONCURRENCY = 32
#: A compare-and-swap against this version never succeeds: a withdrawn
#: node's probe of whether lease writes work again (`Keeper.probe`), a
#: Conflict being the answer that they do. Every store must refuse it as a
#: Conflict (the store contract checks): it is the largest resourceVersion
#: Kubernetes parses (etcd's revision never gets there; "0" would mean an
#: unconditional update there, and a non-number is an error), an ETag S3
#: never makes, and no version of the memory or file stores.
NO_SUCH_VERSION = "18446744073709551615"


class Phase(enum.Enum):
    """Where a lease this node holds stands. One state per shard, moved by the
    round (release), the runner (closed) and the renewals (freed)."""

    HELD = "held"  # ours: the runner opens or runs the shard; renewed
    RELEASING = "releasing"  # the runner is closing it to give it up; still renewed
    CLOSED = "closed"  # the runner closed it: free the lease, no more renewals


@dataclass
class Held:
    lease: Lease
    version: str
    phase: Phase = Phase.HELD
    #: Why the runner closed it (Phase.CLOSED): a fenced lease is not freed at any cost.
    reason: Reason | None = None
    #: Claimed above the share (free for longer than a TTL): released last.
    adopted: bool = False
    #: The "no owner" record being written, kept so that a retry carries the
    #: same write id and recognises an earlier attempt that landed.
    freeing: Lease | None = None
    #: When `version` last changed (monotonic): a listing started before
    #: that may show an older version, which is no sign of another writer.
    changed_at: float = 0.0
    #: When the runner closed it (monotonic): a node-mode lease its epoch
    #: keeps must be freed within a TTL of that, or the epoch is given up.
    closed_at: float | None = None
    #: Not freed before this (monotonic): its lease's expiry when the host
    #: may still have the shard open (its close did not succeed).
    free_after: float = -math.inf
    #: The round of this node that claimed it (placement gives back the
    #: newest first).
    claimed_in: int = 0
    #: The host has seen this generation (an open refused as outdated): the
    #: free writes it, so that the next claim is above it.
    floor: int = 0
    #: Seconds the free keeps the shard from every node (the refusal's wait,
    #: `view.LeaseView.refusal_wait`; 0: none). Why a field: the view
    #: judges it when the refusal comes, the free writes it later.
    reserve: float = 0.0
    #: Claimed blind: no record of it could be read and this node knew no
    #: generation of it, so the one claimed (1) may be one another node
    #: opened and holds still (its record deleted under it; regressions
    #: seed-123095345, seed-1851953618). Until its host answers the open
    #: it is not released (`placement.Held.blind`), and a free before that
    #: keeps it from every node as a refusal's does (`on_closed`): only the
    #: host can tell whether the generation was new.
    blind: bool = False
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)

    def wrote(self, lease: Lease, version: str, now: float) -> None:
        self.lease, self.version, self.changed_at = lease, version, now

    def closed(self, reason: Reason, now: float, free_after: float = -math.inf) -> None:
        self.phase, self.reason, self.closed_at = Phase.CLOSED, reason, now
        self.free_after = free_after

    @property
    def by_epoch(self) -> bool:
        """Kept by its epoch (node mode), not by rewriting the record."""
        return self.lease.renewal == "node"


def renewed_apart(answered_in: float, ttl: float, margin: float, pace: float) -> bool:
    """Whether a shard-mode claim answered `answered_in` seconds after it was
    sent is renewed apart from the batch (`Keeper.claimed`): left to the
    batch, its first renewal may be sent a pace and a latency after the
    answer and land a latency later, 3 latencies + a pace after the claim
    was sent, which must be within its deadline (sent + ttl - margin)."""
    return answered_in > (ttl - margin - pace) / 3


def refusal_hold(known: float, holds_by: list[float] | None) -> float:
    """How long the free after a refusal as outdated keeps the shard from
    every node: the longest TTL a node may still hold it by. `known`: the
    longest this node saw for itself (`view.LeaseView.refusal_wait`: its own
    TTL, the shard's last readable record's, any record's); `holds_by`: what
    every heartbeat of the cluster said just now (`Heartbeat.holds_by`), None
    if they could not all be read.

    Why the heartbeats: the owner whose record was deleted under it may be a
    node this one never saw a record of (it joined after the deletion), whose
    lease writes fail since (its record is gone), valid by the TTL its last
    landed write carried, which a TTL cut in place leaves longer than any
    this node knows (regression seed-143). Its heartbeat says so.

    Unread, the wait falls back to the longest a lease may be held by at
    all, `MAX_LEASE_TTL` (no record carries a longer TTL, so no owner holds
    longer by one): nothing shorter can be justified without them. A
    shard kept an hour costs only its availability, and only on a refusal
    (a deleted or lost record) whose heartbeat reads failed."""
    longest = MAX_LEASE_TTL if holds_by is None else max([known, *holds_by])
    return min(MAX_HOLD, max(known, longest))


def reservation(refused: float, stop_hold: float, name: str) -> tuple[str | None, float]:
    """What a free writes of a reservation, (reserved_for, hold): kept for
    this node's `name` for `stop_hold` seconds (a stop under `handoff: hold`;
    0: none); kept from every node for `refused` seconds (the longest TTL a
    node may still hold the shard by) after the host refused the claim's
    generation as outdated, or never answered a blind claim's open; nothing
    otherwise (and a free after a release clears an earlier one). A table
    in tests/test_loop.py.

    Why after a refusal: another host opened a generation at least as
    high, and its node may hold the shard still (its record was deleted
    or lost under it and claimed here by a node that could not know it).
    Its renewals no longer land (the record is another's now), so its
    deadline is past within a TTL of this claim, in node mode once it
    sees its record gone. Claimed again above at once, the shard would
    be open twice until then; the generation would fence the older
    writer at the application, but two owners would be open. This node
    waits out the same time (`view.LeaseView.refused`).

    Kept for no node then, this one included (its next incarnation reads
    the record, not this one's memory), and for no less than the stop's
    hold: neither shortens the wait (issue 38, family A3: a hold shorter
    than the TTL once replaced it)."""
    if refused > 0:
        return None, min(max(refused, stop_hold), MAX_HOLD)
    if stop_hold > 0:
        return name, stop_hold
    return None, 0.0


async def gather_limited(*calls: Callable[[], Awaitable[None]]) -> None:
    """Run the coroutine functions with at most WRITE_CONCURRENCY at once."""
    limit = asyncio.Semaphore(WRITE_CONCURRENCY)

    async def one(call: Callable[[], Awaitable[None]]) -> None:
        async with limit:
            await call()

    await asyncio.gather(*(one(c) for c in calls))


class Keeper:
    def __init__(self, store: LeaseStore, calls: Calls, clock: Clock, telemetry: Telemetry,
                 runner: Runner, own: OwnEpoch, *, cluster: str, name: str,
                 options: Callable[[], Options], stopping: Callable[[], bool],
                 earlier_pace: Callable[[], float],
                 released: Callable[[int], None],
                 track: Callable[[asyncio.Task[None]], None],
                 holds_by_all: Callable[[], Awaitable[list[float] | None]],
                 kept_off: Callable[[int, float], None],
                 announced: Callable[[], float] = lambda: 0.0) -> None:
        self.store, self.calls, self.clock = store, calls, clock
        self.telemetry, self.runner, self.own = telemetry, runner, own
        self.cluster, self.name = cluster, name
        self.options, self.stopping, self.earlier_pace = options, stopping, earlier_pace
        #: Told of every shard whose lease this node freed (no longer an owner to show).
        self.released = released
        #: Given every free started apart from the renewals (the loop awaits them).
        self.track = track
        #: What every heartbeat says now of how long its node may hold a
        #: lease (`heartbeats.Heartbeats.holds_by_all`; None: unread).
        self.holds_by_all = holds_by_all
        #: What this node's last landed heartbeat said it holds by
        #: (`heartbeats.Heartbeats.landed_holds_by`; 0: none landed, or node
        #: mode): the cap of every TTL it writes (`writable_ttl`).
        self.announced = announced
        #: Told how long a refusal's free keeps a shard from every node, once
        #: that is known (this node waits as long: `view.LeaseView.keep_off`).
        self.kept_off = kept_off
        # -- mutable state
        self.held: dict[int, Held] = {}
        #: The free in flight of each closed shard: never one of the renewals'
        #: batch, which a free that hangs (up to a TTL) would hold up, and
        #: with it the renewal of every shard still open.
        self._frees: dict[int, asyncio.Task[None]] = {}
        #: The renewals of each slow claim, apart from the batch until a
        #: batch renews it (`claimed`).
        self._apart: dict[int, asyncio.Task[None]] = {}
        #: Leases of ours not held may remain (unknown until a read).
        self.strays = True
        #: A graceful stop under `handoff: hold`: every lease it frees is kept
        #: for this node's name for this many seconds (0: freed for anyone).
        self.hold = 0.0
        #: Since when every lease write has failed (None: the last one worked),
        #: and since when this node has withdrawn because of it (`withdrawn`).
        self._writes_failing: float | None = None
        self._withdrawn_at: float | None = None
        #: Node mode, stopping: closed shards of the current epoch whose
        #: leases are freed all at once by the end of the epoch (`end_epoch`).
        #: (Each with what it was held as: if the epoch is not ended after
        #: all, an abort frees them one by one, `free_alone`.)
        self.left_to_end: dict[int, Held] = {}

    @property
    def ttl(self) -> float:
        return self.options().lease_ttl

    def own_epochs(self) -> set[str]:
        return self.own.all

    def holds_by(self) -> float:
        """The longest TTL any lease this node holds was last written with by
        a write that landed (0: none), as its heartbeat says
        (`Heartbeat.holds_by`): a shard-mode lease is valid until that write's
        send time + that TTL - margin, whatever the TTL is now. (Closed
        shards too, until freed: one whose close failed may still be open.)"""
        return max((h.lease.ttl for h in self.held.values()), default=0.0)

    def announce(self) -> float:
        """What this node's heartbeat says it holds by (`Heartbeat.holds_by`):
        the longest TTL its held leases were written with, and the TTL it
        writes new ones with, which a raise in place makes longer. A lease
        is written with it only once a heartbeat saying so landed
        (`writable_ttl`)."""
        return max(self.holds_by(), self.ttl)

    def writable_ttl(self) -> float:
        """The TTL a lease write of this node may carry now: the options', but
        never above what its last landed heartbeat said (regression
        seed-3062478051: a TTL raised in place, 6 to 60, landed in a renewal
        while the heartbeat still said 6; a node refused as outdated, reading
        the heartbeats, waited 6 s while the owner held by 60). Until one
        lands (a node's first heartbeat, or node mode, which beats none),
        the options'."""
        announced = self.announced()
        return self.ttl if announced <= 0 else min(self.ttl, announced)

    def shards_of(self, epoch: str) -> list[int]:
        """The held node-mode shards of `epoch` that are not closed."""
        return [s for s, h in self.held.items()
                if h.by_epoch and h.lease.incarnation == epoch and h.phase is not Phase.CLOSED]

    def release(self, shard: int) -> None:
        """Give a held shard up: the runner closes it, then it is freed."""
        held = self.held[shard]
        if held.phase is Phase.HELD:
            held.phase = Phase.RELEASING
            self.runner.stop(shard, Reason.SHUTDOWN if self.stopping() else Reason.RELEASE)

    # -- the one write step -------------------------------------------------------------

    async def write(self, lease: Lease, version: str | None) -> str:
        """Every lease write of this node, so that it knows whether it can
        write leases at all (a conflict is an answer: the store works)."""
        try:
            written = await self.store.write_lease(lease, version)
        except Conflict:
            self._writes_failing = None
            raise
        except StoreError:
            if self._writes_failing is None:
                self._writes_failing = self.clock.monotonic()
            raise
        self._writes_failing = None
        return written

    async def _write_held(self, held: Held, lease: Lease) -> str:
        """Compare-and-swap a lease this node holds. A conflict may be this
        node's own earlier write whose answer was lost and could not be
        recognised then (the read-back failed too): if the record still names
        this process (any of its epochs), with our generation, nobody else
        wrote it, so take its version and write once more. A record that
        another writer corrupted or deleted under us is repaired the same way
        (`_damaged`). Raises `Conflict` when another node wrote the record,
        `StoreError` when that cannot be told yet."""
        try:
            return await self.write(lease, held.version)
        except Conflict:
            current = await self.store.get_lease(self.cluster, lease.shard)
            rec = current.record if current is not None else None
            if self._damaged(lease.shard, current):
                held.wrote(held.lease, VANISHED if current is None else current.version,
                           self.clock.monotonic())
                return await self.write(lease, held.version)
            # (Any incarnation of this process: a hand-over names another.)
            if current is None or rec is None or rec.owner != self.name \
                    or rec.incarnation not in self.own_epochs() \
                    or rec.generation != held.lease.generation \
                    or current.version == held.version:
                raise
            logger.info("shard %d: an earlier write of ours had landed; resuming from it",
                        lease.shard)
            held.wrote(held.lease, current.version, self.clock.monotonic())
        return await self.write(lease, held.version)

    def _damaged(self, shard: int, current: Stored[Lease] | None) -> bool:
        """Whether a held lease's record was corrupted or deleted by another
        writer (not replaced by a record another node can read: a newer
        format is another version's, and is lost to it), while the shard's
        deadline has not passed: before it, no other node may have written
        the record, so the damage is a foreign writer's. Such a record is
        repaired by a compare-and-swap on the version that is there, and
        the shard kept: it is a renewal like any other (observers date the
        repaired version from when they first see it), and a peer that took
        the damaged record meanwhile changed its version, so the swap fails
        and the shard is lost."""
        if current is not None and (current.record is not None
                                    or current.newer_format is not None):
            return False
        what = "deleted" if current is None else "corrupted"
        deadline = self.runner.deadline(shard)
        if deadline is None or deadline <= self.clock.monotonic():
            # Past the shard's deadline (fenced, or closed and not freed yet)
            # a peer may have taken the lease before the damage: what is
            # there may be a damaged record of another owner's. Lost.
            logger.error("shard %d: its lease record was %s, and our lease of it may have "
                         "expired before that: not ours to repair", shard, what)
            return False
        logger.error("shard %d: its lease record was %s by another writer: writing ours back "
                     "over it", shard, what)
        return True

    async def _write_step(self, shard: int, held: Held, lease: Lease, what: str,
                          budget: float | None) -> bool:
        """Write `lease` over the held record (CAS, retried within `budget`).
        True once written; False if another node wrote it (the shard is lost);
        raises `StoreError` when the store did not answer in time."""
        try:
            version = await self.calls.bounded(f"{what} of shard {shard}",
                                               lambda: self._write_held(held, lease),
                                               budget=budget)
        except Conflict:
            self.lost(shard)
            return False
        held.wrote(lease, version, self.clock.monotonic())
        return True

    def lost(self, shard: int) -> None:
        logger.warning("lost the lease of shard %d: another node holds it", shard)
        self._forget_apart(shard)
        self.held.pop(shard, None)
        self.runner.stop(shard, Reason.LOST)
        self.telemetry.emit(Lost(cluster=self.cluster, node=self.name, shard=shard))

    # -- renewals -------------------------------------------------------------------------

    def renew_pace(self) -> float:
        """The interval between renewals: the options', unless a held lease's
        record still carries a TTL from before `reconfigure()`. Its deadline
        came from that TTL and the margin of then, made to be met at the pace
        of then; so until a renewal wrote the new TTL, renew at the faster of
        the two (say 15 s -> 45 s with the interval 5 s -> 15 s: the record
        written at t with TTL 15 fences at t + 12.5, before t + 15)."""
        pace = self.options().interval_s
        if any(h.lease.ttl != self.ttl for h in self.held.values() if h.phase is not Phase.CLOSED):
            pace = min(pace, self.earlier_pace())
        return pace

    def claimed(self, shard: int, sent: float) -> None:
        """A shard-mode claim sent at `sent` landed and opened. Answered slowly,
        it is renewed an interval after `sent`, apart from the batch, as the
        batch renews the others an interval after theirs; and so on, until a
        batch renews it (one that starts while this renewal waits). Left to
        the batch (one in flight, or the next, up to an interval after the
        claim's *answer*), its first renewal could go out an interval and a
        latency after that answer, and land a latency later still: past the
        deadline (sent + TTL - margin) once the store answers in more than
        (TTL - margin - interval) / 3 (the slow-store process test on a
        loaded machine; tests/sim/test_ordinary_faults.py). A claim answered
        faster is left to the batch, which renews it in time."""
        held = self.held.get(shard)
        if held is None or held.by_epoch or self.runner.deadline(shard) is None:
            return  # (node mode: the epoch renews it)
        if renewed_apart(self.clock.monotonic() - sent, held.lease.ttl,
                         self.options().margin_s, self.renew_pace()):
            self._start(self._apart, shard, self._renew_apart(shard, held, sent))

    async def _renew_apart(self, shard: int, held: Held, sent: float) -> None:
        mine = held.changed_at
        while True:
            wait = sent + self.renew_pace() - self.clock.monotonic()
            if wait > 0:
                await asyncio.sleep(wait)
            sent = self.clock.monotonic()
            try:
                if not await self._renew(shard, held, unless_changed_since=mine):
                    return  # a batch renewed it (it keeps it now), or it is gone
            except StoreError as e:
                # The batch tries again (and says so if it fails too).
                logger.info("renewal of shard %d (apart from the batch) failed: %s", shard, e)
                return
            finally:
                self.runner.flush()
            mine = held.changed_at

    def _forget_apart(self, shard: int) -> None:
        """The shard closes or is lost: no renewal apart is waited for (a
        graceful stop awaits the tasks the keeper started)."""
        if (task := self._apart.pop(shard, None)) is not None:
            task.cancel()

    async def renew_all(self) -> bool:
        """Renew every held lease, and start the free again of each closed
        one whose last free failed (apart: a free is never waited for here).
        False if a renewal failed for a reason other than losing the lease,
        so the next try comes sooner."""
        failed: list[int] = []
        errors: list[str] = []

        def one(shard: int, held: Held) -> Callable[[], Awaitable[None]]:
            async def call() -> None:
                try:
                    await self._renew(shard, held)
                except StoreError as e:
                    failed.append(shard)
                    errors.append(str(e))
            return call

        for shard, held in list(self.held.items()):
            if held.phase is Phase.CLOSED and shard not in self._frees:
                self._start_free(shard, held)  # (tried again: the last one failed)
        # Node-mode leases are renewed by the epoch; a claim's renewal in
        # flight apart from the batch (`claimed`) is left to land: the batch
        # would wait on its lock, and every shard's next renewal with it.
        await gather_limited(*(one(s, h) for s, h in list(self.held.items())
                               if not h.by_epoch and h.phase is not Phase.CLOSED
                               and not (s in self._apart and h.lock.locked())))
        self.runner.flush()  # the host learns the moved deadlines, in one call
        if not self.stopping() and (stranded := self.stranded()):
            await self.own.give_up(f"could not free shard(s) {stranded} within a TTL of "
                                   "closing them", self._close_all)
        if failed:
            logger.warning("renewal failed for %d shard(s): %s", len(failed), errors[0])
            self.telemetry.emit(RenewFailed(cluster=self.cluster, node=self.name,
                                            shards=tuple(sorted(failed)), error=errors[0]))
        return not failed

    def _close_all(self, shards: list[int]) -> None:
        for shard in shards:
            self.held[shard].phase = Phase.RELEASING
            self.runner.stop(shard, Reason.RELEASE)

    async def _renew(self, shard: int, held: Held, *,
                     unless_changed_since: float | None = None) -> bool:
        """Renew one lease; False if it was not tried (no longer held, closed,
        or written since `unless_changed_since`, a `Held.changed_at`)."""
        async with held.lock:
            if self.held.get(shard) is not held or held.phase is Phase.CLOSED \
                    or unless_changed_since not in (None, held.changed_at):
                return False
            # Any attempt may be the one that lands (a lost answer): the
            # deadline counts from the first, the earliest an observer can
            # have seen this renewal.
            sent = self.clock.monotonic()
            # Useful until the deadline: a slow store may still save the shard.
            deadline = self.runner.deadline(shard)
            lease = held.lease.model_copy(update={
                "write_id": new_write_id(), "renewed_at": self.clock.wall(),
                "ttl": self.written_ttl(held.lease.ttl, deadline, sent)})
            if await self._write_step(shard, held, lease, "renewal",
                                      None if deadline is None else deadline - sent):
                self.runner.extend(shard, self.deadline(sent, lease.ttl))
            return True

    def written_ttl(self, current: float, deadline: float | None, sent: float) -> float:
        """The TTL a renewal sent at `sent` writes over a record carrying
        `current`, for a shard whose deadline is `deadline`: the options' TTL,
        unless that is shorter than the record's (`reconfigure()` lowered it)
        and would no longer cover the deadline once the write landed -- then
        what still covers it (observers may count the new record's TTL from
        `sent`; the deadline must stay a margin before that)."""
        ttl = max(self.writable_ttl(), min(current, self.ttl))
        if ttl >= current or deadline is None:
            return ttl
        return min(current, max(ttl, deadline - sent + self.options().margin_s))

    def deadline(self, sent: float, ttl: float) -> float:
        """The deadline a write sent at `sent` gives: `ttl` is the one it wrote
        into the record (observers honour that one), not the options' now."""
        margin = self.options().margin_s
        if ttl < self.ttl:
            # A raise not announced yet (`writable_ttl`): the record still
            # says the shorter TTL, which the new margin may not fit (TTL 15
            # to 60 with a margin of 20: every shard would be fenced). The
            # default share of that TTL instead: the expiry stays after it.
            margin = min(margin, ttl / 6)
        return sent + ttl - margin

    # -- frees ------------------------------------------------------------------------------

    def on_closed(self, ended: Ended, reserve: float = 0.0) -> None:
        """The runner is done with a shard: free its lease now (and again from
        the renewals until that works); nothing if it was lost. If the host
        may still have the shard open (`ended.closed` False), not before the
        lease's expiry: until then the next owner could open it beside the
        host (in node mode the epoch keeps beating, but no longer names it).
        `ended.highest`: the host has seen that generation (it refused the
        open as outdated), so the free writes it, and every node's next
        claim goes above it, not within `reserve` seconds of the free."""
        shard = ended.shard
        self._forget_apart(shard)
        held = self.held.get(shard)
        if held is None:
            return
        now = self.clock.monotonic()
        held.closed(ended.reason, now, -math.inf if ended.closed else ended.expiry)
        if ended.highest is not None:
            held.floor = max(ended.highest, held.floor)
            held.reserve = max(reserve, held.reserve)
        elif held.blind and not ended.opened:
            # Never answered (a stop, a fence, a failed open): the host may
            # have refused it had it asked, so the free waits as a refusal's.
            held.reserve = max(reserve, held.reserve)
        if not ended.closed:
            self.left_to_expire(shard, ended.expiry - now)
        self._start_free(shard, held)

    def left_to_expire(self, shard: int, left: float) -> None:
        """Say that the lease of `shard`, which the host may still have open,
        is not freed before it expires (`left` seconds from now at most)."""
        self.telemetry.emit(LeftToExpire(cluster=self.cluster, node=self.name, shard=shard,
                                         left=max(0.0, left)))

    def _start_free(self, shard: int, held: Held) -> None:
        self._start(self._frees, shard, self._free_soon(shard, held))

    def _start(self, tasks: dict[int, asyncio.Task[None]], shard: int,
               work: Coroutine[Any, Any, None]) -> None:
        """Run `work` about `shard` apart from the renewals' batch, as the
        shard's entry in `tasks` until it ends, awaited before the loop ends."""
        task = asyncio.create_task(work)
        tasks[shard] = task

        def done(t: asyncio.Task[None]) -> None:
            if tasks.get(shard) is t:
                del tasks[shard]
        task.add_done_callback(done)
        self.track(task)

    async def _free_soon(self, shard: int, held: Held) -> None:
        wait = held.free_after - self.clock.monotonic()
        if wait > 0:
            await asyncio.sleep(wait)
        try:
            await self.free(shard, held)
        except StoreError as e:
            logger.warning("could not free shard %d yet (retried with the renewals): %s",
                           shard, e)

    async def free(self, shard: int, held: Held, *, alone: bool = False) -> None:
        """Write "no owner" (keeping the generation, or raising it to the
        host's) on a closed shard's lease; while stopping in node mode, leave
        it to the end of the epoch, unless `alone` (the epoch will not be
        ended: it keeps a shard its host may still have open)."""
        async with held.lock:
            if self.held.get(shard) is not held or held.free_after > self.clock.monotonic():
                return
            # (Not one the host refused, nor a blind one it never answered:
            # the end would free it for every node at once, where its free
            # keeps it from all for a while.)
            if not alone and held.by_epoch and self._left_to_end(held.lease) \
                    and held.floor == 0 and held.reserve == 0:
                # One write ends the epoch and frees every lease of it
                # (`end_epoch`), rather than one write per shard.
                self.held.pop(shard, None)
                self.left_to_end[shard] = held
                return
            if held.freeing is None:
                reserve = held.reserve
                if reserve > 0:
                    if held.floor > 0 and not held.blind:
                        # A refusal's: kept from every node for as long as
                        # any node's heartbeat says it may hold a lease, read
                        # now (an hour if they cannot be read).
                        reserve = refusal_hold(reserve, await self.holds_by_all())
                    # A blind claim's, refused or never answered: its record
                    # was written with the longest TTL the heartbeats said at
                    # its claim (shard mode; they say no less than their
                    # nodes' leases carry: `writable_ttl`), which bounds the
                    # owner it may hide, whose record was gone before it (it
                    # renews no more). Not read again: unread, a refusal's
                    # wait is an hour (found by the explorer: a stop with a
                    # slow store, and a refusal in the random swarm, kept a
                    # shard for that long).
                    reserve = max(reserve, held.lease.ttl)
                    self.kept_off(shard, reserve)
                held.freeing = held.lease.model_copy(update={
                    "owner": None, "incarnation": None, "write_id": new_write_id(),
                    "generation": max(held.lease.generation, held.floor),
                    "renewed_at": self.clock.wall(), "since": self.clock.wall(),
                    **self._reservation(reserve)})
            try:
                if not await self._write_step(shard, held, held.freeing, "free", self.ttl):
                    return
            except StoreError:
                if held.reason is Reason.FENCED:
                    # Fenced: the lease is not ours to keep; it will expire,
                    # or be freed as a stray once the store answers.
                    self.held.pop(shard, None)
                    self.strays = True
                    return
                raise
            self.held.pop(shard, None)
            self.released(shard)
            self.telemetry.emit(Release(cluster=self.cluster, node=self.name, shard=shard))

    def _reservation(self, refused: float = 0.0) -> dict[str, object]:
        """What a free writes of a reservation (`reservation`, from this
        node's name and whether it stops under `handoff: hold`)."""
        reserved_for, hold = reservation(refused, self.hold if self.stopping() else 0.0,
                                         self.name)
        return {"reserved_for": reserved_for, "hold": hold}

    def _left_to_end(self, lease: Lease) -> bool:
        """Stopping in node mode: a lease of the current epoch is freed by the
        end of the epoch, with all the others (`end_epoch`), while the epoch
        is valid (its writes work: else each is freed by a write of its own)."""
        return self.stopping() and lease.renewal == "node" \
            and lease.incarnation == self.own.epoch and self.own.valid()

    async def end_epoch(self) -> bool:
        """Stopping in node mode, once nothing is held: end the epoch (one
        compare-and-swap), which frees every lease left to it at once. True
        if it did."""
        if not self.left_to_end:
            # Nothing to free: the record is deleted (peers wait a TTL after
            # they see it gone, in case a lease of it was written unheard).
            await self.own.retire()
            return False
        ended = await self.own.end()
        shards, self.left_to_end = sorted(self.left_to_end), {}
        if not ended:
            return False
        for shard in shards:
            self.released(shard)
            self.telemetry.emit(Release(cluster=self.cluster, node=self.name, shard=shard,
                                        ended=True))
        return True

    async def free_alone(self) -> None:
        """Node mode, stopped short with an epoch that is not to be ended (it
        keeps a shard its host may still have open): free the closed shards
        left to its end each by a write of its own (the caller bounds it)."""
        shards, self.left_to_end = sorted(self.left_to_end.items()), {}
        for shard, held in shards:
            self.held[shard] = held

        async def one(shard: int, held: Held) -> None:
            with contextlib.suppress(StoreError):
                await self.free(shard, held, alone=True)

        await gather_limited(*(functools.partial(one, s, h) for s, h in shards))

    def stranded(self) -> list[int]:
        """Node mode: closed shards of the current epoch whose lease could not
        be freed within a TTL of their close: nobody can take them while the
        epoch lives (its record keeps them), so they are open nowhere."""
        now = self.clock.monotonic()
        return [s for s, h in self.held.items()
                if h.phase is Phase.CLOSED and h.by_epoch
                and h.lease.incarnation == self.own.epoch
                and h.closed_at is not None and now - h.closed_at > self.ttl]

    async def free_strays(self, leases: dict[int, Stored[Lease]]) -> None:
        """Free the leases that still name this process but that it no longer
        holds (a fenced shard whose free failed, a claim whose answer was
        lost), so that peers need not wait for them to expire. Nobody else
        writes this process's records, and the shard is not in the runner, so
        a compare-and-swap on the version just read frees it safely."""
        failed = False
        for shard, stored in leases.items():
            rec = stored.record
            if rec is None or rec.owner != self.name \
                    or rec.incarnation not in self.own_epochs() \
                    or shard in self.held or self.runner.state(shard) is not None:
                continue
            if self._left_to_end(rec):
                if shard not in self.left_to_end:
                    self.left_to_end[shard] = Held(rec, stored.version, phase=Phase.CLOSED,
                                                   changed_at=self.clock.monotonic())
                continue
            lease = rec.model_copy(update={"owner": None, "incarnation": None,
                                           "write_id": new_write_id(),
                                           "renewed_at": self.clock.wall(),
                                           "since": self.clock.wall(), **self._reservation()})
            try:
                await self.calls.bounded(f"free of stray shard {shard}",
                                         functools.partial(self.write, lease, stored.version),
                                         budget=self.ttl)
            except Conflict:
                # Changed since the read: freed by this node's own release in
                # the meantime, or taken by a peer. Either way no longer ours.
                continue
            except StoreError as e:
                logger.info("could not free the stray lease of shard %d: %s", shard, e)
                failed = True
                continue
            self.released(shard)
            self.telemetry.emit(Release(cluster=self.cluster, node=self.name, shard=shard))
        self.strays = failed

    # -- records changed under us -----------------------------------------------------------

    async def check_held(self, leases: dict[int, Stored[Lease]], listed: float) -> None:
        """A node-mode lease is written only by its owner (claims, frees), so
        its record changes under it only by another writer: corrupted,
        replaced or deleted. Shard mode learns that from its next renewal's
        compare-and-swap; node mode would keep the shard for ever while
        nobody else may claim what the record says. A listing that shows
        another version (and started after our last write of it) is checked
        by a read. A record replaced by another's is lost; a corrupt or
        deleted one is repaired (`_damaged`): ours written back over it by a
        compare-and-swap. Meanwhile a peer that saw our record before waits
        for our epoch to end (view.LeaseView.claimable); one that never did
        waits a TTL from when it first saw the damage."""
        for shard, held in list(self.held.items()):
            stored = leases.get(shard)
            if not held.by_epoch or held.changed_at >= listed or held.lock.locked() \
                    or (stored is not None and stored.version == held.version):
                continue
            try:
                current = await self.calls.bounded(
                    f"read of shard {shard}",
                    functools.partial(self.store.get_lease, self.cluster, shard))
            except StoreError as e:
                if stored is not None and stored.record is not None:
                    logger.info("shard %d: could not read its lease again: %s", shard, e)
                    continue
                # The listing shows it damaged and it cannot be read back: the
                # repair's compare-and-swap against what the listing shows
                # tells (a stale listing's version is refused, harmlessly).
                current = stored
            if self.held.get(shard) is not held or held.changed_at >= listed \
                    or held.lock.locked():
                continue  # written by us meanwhile
            rec = current.record if current is not None else None
            if current is not None and (current.version == held.version or (
                    rec is not None and rec.owner == self.name
                    and rec.incarnation in self.own_epochs()
                    and rec.generation == held.lease.generation)):
                continue  # ours (a write whose answer was lost names us too)
            if not self._damaged(shard, current):
                logger.error("shard %d: its lease record was replaced by another writer: giving "
                             "the shard up", shard)
                self.lost(shard)
                continue
            async with held.lock:
                if self.held.get(shard) is not held:
                    continue
                before = held.version, held.changed_at
                held.wrote(held.lease, VANISHED if current is None else current.version,
                           self.clock.monotonic())
                lease = held.lease.model_copy(update={"write_id": new_write_id(),
                                                      "renewed_at": self.clock.wall()})
                try:
                    await self._write_step(shard, held, lease, "repair", self.ttl)
                except StoreError as e:  # tried again from the next listing
                    logger.warning("shard %d: could not repair its record yet: %s", shard, e)
                    held.version, held.changed_at = before

    # -- whether this node can write leases at all ------------------------------------------

    def withdrawn(self) -> bool:
        """A node whose lease writes have failed for a TTL and that keeps no
        shard open is no use to its peers, and would only take a share it
        cannot claim (the shards of that share then open nowhere): it stops
        counting itself and stops beating (its heartbeat, or in node mode its
        epoch) until a probe shows lease writes work again."""
        since = self._writes_failing
        if since is None or self.stopping() or self.clock.monotonic() - since <= self.ttl \
                or any(h.phase is not Phase.CLOSED for h in self.held.values()):
            if self._withdrawn_at is not None:
                self._withdrawn_at = None
                logger.info("lease writes work again: counting this node as a peer")
            return False
        if self._withdrawn_at is None:
            self._withdrawn_at = self.clock.monotonic()
            logger.error("lease writes have failed for over a TTL: not counting this node "
                         "as a peer until they work again")
        return True

    async def probe(self) -> None:
        """A lease write that cannot land (a compare-and-swap against a version
        no store makes): a Conflict says the store takes lease writes again."""
        now = self.clock.wall()
        probe = Lease(cluster=self.cluster, shard=0, owner=None, generation=0,
                      write_id=new_write_id(), renewed_at=now, since=now, ttl=self.ttl)
        with contextlib.suppress(Conflict, StoreError):
            await self.calls.bounded("probe of lease writes",
                                     functools.partial(self.write, probe, NO_SUCH_VERSION))
