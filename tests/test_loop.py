"""Unit tests of the placement loop: the real loop and runner, a scripted
memory store and a strict fake host, in virtual time."""

from __future__ import annotations

import asyncio
import functools
import itertools
import math
import random
from collections.abc import Callable, Coroutine, Iterable
from typing import Any

import pytest

from shardlease.clock import LoopClock
from shardlease.errors import OutdatedGeneration, RunnerDied
from shardlease.keeper import refusal_hold, renewed_apart, reservation
from shardlease.loop import PlacementLoop, paced, settles, wakes, woken_due
from shardlease.options import Options
from shardlease.records import (
    MAX_HOLD,
    MAX_LEASE_TTL,
    Heartbeat,
    Lease,
    Stored,
    decode_heartbeat,
    stored_lease,
)
from shardlease.runner import State
from shardlease.sim.fakes import ScriptedStore, StrictHost, recorder
from shardlease.sim.vloop import run_virtual
from shardlease.stores.base import Change, Listed
from shardlease.stores.memory import MemoryBackend
from shardlease.telemetry import (
    Claim,
    Event,
    Lost,
    Release,
    RenewFailed,
    RenewSlow,
    Round,
    SelfFence,
    Telemetry,
)

CLUSTER = "c"


def virtual(fn: Callable[..., Coroutine[Any, Any, None]]) -> Callable[..., None]:
    @functools.wraps(fn)
    def run(*args: Any, **kwargs: Any) -> None:
        run_virtual(fn(*args, **kwargs))

    return run


async def idle(n: int = 100) -> None:
    for _ in range(n):
        await asyncio.sleep(0)


def now() -> float:
    return asyncio.get_running_loop().time()


async def claimed() -> None:
    """Until just after a node started at 0 claimed: its first round only
    reads, its second (at one interval, 5 s) claims."""
    await asyncio.sleep(5.0)
    await idle()


def lease(backend: MemoryBackend, shard: int) -> Lease | None:
    found = backend.leases.get((CLUSTER, shard))
    return None if found is None else stored_lease(found[1], found[0], CLUSTER, shard).record


class Node:
    def __init__(self, name: str, backend: MemoryBackend, *, shards: int = 4,
                 peers: Callable[[], Iterable[str]] | None = None,
                 host: StrictHost | None = None, store: ScriptedStore | None = None,
                 **options: Any) -> None:
        self.name = name
        self.backend = backend
        self.store = store or ScriptedStore(backend)
        self.host = host or StrictHost()
        self.telemetry = Telemetry()
        self.events = recorder(self.telemetry)
        # These tests are of per-shard renewal unless they say otherwise
        # (tests/test_node_renewal.py passes renewal="node").
        opts = Options(shards=shards, name=name, cluster_name=CLUSTER,
                       **{"lease_ttl": 15.0, "renewal": "shard", **options})
        self.loop = PlacementLoop(self.store, self.host, opts, peers=peers, clock=LoopClock(),
                                  telemetry=self.telemetry, rng=random.Random(name))
        self.task: asyncio.Task[None] | None = None

    def start(self) -> Node:
        self.task = asyncio.create_task(self.loop.run(), name=f"node-{self.name}")
        return self

    async def stop(self) -> None:
        await self.loop.stop()
        assert self.task is not None
        await self.task
        assert self.host.problems == []

    def of(self, kind: type[Event]) -> list[tuple[float, Any]]:
        return [(t, ev) for t, ev in self.events if isinstance(ev, kind)]

    def round_times(self) -> list[float]:
        return [t for t, _ in self.of(Round)]

    def opened(self) -> set[int]:
        return set(self.host.open_now)


@virtual
async def test_claims_every_shard_alone_and_opens_with_generation_one() -> None:
    backend = MemoryBackend()
    a = Node("a", backend).start()
    await idle()
    assert a.loop.ready.is_set() and a.opened() == set()  # the first round only reads
    await claimed()
    assert a.opened() == {0, 1, 2, 3}
    assert {s: g for s, g in a.host.open_now.items()} == {0: 1, 1: 1, 2: 1, 3: 1}
    assert all((rec := lease(backend, s)) and rec.owner == "a" and rec.generation == 1
               for s in range(4))
    assert a.loop.ready.is_set()
    await a.stop()


@virtual
async def test_a_failed_renewal_is_retried_within_its_interval() -> None:
    backend = MemoryBackend()
    a = Node("a", backend, shards=2).start()  # interval 5
    await asyncio.sleep(7)
    a.store.fail["update_lease"] = 1
    a.store.fail["get_lease"] = 1  # the check for a lost answer fails too
    await asyncio.sleep(5)
    tries = [t for t, m in a.store.calls if m == "update_lease" and 10 <= t < 15]
    assert len(tries) == 3 and tries[0] == 10.0  # two renewals, one retried
    assert a.of(RenewFailed) == []  # retried before it counted as failed
    assert a.loop.runner.deadline(0) == a.loop.runner.deadline(1)
    assert all(10 + 12.5 <= (a.loop.runner.deadline(s) or 0) for s in (0, 1))
    assert a.opened() == {0, 1}
    await a.stop()


@virtual
async def test_renewals_failing_for_their_budget_are_reported_and_the_fence_announced() -> None:
    backend = MemoryBackend()
    a = Node("a", backend, shards=1).start()
    await asyncio.sleep(7)  # claimed at 5: deadline 17.5 (the renewal at 5 came before)
    a.store.broken.update({"update_lease", "get_lease"})
    await asyncio.sleep(15)
    t_failed = [t for t, _ in a.of(RenewFailed)]
    (t_slow, slow), = a.of(RenewSlow)
    (t_fence, fence), = a.of(SelfFence)
    # Warned half an interval before the fence; the try at 10 kept retrying
    # while it could still help (until the deadline), and said it failed.
    assert t_slow == 15.0 < t_fence == 17.5 and 10 < t_failed[0] < t_fence
    assert slow.shards == fence.shards == (0,) and slow.left == 2.5
    a.store.broken.clear()
    await a.stop()


@virtual
async def test_rounds_start_every_interval_even_when_the_store_is_slow() -> None:
    backend = MemoryBackend()
    a = Node("a", backend, shards=2).start()
    await asyncio.sleep(1)
    a.store.delay["list_leases"] = 3.0
    await asyncio.sleep(22.5)  # the round started at 20 ends at 23
    starts = [t - ev.duration for t, ev in a.of(Round)]
    assert starts == [0.0, 5.0, 10.0, 15.0, 20.0]
    assert a.opened() == {0, 1}
    await a.stop()


@virtual
async def test_a_failed_lease_read_skips_the_claims_and_lookup_keeps_the_last_owners() -> None:
    backend = MemoryBackend()
    names = {"a", "b"}
    a = Node("a", backend, peers=lambda: names).start()
    await asyncio.sleep(0.5)
    b = Node("b", backend, peers=lambda: names).start()
    await asyncio.sleep(30)
    assert len(a.opened()) == 2 and len(b.opened()) == 2
    routes = {s: b.loop.lookup(s) for s in range(4)}
    assert sorted(str(r) for r in routes.values()) == ["a", "a", "b", "b"]

    b.store.broken.add("list_leases")
    await a.stop()  # frees a's leases: claimable, but b cannot read them
    await asyncio.sleep(20)
    assert len(b.opened()) == 2
    assert not b.of(Claim)[2:]  # only its first two claims
    assert {s: b.loop.lookup(s) for s in range(4)} == routes  # the last good read

    b.store.broken.clear()
    await asyncio.sleep(6)
    assert b.opened() == {0, 1, 2, 3}
    assert {b.loop.lookup(s) for s in range(4)} == {"b"}
    await b.stop()


@virtual
async def test_no_good_read_yet_means_not_ready_and_no_claims() -> None:
    backend = MemoryBackend()
    a = Node("a", backend)
    a.store.broken.add("list_leases")
    a.start()
    await asyncio.sleep(12)
    assert not a.loop.ready.is_set()
    assert a.opened() == set() and a.of(Claim) == []
    assert a.loop.lookup(0) is None
    a.store.broken.clear()
    await asyncio.sleep(5)
    assert a.loop.ready.is_set() and a.opened() == {0, 1, 2, 3}
    await a.stop()


@virtual
async def test_lookup_returns_only_known_peers() -> None:
    backend = MemoryBackend()
    known: set[str] = set()
    a = Node("a", backend, peers=lambda: known).start()
    await asyncio.sleep(0.5)
    c = Node("c", backend).start()
    await asyncio.sleep(30)
    theirs = set(c.opened())
    assert theirs and theirs | a.opened() == {0, 1, 2, 3}
    for s in range(4):
        assert a.loop.lookup(s) == ("a" if s in a.opened() else None)
    # Lease data still shows the owner (owners()), only routing refuses it.
    assert {o.owner for o in a.loop.owners() if o.shard in theirs} == {"c"}
    known.add("c")
    assert {a.loop.lookup(s) for s in theirs} == {"c"}
    await c.stop()
    await a.stop()


@virtual
async def test_generation_rises_by_one_per_claim_and_freeing_keeps_it() -> None:
    backend = MemoryBackend()
    a = Node("a", backend, shards=1).start()
    await claimed()
    assert a.host.open_now == {0: 1}
    await a.stop()
    rec = lease(backend, 0)
    assert rec is not None and rec.owner is None and rec.generation == 1
    again = Node("a", backend, shards=1).start()  # a new incarnation
    await claimed()
    assert again.host.open_now == {0: 2}
    assert [ev.generation for _, ev in again.of(Claim)] == [2]
    await again.stop()
    rec = lease(backend, 0)
    assert rec is not None and rec.owner is None and rec.generation == 2


@virtual
async def test_release_closes_the_shard_before_freeing_its_lease() -> None:
    backend = MemoryBackend()
    a = Node("a", backend).start()
    await claimed()
    assert a.opened() == {0, 1, 2, 3}
    seen: list[tuple[int, str | None]] = []

    def check(shard: int) -> None:
        rec = lease(backend, shard)
        seen.append((shard, rec.owner if rec else None))
        assert rec is not None and rec.incarnation == a.loop.incarnation

    a.host.on_close = check
    b = Node("b", backend).start()
    await asyncio.sleep(20)
    assert len(a.opened()) == 2 and len(b.opened()) == 2
    assert len(seen) == 2 and all(owner == "a" for _, owner in seen)
    assert sorted(ev.shard for _, ev in a.of(Release)) == sorted(s for s, _ in seen)
    # b opened each only after a had closed it.
    for shard, _ in seen:
        assert a.host.times("closed", shard)[0] <= b.host.times("open", shard)[0]
    await a.stop()
    await b.stop()


@virtual
async def test_graceful_stop_frees_every_lease_and_deletes_the_heartbeat() -> None:
    backend = MemoryBackend()
    a = Node("a", backend).start()
    await asyncio.sleep(11)
    assert (CLUSTER, "a") in backend.heartbeats
    await a.stop()
    assert a.opened() == set()
    assert a.host.ops().count("closed") == 4
    assert all((rec := lease(backend, s)) and rec.owner is None and rec.generation == 1
               for s in range(4))
    assert (CLUSTER, "a") not in backend.heartbeats
    assert sorted(ev.shard for _, ev in a.of(Release)) == [0, 1, 2, 3]
    assert a.task is not None and a.task.done() and a.task.exception() is None


@virtual
async def test_graceful_stop_during_a_slow_heartbeat_leaves_no_heartbeat() -> None:
    backend = MemoryBackend()
    a = Node("a", backend)
    a.store.delay["put_heartbeat"] = 2.0
    a.start()
    await asyncio.sleep(5.5)  # the second heartbeat is on its way
    assert (5.0, "put_heartbeat") in a.store.calls and (CLUSTER, "a") in backend.heartbeats
    await a.stop()
    assert (CLUSTER, "a") not in backend.heartbeats


@virtual
async def test_when_the_runner_dies_the_loop_stops_and_every_shard_is_closed() -> None:
    backend = MemoryBackend()
    a = Node("a", backend).start()
    await asyncio.sleep(6)
    assert a.opened() == {0, 1, 2, 3}
    runner, = [t for t in asyncio.all_tasks() if t.get_name() == "shardlease-runner"]
    runner.cancel()
    assert a.task is not None
    with pytest.raises(RunnerDied):
        await a.task
    assert isinstance(a.loop.failure, RunnerDied)  # for a health check that does not await
    assert a.opened() == set()
    assert a.host.problems == []
    # What it could free, it freed (nothing is left to fence but the generation).
    assert all((rec := lease(backend, s)) and rec.owner is None for s in range(4))


@virtual
async def test_a_shard_past_its_deadline_is_fenced_while_the_store_hangs() -> None:
    backend = MemoryBackend()
    a = Node("a", backend, shards=2).start()  # ttl 15, margin 2.5: deadline 12.5 after a renewal
    await asyncio.sleep(6)  # renewed at 5.0
    a.store.delay["update_lease"] = 1000.0
    await asyncio.sleep(12)
    assert a.opened() == set()
    assert a.host.times("close", 0) == [5.0 + 15.0 - 2.5]
    assert all(a.loop.runner.state(s) in (None, State.CLOSED) for s in (0, 1))
    assert a.task is not None
    a.task.cancel()
    await asyncio.gather(a.task, return_exceptions=True)


@virtual
async def test_a_lost_lease_closes_the_shard() -> None:
    backend = MemoryBackend()
    a = Node("a", backend, shards=1).start()
    await claimed()
    assert a.opened() == {0}
    # Someone overwrites the lease (as if it had expired in their eyes).
    rec = lease(backend, 0)
    assert rec is not None
    version = backend.leases[(CLUSTER, 0)][0]
    other = ScriptedStore(backend)
    await other.update_lease(rec.model_copy(update={"owner": "z", "incarnation": "z",
                                                    "generation": 2}), version)
    await asyncio.sleep(6)
    assert a.opened() == set()
    assert a.host.ops(0)[-2:] == ["close", "closed"]
    assert a.loop.held == {}
    assert a.task is not None
    a.task.cancel()
    await asyncio.gather(a.task, return_exceptions=True)
    rec = lease(backend, 0)
    assert rec is not None and rec.owner == "z"  # never overwritten blindly


def test_heartbeat_record_decodes() -> None:
    # Guard for the tests above reading the backend directly.
    from shardlease.records import Heartbeat, encode

    hb = Heartbeat(cluster=CLUSTER, node="a", incarnation="i", seq=1, write_id="w")
    assert decode_heartbeat(encode(hb), CLUSTER, "a") == hb


@virtual
async def test_a_renewal_whose_answer_was_lost_is_not_taken_for_a_lost_lease() -> None:
    # The renewal lands but its answer is lost, and so are the read-backs
    # that would recognise it: its retry conflicts with our own record.
    backend = MemoryBackend()
    a = Node("a", backend, shards=1).start()
    await asyncio.sleep(7)  # claimed at 5; the renewal at 10 meets the faults
    a.store.lose_reply["update_lease"] = 1
    a.store.fail["get_lease"] = 2
    await asyncio.sleep(4)
    assert a.store.fail["get_lease"] == 0 and a.store.lose_reply["update_lease"] == 0
    assert a.of(RenewFailed) == []  # recognised within the renewal's budget
    await asyncio.sleep(10)
    assert a.of(Lost) == []
    assert a.host.ops(0) == ["open", "opened"]  # never closed
    await a.stop()
    rec = lease(backend, 0)
    assert rec is not None and rec.owner is None and rec.generation == 1
    assert [ev.shard for _, ev in a.of(Release)] == [0]


@virtual
async def test_a_free_after_a_lost_renewal_answer_still_frees_the_lease() -> None:
    backend = MemoryBackend()
    a = Node("a", backend, shards=1).start()
    await asyncio.sleep(4)
    a.store.lose_reply["update_lease"] = 1
    a.store.fail["get_lease"] = 1
    await asyncio.sleep(1.5)  # the renewal at 5 failed that way
    await a.stop()
    rec = lease(backend, 0)
    assert rec is not None and rec.owner is None
    assert a.of(Lost) == []


@virtual
async def test_a_claim_whose_answer_was_lost_is_recognised() -> None:
    backend = MemoryBackend()
    a = Node("a", backend, shards=1)
    a.store.lose_reply["create_lease"] = 1
    a.start()
    await claimed()
    assert a.host.open_now == {0: 1}
    assert [ev.generation for _, ev in a.of(Claim)] == [1]
    await a.stop()


@virtual
async def test_graceful_stop_frees_a_fenced_lease_whose_free_had_failed() -> None:
    backend = MemoryBackend()
    a = Node("a", backend, shards=1).start()
    await asyncio.sleep(7)  # claimed at 5: deadline 17.5
    a.store.broken.add("update_lease")  # renewals fail; at 17.5 it is fenced,
    a.store.broken.add("get_lease")  # and freeing it fails: it is dropped
    await asyncio.sleep(35)  # the renewal and the free (a TTL) in flight give up
    assert a.host.times("close", 0) == [17.5]
    assert a.loop.held == {}
    rec = lease(backend, 0)
    assert rec is not None and rec.owner == "a"
    a.store.broken.clear()
    await a.stop()
    rec = lease(backend, 0)
    assert rec is not None and rec.owner is None and rec.generation == 1


@virtual
async def test_graceful_stop_frees_a_claim_whose_answer_was_lost() -> None:
    backend = MemoryBackend()
    a = Node("a", backend, shards=1)
    a.store.lose_reply["create_lease"] = 1
    a.store.fail["get_lease"] = 1  # so the claim looks failed
    a.start()
    await claimed()
    assert a.loop.held == {} and a.opened() == set()
    rec = lease(backend, 0)
    assert rec is not None and rec.owner == "a"
    await a.stop()
    rec = lease(backend, 0)
    assert rec is not None and rec.owner is None


@pytest.mark.parametrize("method", ["put_heartbeat", "list_heartbeats", "list_leases"])
@virtual
async def test_a_slow_heartbeat_or_listing_never_delays_a_renewal(method: str) -> None:
    # Issue #8: a 14 s put_heartbeat (or LIST) used to fence every shard at 27.5.
    backend = MemoryBackend()
    a = Node("a", backend).start()
    await claimed()
    a.store.delay[method] = 14.0
    await asyncio.sleep(60)
    assert a.of(SelfFence) == [] and a.of(RenewSlow) == [] and a.of(RenewFailed) == []
    assert a.opened() == {0, 1, 2, 3}
    renewals = [t for t, m in a.store.calls if m == "update_lease"]
    assert [t for t in renewals if t > 10] == [t for t in renewals if t > 10 and t % 5 == 0]
    # The slow calls were abandoned within the interval: rounds keep starting
    # every interval, those needing the slow call without its answer.
    rounds = [(t - ev.duration, ev) for t, ev in a.of(Round) if t > 10]
    assert all(ev.duration < 5.0 for _, ev in rounds)
    if method == "list_leases":  # a round joins the listing in flight: one in three ends
        assert sum(ev.ok for _, ev in rounds) <= len(rounds) / 2
        assert len([t for t, m in a.store.calls if m == "list_leases" and t > 10]) <= 5
    a.store.delay.clear()
    await a.stop()


@virtual
async def test_a_shard_the_host_refuses_cools_down_and_is_adopted_by_a_peer_at_its_share() -> None:
    from shardlease.errors import HostError
    from shardlease.loop import preference

    backend = MemoryBackend()
    names = {"a", "b"}
    refused = max(range(4), key=lambda s: preference("a", s))
    a = Node("a", backend, peers=lambda: names)
    a.host.open_errors[refused] = HostError("this host cannot serve it")
    a.start()
    # b starts once a claimed (its second round: b was not live in its
    # first), so that a tries the shard it prefers.
    await asyncio.sleep(6)
    b = Node("b", backend, peers=lambda: names).start()
    await asyncio.sleep(114)
    assert b.host.open_now.get(refused) is not None  # opened by the peer above its share
    assert refused not in a.opened()
    # a tried it a few times, with growing pauses: no claim-open-fail-free loop.
    tries = a.host.times("open", refused)
    assert 1 <= len(tries) <= 3
    assert all(later - earlier >= 2 * 15.0 for earlier, later in itertools.pairwise(tries))
    # One round per interval, never an early one when the lease was freed.
    assert len(a.round_times()) <= 120 / 5 + 1
    # And the placement settled: two each (b handed one of its own to a).
    assert len(a.opened()) == 2 and len(b.opened()) == 2
    await a.stop()
    await b.stop()


class RememberingHost(StrictHost):
    """An application whose storage holds `highest` for every shard (the lease
    store lost its records): it refuses an open at or below it as outdated.
    It says so of every generation asked of the `stubborn` shards (broken)."""

    def __init__(self, highest: int, stubborn: frozenset[int] = frozenset()) -> None:
        super().__init__()
        self.highest, self.stubborn = highest, stubborn

    async def open(self, shard: int, generation: int) -> None:
        if generation <= self.highest or shard in self.stubborn:
            self.open_errors[shard] = OutdatedGeneration(
                "seen", shard=shard, generation=generation,
                highest=max(self.highest, generation))
        else:
            self.open_errors.pop(shard, None)
        await super().open(shard, generation)


@pytest.mark.parametrize("renewal", ["shard", "node"])
@virtual
async def test_an_open_refused_as_outdated_is_freed_at_the_hosts_generation_and_claimed_above(
        renewal: str) -> None:
    backend = MemoryBackend()
    a = Node("a", backend, shards=1, renewal=renewal, host=RememberingHost(9)).start()
    await claimed()
    await asyncio.sleep(40)
    calls = [(c.op, c.generation) for c in a.host.calls if c.op in ("open", "open_failed",
                                                                       "opened")]
    assert calls == [("open", 1), ("open_failed", 1), ("open", 10), ("opened", 10)]
    # Claimed again a TTL later (whoever opened generation 9 may hold it until
    # then), once the epochs said none keeps it: in node mode a TTL after a
    # listing showed the free, in the round after; in shard mode, where the
    # epochs are watched only from when the free is seen (issue 38: a
    # node-mode owner may keep the shard by its epoch), a TTL after that. A
    # refusal for a newer generation is no failure, and costs no cooldown
    # beyond that.
    refused, opened = a.host.times("open", 0)
    extra = 15.0 if renewal == "shard" else 0.0
    assert 15.0 - 1e-6 <= opened - refused <= 15.0 + extra + 2 * 5.0 + 1e-6
    rec = lease(backend, 0)
    assert rec is not None and rec.owner == "a" and rec.generation == 10
    await a.stop()


# How long a refusal's free keeps the shard from every node (keeper.refusal_hold):
# the longest of what this node knows and what every heartbeat says its node
# may hold a lease by; the longest any lease may be held by when they are unread.
@pytest.mark.parametrize(("known", "holds_by", "hold"), [
    (15.0, [], 15.0),                  # nobody beats (node mode): what it knows
    (15.0, [0.0, 0.0], 15.0),          # heartbeats older than the field, or holding nothing
    (15.0, [6.0, 15.0], 15.0),         # nobody holds by longer
    (6.0, [30.0, 6.0], 30.0),          # seed-143: the TTL cut to 6, an owner at 30
    (90.0, [30.0], 90.0),              # never shorter than what it knew (a record said 90)
    (6.0, None, MAX_LEASE_TTL),        # unread: the longest any lease is held by
    (15.0, [MAX_LEASE_TTL], MAX_LEASE_TTL),
])
def test_a_refusals_free_keeps_the_shard_for_the_longest_ttl_any_heartbeat_holds_by(
        known: float, holds_by: list[float] | None, hold: float) -> None:
    assert refusal_hold(known, holds_by) == hold


# What a free writes of a reservation (keeper.reservation): a stop's hold
# keeps the shard for the stopping node's name; a refusal's wait keeps it
# from every node, and a stop's hold never shortens it (issue 38, A3).
@pytest.mark.parametrize(("refused", "stop_hold", "written"), [
    (0.0, 0.0, (None, 0.0)),            # a plain free: no reservation (clears one)
    (0.0, 20.0, ("a", 20.0)),           # a stop under handoff: hold, kept for its name
    (30.0, 0.0, (None, 30.0)),          # a refusal: from every node
    (30.0, 3.0, (None, 30.0)),          # A3: a shorter hold does not cut the wait
    (30.0, 60.0, (None, 60.0)),         # a longer hold: for no node either
    (MAX_HOLD + 1.0, 0.0, (None, MAX_HOLD)),
])
def test_what_a_free_writes_of_a_reservation(
        refused: float, stop_hold: float, written: tuple[str | None, float]) -> None:
    assert reservation(refused, stop_hold, "a") == written


def beat_of(backend: MemoryBackend, node: str) -> Heartbeat:
    return decode_heartbeat(backend.heartbeats[(CLUSTER, node)][1], CLUSTER, node)


@pytest.mark.parametrize("reads", ["work", "fail"])
@virtual
async def test_a_refusal_is_kept_from_every_node_for_as_long_as_a_heartbeat_says(
        reads: str) -> None:
    # A peer's heartbeat says it holds a lease by a TTL of 40 (written before
    # the TTL was cut to 15 here): the refusal's free keeps the shard 40 s,
    # and the refusing node waits as long. Its heartbeats unreadable: the
    # longest a lease may be held by at all.
    backend = MemoryBackend()
    store = ScriptedStore(backend)
    await store.put_heartbeat(Heartbeat(cluster=CLUSTER, node="old", incarnation="x", seq=1,
                                        write_id="w", holds_by=40.0))
    # A free record at 1: the claim (at 2) is not blind, so it is made even
    # while the heartbeats cannot be read (a blind one is not: the test below).
    await store.create_lease(Lease(cluster=CLUSTER, shard=0, owner=None, generation=1,
                                   write_id="w", ttl=15.0))
    if reads == "fail":
        store.broken.add("get_heartbeat")
    a = Node("a", backend, shards=1, store=store, host=RememberingHost(9)).start()
    await claimed()
    await asyncio.sleep(4.0)  # (unread: after the reads' budget)
    rec = lease(backend, 0)
    assert rec is not None and rec.owner is None and rec.generation == 9
    assert rec.hold == (40.0 if reads == "work" else MAX_LEASE_TTL)
    await asyncio.sleep(48.0)  # (reopened at 50, and beaten since)
    refused, *later = a.host.times("open", 0)
    if reads == "work":
        assert later and later[0] - refused >= 40.0
        assert beat_of(backend, "a").holds_by == 15.0  # holds it again
    else:
        assert later == []
        assert beat_of(backend, "a").holds_by == 15.0  # holds nothing: its own TTL
    await a.stop()


@pytest.mark.parametrize("renewal", ["shard", "node"])
@virtual
async def test_a_blind_claim_is_not_released_before_its_host_answers_the_open(
        renewal: str) -> None:
    # Issue 38 (regression seed-1851953618): a claim made with no generation
    # known (no record, none seen: 1) may be of a generation a host opened
    # already, under a record deleted since; only the host can say. Above
    # its share, a node gives such a shard up only once the host answered:
    # here one is opening, the other waiting for the one open slot.
    backend = MemoryBackend()
    a = Node("a", backend, shards=2, renewal=renewal, max_concurrency=1).start()
    gates = {0: asyncio.Event(), 1: asyncio.Event()}
    a.host.open_gates.update(gates)
    await claimed()
    b = Node("b", backend, shards=2, renewal=renewal).start()
    await asyncio.sleep(30.0)  # (b is live, a above its share of 1)
    assert [(rec := lease(backend, s)) and rec.owner for s in (0, 1)] == ["a", "a"]
    assert a.of(Release) == []
    for gate in gates.values():
        gate.set()
    await asyncio.sleep(30.0)
    owners = sorted(((rec := lease(backend, s)) and rec.owner) or "" for s in (0, 1))
    assert owners == ["a", "b"]
    assert len(a.of(Release)) == 1
    await b.stop()
    await a.stop()


@pytest.mark.parametrize("renewal", ["shard", "node"])
@virtual
async def test_a_claim_freed_before_its_host_answered_is_kept_from_every_node_if_blind(
        renewal: str) -> None:
    # Issue 38: stopped while the open of a blind claim is in flight, the
    # free keeps the shard from every node as a refusal's does (the host
    # may have refused it); a claim of a known generation is freed plainly.
    backend = MemoryBackend()
    holds = []
    for run in range(2):
        a = Node("a", backend, shards=1, renewal=renewal).start()
        a.host.open_gates[0] = asyncio.Event()
        await claimed()
        for _ in range(12):  # (the first run's free keeps it a while)
            if a.host.ops(0):
                break
            await asyncio.sleep(5.0)
        assert a.host.ops(0) == ["open"]
        await a.stop()
        rec = lease(backend, 0)
        assert rec is not None and rec.generation == run + 1
        if run and renewal == "node":
            # Known: left to the end of the epoch, which frees it at once.
            assert rec.owner == "a" and a.of(Release)[-1][1].ended
        else:
            assert rec.owner is None
        holds.append(rec.hold)
    assert holds == [15.0, 0.0]


@pytest.mark.parametrize("reads", ["work", "fail"])
@virtual
async def test_a_blind_claim_is_written_with_the_longest_ttl_a_heartbeat_holds_by(
        reads: str) -> None:
    # Issue 38 (regression seed-2028277857): a claim with no generation known
    # may be of one another node opened under a record deleted since; if the
    # claimer dies before its host answers, a peer that never saw that record
    # takes the claim's over after the TTL it says. A peer's heartbeat says
    # it holds a lease by 40 s: the blind claim says 40. Unread heartbeats:
    # no blind claim at all (until they can be read).
    backend = MemoryBackend()
    store = ScriptedStore(backend)
    await store.put_heartbeat(Heartbeat(cluster=CLUSTER, node="old", incarnation="x", seq=1,
                                        write_id="w", holds_by=40.0))
    if reads == "fail":
        store.broken.add("get_heartbeat")
    a = Node("a", backend, shards=1, store=store).start()
    await claimed()
    await asyncio.sleep(4.0)  # (unread: after the reads' budget)
    rec = lease(backend, 0)
    if reads == "work":
        assert rec is not None and rec.owner == "a" and rec.ttl == 40.0
    else:
        assert rec is None and a.host.ops(0) == []
    await a.stop()


@virtual
async def test_a_refusal_that_comes_during_a_node_mode_stop_is_freed_by_its_own_write() -> None:
    # Issue 38, family A2: stopping in node mode, a lease is left to the end
    # of the epoch, which frees every lease of it at once for every node at
    # the claim's generation. Not one its host refused as outdated: that one
    # is freed by a write of its own, at the host's generation, kept from
    # every node. The refusal comes while the node stops (its open slow).
    backend = MemoryBackend()
    a = Node("a", backend, shards=1, renewal="node", host=RememberingHost(9))
    gate = asyncio.Event()
    a.host.open_gates[0] = gate
    a.start()
    await claimed()
    assert a.host.ops(0) == ["open"]
    stopping = asyncio.create_task(a.stop())
    await asyncio.sleep(0.5)
    gate.set()
    await stopping
    rec = lease(backend, 0)
    assert rec is not None and rec.owner is None and rec.generation == 9 and rec.hold >= 15.0


@virtual
async def test_a_host_that_keeps_refusing_as_outdated_cools_down_from_the_second_time() -> None:
    from shardlease.loop import preference

    backend = MemoryBackend()
    names = {"a", "b"}
    refused = max(range(4), key=lambda s: preference("a", s))
    a = Node("a", backend, peers=lambda: names,
             host=RememberingHost(9, stubborn=frozenset({refused}))).start()
    # b starts once a was refused twice (its rounds at 5 s, then 35 s: the
    # first round more than a TTL after the epochs, watched from the round
    # that saw the refusal's free at 10 s, said that none keeps the shard).
    await asyncio.sleep(36)
    b = Node("b", backend, peers=lambda: names, host=RememberingHost(9)).start()
    await asyncio.sleep(200)
    tries = a.host.times("open", refused)
    # Claimed again once the refusal's wait is over and the epochs were asked
    # (no cooldown of a failing host), then cooled like a failing host.
    assert tries[:2] == [5.0, 35.0]
    assert all(later - earlier >= 2 * 15.0 for earlier, later in itertools.pairwise(tries[1:]))
    # Every ask over both nodes above the last, and the shard opened by b above them all.
    asked = sorted((c.t, c.generation) for host in (a.host, b.host) for c in host.calls
                   if c.op == "open" and c.shard == refused)
    assert all(g2 > g1 for (_, g1), (_, g2) in itertools.pairwise(asked)), asked
    assert b.host.open_now.get(refused) == asked[-1][1] > 9
    await a.stop()
    await b.stop()


@virtual
async def test_a_graceful_stop_waits_for_a_heartbeat_its_round_gave_up_on() -> None:
    backend = MemoryBackend()
    a = Node("a", backend)
    a.store.delay["put_heartbeat"] = 8.0  # past the budget: the write goes on
    a.start()
    await asyncio.sleep(4.9)  # the heartbeat sent at 0 lands at 8; nobody waits for it now
    assert (CLUSTER, "a") not in backend.heartbeats
    await a.stop()
    assert now() >= 8.0 and (CLUSTER, "a") not in backend.heartbeats


# -- hints: a round woken early ---------------------------------------------------------


def round_starts(node: Node, hinted: bool | None = None) -> list[float]:
    """When each round began (a Round event is emitted at its end)."""
    return [t - ev.duration for t, ev in node.of(Round) if hinted in (None, ev.hinted)]


@virtual
async def test_a_hint_wakes_the_next_round_at_once_and_the_schedule_goes_on_from_it() -> None:
    backend = MemoryBackend()
    a = Node("a", backend).start()
    await claimed()
    await asyncio.sleep(7.3 - now())
    a.loop.hint()
    await asyncio.sleep(0.11)
    assert [round(t, 2) for t in round_starts(a, hinted=True)] == [7.33]  # HINT_QUIET later
    await asyncio.sleep(13 - now())
    # Rounds start every interval from the last one, the hinted one included.
    assert [round(t, 2) for t in round_starts(a)] == [0.0, 5.0, 7.33, 12.33]
    await a.stop()


async def hinted_pair(mode: str, hinted: bool = True) -> tuple[Node, Node]:
    """Two nodes sharing 4 shards at 12 s, a hinted by each of b's frees (as
    a store's watch or b's hint channel would) unless not `hinted`."""
    backend = MemoryBackend()
    a = Node("a", backend, renewal=mode, peers=lambda: {"a", "b"})
    b = Node("b", backend, renewal=mode, peers=lambda: {"a", "b"})
    if hinted:
        b.telemetry.subscribe(lambda ev: a.loop.hint() if isinstance(ev, Release) else None)
    a.start()
    b.start()
    await asyncio.sleep(12.0)
    return a, b


@pytest.mark.parametrize("mode", ["shard", "node"])
@virtual
async def test_frees_that_come_together_are_claimed_by_one_woken_round(mode: str) -> None:
    # b's stop frees its shards as their closes end, a few ms apart; a's
    # round waits until HINT_QUIET passed without one and claims them all.
    a, b = await hinted_pair(mode)
    assert len(b.opened()) == 2
    b.host.close_delay = {s: 0.01 * i for i, s in enumerate(sorted(b.opened()))}
    await b.stop()
    await asyncio.sleep(0.5)
    assert a.opened() == {0, 1, 2, 3}
    hinted = [t for t in round_starts(a, hinted=True) if t >= 12.0]
    assert len(hinted) == 1, hinted
    await a.stop()


@virtual
async def test_a_leave_seen_by_a_watch_does_not_make_the_frees_after_it_wait_a_gap() -> None:
    # Shard mode on a watching store (Kubernetes): a stopping node deletes
    # its heartbeat first (the peers' share counts it gone), and the watch
    # wakes the peers' round at once, while its leases are still held; its
    # frees come as its closes end. Their round must not wait out the
    # HINT_GAP the leave's round began (measured on a real API server before
    # the fix: every freed shard reopened 0.51-0.54 s after its close).
    from shardlease.loop import HINT_GAP, HINT_SETTLE

    a, b = await hinted_pair("shard", hinted=False)
    loop = asyncio.get_running_loop()
    b.store.before["delete_heartbeat"] = lambda cluster, node: loop.call_soon(
        a.loop._on_change, Change("heartbeat", "deleted", node="b"))
    freed: list[float] = []

    def on_release(ev: Event) -> None:
        if isinstance(ev, Release):
            freed.append(now())
            a.loop._on_change(Change("lease", "modified", free=True))

    b.telemetry.subscribe(on_release)
    theirs = b.opened()
    assert len(theirs) == 2
    b.host.close_delay = dict.fromkeys(theirs, 0.05)  # the application's close
    await b.stop()
    await asyncio.sleep(HINT_GAP * 5.0 * 2)
    assert a.opened() == {0, 1, 2, 3}
    claims = [t for t, ev in a.of(Claim) if ev.shard in theirs]
    assert len(claims) == 2 and len(freed) == 2
    # The frees' round began HINT_QUIET after the last one (HINT_SETTLE at
    # most), not HINT_GAP intervals after the leave's round.
    assert max(claims) <= max(freed) + HINT_SETTLE, (freed, claims)
    await a.stop()


@virtual
async def test_hints_together_wake_one_round_and_woken_rounds_keep_a_gap() -> None:
    from shardlease.loop import HINT_BURST, HINT_GAP

    backend = MemoryBackend()
    a = Node("a", backend).start()
    await claimed()
    await asyncio.sleep(7.3 - now())
    for _ in range(100):
        a.loop.hint()
    await asyncio.sleep(0.5)
    assert len(round_starts(a, hinted=True)) == 1
    # A hint every 0.1 s for 10 s: woken rounds on average at most every
    # HINT_GAP intervals, and never HINT_BURST + 1 of them within one gap.
    gap = HINT_GAP * 5.0
    while now() < 18:
        a.loop.hint()
        await asyncio.sleep(0.1)
    starts = [t for t in round_starts(a, hinted=True) if 8 <= t <= 18]
    assert len(starts) <= 10 / gap + HINT_BURST
    assert all(starts[i + HINT_BURST] - starts[i] >= gap - 1e-6
               for i in range(len(starts) - HINT_BURST)), starts
    # Steady hints: one woken round a gap, once the burst is spent.
    assert all(b - a_ >= gap - 1e-6 for a_, b in itertools.pairwise(starts[HINT_BURST:])), starts
    assert len([t for t in round_starts(a) if 8 <= t <= 18]) <= 10 / gap + 10 / 5 + HINT_BURST
    await a.stop()


@virtual
async def test_a_hint_during_a_round_asks_for_one_more_round() -> None:
    backend = MemoryBackend()
    a = Node("a", backend).start()
    await claimed()
    await asyncio.sleep(10 - now())
    # The round of 10 s reads; a hint arriving while it runs may be about a
    # change it read before: one more round follows at once.
    await asyncio.sleep(0)
    a.loop.hint()
    await asyncio.sleep(2)
    assert [round(t, 2) for t in round_starts(a, hinted=True)] == [10.03]  # (HINT_QUIET)
    assert [round(t, 2) for t in round_starts(a)] == [0.0, 5.0, 10.0, 10.03]
    await a.stop()


@virtual
async def test_the_first_round_claims_when_every_known_peer_is_live() -> None:
    backend = MemoryBackend()
    a = Node("a", backend, peers=lambda: {"a"}).start()
    await idle()
    assert a.opened() == {0, 1, 2, 3}  # its first round: nobody else to wait for
    b = Node("b", backend, peers=lambda: {"a", "b", "c"}).start()
    await idle()
    assert b.opened() == set()  # c is not live yet: the first round only reads
    await a.stop()
    await b.stop()


@pytest.mark.parametrize("mode", ["shard", "node"])
@virtual
async def test_a_shard_freed_by_a_stop_is_claimed_at_once_by_a_hinted_peer(mode: str) -> None:
    a, b = await hinted_pair(mode)
    theirs = b.opened()
    assert theirs and theirs | a.opened() == {0, 1, 2, 3}
    stop = asyncio.create_task(b.stop())
    await asyncio.sleep(1.0)
    # a's next round of its own would come at 15 s.
    assert a.opened() == {0, 1, 2, 3}
    claims = [t for t, ev in a.of(Claim) if ev.shard in theirs]
    assert claims and max(claims) < 13.0, claims
    await stop
    await a.stop()


@pytest.mark.parametrize(("credit", "started", "after", "due"), [
    # The first woken round: the next may follow at once (the burst).
    (-math.inf, 10.0, 11.0, 10.0),
    # The second, right after it: the third waits a gap from the first.
    (11.0, 10.1, 12.0, 11.0),
    # Rounds a gap apart or more keep one round of burst in hand.
    (12.0, 13.0, 14.0, 13.0),
    (11.0, 30.0, 31.0, 30.0),
    # A round started as soon as it was due spends the credit exactly.
    (12.0, 11.0, 13.0, 12.0),
])
def test_the_pace_of_woken_rounds(credit: float, started: float, after: float,
                                  due: float) -> None:
    # gap 1 s, HINT_BURST 2: a leaky bucket of two woken rounds.
    assert paced(credit, started, 1.0) == after
    assert woken_due(after, 1.0) == due


@pytest.mark.parametrize(("change", "woken"), [
    # A lease freed (a release, a stop's free): a round may claim it.
    (Change("lease", "modified", free=True), True),
    (Change("lease", "added", free=True), True),
    # A claim or a renewal frees nothing; a deletion is damage, judged by TTL.
    (Change("lease", "modified"), False),
    (Change("lease", "added"), False),
    (Change("lease", "deleted"), False),
    # A peer's epoch ended (its leases are claimable), new (a join) or gone.
    (Change("epoch", "modified", node="b", ended=True), True),
    (Change("epoch", "added", node="b"), True),
    (Change("epoch", "deleted", node="b"), True),
    (Change("epoch", "modified", node="b"), False),  # a renewal
    # Heartbeats: a join or a leave changes the share; a beat does not.
    (Change("heartbeat", "added", node="b"), True),
    (Change("heartbeat", "deleted", node="b"), True),
    (Change("heartbeat", "modified", node="b"), False),
    # This node's own records tell it nothing new.
    (Change("epoch", "modified", node="a", ended=True), False),
    (Change("heartbeat", "added", node="a"), False),
])
def test_which_changes_a_watch_sees_wake_a_round(change: Change, woken: bool) -> None:
    assert wakes(change, "a") is woken


@pytest.mark.parametrize(("change", "settle"), [
    # One free among others (a stop's, a rebalance's): wait for the rest.
    (Change("lease", "modified", free=True), True),
    # One write that frees everything it kept, or a peer come or gone: at once.
    (Change("epoch", "modified", node="b", ended=True), False),
    (Change("epoch", "deleted", node="b"), False),
    (Change("heartbeat", "added", node="b"), False),
])
def test_which_woken_rounds_wait_for_more_frees(change: Change, settle: bool) -> None:
    assert settles(change) is settle


@virtual
async def test_a_hint_that_says_it_all_wakes_its_round_at_once_unless_others_wait() -> None:
    backend = MemoryBackend()
    a = Node("a", backend).start()
    await claimed()
    await asyncio.sleep(7.3 - now())
    a.loop.hint(settle=False)  # an epoch ended: nothing more to wait for
    await asyncio.sleep(0.01)
    assert [round(t, 2) for t in round_starts(a, hinted=True)] == [7.3]
    await asyncio.sleep(9.0 - now())
    a.loop.hint()  # a free, then the epoch's end: no wait either
    a.loop.hint(settle=False)
    await asyncio.sleep(0.01)
    assert [round(t, 2) for t in round_starts(a, hinted=True)] == [7.3, 9.0]
    await a.stop()


@virtual
async def test_a_woken_round_waits_for_a_quiet_moment_not_a_fixed_settle() -> None:
    # Frees that come together wake one round once HINT_QUIET passed
    # without another (at most HINT_SETTLE after the first): a lone free's
    # round starts HINT_QUIET after it, not HINT_SETTLE. Before, every free
    # waited HINT_SETTLE, most of the unowned time of a join's moves (file
    # store, 3 nodes, 12 shards: 0.47-0.49 shard-s with 0.1 s, 0.15-0.18
    # with 0.02 s).
    from shardlease.loop import HINT_QUIET, HINT_SETTLE

    backend = MemoryBackend()
    a = Node("a", backend).start()
    await claimed()
    await asyncio.sleep(7.3 - now())
    a.loop.hint()  # one free
    await asyncio.sleep(0.5)
    assert [round(t, 3) for t in round_starts(a, hinted=True)] == [round(7.3 + HINT_QUIET, 3)]
    await asyncio.sleep(9.0 - now())
    for _ in range(4):  # frees HINT_QUIET / 2 apart: one round, after the last
        a.loop.hint()
        await asyncio.sleep(HINT_QUIET / 2)
    await asyncio.sleep(0.5)
    last = 9.0 + 3 * HINT_QUIET / 2
    assert [round(t, 3) for t in round_starts(a, hinted=True)][1:] == [round(last + HINT_QUIET, 3)]
    await asyncio.sleep(11.0 - now())
    while now() < 11.0 + 3 * HINT_SETTLE:  # frees that do not stop: HINT_SETTLE at most
        a.loop.hint()
        await asyncio.sleep(HINT_QUIET / 4)
    assert [round(t, 3) for t in round_starts(a, hinted=True)][2] == round(11.0 + HINT_SETTLE, 3)
    await a.stop()


class Telling(ScriptedStore):
    """Records what each lease listing is told, beside the epoch and
    heartbeat listings this store answered before it."""

    def __init__(self, backend: MemoryBackend) -> None:
        super().__init__(backend)
        self.epoch_listings: list[object] = []
        self.beat_listings: list[object] = []
        #: (what it was told, the epoch listings and heartbeat listings
        #: answered by then)
        self.told: list[tuple[Listed | None, list[object], list[object]]] = []

    async def list_epochs(self, cluster: str) -> dict[tuple[str, str], str]:
        listing = await super().list_epochs(cluster)
        self.epoch_listings.append(listing)
        return listing

    async def list_heartbeats(self, cluster: str) -> dict[str, str]:
        listing = await super().list_heartbeats(cluster)
        self.beat_listings.append(listing)
        return listing

    async def list_leases(self, cluster: str, *,
                          seen: Listed | None = None) -> dict[int, Stored[Lease]]:
        self.told.append((seen, list(self.epoch_listings), list(self.beat_listings)))
        return await super().list_leases(cluster, seen=seen)


@pytest.mark.parametrize("mode", ["shard", "node"])
@virtual
async def test_a_round_tells_its_lease_listing_what_it_listed(mode: str) -> None:
    # Node mode: the epochs listed first, that very listing told (each one
    # once, made since the lease listing before); shard mode lists no epochs.
    # Both: the last heartbeat listing that succeeded (None after a failure).
    backend = MemoryBackend()
    store = Telling(backend)
    a = Node("a", backend, renewal=mode, store=store).start()
    await asyncio.sleep(12.0)
    store.broken.add("list_heartbeats")
    await asyncio.sleep(10.0)
    store.broken.discard("list_heartbeats")
    await asyncio.sleep(10.0)
    await a.stop()
    listed_before = 0
    for seen, epochs, beats in store.told:
        assert seen is not None
        if mode == "node":
            assert len(epochs) > listed_before, "an epoch listing since the last lease listing"
            assert seen.epochs is epochs[-1]
            listed_before = len(epochs)
        else:
            assert seen.epochs is None and epochs == []
        # The last one the loop took in: this round's own, read beside, may
        # have been answered just before and not taken in yet, and so may a
        # blind claim's read of every heartbeat (shard mode, a first claim).
        assert seen.heartbeats is None or any(seen.heartbeats is b for b in beats[-3:])
    told_beats = [seen.heartbeats for seen, _, _ in store.told if seen is not None]
    assert None in told_beats[2:], "the listing that failed"
    assert told_beats[-1] is not None, "a good one again"


# When a shard-mode claim is renewed apart from the batch (keeper.renewed_apart):
# answered in more than (ttl - margin - pace) / 3, the batch could renew it late.
@pytest.mark.parametrize(("answered_in", "ttl", "margin", "pace", "apart"), [
    (0.0, 15.0, 2.5, 5.0, False),    # an instant answer: the batch
    (2.5, 15.0, 2.5, 5.0, False),    # at the bound: the batch still makes it
    (2.51, 15.0, 2.5, 5.0, True),
    (4.26, 15.0, 2.5, 5.0, True),    # the simulation's example (fenced before)
    (0.77, 3.0, 0.5, 1.0, True),     # the slow-store process test's claim
    (0.4, 3.0, 0.5, 1.0, False),
    (0.1, 3.0, 0.5, 2.5, True),      # no room left at all: every claim apart
])
def test_a_claim_is_renewed_apart_once_the_batch_could_be_late(
        answered_in: float, ttl: float, margin: float, pace: float, apart: bool) -> None:
    assert renewed_apart(answered_in, ttl, margin, pace) is apart
