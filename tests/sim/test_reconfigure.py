"""Properties of `PlacementLoop.reconfigure` in the simulation: the lease TTL,
the interval and the margin changed while shards are held, up and down, on
each node at a different moment (as agents see a ShardSet change), with and
without a store that loses the answers of lease writes. Every invariant of
shardlease.sim.check must hold (one owner at a time, as judged by the
deadlines each node actually had), and without faults nothing moves."""

from __future__ import annotations

from hypothesis import HealthCheck, given, note, settings
from hypothesis import strategies as st

from shardlease.records import Renewal
from shardlease.sim import Reconfigure, ScenarioResult, StoreFault, run_scenario

SETTINGS = settings(deadline=None, suppress_health_check=[HealthCheck.too_slow],
                    print_blob=True)
seeds = st.integers(0, 2**32 - 1)
#: (lease_ttl, interval, margin); None: the default share of the TTL.
CONFIGS = [(15.0, None, None), (45.0, None, None), (6.0, None, None), (30.0, 4.0, 2.0),
           (9.0, 2.0, 1.0), (60.0, 15.0, 20.0)]
FIRST = 60.0  # every node holds its share by then
EVERY = 60.0  # between two changes


def changes(nodes: int, plan: list[int], offsets: list[float]) -> list[Reconfigure]:
    """Each change of the plan reaches node k `offsets[k]` seconds late."""
    out = []
    for i, c in enumerate(plan):
        ttl, interval, margin = CONFIGS[c]
        for k in range(nodes):
            out.append(Reconfigure(FIRST + i * EVERY + offsets[k], f"n{k}",
                                   (("lease_ttl", ttl), ("interval", interval),
                                    ("margin", margin))))
    return out


def settle(plan: list[int]) -> float:
    ttl = max(CONFIGS[c][0] for c in [0, *plan])
    return 3 * ttl + 20


def ok(result: ScenarioResult) -> ScenarioResult:
    assert result.violations == [], "\n".join(result.violations)
    return result


def moves(result: ScenarioResult, since: float) -> list[str]:
    until = next(ev.t for ev in result.trace if ev.kind == "quiescent")
    return [f"{ev.t:.3f} {ev.node} {ev.kind} {ev.shard} {ev.detail}" for ev in result.trace
            if since <= ev.t < until
            and ev.kind in ("close_call", "open_call", "self_fence", "lost", "claim", "release")]


plans = st.lists(st.integers(0, len(CONFIGS) - 1), min_size=1, max_size=3)
offsets = st.lists(st.floats(0.0, 10.0), min_size=4, max_size=4)
renewals = st.sampled_from(["shard", "node"])


@settings(SETTINGS, max_examples=60)
@given(nodes=st.integers(1, 4), shards=st.integers(1, 24), seed=seeds, plan=plans,
       offsets=offsets, renewal=renewals)
def test_changing_ttl_interval_and_margin_moves_no_shard(
        nodes: int, shards: int, seed: int, plan: list[int], offsets: list[float],
        renewal: Renewal) -> None:
    note(f"plan {[CONFIGS[c] for c in plan]}")
    r = ok(run_scenario(nodes=nodes, shards=shards, seed=seed, renewal=renewal,
                        faults=changes(nodes, plan, offsets), settle=settle(plan)))
    assert moves(r, FIRST) == []


#: The configurations with a TTL shorter than the one they may follow.
SHORT = [i for i, c in enumerate(CONFIGS) if c[0] < 15.0]


@settings(SETTINGS, max_examples=60)
@given(nodes=st.integers(2, 3), shards=st.integers(2, 8), seed=seeds,
       plan=st.tuples(st.lists(st.integers(0, len(CONFIGS) - 1), max_size=2),
                      st.sampled_from(SHORT)).map(lambda p: [*p[0], p[1]]),
       offsets=offsets, lost=st.sampled_from([0.5, 1.0]), unread=st.sampled_from([0.5, 1.0]))
def test_changes_while_renewals_land_unheard_keep_one_owner(
        nodes: int, shards: int, seed: int, plan: list[int], offsets: list[float],
        lost: float, unread: float) -> None:
    """The hard case: n0's renewal that wrote a shorter TTL has landed, peers
    count that TTL from when they saw it, and n0 does not know it landed
    (the answer lost, and the read-back that would tell it failing too).
    Shard mode: in node mode an epoch keeps its TTL, so no renewal writes a
    shorter one."""
    note(f"plan {[CONFIGS[c] for c in plan]}")
    last = FIRST + (len(plan) - 1) * EVERY  # from the last change on (before it
    # n0 would most likely have been fenced already, as it should)
    faults = [StoreFault(last, last + EVERY, node="n0", lost_reply_rate=lost,
                         calls=frozenset({"update_lease"})),
              StoreFault(last, last + EVERY, node="n0", error_rate=unread,
                         calls=frozenset({"get_lease"}))]
    ok(run_scenario(nodes=nodes, shards=shards, seed=seed,
                    faults=[*faults, *changes(nodes, plan, offsets)], settle=settle(plan)))
