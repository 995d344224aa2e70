"""Properties of the engine under the ordinary faults of issue #8: slow store
calls, throttling (503-like failures), a host refusing a shard, and a
simultaneous start. Random seeds and sizes; every invariant of
shardlease.sim.check must hold as well."""

from __future__ import annotations

import math

import pytest
from hypothesis import HealthCheck, example, given, note, settings
from hypothesis import strategies as st

from shardlease import keeper
from shardlease.loop import preference
from shardlease.sim import (
    LEASE_WRITES,
    STORE_CALLS,
    HostFault,
    Join,
    ScenarioResult,
    StoreFault,
    run_scenario,
)

TTL, INTERVAL = 15.0, 5.0
SETTINGS = settings(deadline=None, suppress_health_check=[HealthCheck.too_slow],
                    print_blob=True)
seeds = st.integers(0, 2**32 - 1)


def ok(result: ScenarioResult) -> ScenarioResult:
    assert result.violations == [], "\n".join(result.violations)
    return result


def fences(result: ScenarioResult, node: str | None = None) -> list[str]:
    return [f"{ev.t:.3f} {ev.node} shard {ev.shard}" for ev in result.trace
            if ev.kind == "self_fence" and node in (None, ev.node)]


@settings(SETTINGS, max_examples=25)
@given(nodes=st.integers(1, 4), shards=st.integers(1, 32), seed=seeds,
       node=st.sampled_from([None, "n0"]), latency=st.sampled_from([4.0, 8.0, 15.0]),
       jitter=st.sampled_from([0.0, 5.0]))
def test_slow_calls_other_than_lease_writes_never_fence(
        nodes: int, shards: int, seed: int, node: str | None, latency: float,
        jitter: float) -> None:
    # Heartbeat PUTs, LISTs and GETs up to 3 intervals late; lease writes healthy.
    fault = StoreFault(30, 90, node=node, latency=latency, jitter=jitter,
                       calls=STORE_CALLS - LEASE_WRITES)
    r = ok(run_scenario(nodes=nodes, shards=shards, seed=seed, faults=[fault]))
    assert fences(r) == []
    assert r.counts.get("lost", 0) == 0


def kept_its_share(r: ScenarioResult, node: str, at: float, until: float) -> None:
    """`node` had its fair share open when the fault began, and closed nothing
    (no fence, no loss, no release) until it ended."""
    share = math.ceil(r.shards / r.nodes)
    opened: dict[int, int] = {}
    for ev in r.trace:
        if ev.t >= at:
            break
        if ev.node == node and ev.kind == "open_ok":
            opened[ev.shard] = ev.generation
        elif ev.node == node and ev.kind == "close_ok":
            opened.pop(ev.shard, None)
    least = r.shards - (r.nodes - 1) * share  # what is left when the others hold a share each
    assert len(opened) >= max(1, least), (node, sorted(opened), share)
    closes = [f"{ev.t:.3f} shard {ev.shard}" for ev in r.trace
              if ev.node == node and ev.kind == "close_call" and at <= ev.t < until]
    assert closes == [], closes
    assert fences(r, node) == []


@settings(SETTINGS, max_examples=12)
@given(shards=st.integers(6, 32), seed=seeds)
def test_a_node_whose_every_call_takes_three_tenths_of_a_ttl_keeps_its_share(
        shards: int, seed: int) -> None:
    at, until = 40.0, 110.0
    r = ok(run_scenario(nodes=3, shards=shards, seed=seed, faults=[
        StoreFault(at, until, node="n1", latency=0.3 * TTL)]))
    note(r.format_trace({"self_fence", "close_call", "renew_failed", "renew_slow"}))
    kept_its_share(r, "n1", at, until)


@settings(SETTINGS, max_examples=12)
@given(shards=st.integers(6, 32), seed=seeds)
# Found by a property run: retries doubling up to the deadline left too few
# attempts, and 30% failures fenced a shard of the slowed node.
@example(shards=19, seed=1253)
def test_a_node_with_three_in_ten_calls_failing_keeps_its_share(shards: int, seed: int) -> None:
    at, until = 40.0, 110.0
    r = ok(run_scenario(nodes=3, shards=shards, seed=seed, faults=[
        StoreFault(at, until, node="n1", error_rate=0.3)]))
    note(r.format_trace({"self_fence", "close_call", "renew_failed", "renew_slow"}))
    kept_its_share(r, "n1", at, until)


@settings(SETTINGS, max_examples=12)
@given(shards=st.integers(12, 32), seed=seeds, joins=st.floats(40.0, 46.0))
# Found by hand first (tests/process/test_slow_store.py on a loaded machine:
# a claim answered 0.77 s after it was sent, at TTL 3, fenced at its first
# renewal), then here: the renewals ran every interval start to start, so a
# claim that landed just after a batch began waited an interval more, and
# its first renewal was sent up to answer + interval after the claim was:
# at a latency over (TTL - margin - interval) / 2 it could not land in time.
@example(shards=16, seed=9, joins=43.33)
# And with the first renewal apart from the batch, the second: the batch
# that began while it was in flight left it out, and the next was too late.
@example(shards=12, seed=1153616, joins=41.325682320458974)
def test_a_node_that_joins_while_its_calls_take_a_quarter_to_a_third_of_a_ttl_keeps_its_claims(
        shards: int, seed: int, joins: float) -> None:
    at, until = 40.0, 160.0
    r = ok(run_scenario(nodes=3, shards=shards, seed=seed, faults=[
        Join(joins, "n3"),
        StoreFault(at, until, node="n3", latency=0.25 * TTL, jitter=0.1 * TTL)]))
    note(r.format_trace({"claim", "self_fence", "renew_failed", "renew_slow"}))
    assert fences(r, "n3") == []
    # It claimed at least what the three others leave at a share each.
    claims = [ev for ev in r.trace if ev.node == "n3" and ev.kind == "claim" and ev.t < until]
    assert len(claims) >= max(1, shards - 3 * math.ceil(shards / 4)), claims


def test_the_slow_claim_property_catches_the_claim_left_to_the_batch(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """The judge shown to fail: with every claim left to the batch (the code
    before `Keeper.claimed`), its first example fences, as it did then."""
    monkeypatch.setattr(keeper.Keeper, "claimed", lambda self, shard, sent: None)
    r = run_scenario(nodes=3, shards=16, seed=9, faults=[
        Join(43.33, "n3"), StoreFault(40.0, 160.0, node="n3", latency=0.25 * TTL,
                                      jitter=0.1 * TTL)])
    assert fences(r, "n3") != []


#: Rounds until a shard one host refuses is open on another node.
REFUSED_BOUND_ROUNDS = 12
#: Store requests per interval above a fault-free run's, on any node.
EXTRA_REQUESTS_PER_INTERVAL = 3.0


def requests_per_interval(r: ScenarioResult, node: str, t0: float, t1: float) -> float:
    return r.requests_between(node, t0, t1) / ((t1 - t0) / r.interval)


@settings(SETTINGS, max_examples=12)
@given(nodes=st.integers(2, 4), shards=st.integers(2, 16), seed=seeds)
def test_a_shard_one_host_refuses_opens_elsewhere_without_a_hot_loop(
        nodes: int, shards: int, seed: int) -> None:
    refused = max(range(shards), key=lambda s: preference("n1", s))  # n1 wants it most
    until = 150.0
    # Calls take 10 ms: a loop that spins without backoff still lets time pass.
    store = StoreFault(0, until, latency=0.01)
    faults = [HostFault(0, until, node="n1", refuse=frozenset({refused})), store]
    r = ok(run_scenario(nodes=nodes, shards=shards, seed=seed, faults=faults))
    clean = ok(run_scenario(nodes=nodes, shards=shards, seed=seed, faults=[store]))
    since = r.open_for_good(refused, until, besides="n1")
    assert since is not None, "the refused shard is not open on any other node"
    rounds = math.ceil(since / INTERVAL)
    note(f"open elsewhere for good from {since:.3f}: round {rounds}")
    assert rounds <= REFUSED_BOUND_ROUNDS
    for k in range(nodes):
        name = f"n{k}"
        faulty = requests_per_interval(r, name, INTERVAL, until)
        normal = requests_per_interval(clean, name, INTERVAL, until)
        note(f"{name}: {faulty:.2f} requests per interval (fault-free: {normal:.2f})")
        assert faulty <= normal + EXTRA_REQUESTS_PER_INTERVAL, name
        in_window = [ev.t for ev in r.trace if ev.node == name and ev.kind == "round"
                     and ev.t < until]
        assert len(in_window) <= until / INTERVAL + 1, (name, len(in_window))


@settings(SETTINGS, max_examples=20)
@given(nodes=st.integers(2, 6), shards=st.integers(1, 64), seed=seeds)
def test_nodes_started_together_move_no_shard(nodes: int, shards: int, seed: int) -> None:
    r = ok(run_scenario(nodes=nodes, shards=shards, seed=seed))
    end = next(ev.t for ev in r.trace if ev.kind == "quiescent")
    moves = [f"{ev.t:.3f} {ev.node} shard {ev.shard}" for ev in r.trace
             if ev.kind == "close_call" and ev.t < end]
    assert moves == []
    assert r.claims == shards


@settings(SETTINGS, max_examples=12)
@given(shards=st.integers(6, 32), seed=seeds, hot=st.integers(0, 5))
def test_a_shard_whose_lease_writes_hang_fences_no_other_shard(
        shards: int, seed: int, hot: int) -> None:
    # A hot key of the store: every write of one shard's lease hangs past any
    # budget (its owner fences it, as it must), while n1's other lease writes
    # take 0.3 x TTL, which alone costs it nothing (the test above). The
    # renewals of a node run as one batch, so the hung one holds up the next
    # renewal of every other shard of n1: it must still come in time.
    at, until = 40.0, 110.0
    r = ok(run_scenario(nodes=3, shards=shards, seed=seed, faults=[
        StoreFault(at, until, latency=2 * TTL, calls=LEASE_WRITES, shards=frozenset({hot})),
        StoreFault(at, until, node="n1", latency=0.3 * TTL)]))
    note(r.format_trace({"self_fence", "close_call", "renew_failed", "renew_slow"}))
    others = [f for f in fences(r) if not f.endswith(f" shard {hot}")]
    assert others == [], others
    assert r.counts.get("lost", 0) == 0
