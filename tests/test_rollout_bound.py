"""The fewest moves a rolling restart under `handoff: move` can cost, by
exhaustive search over every placement: the bound docs/rollouts.md quotes,
against which the engine's rollout (tests/sim/test_rollout.py: at most
2 x shards moves) is judged.

The model: `pods` pods, `shards` shards, placed evenly; the pods restart one
at a time, highest ordinal first (a StatefulSet's RollingUpdate). Each
phase (a pod down, then back) ends in a placement where every shard is on a
live pod; a move is a shard whose pod changed from one phase's placement to
the next. With `share`, every phase's placement keeps each pod within the
fair share, ceil(shards / live pods), as the engine does; without it, only
the last placement must be fair (a pod may hold more in between).
"""

from __future__ import annotations

import math

import pytest


def fewest_moves(pods: int, shards: int, *, share: bool) -> int:
    """The minimum, over every sequence of placements, of the moves of a
    rollout (dynamic programming over the pods^shards placements)."""
    n = pods
    weight = [n ** i for i in range(shards)]
    states = n ** shards

    def pod_of(x: int, i: int) -> int:
        return (x // weight[i]) % n

    counts = []
    for x in range(states):
        c = [0] * n
        for i in range(shards):
            c[pod_of(x, i)] += 1
        counts.append(c)
    inf = math.inf
    cost = [inf] * states
    cost[sum((i % n) * weight[i] for i in range(shards))] = 0  # shard i on pod i mod n
    phases = [live for p in reversed(range(n))
              for live in (set(range(n)) - {p}, set(range(n)))]
    for k, live in enumerate(phases):
        # The cheapest way to reach each placement from the last phase's:
        # the Hamming distance, relaxed one shard (coordinate) at a time.
        for i in range(shards):
            relaxed = cost[:]
            for x in range(states):
                base = x - pod_of(x, i) * weight[i]
                best = min(cost[base + u * weight[i]] for u in range(n))
                relaxed[x] = min(relaxed[x], best + 1)
            cost = relaxed
        cap = math.ceil(shards / len(live))
        fair_needed = share or k == len(phases) - 1
        for x in range(states):
            c = counts[x]
            if any(c[q] for q in range(n) if q not in live) or (
                    fair_needed and max(c[q] for q in live) > cap):
                cost[x] = inf
    return int(min(cost))


@pytest.mark.parametrize(("pods", "shards"), [(2, 4), (2, 6), (3, 3), (3, 6), (4, 4)])
def test_within_the_share_a_rollout_costs_two_moves_per_shard(pods: int, shards: int) -> None:
    # Every stop moves the stopping pod's shards away and every start moves
    # as many back: no choice of which shards go where does better.
    assert fewest_moves(pods, shards, share=True) == 2 * shards


@pytest.mark.parametrize(("pods", "shards"), [(2, 4), (2, 6), (3, 3), (3, 6), (4, 4)])
def test_above_the_share_in_between_a_rollout_saves_at_most_shards_minus_two_shares(
        pods: int, shards: int) -> None:
    # The first pod's shards must move twice (no pod is updated yet when it
    # stops), the last pod's share must move onto it once it is back, the
    # rest once: shards + 2 x shards / pods, and that is reached only by
    # letting pods hold more than their share during the rollout.
    assert fewest_moves(pods, shards, share=False) == shards + 2 * shards // pods
