"""What this node saw of the leases: the last good listing, judged.

Each shard's record is tracked on this node's monotonic clock (`observed`):
its version and since when it has been seen unchanged. From that, and from
what the node sees of the epochs (`epochs.EpochWatch`), this module says
whether a record lets this node claim its shard (free, expired, its epoch
over: `claimable`) and for how long it has been free (`free_for`, which
adoption uses). It also keeps what `lookup()` and `owners()` show, and what a
round looks at when the node is at its share (the free shards, the idle ones,
the shards each epoch keeps), so that such a round costs what changed, not
the shard count. It reads nothing itself and writes nothing.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass

from shardlease.epochs import EpochKey, EpochWatch
from shardlease.errors import CorruptRecord
from shardlease.observed import MISSING, Observed
from shardlease.records import MAX_HOLD, Epoch, Lease, Stored, decode_shards
from shardlease.stores.base import VANISHED
from shardlease.telemetry import CorruptLease, NewerRecord, Telemetry

logger = logging.getLogger("shardlease.loop")


@dataclass(frozen=True)
class Owner:
    shard: int
    owner: str | None
    generation: int
    #: Wall-clock seconds since this owner (or none) has had it; 0 if unknown.
    since: float = 0.0
    #: Unowned, and kept for the node of this name (`handoff: hold`).
    reserved_for: str | None = None


class LeaseView:
    def __init__(self, telemetry: Telemetry, epochs: EpochWatch, *, cluster: str, name: str,
                 incarnation: str, own_epochs: Callable[[], set[str]],
                 ttl: Callable[[], float]) -> None:
        self.telemetry, self.epochs = telemetry, epochs
        self.cluster, self.name, self.incarnation = cluster, name, incarnation
        self.own_epochs, self.ttl = own_epochs, ttl
        # -- mutable state
        #: Each shard's record as seen: its version (or MISSING) and since when.
        self.seen: Observed[int, Lease] = Observed()
        #: The highest generation seen per shard: a claim goes above it.
        self.max_generation: dict[int, int] = {}
        #: The last valid record seen per shard: when a record turns corrupt,
        #: who kept it (a node-mode owner keeps it by its epoch, and may not
        #: see the change: its epoch must be over before anyone takes it).
        self.readable: dict[int, Lease] = {}
        #: What `lookup()` shows, from the last good listing.
        self.owners: dict[int, Owner] = {}
        self._rows: dict[int, tuple[Lease, Owner]] = {}
        #: The last listing, and what was worked out from it.
        self.last: dict[int, Stored[Lease]] = {}
        #: The epochs node-mode leases name, in shard order, with their shards.
        self.named: dict[EpochKey, list[int]] = {}
        self.free: list[int] = []
        #: Shards held by a record unchanged for a TTL (shard mode, or
        #: corrupt): perhaps expired, looked at by a node at its share.
        self.idle: list[int] = []
        #: Shards whose record is corrupt (not a newer format's) in the last listing.
        self.damaged: set[int] = set()
        #: Damaged records the epochs say nobody keeps, by version: claimable
        #: this round (`attribute`).
        self.unkept: dict[int, str] = {}
        #: Damaged records as the epochs judged them (`attribute`): the epoch
        #: that keeps each (None: no epoch does).
        self.attributed: dict[int, Lease | None] = {}
        #: When this node's host last refused a claim's generation as
        #: outdated, per shard, and for how long it keeps off (`refused`).
        self.refused_at: dict[int, tuple[float, float]] = {}
        #: The longest TTL a record said, of any shard, since this node
        #: started (`refusal_wait`).
        self.longest_ttl = 0.0
        #: Shards whose record this node saw deleted while it knew a
        #: generation, with that generation (`_blind`).
        self.vanished: dict[int, int] = {}

    def known_generations(self, generations: Mapping[int, int]) -> None:
        """Generations known from outside this store (what was published of
        an earlier store, say): a claim here goes above them too, so that a
        store change or a lost record never hands one out again."""
        for shard, generation in generations.items():
            if generation > self.max_generation.get(shard, 0):
                self.max_generation[shard] = generation

    def refused(self, shard: int, highest: int, now: float) -> None:
        """This node's host refused to open the shard: another host opened
        `highest` (or more). A claim goes above it; and not within a TTL:
        the node that opened it may hold the shard still (its record was
        deleted or lost under it, and claimed here by a node that could not
        know), until its renewals, which no longer land, let its deadline
        pass (in node mode, until it sees its record gone). The free that
        follows keeps the shard from the other nodes as long
        (`keeper.Keeper._reservation`)."""
        self.max_generation[shard] = max(highest, self.max_generation.get(shard, 0))
        self.refused_at[shard] = (now, self.refusal_wait(shard))

    def keep_off(self, shard: int, wait: float) -> None:
        """The free after this node's refusal keeps the shard from every node
        for `wait` (`keeper.refusal_hold`: perhaps longer than `refusal_wait`,
        by what the heartbeats say): this node waits as long, from the
        refusal, also if that free never lands."""
        if (refused := self.refused_at.get(shard)) is not None and wait > refused[1]:
            self.refused_at[shard] = (refused[0], wait)

    def refusal_wait(self, shard: int) -> float:
        """How long a refusal keeps the shard from every node: the longest TTL
        a node may still hold it by -- its unseen owner's, which may not be
        this node's (a TTL changed in place: an owner whose writes fail is
        still valid by the TTL it wrote last, issue 38 family C): the longest
        of this node's, of the shard's last readable record and of any
        record this node has seen."""
        last = self.readable.get(shard)
        return min(MAX_HOLD, max(self.ttl(), self.longest_ttl,
                                 last.ttl if last is not None else 0.0))

    def observe(self, leases: dict[int, Stored[Lease]], shards: int, now: float,
                held: Iterable[tuple[int, Lease]]) -> None:
        """Take in a listing (`held`: this node's own leases, shown as ours)."""
        owners: dict[int, Owner] = {}
        named: dict[EpochKey, list[int]] = {}
        free: list[int] = []
        idle: list[int] = []
        damaged: set[int] = set()
        ttl = self.ttl()
        for shard in range(shards):
            stored = leases.get(shard)
            fresh = stored is None or stored is not self.last.get(shard)
            if stored is None:
                free.append(shard)
                self.seen.missing(shard, now)
                if (known := self.max_generation.get(shard, 0)) > 0:
                    self.vanished[shard] = max(known, self.vanished.get(shard, 0))
                    # Known to have existed (deleted): judged like a damaged
                    # record, by the epochs (`attribute`), since a node-mode
                    # owner may keep it by its epoch without seeing it gone.
                    damaged.add(shard)
                    seen = self.seen.get(shard)
                    if seen is not None and now - seen.since > ttl:
                        idle.append(shard)
                continue
            # (An entry that is the very one of the last listing -- stores keep
            # what did not change -- has nothing new to note.)
            if fresh and self.seen.see(shard, stored.version, now, stored.record):
                self._report(shard, stored)
            if (rec := stored.record) is not None:
                if fresh:
                    self._replaced(shard, rec)
                blind = self._blind(shard, rec)
                if fresh:
                    self.max_generation[shard] = max(rec.generation,
                                                     self.max_generation.get(shard, 0))
                    self.longest_ttl = max(self.longest_ttl, rec.ttl)
                    if not blind:
                        self.readable[shard] = rec
                        self.attributed.pop(shard, None)
                owners[shard] = self._owner_of(shard, rec)
                if blind:
                    # Judged as the deleted record it replaced was: by the
                    # epochs, never while one that may keep it lives. Its own
                    # epoch is watched too (and not collected as garbage):
                    # claimable only once that one is over as well, which an
                    # epoch nobody watches never is (regression
                    # seed-1506566321: a dead blind claimer's).
                    if rec.renewal == "node" and rec.owner is not None:
                        named.setdefault((rec.owner, rec.incarnation or ""), []).append(shard)
                    damaged.add(shard)
                    if rec.owner is None:
                        free.append(shard)
                    seen = self.seen.get(shard)
                    if seen is not None and now - seen.since > ttl:
                        idle.append(shard)
                    continue
                if rec.renewal == "node" and rec.owner is not None \
                        and (rec.owner, rec.incarnation or "") in self.epochs.ended:
                    # Its epoch is over (ended by its owner's stop, or taken
                    # over): nobody has it, whatever the record still says
                    # (kept for its owner's name if it ended with a hold).
                    owners[shard] = Owner(shard, None, rec.generation,
                                          reserved_for=rec.owner
                                          if self.epochs.reserved_for_owner(rec) else None)
                if rec.owner is None:
                    free.append(shard)
                    if rec.hold > 0 and rec.reserved_for is None:
                        # Freed after a refusal as outdated: the owner whose
                        # record was lost may keep it still, by its epoch:
                        # judged by the epochs, like a deleted record.
                        damaged.add(shard)
                        seen = self.seen.get(shard)
                        if seen is not None and now - seen.since > ttl:
                            idle.append(shard)
                    continue
                if rec.renewal == "node":
                    named.setdefault((rec.owner, rec.incarnation or ""), []).append(shard)
                    continue
            elif stored.newer_format is None:
                damaged.add(shard)
                if stored.version.startswith(VANISHED) and stored.generation:
                    # Deleted after this node's store saw it held.
                    self.vanished[shard] = max(stored.generation,
                                               self.vanished.get(shard, 0))
            seen = self.seen.get(shard)
            if seen is not None and now - seen.since > ttl:
                idle.append(shard)
        for shard in sorted(damaged):
            # A damaged record of a node-mode owner's is its epoch's until that
            # epoch is over: the epoch is watched (and not collected as
            # garbage) as if the record still named it.
            if (kept := self.kept_by_epoch(shard)) is not None:
                named.setdefault((kept.owner or "", kept.incarnation or ""), []).append(shard)
        for shard, lease in held:
            owners[shard] = Owner(shard, self.name, lease.generation, lease.since)
        self.owners, self.last, self.named, self.free, self.idle = (
            owners, leases, named, free, idle)
        self.damaged = damaged

    def _replaced(self, shard: int, rec: Lease) -> None:
        """A claim at no higher generation than the record this node saw
        before it, by another owner (or incarnation), was not made over that
        record (a claim is a compare-and-swap at its generation + 1): the
        record was deleted and claimed blind between two of this node's
        listings, so this node never saw it missing. Judged as if it had
        (`vanished`, `_blind`): its free, which the owner of the deleted
        record never wrote, is no licence (found by the explorer, node mode:
        regression seed-1080542040)."""
        last = self.readable.get(shard)
        if last is not None and last.owner is not None and rec.owner is not None \
                and rec.generation <= last.generation \
                and (rec.owner, rec.incarnation) != (last.owner, last.incarnation):
            self.vanished[shard] = max(last.generation, self.vanished.get(shard, 0))

    def _blind(self, shard: int, rec: Lease) -> bool:
        """Whether a record written where this node saw one deleted is a blind
        one: at no higher generation than the deleted record had, and not
        written back by the owner that record named. A node that never saw
        the deleted record (a joiner, a restarted node) claims it missing at
        generation 1, and may free it before it opens (a release, a stop):
        a free that its owner, who may keep the shard by its epoch without
        seeing its record gone, never wrote (issue 38, family B through a
        blind claim; regression seed-3245220484). So it is judged as the
        deleted record was, by the epochs, until a record above that
        generation or the owner's own comes."""
        vanished = self.vanished.get(shard)
        if vanished is None:
            return False
        last = self.readable.get(shard)
        if rec.generation > vanished or (
                last is not None and rec.owner is not None
                and (rec.owner, rec.incarnation) == (last.owner, last.incarnation)):
            del self.vanished[shard]
            return False
        return True

    def _report(self, shard: int, stored: Stored[Lease]) -> None:
        if stored.newer_format is not None:
            logger.warning("shard %d: %s; left to the versions that know it",
                           shard, stored.error)
            self.telemetry.emit(NewerRecord(cluster=self.cluster, node=self.name,
                                            shard=shard, format=stored.newer_format))
        elif stored.record is None:
            logger.warning("shard %d: corrupt lease record: %s", shard, stored.error)
            self.telemetry.emit(CorruptLease(cluster=self.cluster, node=self.name,
                                             shard=shard, error=stored.error or ""))

    def _owner_of(self, shard: int, rec: Lease) -> Owner:
        """The Owner row of a record, shared while the record is unchanged."""
        cached = self._rows.get(shard)
        if cached is None or cached[0] is not rec:
            cached = self._rows[shard] = (rec, Owner(shard, rec.owner, rec.generation,
                                                     rec.since, rec.reserved()))
        return cached[1]

    def forget_owner(self, shard: int) -> None:
        """This node freed the shard's lease: it shows no owner until a read says."""
        self.owners.pop(shard, None)

    def claimed(self, shard: int, lease: Lease) -> None:
        """This node claimed the shard and opens it: shown as ours at once."""
        self.owners[shard] = Owner(shard, self.name, lease.generation, lease.since)

    def silent_shards(self, now: float) -> list[int]:
        """The shards of node-mode leases whose epoch has been silent for a TTL."""
        ttl = self.ttl()
        return [s for key, shards in self.named.items()
                if self.epochs.silent_for(key, now) > ttl for s in shards]

    def claimable(self, shard: int, stored: Stored[Lease] | None, now: float) -> bool:
        """Whether the record lets this node claim the shard: free, expired,
        its epoch over, or ours (cooldowns are placement's; whether this node
        holds it already, the caller's)."""
        if (refused := self.refused_at.get(shard)) is not None and now - refused[0] <= refused[1]:
            return False
        if stored is None:
            return self._missing_claimable(shard, now)
        if stored.newer_format is not None:
            return False  # held by a version that knows the format, for as long as it is
        rec = stored.record
        if rec is not None and shard in self.vanished:
            if rec.owner is not None and rec.renewal == "node" \
                    and not self.epochs.over(rec, now):
                # Whatever it replaced, its own live epoch keeps it: a claim
                # of a node-mode record ends the epoch it names first.
                return False
            return self._damaged_claimable(shard, stored, rec, now)
        if rec is not None and rec.owner is None:
            if rec.hold <= 0 or (rec.reserved_for is not None and rec.reserved_for == self.name):
                return True
            # Kept for a pod being replaced, or from every node (after a
            # refusal as outdated): once this node has seen this version
            # unchanged for the hold (its own monotonic clock).
            seen = self.seen.get(shard)
            if seen is None or now - seen.since < rec.hold:
                return False
            if rec.reserved_for is not None:
                return True
            # A refusal's: the owner whose record was lost may keep the shard
            # by its epoch for longer than any hold (issue 38, families A
            # and B): as a deleted record, never while an epoch that may keep
            # it lives, and once the epochs said that none does.
            kept = self.kept_by_epoch(shard)
            if kept is not None and not self.epochs.over(kept, now):
                return False
            return self.unkept.get(shard) == stored.version
        if rec is not None and rec.owner == self.name and rec.incarnation == self.incarnation:
            return True  # ours, dropped after a fence: nobody else can hold it
        if rec is not None and rec.renewal == "node":
            return self.epochs.over(rec, now)
        if rec is None:
            return self._damaged_claimable(shard, stored, rec, now)
        seen = self.seen.get(shard)
        return seen is not None and now - seen.since > max(self.ttl(), rec.ttl)

    def _damaged_claimable(self, shard: int, stored: Stored[Lease], rec: Lease | None,
                           now: float) -> bool:
        """A damaged record (or a blind one, `_blind`): once seen unchanged for
        a TTL, never while an epoch that may keep it lives (its owner may not
        see the damage), and only as `attribute` judged it."""
        seen = self.seen.get(shard)
        # A damaged record says no TTL: the last one it said, if this node
        # saw it readable (its owner renews at that pace, and may still be
        # valid for that long: a TTL changed in place differs across nodes).
        last = self.readable.get(shard)
        ttl = max(self.ttl(), rec.ttl if rec is not None else 0.0,
                  last.ttl if last is not None else 0.0)
        if seen is None or now - seen.since <= ttl:
            return False
        kept = self.kept_by_epoch(shard)
        if kept is not None and not self.epochs.over(kept, now):
            return False
        return self.unkept.get(shard) == stored.version

    def _missing_claimable(self, shard: int, now: float) -> bool:
        """A shard with no record: never written, or deleted (by hand, a tool,
        a store changed under the cluster). A record this node knows existed
        (a generation seen, here or published: `known_generations`) may be
        its owner's still: a shard-mode owner keeps it until its deadline,
        which no renewal moves any more (a swap on a missing record is a
        conflict), so at most a TTL after the record went; a node-mode owner
        keeps it by its epoch until it sees the record gone (and writes it
        back, `keeper._damaged`) or the epoch is over. A node that cannot
        tell a deleted record from one never written (it never saw one and
        knows no generation) claims at once, as a new cluster's shards must
        be: the host refuses that claim's generation if another host opened
        one as high, and that refusal keeps the shard from every node for a
        TTL (`refused`)."""
        if self.max_generation.get(shard, 0) == 0:
            return True
        # Known to have existed: as a damaged record, never while an epoch
        # that may keep it lives, and only once the epochs said that none
        # does (`attribute`): an owner that never knew this node (it learned
        # the generation from a refusal, or from what was published) keeps it
        # by its epoch as long as it lives (issue 38, family B).
        kept = self.kept_by_epoch(shard)
        if kept is not None and (kept.owner, kept.incarnation) != (self.name, self.incarnation) \
                and not self.epochs.over(kept, now):
            return False
        seen = self.seen.get(shard)
        return seen is not None and now - seen.since > self.refusal_wait(shard) \
            and self.unkept.get(shard) == MISSING

    def reserved_here(self, stored: Stored[Lease] | None) -> bool:
        """Whether the record is kept for this node by name (a free lease
        reserved for it, or a lease of an epoch of ours ended with a hold):
        a node back from a restart claims those first, in its first round."""
        rec = stored.record if stored is not None else None
        if rec is None:
            return False
        if rec.owner is None:
            return rec.reserved() == self.name
        return rec.owner == self.name and rec.renewal == "node" \
            and self.epochs.reserved_for_owner(rec)

    def attribute(self, shards: Iterable[int], leases: dict[int, Stored[Lease]],
                  keepers: list[Epoch] | None, now: float, *, since: float) -> None:
        """Judge damaged records (`shards`) by the epoch records not ended
        (`keepers`, read after the records were seen unchanged for a TTL;
        None if they could not be read): one an epoch says it keeps (or one
        that says nothing) is that epoch's (`kept_by_epoch`: claimable once
        the epoch is over, by ending it), whatever this node saw of the
        record before (a node paused for long may have seen an older owner's
        record); one no live epoch keeps is claimable this round, once
        seen unchanged for the longest TTL of ours and theirs since `since`
        (since when every epoch listing succeeded, and no epoch vanished
        unseen: a deleted record no longer says what it kept).

        Why that suffices: an owner that keeps a shard open by its epoch has
        it in `keeps` of every epoch write since the first one after it
        opened the shard, and until then holds it no longer than its claim
        gave (sent + TTL - margin; loop.PlacementLoop._claim_one). The damage
        came after that claim landed, and this node read the epoch at least a
        TTL after it saw the damage: a write that lacks the shard was its
        owner's last, and its deadline has passed."""
        self.unkept = {}
        if keepers is None:
            return
        kept: list[tuple[Epoch, frozenset[int] | None]] = []
        for epoch in keepers:
            try:
                kept.append((epoch, None if epoch.keeps is None
                             else decode_shards(epoch.keeps)))
            except CorruptRecord:
                kept.append((epoch, None))
        wait = max([self.ttl(), *(e.ttl for e in keepers)])
        for shard in shards:
            stored = leases.get(shard)
            seen = self.seen.get(shard)
            if seen is None:
                continue
            generation = self.max_generation.get(shard, 0) if stored is None \
                else stored.generation or 0
            of = [Lease(cluster=self.cluster, shard=shard, owner=e.node,
                        generation=generation, incarnation=e.epoch,
                        write_id="learned-from-its-epoch", ttl=e.ttl, renewal="node")
                  for e, s in kept if s is None or shard in s]
            live = [lease for lease in of if not self.epochs.over(lease, now)]
            # The epochs say who keeps it, whatever this node saw of the record
            # before (a node that was paused may have seen an older owner's).
            chosen = live[0] if live else of[0] if of else None
            before = self.attributed.get(shard)
            if chosen is not None and (before is None or before.owner != chosen.owner
                                       or before.incarnation != chosen.incarnation):
                logger.warning("shard %d: its damaged record is kept by epoch %s of node %s: "
                               "left to it until that epoch is over", shard,
                               chosen.incarnation, chosen.owner)
            self.attributed[shard] = chosen
            # (The longest TTL seen: the last readable record may be a free
            # written after a refusal at the refuser's TTL, not its owner's.)
            if not live and now - max(seen.since, since) > max(wait,
                                                                self.refusal_wait(shard)):
                self.unkept[shard] = MISSING if stored is None else stored.version

    def blind(self, shard: int, stored: Stored[Lease] | None) -> bool:
        """Whether a claim of `shard` over `stored` would be blind: no
        generation of it known (no record, or one whose generation cannot be
        read, and none ever seen), so the one claimed is 1, which a host may
        have opened already under a record deleted since (issue 38:
        `keeper.Held.blind`, `kept_live`)."""
        return (stored is None or stored.generation is None) \
            and shard not in self.max_generation

    def kept_live(self, keepers: list[Epoch] | None, now: float) -> frozenset[int] | None:
        """The shards the live epochs among `keepers` (`EpochWatch.keepers`,
        read just now) say they keep; None if they may keep any (they could
        not be read, or a live one says nothing readable).

        Why a node-mode claim of a shard it knows no generation of asks
        (`loop.PlacementLoop._claim`): its record may have been deleted
        under an owner that keeps it open by its epoch, whose listings are
        stale and whose repairs fail; a node that never saw the record has
        nothing else to tell it from a shard nobody ever held, and would
        claim generation 1, which that owner opened (regression
        seed-123095345). The owner's epoch has named it since the first
        epoch write after its claim; before that write it holds it no longer
        than its claim gave, and only at generation 1 too, which the host
        of a blind claim refuses."""
        if keepers is None:
            return None
        kept: set[int] = set()
        for epoch in keepers:
            lease = Lease(cluster=self.cluster, shard=0, owner=epoch.node, generation=0,
                          incarnation=epoch.epoch, write_id="learned-from-its-epoch",
                          ttl=epoch.ttl, renewal="node")
            if self.epochs.over(lease, now):
                continue
            if epoch.keeps is None:
                return None
            try:
                kept |= decode_shards(epoch.keeps)
            except CorruptRecord:
                return None
        return frozenset(kept)

    def kept_by_epoch(self, shard: int) -> Lease | None:
        """Who keeps a shard whose record is damaged now, by its epoch: what
        the epochs said (`attribute`), else the last valid record this node
        saw, if it was a node-mode lease of another node's (or an older
        epoch of ours)."""
        if shard in self.attributed:
            return self.attributed[shard]
        last = self.readable.get(shard)
        if last is None or last.owner is None or last.renewal != "node":
            return None
        return last

    def free_for(self, shard: int, stored: Stored[Lease] | None, now: float) -> float:
        """Seconds this node has seen the shard free (no record, or no owner)
        or claimable by expiry (an owner that stopped keeping it: its record,
        or in node mode its epoch, unchanged for the TTL it is judged by);
        0 if it is neither. A shard its owner closed but cannot free (its
        lease writes fail) expires like this, and must then find a node even
        if every node is at its share: adoption counts this."""
        seen = self.seen.get(shard)
        if seen is None:
            return 0.0
        ttl = self.ttl()
        rec = stored.record if stored is not None else None
        if stored is None or (rec is not None and rec.owner is None):
            return now - seen.since
        if rec is None:  # corrupt: held until unchanged for a TTL; a newer format, for ever
            if stored.newer_format is not None or not self.claimable(shard, stored, now):
                return 0.0
            return max(0.0, now - seen.since - ttl)
        if rec.owner == self.name and rec.incarnation in self.own_epochs():
            return 0.0
        if rec.renewal == "node":
            silent = self.epochs.silent_for((rec.owner or "", rec.incarnation or ""), now)
            return max(0.0, silent - max(ttl, rec.ttl))
        return max(0.0, now - seen.since - max(ttl, rec.ttl))
