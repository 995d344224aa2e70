"""The review's findings (issue 16, A to F), each as the scenario that showed
it, checked against every invariant and against what the finding was about."""

from __future__ import annotations

import pytest

from shardlease.sim import (
    Fault,
    Leave,
    Reconfigure,
    ScenarioResult,
    StoreFault,
    run_scenario,
)

TTL = 15.0


def ok(result: ScenarioResult) -> ScenarioResult:
    assert result.violations == [], "\n".join(result.violations)
    return result


def open_nowhere(result: ScenarioResult, t0: float, t1: float) -> float:
    """Shard-seconds in [t0, t1) during which a shard was open on no node."""
    total = 0.0
    for shard in range(result.shards):
        opened: dict[str, float] = {}
        nowhere_since: float | None = t0
        for ev in result.trace:
            if ev.t >= t1:
                break
            if ev.kind == "crash":
                opened.pop(ev.node, None)
            elif ev.shard != shard:
                continue
            elif ev.kind == "open_ok":
                opened[ev.node] = ev.t
            elif ev.kind == "close_call":
                opened.pop(ev.node, None)
            else:
                continue
            if opened and nowhere_since is not None:
                total += max(0.0, ev.t - max(nowhere_since, t0))
                nowhere_since = None
            elif not opened and nowhere_since is None:
                nowhere_since = ev.t
        if nowhere_since is not None:
            total += max(0.0, t1 - max(nowhere_since, t0))
    return total


def ttl_cut(first: float, last: float, late: str) -> list[Fault]:
    """Every node reconfigured from TTL 90 to 15, `late` 2.5 s after the others."""
    return [Reconfigure(first, n, (("lease_ttl", TTL),)) for n in ("n0", "n1", "n2", "n3")
            if n != late] + [Reconfigure(last, late, (("lease_ttl", TTL),))]


@pytest.mark.parametrize("leaver", ["n2", "n3"])
@pytest.mark.parametrize("at", [195.0, 196.0, 197.0])
def test_a_garbage_collected_epoch_is_no_licence_to_take_its_later_leases(
        leaver: str, at: float) -> None:
    # Finding A. n0 holds nothing; its epoch keeps TTL 90 after the cut, and
    # its epoch writes fail, so a peer's garbage collection ends and deletes
    # its epoch after 2 x 15 s, while n0, valid by its own clock (last write +
    # 87.5 s), claims the shard a leaver frees. Its lease names the ended
    # epoch: the collector must still wait the epoch's TTL, not take it at once.
    faults = [*ttl_cut(150.0, 152.5, "n0"),
              StoreFault(160, 320, node="n0", error_rate=1.0,
                         calls=frozenset({"update_epoch", "create_epoch"})),
              Leave(at, leaver)]
    r = ok(run_scenario(nodes=4, shards=3, seed=1, lease_ttl=90.0, renewal="node",
                        faults=faults))
    claimed = [ev for ev in r.trace if ev.kind == "claim" and ev.node == "n0" and ev.t > at]
    assert claimed, "the scenario lost its point: n0 claimed nothing"
