"""`max_moves_per_round` in the simulation: a scale change spread over
rounds. Every invariant of shardlease.sim.check holds (the placement still
balances at quiescence); no node releases more than the cap above its share
in one round."""

from __future__ import annotations

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from shardlease.records import Renewal
from shardlease.sim import Join, Reconfigure, run_scenario

SETTINGS = settings(deadline=None, suppress_health_check=[HealthCheck.too_slow],
                    print_blob=True, max_examples=10)


@settings(SETTINGS)
@given(shards=st.integers(8, 48), joiners=st.integers(1, 4), cap=st.integers(1, 3),
       seed=st.integers(0, 2**32 - 1), renewal=st.sampled_from(["shard", "node"]))
def test_nodes_joining_one_node_take_their_share_a_few_shards_a_round(
        shards: int, joiners: int, cap: int, seed: int, renewal: Renewal) -> None:
    faults = [Reconfigure(1.0, None, (("max_moves_per_round", cap),)),
              *(Join(60.0, f"j{k}") for k in range(joiners))]
    r = run_scenario(nodes=1, shards=shards, seed=seed, renewal=renewal, faults=faults)
    assert r.violations == [], "\n".join(r.violations)
    released = 0
    most = 0
    for ev in r.trace:
        if ev.kind == "quiescent":
            break  # (then every node stops: a stop gives everything up at once)
        if ev.node != "n0":
            continue
        if ev.kind == "release":
            released += 1
        elif ev.kind == "round":
            most, released = max(most, released), 0
    assert 1 <= most <= cap, most
