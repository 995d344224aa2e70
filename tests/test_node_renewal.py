"""Node-mode renewal (one epoch record per node renews every lease it holds):
the real loop and runner, a scripted memory store and a strict fake host, in
virtual time."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest
from prometheus_client import CollectorRegistry

from shardlease.records import Lease
from shardlease.stores.memory import MemoryBackend, MemoryStore
from shardlease.telemetry import (
    Claim,
    EpochEnded,
    Lost,
    NewerRecord,
    PrometheusMetrics,
    RenewSlow,
    SelfFence,
)

from .test_loop import CLUSTER, Node, idle, lease, virtual


def node(name: str, backend: MemoryBackend, **options: Any) -> Node:
    return Node(name, backend, renewal="node", **options)


def leases(backend: MemoryBackend, shards: int) -> list[Lease | None]:
    return [lease(backend, s) for s in range(shards)]


def writes(n: Node, method: str, t0: float, t1: float) -> int:
    return sum(1 for t, m in n.store.calls if m == method and t0 <= t < t1)


@virtual
async def test_in_steady_state_one_epoch_write_renews_every_lease() -> None:
    backend = MemoryBackend()
    a, b = node("a", backend, shards=64).start(), node("b", backend, shards=64).start()
    await asyncio.sleep(30)
    assert len(a.opened()) + len(b.opened()) == 64 and a.opened().isdisjoint(b.opened())
    assert all(rec is not None and rec.renewal == "node" for rec in leases(backend, 64))
    # Over 4 intervals (20 s), nothing moves: no lease is written at all...
    start = asyncio.get_running_loop().time()
    await asyncio.sleep(20)
    for n in (a, b):
        assert writes(n, "update_lease", start, start + 20) == 0
        assert writes(n, "create_lease", start, start + 20) == 0
        # ...and each node writes its epoch once per interval, each time
        # moving every deadline it holds.
        assert writes(n, "update_epoch", start, start + 20) == 4
        deadlines = {n.loop.runner.deadline(s) for s in n.opened()}
        assert len(deadlines) == 1 and deadlines.pop() is not None
    assert a.of(SelfFence) == b.of(SelfFence) == []
    await a.stop()
    await b.stop()


async def requests_per_interval(shards: int) -> float:
    backend = MemoryBackend()
    nodes = [node(f"n{k}", backend, shards=shards).start() for k in range(4)]
    await asyncio.sleep(40)
    start = asyncio.get_running_loop().time()
    await asyncio.sleep(20)
    counts = [sum(1 for t, _ in n.store.calls if start <= t < start + 20) for n in nodes]
    for n in nodes:
        await n.stop()
    return sum(counts) / len(counts) / 4


@virtual
async def test_store_requests_do_not_grow_with_the_shard_count() -> None:
    small, large = await requests_per_interval(16), await requests_per_interval(512)
    # Each round an epoch listing, a lease listing, an epoch write, and the
    # heartbeat listing (which finds nobody here, but would find a peer in
    # shard mode: docs/renewal.md).
    assert small == large == 4


@virtual
async def test_a_silent_node_is_taken_over_only_after_its_epoch_is_ended() -> None:
    backend = MemoryBackend()
    a = node("a", backend, shards=4).start()
    await asyncio.sleep(12)
    assert a.opened() == {0, 1, 2, 3}
    b = node("b", backend, shards=4).start()
    await asyncio.sleep(12)
    assert len(b.opened()) == 2
    # a goes silent: neither its renewals nor its frees land.
    a.store.broken |= {"update_epoch", "update_lease"}
    cut = asyncio.get_running_loop().time()
    await asyncio.sleep(30)
    fenced = [t for t, ev in a.of(SelfFence)]
    warned = [t for t, ev in a.of(RenewSlow)]
    ended = [(t, ev) for t, ev in b.of(EpochEnded)]
    assert warned and fenced and warned[0] < fenced[0]
    assert len(ended) == 1 and ended[0][1].owner == "a"
    # b ended a's epoch only after a had fenced itself, and claimed only after.
    claims = [t for t, ev in b.of(Claim) if t > cut]
    assert fenced[0] < ended[0][0] <= min(claims)
    assert b.opened() == {0, 1, 2, 3}
    # a's next epoch write is refused: it learns, and comes back with a new epoch.
    a.store.broken.clear()
    await asyncio.sleep(30)
    assert [ev.owner for _, ev in a.of(EpochEnded)] == ["a"]
    assert len(a.opened()) == 2 and len(b.opened()) == 2
    assert {rec.incarnation for rec in leases(backend, 4) if rec and rec.owner == "a"} \
        == {a.loop.epoch}
    await a.stop()
    await b.stop()


@virtual
async def test_a_stale_view_cannot_end_a_live_epoch() -> None:
    backend = MemoryBackend()
    a = node("a", backend, shards=2).start()
    await asyncio.sleep(12)
    b = node("b", backend, shards=2).start()
    await asyncio.sleep(12)
    assert len(a.opened()) == len(b.opened()) == 1
    # b's epoch listings freeze (a lagging cache), and b believes a is gone:
    # it sees a's epoch unchanged for a TTL, while a renews it all along.
    frozen = await b.store.list_epochs(CLUSTER)

    async def stale(cluster: str) -> dict[tuple[str, str], str]:
        return dict(frozen)

    b.store.list_epochs = stale  # type: ignore[method-assign]
    b.loop.peers = lambda: ["b"]
    before = dict(a.host.open_now)
    await asyncio.sleep(40)
    assert a.of(EpochEnded) == [] and b.of(EpochEnded) == []
    assert a.of(SelfFence) == []
    assert a.host.open_now == before
    await a.stop()
    await b.stop()


@virtual
async def test_a_graceful_stop_ends_its_epoch_in_one_write_and_peers_take_over_at_once() -> None:
    # Issue 17, item 0: the shards close while the epoch keeps them, then one
    # compare-and-swap ends the epoch, which frees every lease of it.
    backend = MemoryBackend()
    a, b = node("a", backend, shards=8).start(), node("b", backend, shards=8).start()
    await asyncio.sleep(30)
    assert len(a.opened()) == len(b.opened()) == 4
    mine = sorted(a.opened())
    before = {s: backend.leases[(CLUSTER, s)][0] for s in mine}
    loop = asyncio.get_running_loop()
    t0 = loop.time()
    await a.stop()
    t1 = loop.time() + 0.001  # (virtual time: the stop takes no time)
    assert writes(a, "update_lease", t0, t1) == writes(a, "create_lease", t0, t1) == 0
    assert writes(a, "update_epoch", t0, t1) >= 1
    assert [e for (c, n, e) in backend.epochs if c == CLUSTER and n == "a"
            and not ended(backend, n, e)] == []
    # Not one lease written by a's stop: each still names a's (ended) epoch...
    assert {s: backend.leases[(CLUSTER, s)][0] for s in mine} == before
    await asyncio.sleep(6)  # ...until b's next round, which takes them all.
    assert b.opened() == set(range(8))
    assert b.of(SelfFence) == []
    assert all(rec is not None and rec.owner == "b" for rec in leases(backend, 8))
    await idle()
    await b.stop()


@virtual
async def test_a_graceful_stop_holding_nothing_removes_its_epoch() -> None:
    # Nothing to free: no end to tell, the record is deleted as before.
    backend = MemoryBackend()
    a, b = node("a", backend, shards=2).start(), node("b", backend, shards=2).start()
    await asyncio.sleep(30)
    c = node("c", backend, shards=2).start()
    await asyncio.sleep(30)
    assert c.opened() == set() and len(a.opened()) == len(b.opened()) == 1
    assert any(n == "c" for (cl, n, _) in backend.epochs if cl == CLUSTER)
    await c.stop()
    assert not any(n == "c" for (cl, n, _) in backend.epochs if cl == CLUSTER)
    await a.stop()
    await b.stop()


@virtual
async def test_an_epoch_write_whose_answer_was_lost_is_not_taken_for_an_ended_epoch() -> None:
    backend = MemoryBackend()
    a = node("a", backend, shards=2).start()
    await asyncio.sleep(12)
    epoch = a.loop.epoch
    # The next epoch write lands but its answer is lost, and the record
    # cannot be read back for longer than the write's budget: the node is
    # left one version behind its own record.
    a.store.lose_reply["update_epoch"] = 1
    a.store.broken.add("get_epoch")
    await asyncio.sleep(16)
    a.store.broken.discard("get_epoch")
    await asyncio.sleep(20)
    # Its next write conflicts with its own record: that is no end of the epoch.
    assert a.of(EpochEnded) == []
    assert a.loop.epoch == epoch
    assert a.opened() == {0, 1}
    await a.stop()


@virtual
async def test_a_stop_frees_the_stray_a_fenced_shard_left() -> None:
    # Node mode frees strays every round, which left `_strays` False; a
    # fenced shard whose free then failed for its whole budget was dropped
    # as "it will expire", and a stop whose first listing failed ended at
    # once instead of trying again: the lease was left for a newcomer to
    # wait out.
    backend = MemoryBackend()
    a = node("a", backend, shards=1).start()
    await asyncio.sleep(12)
    assert a.opened() == {0}
    a.store.fail["update_epoch"] = 10_000  # the epoch lapses: shard 0 is fenced
    a.store.fail["update_lease"] = 10_000  # ...and its free fails for the whole budget
    await asyncio.sleep(27)
    assert a.of(SelfFence) and a.loop.held == {}
    rec = lease(backend, 0)
    assert rec is not None and rec.owner == "a"  # left behind
    a.store.fail.clear()
    a.store.fail["list_leases"] = 10_000
    stopping = asyncio.create_task(a.stop())
    await asyncio.sleep(6)  # the first stopping round's listing has failed
    a.store.fail.clear()
    await stopping
    rec = lease(backend, 0)
    # Freed: by a write of its own, or (its epoch valid again by the stop)
    # with the end of the epoch it names.
    assert rec is not None, rec
    assert rec.owner is None or ended(backend, "a", rec.incarnation or ""), rec


def ended(backend: MemoryBackend, node: str, epoch: str) -> bool:
    found = backend.epochs.get((CLUSTER, node, epoch))
    return found is not None and json.loads(found[1]).get("ended_by") is not None


def renewals(backend: MemoryBackend, shards: int) -> set[str]:
    return {rec.renewal for rec in leases(backend, shards) if rec is not None and rec.owner}


@virtual
async def test_a_shard_mode_node_beside_node_mode_nodes_takes_its_share_by_the_ordinary_moves(
        ) -> None:
    # A cluster switching modes mixes this version's shard-mode and node-mode
    # nodes: each lease is judged by its own record (a node-mode lease only
    # after its epoch is ended by a compare-and-swap), and liveness comes from
    # heartbeats and epochs alike, so nobody is ever open twice, nobody is
    # fenced, and the shard-mode node gets its share as the others release.
    backend = MemoryBackend()
    a, b = node("a", backend, shards=8).start(), node("b", backend, shards=8).start()
    await asyncio.sleep(30)
    assert renewals(backend, 8) == {"node"} and len(a.opened() | b.opened()) == 8
    assert backend.heartbeats == {}
    other = Node("other", backend, shards=8, renewal="shard").start()
    overlaps: list[tuple[float, set[int]]] = []

    async def sample() -> None:
        while True:
            opened = [n.opened() for n in (a, b, other)]
            if twice := {s for s in range(8) if sum(s in o for o in opened) > 1}:
                overlaps.append((asyncio.get_running_loop().time(), twice))
            await asyncio.sleep(0.05)

    sampler = asyncio.create_task(sample())
    await asyncio.sleep(36)
    assert len(other.opened()) >= 2
    assert sum(len(n.opened()) for n in (a, b, other)) == 8
    assert renewals(backend, 8) == {"node", "shard"}  # each kept its own way
    assert {n for _, n in backend.heartbeats} == {"other"}  # node mode never beats
    for n in (a, b, other):
        assert n.of(SelfFence) == [] and n.of(EpochEnded) == [] and n.of(Lost) == []
    await other.stop()
    await asyncio.sleep(30)
    assert len(a.opened() | b.opened()) == 8
    assert renewals(backend, 8) == {"node"}
    sampler.cancel()
    assert overlaps == []
    await a.stop()
    await b.stop()


@virtual
@pytest.mark.parametrize("renewal", ["shard", "node"])
async def test_a_lease_of_a_newer_format_is_never_claimed_and_is_reported(
        renewal: str) -> None:
    # docs/renewal.md, "Record formats": a node of this version beside the
    # records of a newer one keeps its hands off what it cannot read, however
    # long the record stays unchanged, and says so (event, metric).
    backend = MemoryBackend()
    future = json.dumps({"cluster": CLUSTER, "shard": 2, "owner": "future", "generation": 7,
                         "format": 2, "write_id": "w", "ttl": 15.0, "new_field": [1, 2]})
    MemoryStore(backend).put_raw_lease(CLUSTER, 2, future.encode())
    registry = CollectorRegistry()
    a = Node("a", backend, shards=4, renewal=renewal)
    a.telemetry.subscribe(PrometheusMetrics(registry))
    a.start()
    b = Node("b", backend, shards=4, renewal=renewal).start()
    await asyncio.sleep(10 * 15.0)  # ten TTLs unchanged
    assert 2 not in a.opened() | b.opened()
    assert (a.opened() | b.opened()) == {0, 1, 3}
    assert backend.leases[(CLUSTER, 2)][1] == future.encode()  # never written over
    assert [e.format for _, e in a.of(NewerRecord)] == [2]  # once per version seen
    assert registry.get_sample_value("shardlease_newer_records_total",
                                     {"cluster": CLUSTER, "node": "a"}) == 1
    assert a.loop.lookup(2) is None and b.loop.lookup(2) is None
    await a.stop()
    await b.stop()


@virtual
async def test_a_last_node_whose_epoch_lands_after_its_first_round_claims_once_it_lands() -> None:
    # Nodes started together: the last to start sees every peer it knows of
    # live in its first round, so it may claim at once, but its own epoch
    # (written beside that round) has not landed yet, and a lease must name
    # a live epoch. Its claims must follow the epoch's first write, not the
    # next round of its time (measured on the file store, 3 nodes, TTL 3 s:
    # the last node's 4 shards waited an interval, 4 of 7.5 unowned shard-s).
    backend = MemoryBackend()
    peers = {"a", "b", "c"}
    a = node("a", backend, shards=6, peers=lambda: peers).start()
    b = node("b", backend, shards=6, peers=lambda: peers).start()
    await asyncio.sleep(0.2)
    c = node("c", backend, shards=6, peers=lambda: peers)
    c.store.delay["create_epoch"] = 0.05
    c.start()
    await asyncio.sleep(6.0)
    assert sorted(c.opened() | a.opened() | b.opened()) == [0, 1, 2, 3, 4, 5]
    landed = min(t for t, m in c.store.calls if m == "create_epoch") + 0.05
    claims = [t for t, _ in c.of(Claim)]
    assert claims, "c claimed nothing"
    first_round = c.round_times()[0]
    assert first_round < landed, "the scenario needs the first round to end before the epoch"
    assert min(claims) <= landed + 0.1, (landed, claims, c.round_times())
    for n in (a, b, c):
        await n.stop()


@virtual
async def test_a_node_that_lost_every_spare_to_peers_claims_the_rest_at_once() -> None:
    # Nodes started together read the same free shards and race for them.
    # c's writes land last: of the 8 shards it prefers most (its claims and
    # its spares), a and b took 7, so after its first claims it holds 1 of
    # its share of 4. It must list again now, not an interval later
    # (measured on the file store, 3 nodes, TTL 3 s: the shard it missed
    # waited an interval, 1 of 4.4 unowned shard-s).
    backend = MemoryBackend()
    peers = {"a", "b", "c"}
    nodes = [node(n, backend, shards=12, peers=lambda: peers) for n in ("a", "b", "c")]
    c = nodes[2]
    c.store.delay["create_lease"] = 0.01
    for n in nodes:
        n.start()
    await asyncio.sleep(4.0)  # under an interval (5 s)
    claims = [t for t, _ in c.of(Claim)]
    assert [len(n.opened()) for n in nodes] == [4, 4, 4], (claims, c.round_times())
    assert max(claims) - min(claims) < 1.0, claims
    for n in nodes:
        await n.stop()


@pytest.mark.parametrize("held", [True, False])
@virtual
async def test_a_graceful_stop_whose_end_is_slower_than_a_call_budget_still_ends_its_epoch(
        held: bool) -> None:
    # A stop's end of its epoch (or, holding nothing, its deletion) is useful
    # until peers would end the epoch themselves: a TTL (PlacementLoop.run
    # waits that long), not one round's call budget (4.75 s here). Cut at the
    # budget, the node exited 0 with every lease still naming its epoch:
    # peers waited a TTL of silence (the graceful-stop process test's CI
    # failure on MinIO, [s3-node]; the simulation's (g) with the swarm's
    # slow_stop kind).
    backend = MemoryBackend()
    peers = lambda: ["a", "b"]  # noqa: E731
    if not held:  # b takes the one shard first: a holds nothing
        b = node("b", backend, shards=1, peers=peers).start()
        await asyncio.sleep(11)
    a = node("a", backend, shards=4 if held else 1,
             peers=None if held else peers).start()  # TTL 15, interval 5
    await asyncio.sleep(30)
    assert len(a.opened()) == (4 if held else 0)
    epoch = a.loop.epoch
    a.store.delay["update_epoch"] = a.store.delay["delete_epoch"] = 6.0
    await a.stop()
    await idle()
    if held:
        assert ended(backend, "a", epoch), "the end of the epoch did not land"
        assert all((rec := lease(backend, s)) is not None and rec.incarnation == epoch
                   for s in range(4))
    else:
        assert (CLUSTER, "a", epoch) not in backend.epochs, "the epoch was not deleted"
        await b.stop()
