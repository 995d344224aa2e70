"""The placement loop: one node's rounds of heartbeat, renew, share, release, claim.

Every `interval` (interval/2 after a failed renewal) a node:

1. heartbeats;
2. renews every lease it holds, and stops any shard whose lease it lost;
3. computes its fair share, ceil(shards / live nodes);
4. releases shards above its share: the runner closes the shard, and only
   then is the lease freed, so the next owner opens a closed shard;
5. reads every lease (this feeds `lookup`) and claims free or expired leases
   up to its share, handing each to the runner with the lease's generation.

Time. Expiry and liveness are judged only on this node's monotonic clock:
a record is expired when this node has seen its version unchanged for a whole
`lease_ttl`, as client-go's leader election does. Wall-clock times written in
records are never compared, so skewed clocks cannot make two owners. Every
write carries a fresh `write_id`, so every renewal changes the version even
on stores whose versions are content hashes (S3 ETags).

The loop knows no store and no host: it talks to a `LeaseStore` and a runner.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import logging
import math
import uuid
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

from shardlease.clock import Clock, LoopClock
from shardlease.errors import Conflict, EngineError, RunnerDied, StoreError
from shardlease.hosts.base import Host
from shardlease.options import Options
from shardlease.records import Heartbeat, Lease, Stored, new_write_id
from shardlease.runner import Reason, Runner, State
from shardlease.stores.base import LeaseStore
from shardlease.telemetry import (
    Claim,
    CorruptLease,
    Lost,
    Release,
    RenewFailed,
    Round,
    Telemetry,
)

logger = logging.getLogger("shardlease.loop")

#: Store writes in flight at once for renewals and claims.
WRITE_CONCURRENCY = 32


@dataclass
class _Held:
    lease: Lease
    version: str
    releasing: bool = False
    closed: Reason | None = None  # the runner closed it; the lease is to be freed
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)


@dataclass
class _Seen:
    """A record as this node saw it: its version and when that version was first seen."""

    version: str
    since: float
    record: Lease | None


@dataclass(frozen=True)
class Owner:
    shard: int
    owner: str | None
    generation: int


def preference(node: str, shard: int) -> int:
    """Rendezvous score: each node prefers different shards, so concurrent
    claimers rarely race for the same lease and placements stay put."""
    digest = hashlib.blake2b(f"{node}\0{shard}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big")


class PlacementLoop:
    def __init__(
        self,
        store: LeaseStore,
        host: Host,
        options: Options,
        *,
        peers: Callable[[], Iterable[str]] | None = None,
        clock: Clock | None = None,
        telemetry: Telemetry | None = None,
    ) -> None:
        self.store = store
        self.options = options
        self.name = options.name
        self.cluster = options.cluster_name
        self.peers = peers or (lambda: ())
        self.clock = clock or LoopClock()
        self.telemetry = telemetry or Telemetry()
        self.incarnation = uuid.uuid4().hex
        self.runner = Runner(
            host,
            cluster=self.cluster,
            node=self.name,
            clock=self.clock,
            telemetry=self.telemetry,
            max_concurrency=options.max_concurrency,
            open_timeout=options.open_timeout,
            close_timeout=options.close_timeout,
            on_closed=self._on_closed,
        )
        self.held: dict[int, _Held] = {}
        self.ready = asyncio.Event()  # set once a round read the leases
        self.rounds = 0
        self._seen: dict[int, _Seen] = {}
        self._max_generation: dict[int, int] = {}
        self._beats: dict[str, tuple[str, float]] = {}
        self._live: set[str] = {self.name}
        self._owners: dict[int, Owner] = {}
        self._hb_seq = 0
        # Held by a heartbeat write and by its deletion: a graceful stop must
        # not delete the heartbeat while a write of it is on its way.
        self._hb_lock = asyncio.Lock()
        self._hb_deleted = False
        self._stop_started: float | None = None
        self._strays = True  # leases of ours not held may remain (unknown until a read)
        self._stopping = False
        self._wake = asyncio.Event()
        self._tasks: set[asyncio.Task[None]] = set()
        self._done = asyncio.Event()

    # -- public --------------------------------------------------------------

    @property
    def ttl(self) -> float:
        return self.options.lease_ttl

    def lookup(self, shard: int) -> str | None:
        """The owner of `shard` from the last good read, if it is a known peer
        (or this node). Lease data alone never makes a routing target."""
        owner = self._owners.get(shard)
        if owner is None or owner.owner is None:
            return None
        if owner.owner == self.name or owner.owner in set(self.peers()):
            return owner.owner
        return None

    def owners(self) -> list[Owner]:
        """Every shard's owner and generation from the last good read."""
        return [self._owners.get(s, Owner(s, None, 0)) for s in range(self.options.shards)]

    def live_nodes(self) -> set[str]:
        return set(self._live)

    def open_shards(self) -> dict[int, State]:
        return self.runner.shards()

    async def run(self) -> None:
        """Run rounds until `stop()` (graceful) or cancellation (closes every
        shard, frees what it can, then re-raises)."""
        runner = asyncio.create_task(self.runner.run(), name="shardlease-runner")
        try:
            while True:
                started = self.clock.monotonic()
                ok = await self._round()
                if self._stopping and not self.held and not self._strays_pending():
                    break
                delay = self.options.interval_s if ok else self.options.interval_s / 2
                if self._stopping:
                    delay = min(delay, self.options.interval_s / 4)
                # Rounds start every `interval` (start to start): a slow store
                # must not stretch the time between two renewals by the
                # length of a round.
                delay = max(0.0, delay - (self.clock.monotonic() - started))
                self._wake.clear()
                waiter = asyncio.create_task(self._wake.wait())
                try:
                    await asyncio.wait({waiter, runner}, timeout=delay,
                                       return_when=asyncio.FIRST_COMPLETED)
                finally:
                    waiter.cancel()
                if runner.done():
                    raise RunnerDied("the shard runner stopped") from (
                        None if runner.cancelled() else runner.exception())
        except asyncio.CancelledError:
            self._stopping = True
            await self._abandon(runner)
            raise
        except BaseException:
            await self._abandon(runner)
            raise
        else:
            runner.cancel()
            await asyncio.gather(runner, return_exceptions=True)
            await self._drain_tasks()
            if not self._hb_deleted:  # stop() could not delete it: try once more
                with contextlib.suppress(StoreError, TimeoutError):
                    await asyncio.wait_for(self._delete_heartbeat(), self.options.interval_s)
        finally:
            self._done.set()

    async def stop(self) -> None:
        """Graceful stop: stop heartbeating (peers stop counting this node at
        once), close every shard and free its lease, so peers take over within
        about one interval instead of waiting out the TTL."""
        if not self._stopping:
            self._stopping = True
            self._stop_started = self.clock.monotonic()
            logger.info("stopping: releasing %d shard(s)", len(self.held))
            try:
                await self._delete_heartbeat()
            except StoreError as e:
                logger.warning("could not delete the heartbeat: %s", e)
            self._wake.set()
        await self._done.wait()

    # -- one round -------------------------------------------------------------

    async def _round(self) -> bool:
        started = self.clock.monotonic()
        if not self._stopping:
            await self._heartbeat()
        ok = await self._renew_all()
        live = await self._live_nodes()
        share = 0 if self._stopping else math.ceil(self.options.shards / max(1, len(live)))
        self._release_excess(share)
        leases = await self._read_leases()
        if leases is not None and not self._stopping and self.runner.running:
            await self._claim(leases, share)
        elif leases is not None and self._stopping:
            await self._free_strays(leases)
        self.rounds += 1
        self.telemetry.emit(Round(cluster=self.cluster, node=self.name, live_nodes=len(live),
                                  share=share, held=len(self.held),
                                  duration=self.clock.monotonic() - started, ok=ok))
        return ok

    async def _heartbeat(self) -> None:
        async with self._hb_lock:
            if self._stopping:
                return
            self._hb_seq += 1
            hb = Heartbeat(cluster=self.cluster, node=self.name, incarnation=self.incarnation,
                           seq=self._hb_seq, write_id=new_write_id(), at=self.clock.wall())
            try:
                await self.store.put_heartbeat(hb)
            except StoreError as e:
                logger.warning("heartbeat failed: %s", e)

    async def _delete_heartbeat(self) -> None:
        """After any heartbeat write in flight, so that it cannot land after."""
        async with self._hb_lock:
            await self.store.delete_heartbeat(self.cluster, self.name)
            self._hb_deleted = True

    async def _renew_all(self) -> bool:
        """Renew (or, once closed, free) every held lease. False if any failed
        for a reason other than losing it, so the next round comes sooner."""
        failed: list[int] = []
        errors: list[str] = []
        limit = asyncio.Semaphore(WRITE_CONCURRENCY)

        async def one(shard: int, held: _Held) -> None:
            async with limit:
                try:
                    if held.closed is not None:
                        await self._free(shard, held)
                    else:
                        await self._renew(shard, held)
                except StoreError as e:
                    failed.append(shard)
                    errors.append(str(e))

        await asyncio.gather(*(one(s, h) for s, h in list(self.held.items())))
        if failed:
            logger.warning("renewal failed for %d shard(s): %s", len(failed), errors[0])
            self.telemetry.emit(RenewFailed(cluster=self.cluster, node=self.name,
                                            shards=tuple(sorted(failed)), error=errors[0]))
        return not failed

    async def _renew(self, shard: int, held: _Held) -> None:
        async with held.lock:
            if self.held.get(shard) is not held or held.closed is not None:
                return
            lease = held.lease.model_copy(update={"write_id": new_write_id(),
                                                  "renewed_at": self.clock.wall(),
                                                  "ttl": self.ttl})
            sent = self.clock.monotonic()
            try:
                version = await self._write_held(held, lease)
            except Conflict:
                self._lost(shard)
                return
            held.lease, held.version = lease, version
            self.runner.extend(shard, self._deadline(sent))

    async def _write_held(self, held: _Held, lease: Lease) -> str:
        """Compare-and-swap a lease this node holds. A conflict may be this
        node's own earlier write whose answer was lost and could not be
        recognised then (the read-back failed too): if the record is still
        this incarnation's, with our generation, nobody else wrote it, so take
        its version and write once more. Raises `Conflict` when another node
        wrote the record, `StoreError` when that cannot be told yet."""
        try:
            return await self.store.write_lease(lease, held.version)
        except Conflict:
            current = await self.store.get_lease(self.cluster, lease.shard)
            rec = current.record if current is not None else None
            if current is None or rec is None or rec.owner != self.name \
                    or rec.incarnation != self.incarnation \
                    or rec.generation != held.lease.generation \
                    or current.version == held.version:
                raise
            logger.info("shard %d: an earlier write of ours had landed; resuming from it",
                        lease.shard)
            held.version = current.version
        return await self.store.write_lease(lease, held.version)

    def _deadline(self, sent: float) -> float:
        return sent + self.ttl - self.options.margin_s

    def _lost(self, shard: int) -> None:
        logger.warning("lost the lease of shard %d: another node holds it", shard)
        self.held.pop(shard, None)
        self.runner.stop(shard, Reason.LOST)
        self.telemetry.emit(Lost(cluster=self.cluster, node=self.name, shard=shard))

    async def _live_nodes(self) -> set[str]:
        try:
            beats = await self.store.list_heartbeats(self.cluster)
        except StoreError as e:
            logger.warning("could not read heartbeats, keeping the last live set: %s", e)
            return self._live
        now = self.clock.monotonic()
        for node, version in beats.items():
            seen = self._beats.get(node)
            if seen is None or seen[0] != version:
                self._beats[node] = (version, now)
        for node in set(self._beats) - set(beats):
            del self._beats[node]  # deleted: a graceful stop
        live = {n for n, (_, since) in self._beats.items() if now - since <= self.ttl}
        if not self._stopping:
            live.add(self.name)
        else:
            live.discard(self.name)
        self._live = live
        return live

    def _release_excess(self, share: int) -> None:
        keep = [s for s, h in self.held.items() if not h.releasing]
        excess = len(keep) - share
        if excess <= 0:
            return
        # Shards not yet open go first (nothing to close), then the ones this
        # node likes least, so the shards it keeps are the ones it would claim.
        def cost(s: int) -> tuple[int, int]:
            opened = self.runner.state(s) not in (State.WAITING, None)
            return (int(opened), preference(self.name, s))

        for shard in sorted(keep, key=cost)[:excess]:
            self.held[shard].releasing = True
            self.runner.stop(shard, Reason.SHUTDOWN if self._stopping else Reason.RELEASE)

    async def _read_leases(self) -> dict[int, Stored[Lease]] | None:
        try:
            leases = await self.store.list_leases(self.cluster)
        except StoreError as e:
            logger.warning("could not read the leases, no claims this round: %s", e)
            return None
        now = self.clock.monotonic()
        owners: dict[int, Owner] = {}
        for shard in range(self.options.shards):
            stored = leases.get(shard)
            if stored is None:
                self._seen.pop(shard, None)
                continue
            seen = self._seen.get(shard)
            if seen is None or seen.version != stored.version:
                self._seen[shard] = _Seen(stored.version, now, stored.record)
                if stored.record is None:
                    logger.warning("shard %d: corrupt lease record: %s", shard, stored.error)
                    self.telemetry.emit(CorruptLease(cluster=self.cluster, node=self.name,
                                                     shard=shard, error=stored.error or ""))
            if stored.record is not None:
                gen = stored.record.generation
                self._max_generation[shard] = max(gen, self._max_generation.get(shard, 0))
                owners[shard] = Owner(shard, stored.record.owner, gen)
        for shard, held in self.held.items():
            owners[shard] = Owner(shard, self.name, held.lease.generation)
        self._owners = owners
        self.ready.set()
        return leases

    def _claimable(self, shard: int, stored: Stored[Lease] | None, now: float) -> bool:
        if shard in self.held or self.runner.state(shard) is not None:
            return False
        if stored is None:
            return True
        rec = stored.record
        if rec is not None and rec.owner is None:
            return True
        if rec is not None and rec.owner == self.name and rec.incarnation == self.incarnation:
            return True  # ours, dropped after a fence: nobody else can hold it
        seen = self._seen[shard]
        ttl = max(self.ttl, rec.ttl) if rec is not None else self.ttl
        return now - seen.since > ttl

    async def _claim(self, leases: dict[int, Stored[Lease]], share: int) -> None:
        active = sum(1 for h in self.held.values() if not h.releasing)
        want = share - active
        if want <= 0:
            return
        now = self.clock.monotonic()
        candidates = [s for s in range(self.options.shards)
                      if self._claimable(s, leases.get(s), now)]
        candidates.sort(key=lambda s: preference(self.name, s), reverse=True)
        limit = asyncio.Semaphore(WRITE_CONCURRENCY)

        async def one(shard: int) -> None:
            async with limit:
                try:
                    await self._claim_one(shard, leases.get(shard))
                except StoreError as e:
                    logger.info("claim of shard %d failed: %s", shard, e)

        await asyncio.gather(*(one(s) for s in candidates[:want]))

    async def _claim_one(self, shard: int, stored: Stored[Lease] | None) -> None:
        # A corrupt record still carries the generation its raw bytes show.
        previous = stored.generation if stored is not None else None
        if stored is not None and stored.record is None:
            logger.warning("claiming shard %d over a corrupt lease record", shard)
        generation = max(previous or 0, self._max_generation.get(shard, 0)) + 1
        lease = Lease(cluster=self.cluster, shard=shard, owner=self.name, generation=generation,
                      incarnation=self.incarnation, write_id=new_write_id(),
                      renewed_at=self.clock.wall(), ttl=self.ttl)
        sent = self.clock.monotonic()
        try:
            version = await self.store.write_lease(lease, stored.version if stored else None)
        except Conflict:
            logger.debug("shard %d: lost the race to claim it", shard)
            return
        if self._stopping:
            # Stopped while the claim was in flight: hand it straight back.
            held = _Held(lease, version, releasing=True, closed=Reason.SHUTDOWN)
            self.held[shard] = held
            await self._free(shard, held)
            return
        self._max_generation[shard] = generation
        self.held[shard] = _Held(lease, version)
        self._owners[shard] = Owner(shard, self.name, generation)
        try:
            self.runner.start(shard, generation, self._deadline(sent))
        except EngineError as e:  # it ended while we claimed: the lease is freed on the way out
            raise RunnerDied("the shard runner stopped") from e
        self.telemetry.emit(Claim(cluster=self.cluster, node=self.name, shard=shard,
                                  generation=generation))

    # -- after the runner closed a shard ----------------------------------------

    def _on_closed(self, shard: int, reason: Reason) -> None:
        held = self.held.get(shard)
        if held is None:
            return  # lost: nothing to free
        held.closed = reason
        task = asyncio.create_task(self._free_soon(shard, held))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _free_soon(self, shard: int, held: _Held) -> None:
        try:
            await self._free(shard, held)
        except StoreError as e:
            logger.warning("could not free shard %d yet (retried next round): %s", shard, e)
        self._wake.set()

    async def _free(self, shard: int, held: _Held) -> None:
        """Write "no owner" (keeping the generation) on a closed shard's lease."""
        async with held.lock:
            if self.held.get(shard) is not held:
                return
            lease = held.lease.model_copy(update={"owner": None, "incarnation": None,
                                                  "write_id": new_write_id(),
                                                  "renewed_at": self.clock.wall()})
            try:
                await self._write_held(held, lease)
            except Conflict:
                self.held.pop(shard, None)
                self.telemetry.emit(Lost(cluster=self.cluster, node=self.name, shard=shard))
                return
            except StoreError:
                if held.closed is Reason.FENCED:
                    # Fenced: the lease is not ours to keep; it will expire.
                    self.held.pop(shard, None)
                    return
                raise
            self.held.pop(shard, None)
            self._owners.pop(shard, None)
            self.telemetry.emit(Release(cluster=self.cluster, node=self.name, shard=shard))

    def _strays_pending(self) -> bool:
        """Stopping: keep trying to free stray leases for up to a TTL after
        stop() (by then they have expired anyway)."""
        if not self._strays or self._stop_started is None:
            return False
        return self.clock.monotonic() - self._stop_started < self.ttl

    async def _free_strays(self, leases: dict[int, Stored[Lease]]) -> None:
        """Stopping: free the leases that still name this incarnation but that
        the loop no longer holds (a fenced shard whose free failed, a claim
        whose answer was lost), so that peers need not wait for them to
        expire. Nobody else writes this incarnation's records, and the shard
        is not in the runner, so a compare-and-swap on the version just read
        frees it safely."""
        failed = False
        for shard, stored in leases.items():
            rec = stored.record
            if rec is None or rec.owner != self.name or rec.incarnation != self.incarnation \
                    or shard in self.held or self.runner.state(shard) is not None:
                continue
            lease = rec.model_copy(update={"owner": None, "incarnation": None,
                                           "write_id": new_write_id(),
                                           "renewed_at": self.clock.wall()})
            try:
                await self.store.write_lease(lease, stored.version)
            except Conflict:
                # Changed since the read: freed by this node's own release in
                # the meantime, or taken by a peer. Either way no longer ours.
                continue
            except StoreError as e:
                logger.info("could not free the stray lease of shard %d: %s", shard, e)
                failed = True
                continue
            self._owners.pop(shard, None)
            self.telemetry.emit(Release(cluster=self.cluster, node=self.name, shard=shard))
        self._strays = failed

    async def _drain_tasks(self) -> None:
        if self._tasks:
            await asyncio.gather(*list(self._tasks), return_exceptions=True)

    async def _abandon(self, runner: asyncio.Task[None]) -> None:
        """Cancelled or failed: the runner closes every open shard (its abort),
        then free what we can without waiting for anything slow."""
        runner.cancel()
        await asyncio.gather(runner, return_exceptions=True)
        await self._drain_tasks()
        for shard, held in list(self.held.items()):
            if held.closed is None:
                held.closed = Reason.SHUTDOWN
            with contextlib.suppress(StoreError, TimeoutError):
                await asyncio.wait_for(self._free(shard, held), self.options.interval_s)
        with contextlib.suppress(StoreError, TimeoutError):
            await asyncio.wait_for(self.store.delete_heartbeat(self.cluster, self.name),
                                   self.options.interval_s)
