"""`PlacementLoop.reconfigure`: new options applied in place, on the real loop
and runner, the memory store and the strict fake host, in virtual time.

Every change but the shard count leaves every shard open and every lease
held; a shard count change moves only the shards it has to."""

from __future__ import annotations

import asyncio
import itertools
from typing import Any

import pytest

from shardlease.errors import ConfigError
from shardlease.options import Options
from shardlease.stores.memory import MemoryBackend
from shardlease.telemetry import Claim, Closed, Lost, Overrun, Release, Round, SelfFence
from tests.test_loop import CLUSTER, Node, idle, lease, now, virtual


def pair(backend: MemoryBackend, shards: int, **options: Any) -> tuple[Node, Node]:
    names = {"a", "b"}
    a = Node("a", backend, shards=shards, peers=lambda: names, **options)
    b = Node("b", backend, shards=shards, peers=lambda: names, **options)
    return a, b


def changed(node: Node, **changes: Any) -> Options:
    return node.loop.options.model_copy(update=changes)


def reconfigure(node: Node, **changes: Any) -> Options:
    """Through `Options.make`, as the agent builds them (validated)."""
    opts = Options.make(**{**node.loop.options.model_dump(), **changes})
    node.loop.reconfigure(opts)
    return opts


def closes(node: Node, since: float = 0.0) -> list[tuple[float, int]]:
    return [(c.t, c.shard) for c in node.host.calls if c.op == "close" and c.t >= since]


def opens(node: Node, since: float = 0.0) -> list[tuple[float, int]]:
    return [(c.t, c.shard) for c in node.host.calls if c.op == "open" and c.t >= since]


def gaps(times: list[float]) -> set[float]:
    return {round(b - a, 6) for a, b in itertools.pairwise(times)}


@virtual
async def test_ttl_interval_margin_and_timeouts_change_without_closing_anything() -> None:
    backend = MemoryBackend()
    a, b = pair(backend, 8)  # ttl 15, interval 5, margin 2.5
    a.start()
    await asyncio.sleep(0.5)
    b.start()
    await asyncio.sleep(32)  # 32.5: between two beats of each schedule (a: 30, b: 30.5)
    held = {n.name: n.opened() for n in (a, b)}
    assert len(held["a"]) == len(held["b"]) == 4
    t0 = now()

    # Raise the TTL, change the pace, the margin, the concurrency and the timeouts.
    for n in (a, b):
        reconfigure(n, lease_ttl=30.0, interval=4.0, margin=3.0, max_concurrency=2,
                    open_timeout=7.0, close_timeout=9.0)
    await asyncio.sleep(40)
    for n in (a, b):
        # Each schedule was woken: its first sleep already took the new pace.
        for times in ([t - ev.duration for t, ev in n.of(Round)],
                      sorted({t for t, m in n.store.calls if m == "update_lease"}),
                      [t for t, m in n.store.calls if m == "put_heartbeat"]):
            last = max(t for t in times if t < t0)
            assert min(t for t in times if t >= t0) <= last + 4.0
        assert n.opened() == held[n.name]
        assert closes(n, t0) == [] and opens(n, t0) == []
        assert n.of(Lost) == [] and n.of(SelfFence) == [] and n.of(Release) == []
        runner = n.loop.runner
        assert (runner.open_timeout, runner.close_timeout, runner.margin,
                runner.warn_ahead, runner.max_concurrency) == (7.0, 9.0, 3.0, 2.0, 2)
        assert (n.loop.calls.interval, n.loop.calls.ttl) == (4.0, 30.0)
        # The new pace: rounds, renewals and heartbeats every 4 s (start to start).
        late = t0 + 5  # past the first sleep, which the change cut short
        assert gaps([t - ev.duration for t, ev in n.of(Round) if t >= late]) == {4.0}
        renewals = sorted({t for t, m in n.store.calls if m == "update_lease" and t >= late})
        assert gaps(renewals) == {4.0}
        beats = [t for t, m in n.store.calls if m == "put_heartbeat" and t >= late]
        assert gaps(beats) == {4.0}
    for s in range(8):
        rec = lease(backend, s)
        assert rec is not None and rec.ttl == 30.0 and rec.generation == 1
        owner = rec.owner
        assert owner is not None and s in held[owner]
    # Deadlines: the last renewal (sent at a multiple of the pace) + 30 - 3.
    for n in (a, b):
        for s in held[n.name]:
            deadline = n.loop.runner.deadline(s)
            assert deadline is not None and now() + 27 - 4 <= deadline <= now() + 27

    # Lower it again.
    t1 = now()
    for n in (a, b):
        reconfigure(n, lease_ttl=6.0, interval=1.5, margin=1.0, max_concurrency=16,
                    open_timeout=60.0, close_timeout=60.0)
    await asyncio.sleep(40)  # the TTL comes down over a deadline's time (27 s)
    for n in (a, b):
        assert n.opened() == held[n.name]
        assert closes(n, t1) == [] and opens(n, t1) == []
        assert n.of(Lost) == [] and n.of(SelfFence) == [] and n.of(Release) == []
        renewals = sorted({t for t, m in n.store.calls if m == "update_lease" and t >= t1 + 2})
        assert gaps(renewals) == {1.5}
        for s in held[n.name]:
            deadline = n.loop.runner.deadline(s)
            assert deadline is not None and deadline <= now() + 6 - 1
    assert {getattr(lease(backend, s), "ttl", None) for s in range(8)} == {6.0}
    assert a.of(Claim)[4:] == [] and b.of(Claim)[4:] == []
    await a.stop()
    await b.stop()


@virtual
async def test_a_lowered_ttl_comes_down_by_renewals_that_cover_the_deadline() -> None:
    """A renewal may land without this node ever hearing of it; a peer then
    takes the shard one record's TTL after seeing it. So each renewal writes
    a TTL that still covers the deadline the holder (and its application)
    has: the peer cannot open before the holder closed."""
    backend = MemoryBackend()
    a, b = pair(backend, 1, lease_ttl=30.0, interval=10.0, margin=5.0)
    a.start()
    await asyncio.sleep(10.5)
    assert a.opened() == {0}
    b.start()
    await asyncio.sleep(14)  # 24.5: renewed at 20, deadline 45
    assert a.loop.runner.deadline(0) == 45.0
    # Every renewal of a lands, and a never hears of it (nor can it read it back).
    a.store.lose_reply["update_lease"] = 1000
    a.store.broken.add("get_lease")
    for n in (a, b):
        reconfigure(n, lease_ttl=12.0, interval=4.0, margin=2.0)
    await idle()
    # The renewal due at 24 went out at once, with what covers 45: 45 - 24.5 + 2.
    rec = lease(backend, 0)
    assert rec is not None and rec.ttl == 22.5 and rec.owner == "a"
    assert a.loop.runner.deadline(0) == 45.0
    await asyncio.sleep(30)
    (t_fence, fence), = a.of(SelfFence)
    assert t_fence == 45.0 and fence.shards == (0,)
    (t_closed,) = a.host.times("closed", 0)
    (t_open,) = b.host.times("open", 0)
    assert t_closed <= 45.0 < 45.0 + 2.0 <= t_open
    assert b.opened() == {0} and b.host.open_now[0] == 2
    a.store.lose_reply.clear()
    a.store.broken.clear()
    await a.stop()
    await b.stop()


@virtual
async def test_a_lowered_ttl_reaches_the_new_value_within_the_old_one() -> None:
    backend = MemoryBackend()
    a = Node("a", backend, shards=1, lease_ttl=45.0).start()  # interval 15, margin 7.5
    written: list[float] = []
    a.store.before["update_lease"] = lambda lease, version: written.append(lease.ttl)
    await asyncio.sleep(16)  # claimed at 15: deadline 52.5
    reconfigure(a, lease_ttl=6.0)  # interval 2, margin 1
    await asyncio.sleep(60)
    # The first renewal, at 17 (the faster pace of the two: the record says
    # 45), covers 52.5; each next one the deadline the previous one gave;
    # then the new TTL.
    assert written[:3] == [52.5 - 17 + 1, 52.5 - 19 + 1, 52.5 - 21 + 1]
    assert written[-1] == 6.0 and written.index(6.0) == len(written) - written.count(6.0)
    assert all(x >= y for x, y in itertools.pairwise(written))
    assert a.of(SelfFence) == [] and closes(a) == [] and a.opened() == {0}
    await a.stop()


@virtual
async def test_a_renewal_in_flight_when_the_ttl_rises_keeps_the_ttl_it_wrote() -> None:
    backend = MemoryBackend()
    a = Node("a", backend, shards=1).start()  # ttl 15, interval 5, margin 2.5
    await asyncio.sleep(6)
    a.store.delay["update_lease"] = 1.0
    await asyncio.sleep(4.5)  # 10.5: the renewal sent at 10 is on its way
    reconfigure(a, lease_ttl=60.0, interval=5.0, margin=2.5)
    await asyncio.sleep(0.6)  # its answer came at 11
    assert a.loop.runner.deadline(0) == 10.0 + 15.0 - 2.5  # what the record says
    await asyncio.sleep(5)  # the next one (sent at 15) still wrote 15: ...
    rec = lease(backend, 0)
    assert rec is not None and rec.ttl == 15.0
    await asyncio.sleep(5)  # ... the heartbeat said 60 first; the one sent at 20 wrote it
    rec = lease(backend, 0)
    assert rec is not None and rec.ttl == 60.0
    assert a.loop.runner.deadline(0) == 20.0 + 60.0 - 2.5
    await a.stop()


@virtual
async def test_a_longer_interval_waits_for_renewals_that_wrote_the_longer_ttl() -> None:
    """15 s -> 45 s, so the interval 5 -> 15 s: the records written with TTL
    15 fence 12.5 s after their renewal, so the next renewal comes at the old
    pace; once every record carries 45, the new pace. (A record carries 45
    once the node's heartbeat has said it: regression seed-3062478051.)"""
    backend = MemoryBackend()
    a = Node("a", backend, shards=2).start()
    await asyncio.sleep(6)  # claimed at 5: deadline 17.5
    reconfigure(a, lease_ttl=45.0)
    await asyncio.sleep(60)
    assert a.of(SelfFence) == [] and closes(a) == [] and a.opened() == {0, 1}
    renewals = sorted({t for t, m in a.store.calls if m == "update_lease"})
    beats = sorted({t for t, m in a.store.calls if m == "put_heartbeat"})
    # Claimed at 5; a record carries 45 only once a heartbeat said so (the
    # first after the change, at 20, on the new interval): the old pace
    # until the renewal after it, then the new.
    assert beats[:4] == [0.0, 5.0, 20.0, 35.0]
    assert renewals[:6] == [10.0, 15.0, 20.0, 25.0, 40.0, 55.0]
    assert {getattr(lease(backend, s), "ttl", None) for s in (0, 1)} == {45.0}
    await a.stop()


@virtual
async def test_a_raised_margin_does_not_stretch_a_fenced_close_past_the_expiry() -> None:
    backend = MemoryBackend()
    a = Node("a", backend, shards=1).start()  # ttl 15, interval 5, margin 2.5
    await asyncio.sleep(6)  # renewed at 5: deadline 17.5, the lease expires at 20
    a.store.delay["update_lease"] = 1000.0
    a.host.close_delay[0] = 1000.0
    await asyncio.sleep(1)
    reconfigure(a, margin=6.0)
    await asyncio.sleep(20)
    (t_fence, _), = a.of(SelfFence)
    (t_overrun, _), = a.of(Overrun)
    assert (t_fence, t_overrun) == (17.5, 20.0)
    a.store.delay.clear()
    a.host.close_delay.clear()
    assert a.task is not None
    a.task.cancel()
    await asyncio.gather(a.task, return_exceptions=True)


@virtual
async def test_more_shards_only_opens_the_new_ones() -> None:
    backend = MemoryBackend()
    a, b = pair(backend, 8)
    a.start()
    await asyncio.sleep(0.5)
    b.start()
    await asyncio.sleep(30)
    before = {n.name: n.opened() for n in (a, b)}
    assert before["a"] | before["b"] == set(range(8))
    t0 = now()
    for n in (a, b):
        reconfigure(n, shards=12)
    assert len(a.loop.owners()) == 12 and a.loop.lookup(10) is None
    await asyncio.sleep(30)
    for n in (a, b):
        assert closes(n, t0) == []
        assert n.opened() >= before[n.name] and len(n.opened()) == 6
        assert {s for _, s in opens(n, t0)} == n.opened() - before[n.name]
    assert a.opened() | b.opened() == set(range(12))
    assert {a.loop.lookup(s) for s in range(8, 12)} <= {"a", "b"}
    assert {getattr(lease(backend, s), "generation", None) for s in range(12)} == {1}
    await a.stop()
    await b.stop()


@virtual
async def test_fewer_shards_releases_only_what_it_must() -> None:
    backend = MemoryBackend()
    a, b = pair(backend, 12)
    a.start()
    await asyncio.sleep(0.5)
    b.start()
    await asyncio.sleep(40)
    before = {n.name: n.opened() for n in (a, b)}
    assert len(before["a"]) == len(before["b"]) == 6
    t0 = now()
    for n in (a, b):
        reconfigure(n, shards=6)
    assert len(a.loop.owners()) == 6
    assert all(a.loop.lookup(s) is None for s in range(6, 12))
    await asyncio.sleep(40)
    share = 3
    # Shards 6..11 closed by their holders, each once; of shards 0..5, only
    # what one node held above the new share of 3 moved, once.
    must_move = sum(max(0, len({s for s in before[n] if s < 6}) - share) for n in before)
    moved = 0
    for n in (a, b):
        gone = [s for _, s in closes(n, t0)]
        assert len(gone) == len(set(gone))
        assert {s for s in gone if s >= 6} == {s for s in before[n.name] if s >= 6}
        moved += len([s for s in gone if s < 6])
        assert len(n.opened()) == share
        assert all(s < 6 for s in n.opened())
        assert n.of(Lost) == [] and n.of(SelfFence) == []
        assert all(ev.reason == "release" for _, ev in n.of(Closed))
    assert moved == must_move
    assert a.opened() | b.opened() == set(range(6))
    for s in range(6, 12):
        rec = lease(backend, s)
        assert rec is not None and rec.owner is None  # freed, kept (generation)
    await a.stop()
    await b.stop()


@virtual
async def test_name_and_cluster_cannot_change_in_place() -> None:
    backend = MemoryBackend()
    a = Node("a", backend).start()
    await asyncio.sleep(11)
    before = a.loop.options
    with pytest.raises(ConfigError, match="name cannot change in place"):
        a.loop.reconfigure(changed(a, name="z", lease_ttl=20.0))
    with pytest.raises(ConfigError, match="cluster_name cannot change in place"):
        a.loop.reconfigure(changed(a, cluster_name="other"))
    assert a.loop.options is before and a.loop.runner.margin == before.margin_s
    assert a.opened() == {0, 1, 2, 3}
    assert (CLUSTER, "a") in backend.heartbeats
    await a.stop()


@virtual
async def test_max_concurrency_resizes_the_open_slots_in_use() -> None:
    backend = MemoryBackend()
    a = Node("a", backend, shards=6, max_concurrency=1)
    gates = {s: asyncio.Event() for s in range(6)}
    a.host.open_gates.update(gates)
    a.start()
    await asyncio.sleep(5.5)
    assert a.host.opening == 1
    reconfigure(a, max_concurrency=3)
    await idle()
    assert a.host.opening == 3  # two more started at once
    reconfigure(a, max_concurrency=1)
    for _, s in opens(a):
        gates[s].set()
    await idle()
    assert a.host.opening == 1  # the three ran out; one more started, not three
    for g in gates.values():
        g.set()
    await asyncio.sleep(1)
    assert a.opened() == set(range(6)) and a.host.max_opening == 3
    assert closes(a) == []
    await a.stop()


@virtual
async def test_node_mode_keeps_the_epochs_ttl_and_pace_and_closes_nothing() -> None:
    backend = MemoryBackend()
    a, b = pair(backend, 8, renewal="node")  # ttl 15, interval 5, margin 2.5
    a.start()
    await asyncio.sleep(0.5)
    b.start()
    await asyncio.sleep(32)
    held = {n.name: n.opened() for n in (a, b)}
    assert len(held["a"]) == len(held["b"]) == 4
    t0 = now()
    # A margin the epoch's TTL (15 s) cannot hold at its pace (5 s) is refused.
    with pytest.raises(ConfigError, match="epoch keeps its lease TTL"):
        reconfigure(a, lease_ttl=45.0, interval=5.0, margin=10.0)
    for n in (a, b):
        with pytest.raises(ConfigError, match="renewal cannot change in place"):
            n.loop.reconfigure(changed(n, renewal="shard"))
        reconfigure(n, lease_ttl=45.0, max_concurrency=4)  # interval 15, margin 7.5
    await asyncio.sleep(60)
    for n in (a, b):
        assert n.opened() == held[n.name]
        assert closes(n, t0) == [] and opens(n, t0) == []
        assert n.of(Lost) == [] and n.of(SelfFence) == [] and n.of(Release) == []
        # The epoch keeps its TTL of 15 s, so its writes keep the pace of 5 s.
        beats = [t for t, m in n.store.calls if m == "update_epoch" and t >= t0 + 5]
        assert gaps(beats) == {5.0}
        # Rounds take the new pace.
        assert gaps([t - ev.duration for t, ev in n.of(Round) if t >= t0 + 15]) == {15.0}
    assert {getattr(lease(backend, s), "ttl", None) for s in range(8)} == {15.0}
    await a.stop()
    await b.stop()

