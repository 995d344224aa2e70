"""The invariant checks catch what they are meant to: synthetic traces."""

from __future__ import annotations

from shardlease.records import Lease
from shardlease.sim.check import (
    check_deadlines,
    check_exclusive,
    check_generations,
    check_host_order,
    check_quiescence,
    intervals,
    recoveries,
)
from shardlease.sim.world import Snapshot, TraceEvent


def ev(t: float, node: str, kind: str, shard: int = -1, gen: int = -1, value: float = 0.0,
       detail: str = "") -> TraceEvent:
    return TraceEvent(t, node, kind, shard, gen, value, detail)


def owned(node: str, shard: int, gen: int, t0: float, deadline: float,
          close_at: float | None = None) -> list[TraceEvent]:
    """A claim, an open, and (optionally) a close of one shard on one node."""
    out = [ev(t0, node, "deadline", shard, gen, deadline, "claim"),
           ev(t0, node, "open_call", shard, gen), ev(t0, node, "open_ok", shard, gen)]
    if close_at is not None:
        out += [ev(close_at, node, "close_call", shard), ev(close_at, node, "close_ok", shard)]
    return out


def by_time(*parts: list[TraceEvent]) -> list[TraceEvent]:
    return sorted((e for p in parts for e in p), key=lambda e: e.t)


def test_a_clean_handover_passes() -> None:
    trace = by_time(owned("a", 0, 1, 0.0, 12.5, close_at=10.0), owned("b", 0, 2, 11.0, 30.0))
    assert check_exclusive(trace) == []
    assert check_generations(trace) == []
    assert check_deadlines(trace) == []
    assert check_host_order(trace) == []


def test_two_open_owners_before_the_deadline_are_caught() -> None:
    trace = by_time(owned("a", 0, 1, 0.0, 12.5, close_at=20.0), owned("b", 0, 2, 11.0, 30.0))
    problems = check_exclusive(trace)
    assert len(problems) == 1 and problems[0].startswith("(a) shard 0")


def test_an_overlap_after_the_older_deadline_is_allowed_but_a_late_renewal_is_not() -> None:
    # a is paused: its close comes late, but its deadline (12.5) had passed
    # when b opened at 16.
    trace = by_time(owned("a", 0, 1, 0.0, 12.5, close_at=40.0), owned("b", 0, 2, 16.0, 30.0),
                    [ev(1.0, "a", "pause", value=40.0)])
    assert check_exclusive(trace) == []
    # A renewal moving a's deadline past b's open during the overlap is caught.
    late = [*trace, ev(17.0, "a", "deadline", 0, -1, 29.0, "renew")]
    late.sort(key=lambda e: e.t)
    assert check_exclusive(late) != []


def test_generations_going_back_are_caught() -> None:
    trace = by_time(owned("a", 0, 2, 0.0, 12.5, close_at=5.0), owned("b", 0, 2, 6.0, 20.0))
    assert check_generations(trace)[0].startswith("(b) shard 0")


def test_a_refused_ask_after_a_lost_generation_is_no_violation_even_past_a_slow_open() -> None:
    # a's open of 1 was asked before the record was deleted (at 1.0) and
    # ended after it: the record still showed 1 when it was asked. b, who
    # never saw it, asks 1 again: the application refuses it, which is the
    # design (explorer seed 1302957853 took it for a generation going back).
    slow = [ev(0.0, "a", "deadline", 0, 1, 5.0, "claim"), ev(0.0, "a", "open_call", 0, 1),
            ev(1.0, "*", "corrupted", 0, -1, detail="deleted"), ev(2.0, "a", "open_ok", 0, 1),
            ev(30.0, "b", "open_call", 0, 1), ev(30.0, "b", "open_err", 0, 1, 1.0, "outdated")]
    assert check_generations(slow) == []
    # Opened by the application, it is one.
    opened = [*slow[:5], ev(30.0, "b", "open_ok", 0, 1)]
    assert check_generations(opened)[0].startswith("(b) shard 0")
    # An open asked after the loss ends it: the next ask must be above.
    after = [*owned("a", 0, 1, 0.0, 5.0), ev(1.0, "*", "corrupted", 0, -1, detail="deleted"),
             *owned("c", 0, 2, 3.0, 9.0), ev(30.0, "b", "open_call", 0, 1),
             ev(30.0, "b", "open_err", 0, 1, 2.0, "outdated")]
    assert check_generations(after)[0].startswith("(b) shard 0")
    # An ask of 2 that never reached the application (cancelled on its way:
    # a slow open fenced) is not what a later ask of 2 must be above, once
    # the record is gone (explorer seed 2856617557); one it opened is.
    cancelled = [*owned("a", 0, 1, 0.0, 5.0), ev(6.0, "b", "open_call", 0, 2),
                 ev(7.0, "*", "corrupted", 0, -1, detail="deleted"),
                 ev(9.0, "b", "open_cancel", 0, 2), *owned("c", 0, 2, 30.0, 40.0)]
    assert check_generations(cancelled) == []
    reached = [*cancelled[:4], ev(8.0, "b", "open_ok", 0, 2), *owned("c", 0, 2, 30.0, 40.0)]
    assert check_generations(reached)[0].startswith("(b) shard 0")


def test_an_open_asked_after_the_loss_on_a_claim_from_before_leaves_it_lost() -> None:
    # a claimed 2 before the record was deleted (at 1.0), and its open, queued
    # behind a slow one, was asked only after: the record never showed 2
    # again. j, which never saw it, asks 1: the application refuses it, as
    # designed (explorer seed 2438274690 took it for a generation going back).
    queued = [*owned("z", 0, 1, -5.0, 0.0, close_at=-1.0),
              ev(0.0, "a", "deadline", 0, 2, 5.0, "claim"),
              ev(1.0, "*", "corrupted", 0, -1, detail="deleted"),
              ev(2.0, "a", "open_call", 0, 2), ev(3.0, "a", "open_ok", 0, 2),
              ev(30.0, "j", "open_call", 0, 1), ev(30.0, "j", "open_err", 0, 1, 2.0, "outdated")]
    assert check_generations(queued) == []
    # Opened by the application, it is one.
    accepted = [*queued[:-1], ev(30.0, "j", "open_ok", 0, 1)]
    assert check_generations(accepted)[0].startswith("(b) shard 0")
    # And a claim written after the loss puts the generation back in the record.
    claimed = [*queued[:7], ev(1.5, "a", "deadline", 0, 2, 5.0, "claim"), *queued[7:]]
    assert check_generations(claimed)[0].startswith("(b) shard 0")


def test_an_open_completing_after_its_deadline_is_caught() -> None:
    trace = [ev(0.0, "a", "deadline", 0, 1, 5.0), ev(0.0, "a", "open_call", 0, 1),
             ev(6.0, "a", "open_ok", 0, 1)]
    assert check_deadlines(trace)[0].startswith("(e)")


def test_a_close_starting_after_the_deadline_is_caught_unless_paused_or_failing() -> None:
    trace = owned("a", 0, 1, 0.0, 5.0, close_at=6.0)
    assert check_deadlines(trace)[0].startswith("(f)")
    assert check_deadlines([ev(0.0, "a", "pause", value=9.0), *trace]) == []


def test_host_order_violations_are_caught() -> None:
    twice = [ev(0, "a", "open_call", 0, 1), ev(0, "a", "open_ok", 0, 1),
             ev(1, "a", "open_call", 0, 2)]
    assert "without a close" in check_host_order(twice)[0]
    during = [ev(0, "a", "open_call", 0, 1), ev(0.5, "a", "close_call", 0)]
    assert "while its open is running" in check_host_order(during)[0]
    abandoned = [ev(0, "a", "open_call", 0, 1), ev(0, "a", "open_ok", 0, 1),
                 ev(3, "a", "abandoned", 0, 1, detail="release")]
    assert check_host_order(abandoned) != []
    fenced = [*abandoned[:2], ev(3, "a", "abandoned", 0, 1, detail="fenced")]
    assert check_host_order(fenced) == []
    aborted = [*abandoned[:2], ev(3, "a", "abandoned", 0, 1, detail="aborted")]
    assert check_host_order(aborted) == []


def test_intervals_end_at_the_successful_close_or_the_crash() -> None:
    trace = [*owned("a", 0, 1, 0.0, 50.0),
             ev(2.0, "a", "close_call", 0), ev(2.5, "a", "close_err", 0),
             ev(3.0, "a", "close_call", 0), ev(3.5, "a", "close_ok", 0),
             *owned("a", 1, 1, 4.0, 50.0), ev(9.0, "a", "crash", detail="1")]
    (first, second) = intervals(trace)
    assert (first.end_t, first.ended_by) == (3.0, "close")
    assert (second.end_t, second.ended_by) == (9.0, "crash")


def lease(shard: int, owner: str | None, gen: int, inc: str) -> Lease:
    return Lease(cluster="sim", shard=shard, owner=owner, generation=gen, incarnation=inc,
                 write_id="w", ttl=15.0)


def snapshot(**changes: object) -> Snapshot:
    base = Snapshot(
        t=100.0, live={"a": "a", "b": "b"}, incarnations={"a": "ia", "b": "ib"},
        open={"a": {0: 1}, "b": {1: 3}}, held={"a": {0}, "b": {1}},
        leases={0: lease(0, "a", 1, "ia"), 1: lease(1, "b", 3, "ib")},
        lookups={"a": {0: "a", 1: "b"}, "b": {0: "a", 1: "b"}})
    for k, v in changes.items():
        setattr(base, k, v)
    return base


def test_quiescence_accepts_a_balanced_placement() -> None:
    assert check_quiescence(snapshot(), shards=2) == []


def test_quiescence_catches_each_kind_of_imbalance() -> None:
    assert "open on ['a', 'b']" in check_quiescence(
        snapshot(open={"a": {0: 1, 1: 3}, "b": {1: 3}}, held={"a": {0, 1}, "b": {1}}), 2)[0]
    assert "no live node" in check_quiescence(
        snapshot(open={"a": {0: 1}, "b": {}}, held={"a": {0}, "b": set()}), 2)[0]
    assert "but its lease is" in check_quiescence(
        snapshot(leases={0: lease(0, "a", 2, "ia"), 1: lease(1, "b", 3, "ib")}), 2)[0]
    assert "routes shard 1 to None" in check_quiescence(
        snapshot(lookups={"a": {0: "a", 1: None}, "b": {0: "a", 1: "b"}}), 2)[0]
    over = check_quiescence(snapshot(
        live={"a": "a"}, incarnations={"a": "ia"}, open={"a": {0: 1, 1: 3}},
        held={"a": {0}}, leases={0: lease(0, "a", 1, "ia"), 1: lease(1, "a", 3, "ia")},
        lookups={"a": {0: "a", 1: "a"}}), 3)
    assert any("holds leases [0] but has [0, 1] open" in p for p in over)
    assert any("shard 2 is open on no live node" in p for p in over)


def test_recovery_time_is_until_the_last_shard_reopens_elsewhere() -> None:
    trace = [ev(10.0, "a", "crash", detail="0,1"), ev(12.0, "a", "open_ok", 0, 2),
             ev(30.0, "b", "open_ok", 0, 2), ev(31.0, "b", "open_ok", 1, 2)]
    (r,) = recoveries(trace)
    assert (r.node, r.shards, r.seconds) == ("a", (0, 1), 21.0)
    (never,) = recoveries(trace[:3])
    assert never.seconds is None


def test_an_unreported_fence_and_a_free_before_the_close_are_caught() -> None:
    from shardlease.sim.check import check_release_and_fence

    fine = [*owned("a", 0, 1, 0.0, 5.0), ev(5.0, "a", "self_fence", 0),
            ev(5.0, "a", "close_call", 0), ev(5.0, "a", "close_ok", 0),
            ev(5.0, "a", "closed", 0, detail="fenced"), ev(5.5, "a", "release", 0)]
    assert check_release_and_fence(fine) == []
    silent = [e for e in fine if e.kind != "self_fence"]
    assert check_release_and_fence(silent)[0].startswith("(i)")
    early = [*owned("a", 0, 1, 0.0, 50.0), ev(4.0, "a", "release", 0),
             ev(5.0, "a", "close_call", 0), ev(5.0, "a", "close_ok", 0)]
    assert check_release_and_fence(early)[0].startswith("(j)")


def test_a_lease_freed_beside_a_host_that_may_still_have_the_shard_open_is_caught() -> None:
    from shardlease.sim.check import check_release_and_fence

    # The host still has shard 0 open (its close failed: abandoned after a
    # fence, or cut short by an abort), and the lease expires at 7.5 in the
    # node's eyes: a free before then lets a peer open it beside that host.
    for why in ("fenced", "aborted"):
        gave_up = [*owned("a", 0, 1, 0.0, 5.0),
                   ev(5.5, "a", "abandoned", 0, 1, value=7.5, detail=why)]
        early = [*gave_up, ev(6.0, "a", "release", 0)]
        assert check_release_and_fence(early)[0].startswith("(j)"), why
        assert "before its expiry at 7.500" in check_release_and_fence(early)[0]
        assert check_release_and_fence([*gave_up, ev(7.5, "a", "release", 0)]) == []
    # An abort frees what it never closed: caught before the abandonment is.
    unclosed = [*owned("a", 0, 1, 0.0, 50.0), ev(3.0, "a", "abort", detail="loop"),
                ev(3.1, "a", "release", 0),
                ev(3.2, "a", "abandoned", 0, 1, value=52.5, detail="aborted")]
    assert check_release_and_fence(unclosed)[0].startswith("(j)")


def test_a_fence_without_a_warning_since_the_last_deadline_is_caught() -> None:
    from shardlease.sim.check import check_announced

    warned = [*owned("a", 0, 1, 0.0, 5.0), ev(2.5, "a", "renew_slow", 0, value=2.5),
              ev(5.0, "a", "self_fence", 0)]
    assert check_announced(warned) == []
    silent = [e for e in warned if e.kind != "renew_slow"]
    assert check_announced(silent)[0].startswith("(k)")
    # A warning before a renewal that moved the deadline does not announce a later fence.
    stale = [*owned("a", 0, 1, 0.0, 5.0), ev(2.5, "a", "renew_slow", 0, value=2.5),
             ev(3.0, "a", "deadline", 0, -1, 8.0, "renew"), ev(8.0, "a", "self_fence", 0)]
    assert check_announced(stale)[0].startswith("(k)")


def test_a_fenced_shard_still_closing_when_its_lease_can_be_taken_is_caught() -> None:
    from shardlease.sim.check import check_fenced_closes

    fenced = [*owned("a", 0, 1, 0.0, 5.0), ev(5.0, "a", "self_fence", 0),
              ev(5.0, "a", "close_call", 0)]
    in_time = [*fenced, ev(7.5, "a", "close_cancel", 0), ev(7.5, "a", "closed", 0,
                                                             detail="fenced")]
    assert check_fenced_closes(in_time, margin=2.5) == []
    late = [*fenced, ev(45.0, "a", "close_ok", 0), ev(45.0, "a", "closed", 0,
                                                         detail="fenced")]
    assert check_fenced_closes(late, margin=2.5)[0].startswith("(l)")


def test_a_shard_open_nowhere_while_a_node_works_is_caught_after_the_bound() -> None:
    from shardlease.sim.check import check_open_somewhere, open_nowhere

    # a opens shard 0 at 1, closes it at 10; b (working throughout) opens it at 40.
    trace = by_time([ev(0.0, "a", "start"), ev(0.0, "b", "start")],
                    owned("a", 0, 1, 1.0, 50.0, close_at=10.0), owned("b", 0, 2, 40.0, 90.0))
    assert open_nowhere(trace, 1, until=100.0) == {0: [(0.0, 1.0), (10.0, 40.0)]}
    assert check_open_somewhere(trace, 1, [], until=100.0, bound=30.0) == []
    (late,) = check_open_somewhere(trace, 1, [], until=100.0, bound=20.0)
    assert late.startswith("(m) shard 0: open on no node from 10.000 to 40.000, 30.0s")
    # Never reopened: open nowhere until the end of the time checked.
    assert "(still at quiescence)" in check_open_somewhere(
        [e for e in trace if e.node != "b" or e.kind == "start"], 1, [], 100.0, 30.0)[0]


def test_a_shard_open_nowhere_is_excused_while_no_node_works() -> None:
    from shardlease.sim import HostFault, StoreFault
    from shardlease.sim.check import check_open_somewhere, stretches

    trace = by_time([ev(0.0, "a", "start"), ev(0.0, "b", "start")],
                    owned("a", 0, 1, 1.0, 50.0, close_at=10.0), owned("b", 0, 2, 70.0, 90.0))
    # b's lease writes fail until 50, a's store is slow, then a leaves at 15:
    # some node works only in [0, 5) and from 50 (20 s before the open).
    faults = [StoreFault(5.0, 50.0, node="b", error_rate=1.0, calls=frozenset({"create_lease"})),
              StoreFault(5.0, 30.0, node="a", latency=1.0)]
    left = [*trace, ev(15.0, "a", "leave")]
    assert check_open_somewhere(left, 1, faults, until=100.0, bound=25.0) == []
    assert [(st.start, st.end, st.seconds, st.workers) for st in stretches(
        left, 1, faults, 100.0)][:2] == [(10.0, 70.0, 20.0, ("b",)), (0.0, 1.0, 1.0, ("a", "b"))]
    # A pause or a host fault is no working node either.
    paused = by_time(trace, [ev(12.0, "a", "pause", value=60.0)])
    assert check_open_somewhere(paused, 1, faults[:1], until=100.0, bound=25.0) == []
    assert check_open_somewhere(paused, 1, [], until=100.0, bound=25.0) != []
    refusing = [HostFault(10.0, 60.0, node=None, refuse=frozenset({0}))]
    assert check_open_somewhere(trace, 1, refusing, until=100.0, bound=25.0) == []
    assert check_open_somewhere(trace, 1, [], until=100.0, bound=25.0) != []


def test_a_fence_needs_a_cause_on_its_node_and_lease_within_the_window() -> None:
    from shardlease.sim.check import check_fences_caused
    from shardlease.sim.faults import Corrupt, HostFault, Pause, StoreFault

    ttl, interval = 15.0, 5.0  # the window: 25 s before the fence
    fence = [ev(100.0, "n1#1", "self_fence", 2)]
    table: list[tuple[str, list[TraceEvent], list[object], bool]] = [
        ("nothing", [], [], False),
        ("its node's calls failing", [], [StoreFault(80.0, 90.0, node="n1", error_rate=1.0)],
         True),
        ("every node's calls slow", [], [StoreFault(90.0, 95.0, latency=3.0)], True),
        ("its own lease a hot key", [],
         [StoreFault(80.0, 90.0, shards=frozenset({2, 5}), latency=30.0)], True),
        ("another lease a hot key", [],
         [StoreFault(80.0, 90.0, shards=frozenset({0, 1}), latency=30.0)], False),
        ("another node's calls failing", [], [StoreFault(80.0, 99.0, node="n2", error_rate=1.0)],
         False),
        ("a fault over before the window", [], [StoreFault(10.0, 70.0, node="n1",
                                                           error_rate=1.0)], False),
        # A slow call started before `until` ends up to its latency later.
        ("a slow call still in flight", [], [StoreFault(60.0, 70.0, latency=6.0)], True),
        ("its host slow", [], [HostFault(85.0, 88.0, node="n1", close_latency=1.0)], True),
        ("its record corrupted", [], [Corrupt(90.0, 2)], True),
        ("another record corrupted", [], [Corrupt(90.0, 3)], False),
        ("its node paused", [ev(78.0, "n1#1", "pause", value=80.0)], [Pause(78.0, "n1", 2.0)],
         True),
        ("another incarnation paused", [ev(90.0, "n1", "pause", value=95.0)], [], False),
        ("options changed", [ev(99.0, "n3", "reconfigure")], [], True),
    ]
    for name, events, faults, excused in table:
        found = check_fences_caused(by_time(events, fence), faults,  # type: ignore[arg-type]
                                    ttl, interval)
        assert (found == []) is excused, (name, found)
        if not excused:
            assert found[0].startswith("(o) n1#1 shard 2: self-fenced at 100.000"), found
