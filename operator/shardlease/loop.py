"""The placement loop: composes one node's parts and runs their schedules.

The parts, each with one job (docs/renewal.md names which rule each keeps):

- `keeper.Keeper`: the leases this node holds (renew, hand over, free, lose),
  every write of one through a single compare-and-swap step;
- `own_epoch.OwnEpoch`: this node's epoch in node mode (the renewal of every
  node-mode lease it holds); `epochs.EpochWatch`: what it sees of others';
- `heartbeats.Heartbeats`: its heartbeat in shard mode, and which peers are
  live by theirs;
- `view.LeaseView`: what it saw of the leases, judged (claimable, free for how
  long, owners for `lookup`);
- `placement.plan`: the round's decision, a pure function of that view;
- `runner.Runner`: opens, closes and deadlines, in a task of its own.

Schedules, each its own task, so that nothing slow on one delays another:

- heartbeats (shard mode) or the epoch (node mode): every `interval`;
- renewals: every `interval` (interval/2 after a failure), renew every lease
  the node holds, or free it once the runner closed its shard. Renewals never
  wait behind a heartbeat, a listing, a GET or a claim: those are what a slow
  store makes slow, and a renewal late by more than `ttl - margin` fences
  every shard;
- rounds of placement, every `interval`:
  1. read the heartbeats, the epochs and the leases (this feeds `lookup`):
     the heartbeats beside the other two, the epochs before the leases,
     whose listing is told of them (`_read_records`);
  2. plan (`placement.plan`): the fair share, ceil(shards / live nodes), what
     to release above it, what to claim up to it, what to adopt;
  3. release: the runner closes the shard, and only then is the lease freed,
     so the next owner opens a closed shard;
  4. claim, handing each claimed shard to the runner with the lease's
     generation. The node's life (`Life`) says when: its first round claims
     nothing (peers' records may not be there yet) unless every peer the
     node knows of (`peers`: the pod list) is live in it already, a stopping
     node claims nothing and gives everything up.

  A round also starts early on a hint (`hint()`): a peer freed leases or
  joined, told by a store's watch or by the peer itself (`shardlease.hints`).
  A hint only wakes a round, which judges what it reads as any round does;
  woken rounds start on average at least `HINT_GAP` intervals apart (two
  may come back to back: `paced`), and a burst of hints wakes one round,
  once `HINT_QUIET` passed without another (at most `HINT_SETTLE` after the
  first).

Budgets. Every store call of a round and every heartbeat gets a budget below
the interval (`calls.CALL_BUDGET` of it): failures are retried within it after a
backoff with jitter that never sleeps past it, and a call still unanswered at
its end is abandoned: the caller stops waiting. A read or heartbeat request
itself goes on (cancelling an HTTP request costs its connection, and the next
request would be slower still): the next caller joins it instead of starting
another, and one unanswered for a whole TTL is cancelled. Claims are
cancelled at the budget. A renewal may take until the shard's deadline (it
is useful until then), and a free a TTL. A slow or throttling store thus
costs a round its claims, never a renewal its pace.

Time. Expiry and liveness are judged only on this node's monotonic clock:
a record is expired when this node has seen its version unchanged for a whole
`lease_ttl`, as client-go's leader election does. Wall-clock times written in
records are never compared, so skewed clocks cannot make two owners. Every
write carries a fresh `write_id`, so every renewal changes the version even
on stores whose versions are content hashes (S3 ETags).

Node-mode renewal (after CockroachDB's epoch leases) and every rule of it
are in docs/renewal.md, with the safety argument and the test of each rule.

The loop knows no store and no host: it talks to a `LeaseStore` and a runner.
"""

from __future__ import annotations

import asyncio
import contextlib
import enum
import functools
import logging
import math
import random
import uuid
from collections.abc import Awaitable, Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from shardlease import placement
from shardlease.calls import Calls
from shardlease.clock import Clock, LoopClock
from shardlease.epochs import EpochKey, EpochWatch
from shardlease.errors import ConfigError, Conflict, EngineError, RunnerDied, StoreError
from shardlease.heartbeats import Heartbeats
from shardlease.hosts.base import Host
from shardlease.keeper import (
    WRITE_CONCURRENCY,
    Held,
    Keeper,
    Phase,
    gather_limited,
    refusal_hold,
)
from shardlease.options import Options
from shardlease.own_epoch import OwnEpoch
from shardlease.placement import preference as preference
from shardlease.records import MAX_HOLD, Lease, Stored, new_write_id
from shardlease.runner import Ended, Reason, Runner, State
from shardlease.stores.base import Change, LeaseStore, Listed
from shardlease.telemetry import (
    Claim,
    Joined,
    Round,
    Telemetry,
)
from shardlease.view import LeaseView
from shardlease.view import Owner as Owner

logger = logging.getLogger("shardlease.loop")

#: The pace of rounds a hint woke, in intervals between starts (after a
#: burst of HINT_BURST): what bounds the store load a storm of hints can
#: make (at most 1 / HINT_GAP woken rounds an interval, and HINT_BURST,
#: besides the one of its time).
HINT_GAP = 0.25
#: Seconds a woken round waits after a hint of a freed lease (at most
#: HINT_GAP intervals): the frees of one stop or one rebalance come within
#: tens of milliseconds of each other (each close ends, then its lease is
#: freed), and a round that starts at the first would leave the rest to the
#: next woken round, HINT_GAP later. An ended epoch or a peer come or gone
#: is one event that says it all: its round starts at once (`settles`).
HINT_SETTLE = 0.1
#: ... but only until no hint came for this long: the frees of one burst
#: come a few ms apart, so a quiet moment says the burst is over (a debounce,
#: capped by HINT_SETTLE), and a lone free's round starts this soon after it.
HINT_QUIET = 0.03
#: Woken rounds that may start back to back before HINT_GAP paces them. A
#: leave a watch sees (a stopping node's heartbeat deleted, so that the
#: peers' share counts it gone) wakes a round while the leaver still holds
#: its leases; its frees come a moment later, as its closes end, and their
#: round must not wait out the gap the leave's round began (on a real API
#: server it did: every freed shard reopened 0.5 s after its close).
HINT_BURST = 2


def paced(credit: float, started: float, gap: float) -> float:
    """The pace of woken rounds, a leaky bucket (GCRA) of HINT_BURST rounds:
    `credit` is the time until which woken rounds have used the rate (-inf
    at first), a woken round began at `started`, and `gap` is HINT_GAP
    intervals in seconds; the new credit. The next woken round may start
    at `woken_due(credit, gap)`."""
    return max(credit, started) + gap


def woken_due(credit: float, gap: float) -> float:
    """The earliest start of the next woken round: HINT_BURST - 1 rounds
    ahead of the pace. Over any time T at most T / gap + HINT_BURST woken
    rounds start, and no HINT_BURST + 1 of them within one gap."""
    return credit - (HINT_BURST - 1) * gap


def settles(change: Change) -> bool:
    """Whether the round a change wakes waits HINT_SETTLE for more like it:
    a freed lease (more frees follow, one by one); not an epoch's end (one
    write frees every shard it kept) nor a heartbeat."""
    return change.kind == "lease"


def wakes(change: Change, name: str) -> bool:
    """Whether a change a store's watch saw is worth a round now: a lease
    freed, a peer's epoch ended or gone, a peer's liveness record new or gone
    (the share changes). Renewals (of leases, epochs or heartbeats) and
    claims are not: they free nothing and change no share."""
    if change.kind == "lease":
        return change.free and change.what != "deleted"
    if change.node == name:
        return False
    if change.kind == "epoch":
        return change.ended or change.what != "modified"
    return change.what != "modified"  # heartbeats


@dataclass
class _Cooldown:
    failures: int
    until: float


class Life(enum.Enum):
    """Where the node's life stands, and what each stage allows."""

    #: Reads and renews, claims nothing: its first round only reads (peers'
    #: liveness records may not be there yet; a node that sees only itself
    #: would claim every shard to give most of them back a round later),
    #: unless it shows every peer the node knows of live.
    STARTING = "starting"
    #: Claims, releases and renews.
    RUNNING = "running"
    #: `stop()` (or a cancellation): claims nothing, closes and frees every
    #: shard, looks for strays for up to a TTL.
    STOPPING = "stopping"
    #: `run()` returned or raised: nothing runs.
    STOPPED = "stopped"


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
        rng: random.Random | None = None,
    ) -> None:
        self.store = store
        # Failed calls are retried within the loop's budgets (calls.py), never
        # by the store on a schedule of its own.
        store.retried_by_caller()
        self.options = options
        self.name = options.name
        self.cluster = options.cluster_name
        self.peers = peers or (lambda: ())
        self.clock = clock or LoopClock()
        self.telemetry = telemetry or Telemetry()
        #: Jitter of retries and cooldowns (seeded by simulations).
        self.rng = rng or random.Random()
        self.incarnation = uuid.uuid4().hex
        self.mode = options.renewal
        self.runner = Runner(
            host,
            cluster=self.cluster,
            node=self.name,
            clock=self.clock,
            telemetry=self.telemetry,
            max_concurrency=options.max_concurrency,
            open_timeout=options.open_timeout,
            close_timeout=options.close_timeout,
            margin=options.margin_s,
            warn_ahead=options.interval_s / 2,
            extend_timeout=options.interval_s,
            on_closed=self._on_closed,
        )
        self.ready = asyncio.Event()  # set once a round read the leases
        self.rounds = 0
        self._cooldown: dict[int, _Cooldown] = {}
        self._live: set[str] = {self.name}
        #: The nodes live by their epochs in the last epoch listing that
        #: succeeded (a failed one keeps them; heartbeats keep theirs too).
        self._epoch_live: set[str] = set()
        #: When the node began to stop (monotonic), None before.
        self._stop_started: float | None = None
        #: Whether the last lease listing had node-mode leases (shard-mode
        #: nodes read the epochs only then).
        self._node_leases = False
        self.life = Life.STARTING
        self._wake = asyncio.Event()
        #: A hint came since the last round began: the next one starts soon.
        self._hinted = False
        #: The round the hints ask for waits for more frees (see `hint`).
        self._settle = True
        #: When the first and the last hint since the last round began came.
        self._first_hint = self._last_hint = -math.inf
        #: Whether this node's liveness record has landed once (`Joined`).
        self._joined = False
        #: When the rounds of the first interval end (set by the first).
        self._claims_from = math.inf
        #: Set (and replaced) by `reconfigure()`: wakes the schedules' sleeps.
        self._reconfigured = asyncio.Event()
        #: The shortest interval of the options before `reconfigure()`: the
        #: renewal pace while a held record still carries another TTL.
        self._earlier_pace = math.inf
        self._tasks: set[asyncio.Task[None]] = set()
        #: Reads and heartbeat writes in flight, by kind: joined, not repeated.
        self.calls = Calls(interval=options.interval_s, ttl=options.lease_ttl,
                           clock=self.clock, rng=self.rng)
        #: What this node sees of every node's epoch (node mode).
        self.epoch_watch = EpochWatch(self.store, self.calls, self.clock, self.telemetry,
                                      cluster=self.cluster, name=self.name,
                                      ttl=lambda: self.ttl, own=lambda: self.epoch)
        #: This node's own epoch (node mode), and the leases it holds.
        self.own = OwnEpoch(self.store, self.calls, self.clock, self.telemetry, self.runner,
                            cluster=self.cluster, name=self.name, incarnation=self.incarnation,
                            ttl=options.lease_ttl, margin=lambda: self.options.margin_s,
                            next_ttl=lambda: self.ttl,
                            shards_of=lambda epoch: self.keeper.shards_of(epoch),
                            on_lost=lambda epoch: self.epoch_watch.ended.add((self.name, epoch)))
        #: This node's heartbeat (shard mode), and the peers live by theirs.
        self.beats = Heartbeats(self.store, self.calls, self.clock, cluster=self.cluster,
                                name=self.name, incarnation=self.incarnation,
                                ttl=lambda: self.ttl, writes=self.mode == "shard",
                                holds_by=lambda: self.keeper.announce())
        #: What this node saw of the leases.
        self.view = LeaseView(self.telemetry, self.epoch_watch, cluster=self.cluster,
                              name=self.name, incarnation=self.incarnation,
                              own_epochs=lambda: self.own_epochs, ttl=lambda: self.ttl)
        self.keeper = Keeper(self.store, self.calls, self.clock, self.telemetry, self.runner,
                             self.own, cluster=self.cluster, name=self.name,
                             options=lambda: self.options, stopping=lambda: self.stopping,
                             earlier_pace=lambda: self._earlier_pace,
                             released=self.view.forget_owner, track=self._track,
                             holds_by_all=self.beats.holds_by_all,
                             kept_off=self.view.keep_off,
                             announced=self.beats.landed_holds_by)
        #: Set once `run()` ended (Life.STOPPED).
        self._done = asyncio.Event()
        #: Why `run()` ended, if it failed (`RunnerDied`, `EngineError`, ...):
        #: for health checks that do not await the task.
        self.failure: BaseException | None = None

    # -- public --------------------------------------------------------------

    @property
    def ttl(self) -> float:
        return self.options.lease_ttl

    @property
    def budget(self) -> float:
        """Seconds a store call (with its retries) may take before it is abandoned."""
        return self.calls.budget

    def lookup(self, shard: int) -> str | None:
        """The owner of `shard` from the last good read, if it is a known peer
        (or this node). Lease data alone never makes a routing target."""
        owner = self.view.owners.get(shard) if shard < self.options.shards else None
        if owner is None or owner.owner is None:
            return None
        if owner.owner == self.name or owner.owner in set(self.peers()):
            return owner.owner
        return None

    def owners(self) -> list[Owner]:
        """Every shard's owner and generation from the last good read."""
        return [self.view.owners.get(s, Owner(s, None, 0)) for s in range(self.options.shards)]

    def highest_generations(self) -> dict[int, int]:
        """The highest generation this node has seen or handed out per shard."""
        return dict(self.view.max_generation)

    def known_generations(self, generations: Mapping[int, int]) -> None:
        """Generations known from elsewhere (a published status, a store
        this node used before): every claim of this loop goes above them."""
        self.view.known_generations(generations)

    def reconfigure(self, options: Options) -> None:
        """Apply new options in place: no shard is closed, no lease given up,
        except the shards a smaller `shards` leaves out.

        - `name` and `cluster_name` cannot change (raises `ConfigError`): they
          are who this node is in every record; that needs a new loop. Nor
          can `renewal` (the mode decides which tasks run).
        - `interval`: each schedule (heartbeats, renewals, rounds) is woken and
          takes the new pace from its next sleep; a round starts at once.
          Renewals keep the old pace if it is faster while any held record
          still carries the old TTL (`_renew_pace`): the deadlines those
          records gave were made for it.
        - `lease_ttl` and `margin`: see below; store calls get the new budgets
          from their next start (`Calls.configure`).
        - `max_concurrency`, `open_timeout`, `close_timeout`: the runner's,
          for the opens and closes that start from now on.
        - `shards`: held shards at or above the new count are released the
          usual way (the runner closes them, then the lease is freed); shards
          new to the count become claimable; `lookup()` and `owners()` use
          the new count at once.

        Why a TTL or margin change is safe while leases are held. A lease's
        expiry, in any observer's eyes, is at least the time its last write
        was sent plus the TTL written *in that record*: observers date a
        version from when they first saw it, and wait max(their own TTL, the
        record's TTL) (`LeaseView.claimable`). So this node's deadline for a shard is
        always computed from the TTL the write that moved it carried
        (`Keeper.deadline(sent, lease.ttl)`), never from the options of the moment:

        - raising the TTL: records keep the old, shorter TTL until a renewal
          writes the new one, and only that renewal's answer moves the
          deadline with it. A peer still on the old options reads the new
          record and waits max(old, new): the longer one. Safe.
        - lowering the TTL: peers still on the old options wait longer than
          needed: safe. This node's deadlines were computed from records that
          carry the old TTL, which every observer honours while they stand. A
          renewal may land (unbeknown to this node: a lost answer) as soon as
          it is sent, and observers then count its TTL from (at the earliest)
          the sending; the shard's deadline, and the validity its host was
          told (never past the deadline), must stay covered by that. So the
          TTL comes down gradually (`Keeper.written_ttl`): a renewal sent at `sent`
          writes at least `deadline - sent + margin`, never less than the
          deadline it keeps needs; each renewal goes down by about an interval
          until the new TTL is reached. No deadline ever moves backwards.
        - margin: a shard keeps the margin its deadline was computed with
          (the runner judges a fenced close against deadline + that margin);
          the new one applies from each shard's next renewal.

        Node mode: an epoch keeps the TTL it started with for its life (its
        leases carry it, and readers wait that), so a TTL change applies to the
        next epoch; meanwhile epoch writes keep the faster of the old and new
        paces (`_epoch_pace`), and a margin the epoch's TTL cannot hold with
        that pace is refused (`ConfigError`): it would fence every shard.

        Liveness by heartbeats uses the new TTL at once; a peer still beating
        at an older, longer interval may look dead for a while, which costs
        balance (a larger share here), never safety: only free or expired
        leases are claimed.
        """
        old = self.options
        for field_name in ("name", "cluster_name", "renewal"):
            if getattr(options, field_name) != getattr(old, field_name):
                raise ConfigError(
                    f"{field_name} cannot change in place ({getattr(old, field_name)!r} -> "
                    f"{getattr(options, field_name)!r}): start a new loop")
        earlier = min(self._earlier_pace, old.interval_s)
        if self.mode == "node" and self.own.ttl != options.lease_ttl:
            pace = min(options.interval_s, earlier)
            if options.margin_s + pace >= self.own.ttl:
                raise ConfigError(
                    f"margin {options.margin_s:g}s: the current epoch keeps its lease TTL "
                    f"({self.own.ttl:g}s) until it ends, and renewing it every {pace:g}s "
                    f"with that margin would fence every shard; keep margin + interval "
                    f"below {self.own.ttl:g}s, or restart the node")
        self.options = options
        self._earlier_pace = earlier
        self.calls.configure(interval=options.interval_s, ttl=options.lease_ttl)
        self.runner.reconfigure(max_concurrency=options.max_concurrency,
                                open_timeout=options.open_timeout,
                                close_timeout=options.close_timeout,
                                margin=options.margin_s, warn_ahead=options.interval_s / 2,
                                extend_timeout=options.interval_s)
        if options.shards < old.shards:
            self._release_beyond()
        changed = [f"{k} {getattr(old, k)} -> {getattr(options, k)}"
                   for k in Options.model_fields if getattr(old, k) != getattr(options, k)]
        if changed:
            logger.info("options changed in place: %s", ", ".join(changed))
        woken, self._reconfigured = self._reconfigured, asyncio.Event()
        woken.set()
        self._wake.set()

    def hint(self, settle: bool = True) -> None:
        """A peer freed leases, or joined (a store's watch event, a hint it
        sent: `shardlease.hints`): start the next round soon rather than at
        its time, so that a freed shard reopens here at once. Nothing else:
        the round judges what it reads as any round does, and every claim is
        a compare-and-swap. Hints that come together wake one round; woken
        rounds keep the pace of `paced` (HINT_GAP intervals apart after a
        burst of HINT_BURST), and start `HINT_SETTLE` after the first hint
        at most (HINT_QUIET after the last) unless one of them
        said all there was to say (`settle` False: see `settles`)."""
        if self.life is Life.STOPPED:
            return
        now = self.clock.monotonic()
        if not self._hinted:
            self._first_hint = now
        self._last_hint = now
        self._settle = settle if not self._hinted else self._settle and settle
        self._hinted = True
        self._wake.set()

    def _on_change(self, change: Change) -> None:
        """A change the store's watch saw: a hint if it may free a shard here
        or change the share (`wakes`)."""
        if wakes(change, self.name):
            self.hint(settle=settles(change))

    def _release_beyond(self) -> None:
        """Release the held shards at or above the shard count (it shrank, or
        a claim in flight when it did landed since)."""
        for shard in placement.releases_beyond(self._placement_held(), self.options.shards):
            self.keeper.release(shard)

    async def _pause(self, due: Callable[[], float]) -> None:
        """Sleep until the monotonic time `due()`, computed again whenever
        `reconfigure()` changes the options (a new interval)."""
        while (left := due() - self.clock.monotonic()) > 0:
            reconfigured = self._reconfigured
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(left):
                    await reconfigured.wait()

    def live_nodes(self) -> set[str]:
        return set(self._live)

    def open_shards(self) -> dict[int, State]:
        return self.runner.shards()

    @property
    def lease_incarnation(self) -> str:
        """What a lease claimed now names as its owner's incarnation: this
        process's, or in node mode its current epoch."""
        return self.epoch if self.mode == "node" else self.incarnation

    @property
    def stopping(self) -> bool:
        """Stopping (or stopped): claims nothing, gives everything up."""
        return self.life in (Life.STOPPING, Life.STOPPED)

    def _begin_stop(self) -> bool:
        """Enter Life.STOPPING; False if the node was stopping already."""
        if self.stopping:
            return False
        self.life = Life.STOPPING
        self._stop_started = self.clock.monotonic()
        return True

    @property
    def held(self) -> dict[int, Held]:
        """The leases this node holds (the keeper's)."""
        return self.keeper.held

    @property
    def epoch(self) -> str:
        """This node's current epoch id (node mode)."""
        return self.own.epoch

    @property
    def own_epochs(self) -> set[str]:
        """Every incarnation a lease of this process may name."""
        return self.own.all | {self.incarnation}

    def phases(self) -> dict[int, Phase]:
        """Each held lease's phase."""
        return {s: h.phase for s, h in self.held.items()}

    async def run(self) -> None:
        """Run until `stop()` (graceful) or cancellation (closes every shard,
        frees what it can, then re-raises). Raises `RunnerDied` if the runner
        stops on its own, `EngineError` if another of the loop's tasks does."""
        # A store that watches its backend wakes a round on what may free a
        # shard here (Kubernetes: the Lease watch); others rely on hints.
        unwatch = self.store.watch_changes(self.cluster, self._on_change)
        runner = asyncio.create_task(self.runner.run(), name="shardlease-runner")
        keepers = [
            asyncio.create_task(self._heartbeats(), name="shardlease-heartbeats"),
            asyncio.create_task(self._renewals(), name="shardlease-renewals"),
        ]
        epochs: asyncio.Task[None] | None = None
        if self.mode == "node":
            epochs = asyncio.create_task(self._epochs(), name="shardlease-epochs")
            keepers.append(epochs)
        try:
            hinted, credit = False, -math.inf
            while True:
                started = self.clock.monotonic()
                # A hint from now on asks for one more round after this one.
                self._hinted = False
                await self._round(hinted=hinted)
                if self.stopping and not self.held and not self._strays_pending():
                    break
                delay = self.options.interval_s
                if self.stopping:
                    delay = delay / 4
                # Rounds start every `interval` (start to start).
                delay = max(0.0, delay - (self.clock.monotonic() - started))
                self._wake.clear()
                if not self._hinted or self.stopping:
                    await self._sleep(delay, runner, keepers, wakeable=True)
                hinted = self._hinted and not self.stopping
                if hinted:
                    # Rate limit: the pace of woken rounds (`paced`; a round
                    # of its time does not count: it may have read just
                    # before the free).
                    await self._settle_hints(credit, delay, runner, keepers)
                    credit = paced(credit, self.clock.monotonic(),
                                   HINT_GAP * self.options.interval_s)
                self._check_alive(runner, keepers)
        except asyncio.CancelledError:
            self._begin_stop()
            await self._abandon(runner, keepers)
            raise
        except BaseException as e:
            self.failure = e
            await self._abandon(runner, keepers)
            raise
        else:
            await _cancel(*(t for t in keepers if t is not epochs))
            if epochs is not None:
                # The epoch's beat in flight, if any, is let finish: the end
                # waits for it (the epoch's lock) and the beats stop there.
                # Cancelled, it may have landed unheard, and the end then
                # conflicts with it and takes two more calls (a read, a
                # write): on a slow store that once took the end past its
                # budget, and the node left its leases to a TTL of silence
                # (the simulation's reply_share; CI at 91dc689, s3-node). The
                # end is useful until peers would end the epoch: a TTL.
                try:
                    async with asyncio.timeout(self.ttl):
                        await self.keeper.end_epoch()
                except (StoreError, TimeoutError) as e:
                    logger.warning("could not end our epoch within %gs (%s): peers take its "
                                   "leases after a TTL of silence", self.ttl,
                                   e or "no answer")
                await _cancel(epochs)
            if not self.beats.deleted:
                # After stop()'s deletion (under the lock, once any heartbeat
                # write in flight has ended), or instead of it if it failed.
                with contextlib.suppress(StoreError, TimeoutError):
                    async with asyncio.timeout(self.ttl + self.options.interval_s):
                        await self.beats.delete()
            await _cancel(*self.calls.in_flight())
            await _cancel(runner)
            await self._drain_tasks()
        finally:
            if unwatch is not None:
                unwatch()
            self.life = Life.STOPPED
            self._done.set()

    async def _settle_hints(self, credit: float, delay: float, runner: asyncio.Task[None],
                            keepers: list[asyncio.Task[None]]) -> None:
        """Before a woken round: not sooner than the pace of woken rounds
        allows (`credit`: `woken_due`), and, if its hints were frees, not
        before HINT_QUIET passed without another hint (at most HINT_SETTLE
        after the first); `delay` at most."""
        interval = self.options.interval_s
        limit = self.clock.monotonic() + delay
        while True:
            until = woken_due(credit, HINT_GAP * interval)
            if self._settle:
                cap = self._first_hint + min(HINT_SETTLE, HINT_GAP * interval)
                until = max(until, min(cap, self._last_hint + HINT_QUIET))
            left = min(until, limit) - self.clock.monotonic()
            if left <= 0 or runner.done() or any(k.done() for k in keepers):
                return
            await self._sleep(left, runner, keepers, wakeable=False)

    async def _sleep(self, delay: float, runner: asyncio.Task[None],
                     keepers: list[asyncio.Task[None]], *, wakeable: bool) -> None:
        """Wait `delay` seconds, less if the runner or a keeper ends (or, if
        `wakeable`, `_wake` is set: a stop, a reconfigure, a hint)."""
        waiter = asyncio.create_task(self._wake.wait()) if wakeable else None
        try:
            await asyncio.wait({*([waiter] if waiter else []), runner,
                                *(k for k in keepers if not k.done())},
                               timeout=delay, return_when=asyncio.FIRST_COMPLETED)
        finally:
            if waiter is not None:
                waiter.cancel()

    async def stop(self, hold: float = 0.0) -> None:
        """Graceful stop: close every shard and free its lease, so that peers
        take over within about one interval instead of waiting out the TTL.
        Shard mode frees each lease and deletes the heartbeat (peers stop
        counting this node at once); node mode ends its epoch once every
        shard is closed, which frees every lease of it in one write.

        `hold` > 0 (`handoff: hold`, a pod being replaced): the leases are
        freed *reserved for this node's name* for that many seconds: peers
        leave them alone until they have seen the reservation unchanged that
        long, and the node of this name, back, claims them at once (in its
        first round). Placement only: every claim stays a compare-and-swap."""
        if hold > 0 and not self.stopping:
            self.keeper.hold = self.own.hold = min(hold, MAX_HOLD)
        if self._begin_stop():
            # Node mode frees strays every round, so this may be False; what
            # a stop leaves (a fenced shard whose free fails) is looked for again.
            self.keeper.strays = True
            logger.info("stopping: releasing %d shard(s)", len(self.held))
            # Node mode: the epoch keeps beating (renewing every shard) while
            # the shards close; once none is held, one write ends it, which
            # frees every lease of it (run(), Keeper.end_epoch): O(1) writes.
            if not self.beats.deleted:
                try:
                    await self.beats.delete()
                except StoreError as e:
                    logger.warning("could not delete the heartbeat: %s", e)
            self._wake.set()
        await self._done.wait()

    # -- epochs (node mode) -------------------------------------------------------------

    async def _epochs(self) -> None:
        """Node mode's renewal: the epoch record every interval (half of it
        after a failure), until the epoch is retired by a graceful stop."""
        while not self.own.retired:
            started = self.clock.monotonic()
            ok = await self.own.beat(silent=self.keeper.withdrawn())
            if ok and self.own.valid() and self._announce() and self.rounds:
                # A round ran before the epoch's first write landed, and a
                # lease must name a live epoch: whatever it would have
                # claimed (the last of nodes started together sees all its
                # peers at once) waits for the next round, which runs now
                # rather than an interval later. Once per start.
                self.hint(settle=False)

            def due(ok: bool = ok, started: float = started) -> float:
                pace = self._epoch_pace()
                return started + (pace if ok else pace / 2)

            await self._pause(due)

    def _epoch_pace(self) -> float:
        """The interval between epoch writes: the options', unless the epoch
        keeps a TTL from before `reconfigure()` (an epoch keeps its TTL for
        its life: its leases say it), whose deadlines were made for the pace
        of then: the faster of the two."""
        pace = self.options.interval_s
        if self.own.ttl != self.ttl:
            pace = min(pace, self._earlier_pace)
        return pace

    def _epochs_wanted(self) -> bool:
        """Node mode reads the epochs every round; shard mode only while
        node-mode leases exist (their owners are live by their epochs), or a
        damaged record (a node-mode owner may keep it: `_attribute`)."""
        return self.mode == "node" or self._node_leases or bool(self.view.damaged)

    async def _read_epochs(self) -> dict[EpochKey, str] | None:
        if not self._epochs_wanted():
            self.epoch_watch.unread()
            return None
        return await self.epoch_watch.read()

    def _check_alive(self, runner: asyncio.Task[None],
                     keepers: list[asyncio.Task[None]]) -> None:
        if runner.done():
            raise RunnerDied("the shard runner stopped") from (
                None if runner.cancelled() else runner.exception())
        for task in keepers:
            # The heartbeats end by themselves on a graceful stop; nothing else does.
            if task.done() and (task.cancelled() or task.exception() is not None
                                or not self.stopping):
                raise EngineError(f"the loop's task {task.get_name()} stopped") from (
                    None if task.cancelled() else task.exception())

    # -- heartbeats -----------------------------------------------------------------

    async def _heartbeats(self) -> None:
        while not self.stopping:
            started = self.clock.monotonic()
            await self._heartbeat()

            def due(started: float = started) -> float:
                return started + self.options.interval_s

            await self._pause(due)

    async def _heartbeat(self) -> None:
        if self.mode == "node":
            return  # its epoch is its heartbeat
        if self.keeper.withdrawn():
            if not self.beats.deleted:
                try:
                    await self.beats.delete()
                except StoreError as e:
                    logger.info("could not delete the heartbeat: %s", e)
            return
        if await self.beats.beat(stopping=lambda: self.stopping):
            self._announce()

    def _announce(self) -> bool:
        """The first liveness record landed: peers may be told (`Joined`).
        True the first time."""
        if self._joined:
            return False
        self._joined = True
        self.telemetry.emit(Joined(cluster=self.cluster, node=self.name))
        return True

    # -- renewals ---------------------------------------------------------------------

    async def _renewals(self) -> None:
        """Renew (or free) every held lease every interval, start to start;
        half an interval after a failure, a quarter while stopping."""
        while True:
            started = self.clock.monotonic()
            ok = await self.keeper.renew_all()

            def due(ok: bool = ok, started: float = started) -> float:
                pace = self.keeper.renew_pace()
                delay = pace if ok else pace / 2
                if self.stopping:
                    delay = min(delay, pace / 4)
                return started + delay

            await self._pause(due)

    # -- one round of placement ---------------------------------------------------------

    async def _round(self, *, hinted: bool = False) -> None:
        started = self.clock.monotonic()
        if self.rounds == 0:
            self._claims_from = started + self.options.interval_s
        # (A round of its time starts an interval after the first one, to
        # within float rounding.)
        starting = self.life is Life.STARTING and started < self._claims_from - 1e-6
        live, (epochs, leases) = await asyncio.gather(self.beats.read(), self._read_records())
        if leases is not None:
            self._node_leases = bool(self.view.named)
        if epochs is not None:
            self.epoch_watch.observe(epochs, self.view.named if leases is not None else {})
            if self.epoch_watch.suspects and not self.stopping:
                # Before the share: an epoch a peer ended is no live node.
                await self.epoch_watch.check_suspects()
            self._epoch_live = self.epoch_watch.live()
        elif not self._epochs_wanted():
            self._epoch_live = set()
        # A listing that failed keeps what it showed last: a failed read must
        # never make this node think itself alone (and claim every shard).
        live = live | self._epoch_live
        withdrawn = self.keeper.withdrawn()
        if self.stopping or withdrawn:
            live.discard(self.name)
        else:
            live.add(self.name)
        self._live = live
        # The rounds of the first interval only read (a round a hint woke
        # too: the peers it knows of may still be starting), unless one shows
        # every peer the node knows of (the pod list) live: then nobody it
        # could miss is left to start, and it claims its share at once.
        known = set(self.peers())
        first = starting and not (known and known <= live)
        if leases is not None:
            await self.keeper.check_held(leases, started)
        if withdrawn:
            await self.keeper.probe()
        if leases is not None and not self.stopping:
            await self._attribute(leases)
        # A first round that only reads still claims what is kept for this
        # node by name (its pod back from a restart under `handoff: hold`).
        plan = self._plan(leases if self.runner.running else None, len(live),
                          stopping=self.stopping or withdrawn, reserved_only=first)
        share = plan.share
        for shard in plan.release:
            self.keeper.release(shard)
        if leases is not None and self.stopping:
            await self.keeper.free_strays(leases)
        elif leases is not None and self.runner.running and (not first or plan.claim):
            await self._claim(leases, plan.claim, plan.adopt, plan.spare)
            if self.mode == "node" and not first:
                # A lease of ours that we do not hold (a claim whose answer was
                # lost and could not be recognised): under our live epoch
                # nobody else may take it, so it is freed here.
                await self.keeper.free_strays(leases)
        if leases is not None and epochs is not None:
            await self.epoch_watch.collect(self.view.named)
        self.rounds += 1
        if self.life is Life.STARTING and not first:
            self.life = Life.RUNNING
        self.telemetry.emit(Round(cluster=self.cluster, node=self.name, live_nodes=len(live),
                                  share=share, held=len(self.held),
                                  duration=self.clock.monotonic() - started,
                                  ok=leases is not None, hinted=hinted))

    async def _attribute(self, leases: dict[int, Stored[Lease]]) -> None:
        """Damaged records (corrupt, or deleted under a node-mode owner)
        unchanged for a TTL: who keeps them is read from the epochs
        (`EpochWatch.keepers`), so that none is claimed from a node-mode owner
        that cannot see the damage (its listings stale, its repairs failing)
        and keeps the shard by its epoch, whatever this node saw before."""
        pending = [s for s in self.view.idle if s not in self.held and s in self.view.damaged]
        watching = self.epoch_watch.watching_since
        keepers = None
        if pending and watching is not None:
            keepers = await self.epoch_watch.keepers(self.own.all)
        self.view.attribute(pending, leases, keepers, self.clock.monotonic(),
                            since=max(watching or 0.0, self.epoch_watch.vanished_at))

    def _placement_held(self) -> list[placement.Held]:
        return [placement.Held(shard=s, active=h.phase is Phase.HELD, adopted=h.adopted,
                               opened=self.runner.state(s) not in (State.WAITING, None),
                               claimed_in=h.claimed_in,
                               blind=h.blind and self.runner.state(s) in (
                                   State.WAITING, State.OPENING))
                for s, h in self.held.items()]

    def _plan(self, leases: dict[int, Stored[Lease]] | None, live: int, *,
              stopping: bool, reserved_only: bool = False) -> placement.Plan:
        """This round's releases, claims and adoptions (placement.py decides;
        here is what this node judges of the records: which shards may be
        claimed at all, and for how long each has been free)."""
        now = self.clock.monotonic()
        held = self._placement_held()
        candidates: list[placement.Candidate] = []
        if leases is not None and not stopping:
            share = placement.fair_share(self.options.shards, live, stopping=False)
            want = share - sum(1 for h in held if h.active and h.shard < self.options.shards)
            # At its share a node only adopts shards free (or expired) for a
            # TTL: those are all it needs to look at (the rest costs O(shards)).
            pool: Iterable[int] = range(self.options.shards) if want > 0 else [
                *self.view.free, *self.view.idle, *self.view.silent_shards(now)]
            for s in pool:
                stored = leases.get(s)
                reserved = self.view.reserved_here(stored)
                if (reserved or not reserved_only) and s not in self.held \
                        and self.runner.state(s) is None \
                        and self.view.claimable(s, stored, now):
                    cool = self._cooldown.get(s)
                    candidates.append(placement.Candidate(
                        shard=s, free_for=self.view.free_for(s, stored, now),
                        cooling_until=cool.until if cool is not None else None,
                        reserved=reserved))
        return placement.plan(placement.View(
            node=self.name, shards=self.options.shards, live=live, stopping=stopping, now=now,
            ttl=self.ttl, held=tuple(held), candidates=tuple(candidates),
            max_moves=self.options.max_moves_per_round,
            returning=now < self._claims_from + self.options.interval_s))

    async def _read_records(self) -> tuple[dict[EpochKey, str] | None,
                                           dict[int, Stored[Lease]] | None]:
        """The epochs (when wanted), then the leases, told of that listing and
        of the last heartbeat listing this node has (`Listed`: a store with a
        listing cache checks it by them, the S3 store its move marker, which
        the epoch listing shows). Without epochs the leases are listed at
        once, beside the heartbeats."""
        epochs = await self._read_epochs()
        return epochs, await self._read_leases(Listed(epochs=epochs,
                                                      heartbeats=self.beats.listing))

    async def _read_leases(self, seen: Listed) -> dict[int, Stored[Lease]] | None:
        try:
            leases = await self.calls.joined(
                "leases", "lease listing",
                lambda: self.store.list_leases(self.cluster, seen=seen))
        except StoreError as e:
            logger.warning("could not read the leases, no claims this round: %s", e)
            return None
        self.view.observe(leases, self.options.shards, self.clock.monotonic(),
                          ((shard, held.lease) for shard, held in self.held.items()))
        self.ready.set()
        return leases

    async def _claim(self, leases: dict[int, Stored[Lease]], chosen: Iterable[int],
                     adopt: Iterable[int], spare: Iterable[int] = ()) -> None:
        chosen, adopted, spare = list(chosen), set(adopt), list(spare)
        if not chosen and not adopted:
            return
        if self.mode == "node" and not self.own.valid():
            return  # no epoch to tie a lease to yet, or it is failing
        skip, blind_ttl = await self._blind(leases, [*chosen, *adopted, *spare])
        # A chosen shard lost to a peer (its claim or its epoch's end was
        # first) is followed by the next spare, in this round.
        spares = iter([s for s in spare if s not in skip])
        limit = asyncio.Semaphore(WRITE_CONCURRENCY)
        # Each silent epoch is ended once, before any of its leases is claimed.
        ending: dict[EpochKey, asyncio.Task[bool]] = {}

        short = False

        async def slot(shard: int) -> None:
            nonlocal short
            while not await one(shard):
                if shard in adopted:
                    return
                if (shard := next(spares, -1)) < 0:
                    short = True  # every spare lost too
                    return

        async def one(shard: int) -> bool:
            """Claim `shard`; False if a peer was first."""
            if shard in skip:
                return True  # (not lost to a peer: kept by a live epoch)
            stored = leases.get(shard)
            rec = stored.record if stored is not None else None
            if rec is None:
                # Corrupt, or missing where this node saw a node-mode owner's
                # record: that owner's epoch is ended first.
                rec = self.view.kept_by_epoch(shard)
            if rec is not None and rec.renewal == "node" and rec.owner is not None \
                    and (rec.owner, rec.incarnation) != (self.name, self.epoch):
                key = (rec.owner, rec.incarnation or "")
                if key not in ending:
                    ending[key] = asyncio.create_task(self.epoch_watch.end(key))
                if not await asyncio.shield(ending[key]):
                    return False
            async with limit:
                try:
                    return await self._claim_one(shard, stored, adopted=shard in adopted,
                                                 blind_ttl=blind_ttl)
                except StoreError as e:
                    logger.info("claim of shard %d failed: %s", shard, e)
                    return True  # (not lost to a peer: a failing store is not raced)

        try:
            async with asyncio.timeout(self.budget):
                await asyncio.gather(*(slot(s) for s in [*chosen, *adopted]))
        except TimeoutError:
            # A claim abandoned in flight may still land: the lease then names
            # this incarnation, and is claimed again or freed as a stray.
            logger.warning("claims took longer than %.3gs; abandoned", self.budget)
        finally:
            await _cancel(*ending.values())
        if short:
            # Below the share after races lost to peers that read the same
            # free shards (nodes started together): the listing was stale,
            # and a fresh one in the next round finds what is left, now
            # rather than an interval later. Paced like any woken round, so
            # contention cannot spin; each lost race was a peer's claim.
            self.hint(settle=False)

    async def _blind(self, leases: dict[int, Stored[Lease]],
                     shards: list[int]) -> tuple[set[int], float]:
        """The blind claims among `shards` (`view.LeaseView.blind`): those not
        made this round, and the TTL the others are written with.

        A blind claim's generation (1) may be one a host opened already under
        a record deleted since, and only that host can say. Until it has (the
        keeper waits for its answer: `keeper.Held.blind`), nothing must let a
        peer take the shard over before that owner's deadline. If the
        claimer dies first, its record is all a peer that never saw the
        owner's has (regression seed-2028277857: taken over at 2 after the
        claimer's TTL of 6 s while the owner held by 90). So in shard mode the
        claim is written with the TTL a refusal's free would keep the shard
        for (`keeper.refusal_hold`: the longest any heartbeat says its node
        holds a lease by), and not made while the heartbeats cannot be read.
        In node mode the owner may keep the shard by its epoch for longer
        than any TTL: the claim is not made while a live epoch of another
        node keeps the shard (`view.LeaseView.kept_live`), or while the epochs
        cannot be read."""
        blind = [s for s in shards if self.view.blind(s, leases.get(s))]
        if self.mode == "node":
            # A record at generation 1 may be a blind claim whose claimer died
            # before its host answered, taken while the owner's epoch did not
            # name the shard yet (its claim had just landed), which it names
            # now (regression seed-1979726345: taken over at 2 from the dead
            # claimer's epoch while the owner kept it by its own).
            asked = [*blind, *(s for s in shards if s not in blind
                               and (stored := leases.get(s)) is not None
                               and stored.generation == 1)]
            if not asked:
                return set(), 0.0
            keepers = await self.epoch_watch.keepers(self.own.all)
            kept = self.view.kept_live(keepers, self.clock.monotonic())
            skip = {s for s in asked if kept is None or s in kept}
            why = "the epochs could not all be read" if kept is None else \
                "a live epoch of another node keeps them (their records were deleted under it)"
            ttl = 0.0
        else:
            if not blind:
                return set(), 0.0
            holds = await self.beats.holds_by_all()
            skip = set(blind) if holds is None else set()
            why = "the heartbeats could not all be read"
            ttl = 0.0 if holds is None else refusal_hold(
                max(self.view.refusal_wait(s) for s in blind), holds)
        if skip:
            logger.info("not claiming shard(s) %s: their generation (none known, or 1) may be a "
                        "blind claim's, and %s",
                        ",".join(map(str, sorted(skip))), why)
        return skip, ttl

    async def _claim_one(self, shard: int, stored: Stored[Lease] | None, *,
                         adopted: bool = False, blind_ttl: float = 0.0) -> bool:
        """Claim one shard (and open it); False if another node was first."""
        # A corrupt record still carries the generation its raw bytes show.
        previous = stored.generation if stored is not None else None
        if stored is not None and stored.record is None:
            logger.warning("claiming shard %d over a corrupt lease record", shard)
        generation = max(previous or 0, self.view.max_generation.get(shard, 0)) + 1
        blind = self.view.blind(shard, stored)
        now = self.clock.wall()
        epoch = self.epoch
        by_epoch = self.mode == "node"
        lease = Lease(cluster=self.cluster, shard=shard, owner=self.name, generation=generation,
                      incarnation=epoch if by_epoch else self.incarnation,
                      write_id=new_write_id(), renewed_at=now, since=now,
                      ttl=self.own.ttl if by_epoch
                      else max(self.keeper.writable_ttl(), blind_ttl if blind else 0.0),
                      renewal="node" if by_epoch else "shard")
        sent = self.clock.monotonic()
        try:
            version = await self.keeper.write(lease, stored.version if stored else None)
        except Conflict:
            logger.debug("shard %d: lost the race to claim it", shard)
            return False
        self.view.max_generation[shard] = generation
        # Node mode: valid until the epoch's deadline, and only if the epoch
        # it names is still ours; and no longer than the claim's own write
        # gives until an epoch write names the shard (`keeps`): a peer that
        # finds this record damaged, and reads our epoch to learn who keeps
        # it, reads a write that may have been sent before this claim landed.
        deadline: float | None = self.keeper.deadline(sent, lease.ttl)
        if by_epoch:
            deadline = None if self.own.deadline is None or deadline is None \
                else min(deadline, self.own.deadline)
        if self.stopping or deadline is None or (by_epoch and (
                epoch != self.epoch or deadline <= self.clock.monotonic())):
            # Stopped (or the epoch ended, or its deadline passed: a slow
            # write) while the claim was in flight: never opened; the
            # renewals free it.
            held = Held(lease, version, changed_at=self.clock.monotonic(), blind=blind,
                        reserve=self.view.refusal_wait(shard) if blind else 0.0)
            held.closed(Reason.SHUTDOWN if self.stopping else Reason.FENCED,
                        self.clock.monotonic())
            self.held[shard] = held
            return True
        self.held[shard] = Held(lease, version, adopted=adopted, blind=blind,
                                changed_at=self.clock.monotonic(), claimed_in=self.rounds)
        self.view.claimed(shard, lease)
        try:
            self.runner.start(shard, generation, deadline)
        except EngineError as e:
            # It ended while we claimed: never opened, so the lease is freed
            # on the way out (a blind one kept from every node a while).
            self.held[shard].closed(Reason.SHUTDOWN, self.clock.monotonic())
            if blind:
                self.held[shard].reserve = self.view.refusal_wait(shard)
            raise RunnerDied("the shard runner stopped") from e
        self.keeper.claimed(shard, sent)
        if adopted:
            logger.info("shard %d was free for over a TTL: claimed above the share", shard)
        self.telemetry.emit(Claim(cluster=self.cluster, node=self.name, shard=shard,
                                  generation=generation))
        return True

    # -- after the runner closed a shard ----------------------------------------

    def _on_closed(self, ended: Ended) -> None:
        if ended.highest is not None:
            # The host has seen `highest`: this node's next claim goes above
            # it even if the free that says so to the others fails, and not
            # within a TTL (`view.LeaseView.refused`).
            self.view.refused(ended.shard, ended.highest, self.clock.monotonic())
        self._cool(ended.shard, ended.reason)
        self.keeper.on_closed(ended, self.view.refusal_wait(ended.shard))

    def _track(self, task: asyncio.Task[None]) -> None:
        """A free (or a slow claim's renewals) the keeper started: awaited
        before the loop ends."""
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        # Freeing does not start a round early (a refusing host would spin),
        # except while stopping, which ends once everything is freed.
        task.add_done_callback(lambda _: self._wake.set() if self.stopping else None)

    def _cool(self, shard: int, reason: Reason) -> None:
        """After a failed open, this node leaves the shard alone for a while
        (doubling, with jitter): no claim-open-fail-free loop, and peers get
        to see it free for a TTL and adopt it (`placement.failures_after`
        says how many in a row, `placement.cooldown` for how long)."""
        previous = self._cooldown.get(shard)
        failures = placement.failures_after(
            previous.failures if previous is not None else None,
            failed=reason is Reason.OPEN_FAILED, outdated=reason is Reason.OUTDATED)
        if failures is None:
            self._cooldown.pop(shard, None)
            return
        if failures == 0:
            self._cooldown[shard] = _Cooldown(0, self.clock.monotonic())
            return
        pause = placement.cooldown(failures, self.ttl, self.rng.uniform(1.0, 1.5))
        self._cooldown[shard] = _Cooldown(failures, self.clock.monotonic() + pause)
        logger.info("shard %d failed to open here (%d time(s)); not claimed again for %.3gs",
                    shard, failures, pause)

    def _strays_pending(self) -> bool:
        """Stopping: keep trying to free stray leases for up to a TTL after
        stop() (by then they have expired anyway)."""
        if not self.keeper.strays or self._stop_started is None:
            return False
        return self.clock.monotonic() - self._stop_started < self.ttl

    async def _drain_tasks(self) -> None:
        if self._tasks:
            await asyncio.gather(*list(self._tasks), return_exceptions=True)

    async def _abandon(self, runner: asyncio.Task[None],
                       keepers: list[asyncio.Task[None]]) -> None:
        """Cancelled or failed: the runner closes every open shard (its
        abort), then the leases of the shards the host closed are freed, all
        within one interval (a second signal ends the process within one;
        what is not done by then is left to a TTL of silence, as after a
        crash). One whose close failed, or was cut short, may still be open
        at the host: it is left to expire (never freed early: the next owner
        would open it beside the host; in node mode the epoch is deleted,
        which peers wait a TTL to trust)."""
        end = self.clock.monotonic() + self.options.interval_s

        def left() -> float:
            return max(0.0, end - self.clock.monotonic())

        await _cancel(*keepers, *self.calls.in_flight())
        runner.cancel()
        await asyncio.wait({runner}, timeout=left())
        await _cancel(runner)  # (again, if its closes outlast the interval)
        # Frees in flight, or waiting for an unclosed shard's expiry, are
        # done again here or not at all.
        await _cancel(*self._tasks)
        now = self.clock.monotonic()
        # Node mode: an epoch that keeps a shard its host may still have open
        # is not ended (that would free it): the closed ones are freed alone.
        unclosed = any(h.phase is not Phase.CLOSED or h.free_after > now
                       for h in self.held.values()
                       if h.by_epoch and h.lease.incarnation == self.epoch)
        frees = []
        for shard, held in list(self.held.items()):
            if held.phase is not Phase.CLOSED:
                # The runner never said it was closed: its close was cut short.
                logger.error("shard %d: its close did not finish before the node stopped: "
                             "its lease is left to expire", shard)
                self.keeper.left_to_expire(shard, held.lease.ttl)
                continue
            if held.free_after > now:
                continue  # (said when the runner gave it up)
            frees.append(functools.partial(self.keeper.free, shard, held, alone=unclosed))

        async def quietly(call: Callable[[], Awaitable[None]]) -> None:
            with contextlib.suppress(StoreError):
                await call()

        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(left()):
                await gather_limited(*(functools.partial(quietly, f) for f in frees))
                await quietly(functools.partial(self.store.delete_heartbeat, self.cluster,
                                                self.name))
                if self.mode == "node":
                    await self._abandon_epoch(unclosed)

    async def _abandon_epoch(self, unclosed: bool) -> None:
        """Node mode, stopped short: every shard of the epoch closed at its
        host, end the epoch, which frees them all at once. One its host may
        still have open: free the closed ones alone and delete the record
        instead; peers wait a TTL after they see it gone, by when that lease
        has expired."""
        if unclosed:
            await self.keeper.free_alone()
        elif self.keeper.left_to_end:
            with contextlib.suppress(StoreError):
                if await self.keeper.end_epoch():
                    return
        with contextlib.suppress(StoreError):
            await self.store.delete_epoch(self.cluster, self.name, self.epoch)


async def _cancel(*tasks: asyncio.Task[Any]) -> None:
    for task in tasks:
        task.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)
