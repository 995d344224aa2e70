"""A rolling restart under `handoff: move` in the simulation: each node in
turn, highest ordinal first (a StatefulSet's RollingUpdate), stops
gracefully and starts again once the shards have settled. Properties over
random sizes and seeds, both renewal modes, with every invariant of
shardlease.sim.check:

- it costs at most 2 x shards moves: each stop moves the stopping node's
  shards, each start moves as many back, and no shard moves more (no
  placement within the fair share can do better: tests/test_rollout_bound.py);
- every shard ends where it was before the rollout: a node above its share
  gives back the shards it took last (the ones it took while their node was
  away), so a node back from a restart gets its own shards back, with their
  caches or data on the pod's volume, instead of some peer's.
"""

from __future__ import annotations

from hypothesis import HealthCheck, given, note, settings
from hypothesis import strategies as st

from shardlease.records import Renewal
from shardlease.sim import Fault, Join, Leave, ScenarioResult, run_scenario

TTL, INTERVAL = 15.0, 5.0
START = 60.0
#: Between a stop and the start that follows, and between a start and the
#: next stop: time for the shards to settle (the StatefulSet controller waits
#: for the new pod to be Ready; the shards may take a few rounds more).
GAP = 6 * INTERVAL
SETTINGS = settings(deadline=None, suppress_health_check=[HealthCheck.too_slow],
                    print_blob=True, max_examples=16)


def rollout(nodes: int) -> list[Fault]:
    faults: list[Fault] = []
    t = START
    for i in reversed(range(nodes)):
        faults += [Leave(t, f"n{i}"), Join(t + GAP, f"n{i}")]
        t += 2 * GAP
    return faults


def open_at(r: ScenarioResult, t: float) -> dict[int, str]:
    """shard -> the node that had it open at `t` (by name: "n1#1", the
    second incarnation of n1, is n1)."""
    owner: dict[int, str] = {}
    for ev in r.trace:
        if ev.t > t:
            break
        if ev.kind == "opened":
            owner[ev.shard] = name(ev.node)
        elif ev.kind == "closed" and owner.get(ev.shard) == name(ev.node):
            del owner[ev.shard]
    return owner


def name(node: str) -> str:
    return node.partition("#")[0]


def moves_after(r: ScenarioResult, t: float) -> int:
    """Opens after `t` by a node other than the shard's last opener."""
    last: dict[int, str] = {}
    moves = 0
    for ev in r.trace:
        if ev.kind != "opened":
            continue
        if ev.t > t and last.get(ev.shard) not in (None, name(ev.node)):
            moves += 1
        last[ev.shard] = name(ev.node)
    return moves


@settings(SETTINGS)
@given(nodes=st.integers(2, 4), per_node=st.integers(1, 6), seed=st.integers(0, 2**32 - 1),
       renewal=st.sampled_from(["shard", "node"]))
def test_a_rolling_restart_moves_each_shard_out_and_back_home(
        nodes: int, per_node: int, seed: int, renewal: Renewal) -> None:
    shards = nodes * per_node
    faults = rollout(nodes)
    # (the last start, a gap: the scenario then stops every node)
    end = START + 2 * GAP * nodes - 1
    r = run_scenario(nodes=nodes, shards=shards, seed=seed, lease_ttl=TTL, renewal=renewal,
                     faults=faults, settle=2 * GAP)
    assert r.violations == [], "\n".join(r.violations)
    before, after = open_at(r, START - 1), open_at(r, end)
    note(f"before {before}\nafter {after}")
    assert len(before) == shards, before
    moves = moves_after(r, START)
    assert moves <= 2 * shards, f"{moves} moves for {shards} shards"
    assert after == before, {s: (before.get(s), after.get(s)) for s in range(shards)
                             if before.get(s) != after.get(s)}
