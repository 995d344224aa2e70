"""Real `shardlease node` processes on a shared store: fair shares, kill -9,
SIGSTOP beyond the TTL, SIGTERM. Each test ends with the overlap checker over
what the recording hosts saw: no shard open on two nodes with valid deadlines
at once, generations increasing per shard, host calls in order.

Assertions are orderings and invariants (who owns what, what happened before
what), never durations: every wait is a poll with a generous timeout.
"""

from __future__ import annotations

import signal
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from shardlease.checker import check_events

from .cluster import WAIT, LocalCluster, counts, held_by
from .conftest import MakeCluster, cluster_on

pytestmark = pytest.mark.slow

NAMES = ["n0", "n1", "n2", "n3"]
SHARDS = 16
TTL = 2.0
#: On MinIO, 3 s: a call's budget is then 0.95 s, not 0.63. Three of four
#: warm runs of the suite on 2 cores (2026-12-07, 29394cb to e567ace, the
#: machine busy for 23-27 minutes) failed an s3-shard test here: MinIO calls
#: over 0.63 s for lack of CPU, and the nodes fenced, as they must; no
#: file-store test did.
S3_TTL = 3.0


# The fixtures s3_server (MinIO over HTTP on loopback, session-wide: conftest.py).
pytest_plugins = ["tests.support.s3server"]


@pytest.fixture(params=["file-shard", "file-node", "s3-shard", "s3-node"])
def cluster(request: pytest.FixtureRequest, make_cluster: MakeCluster,
            tmp_path: Path) -> LocalCluster:
    """The nodes' store, the embedded file store or S3 (MinIO) over HTTP, and
    how they keep their leases (per-shard or node-epoch renewal)."""
    return cluster_on(request.param, request, make_cluster, tmp_path, shards=SHARDS,
                      ttl=S3_TTL if request.param.startswith("s3") else TTL)


def wait_events(cluster: LocalCluster, what: str,
                ok: Callable[[list[dict[str, Any]]], bool]) -> list[dict[str, Any]]:
    end = time.monotonic() + WAIT
    while True:
        events = cluster.events()
        if ok(events):
            return events
        if time.monotonic() > end:
            raise AssertionError(f"never recorded: {what} (files in {cluster.workdir})")
        time.sleep(0.2)


def opened_elsewhere(events: list[dict[str, Any]], node: str, after: float) -> set[int]:
    """Shards another node finished opening after wall time `after`."""
    return {e["shard"] for e in events
            if e["event"] == "open_end" and e["node"] != node and e["wall"] > after}


def open_on(events: list[dict[str, Any]], node: str) -> dict[int, int]:
    """shard -> generation of what `node`'s host has open (or is opening) by
    its own recording. Read after the node was stopped, this is exactly what
    it had when stopped; the store's owners read earlier may be stale, since
    a shard can move between the balance and the signal."""
    last: dict[int, dict[str, Any]] = {}
    for e in sorted(events, key=lambda e: e["wall"]):
        if e["node"] == node and e["event"] in (
                "open_start", "open_end", "opened", "close_start", "close_end", "closed"):
            last[e["shard"]] = e
    return {s: e["generation"] for s, e in last.items()
            if e["event"] in ("open_start", "open_end", "opened")}


def busiest(cluster: LocalCluster) -> str:
    """The node with the most shards open now, by the hosts' own recording:
    the one to kill or pause. Not a name chosen before: on a loaded machine
    a node may have fenced all it had by then (a warm fresh-clone run at
    a18d2a1: n1, its MinIO listings and renewals unanswered within 0.95 s,
    fenced its four shards just before it was killed, and the test found
    nothing of it to reopen)."""
    events = wait_events(cluster, "a node with shards open",
                         lambda ev: any(open_on(ev, n) for n in NAMES))
    return max(NAMES, key=lambda n: len(open_on(events, n)))


def start_balanced(cluster: LocalCluster, names: list[str]) -> list[dict[str, Any]]:
    for name in names:
        cluster.start(name)
    owners = cluster.wait_balanced("after the start")
    assert set(counts(owners)) == set(names)
    if SHARDS % len(names) == 0:
        assert sorted(counts(owners).values()) == [SHARDS // len(names)] * len(names)
    return owners


def stop_and_check(cluster: LocalCluster) -> None:
    """SIGTERM everything: each exits 0 having freed its leases; then the
    recording must pass the checker."""
    codes = cluster.stop_all()
    assert set(codes.values()) <= {0}, codes
    owned = [s for s in cluster.owners() if s["owner"] is not None]
    # What the owners' stops said of their epoch and frees, if one is left.
    said = {name: [line for line in cluster.log_tail(name, 400).splitlines()
                   if "epoch" in line or "free" in line or "stray" in line][-8:]
            for name in {s["owner"] for s in owned} if name in cluster.nodes}
    assert not owned, f"still owned after every node stopped: {owned}\n{said}"
    report = cluster.check()
    assert report.ok, "\n".join(report.violations[:20])
    assert report.shards == SHARDS


def test_nodes_share_fairly_and_a_killed_nodes_shards_reopen_elsewhere(
        cluster: LocalCluster) -> None:
    start_balanced(cluster, NAMES)
    # `shardlease owners` as a person reads it: owner, generation, since when.
    # (Polled: a round may still move a shard just after the balance, and
    # the table then shows it unowned for a moment.)
    end = time.monotonic() + WAIT
    while True:
        table = cluster.shardlease("owners", "--store", cluster.store_url, "--cluster",
                                   cluster.name, "--shards", str(cluster.shards))
        assert table.returncode == 0, table.stderr
        rows = [line.split() for line in table.stdout.splitlines()[1:cluster.shards + 1]]
        if all(r[1] != "-" for r in rows) or time.monotonic() > end:
            break
        time.sleep(0.5)
    assert {r[1] for r in rows} == set(NAMES)  # every owner has a heartbeat: no "*"
    assert all(r[3].endswith("s") for r in rows), table.stdout  # claimed seconds ago
    victim = busiest(cluster)
    killed_at = time.time()
    cluster.kill(victim)
    lost = open_on(cluster.events(), victim)
    assert lost, cluster.log_tail(victim)
    survivors = set(NAMES) - {victim}
    after = cluster.wait_balanced("after kill -9", survivors)
    for shard, generation in lost.items():
        assert after[shard]["owner"] in survivors
        assert after[shard]["generation"] > generation
    # Owned in the store, and opened on the survivors' hosts too.
    wait_events(cluster, f"{victim}'s shards opened elsewhere",
                lambda ev: set(lost) <= opened_elsewhere(ev, victim, killed_at))
    stop_and_check(cluster)


def test_a_node_paused_beyond_the_ttl_is_fenced_and_rejoins(cluster: LocalCluster) -> None:
    start_balanced(cluster, NAMES)
    victim = busiest(cluster)
    paused_at = time.time()
    cluster.signal(victim, signal.SIGSTOP)
    held = open_on(cluster.events(), victim)
    assert held, cluster.log_tail(victim)
    others = set(NAMES) - {victim}
    during = cluster.wait_balanced(f"while {victim} is paused", others)
    assert all(during[s]["generation"] > g for s, g in held.items())
    wait_events(cluster, f"{victim}'s shards opened elsewhere while it was paused",
                lambda ev: set(held) <= opened_elsewhere(ev, victim, paused_at))

    resumed_at = time.time()
    cluster.signal(victim, signal.SIGCONT)
    # It finds its deadlines passed (self-fence) or its leases taken (lost),
    # closes every shard it had, and comes back for a fair share.
    events = wait_events(cluster, f"{victim} closing its old shards after SIGCONT",
                         lambda ev: set(held) <= {
                             e["shard"] for e in ev if e["event"] == "close_end"
                             and e["node"] == victim and e["wall"] > resumed_at})
    assert any(e["node"] == victim and e["event"] in ("self_fence", "lost")
               and e["wall"] > resumed_at for e in events)
    final = cluster.wait_balanced(f"after {victim} resumed", set(NAMES))
    assert victim in counts(final)
    # The overlap really happened on the hosts (the new owner opened while the
    # paused one still had the shard open): only the deadline excuses it.
    for shard in held:
        reopened = min(e["wall"] for e in events if e["event"] == "open_end"
                       and e["shard"] == shard and e["node"] != victim and e["wall"] > paused_at)
        closed = min(e["wall"] for e in events if e["event"] == "close_start"
                     and e["shard"] == shard and e["node"] == victim and e["wall"] > paused_at)
        assert reopened < closed
    # Without the paused node's deadlines the checker must call that overlap.
    blind = [{k: v for k, v in e.items() if k != "deadline_wall" or e["node"] != victim}
             for e in cluster.events()]
    assert not check_events(blind).ok
    stop_and_check(cluster)


def test_a_terminated_node_frees_its_leases_before_it_exits(cluster: LocalCluster) -> None:
    names = NAMES[:3]
    before = start_balanced(cluster, names)
    victim = "n0"
    held = held_by(before, victim)

    assert cluster.terminate(victim) == 0
    # Freed before the process exited: nothing waits for the TTL.
    right_after = cluster.owners()
    assert victim not in counts(right_after)
    for shard, generation in held.items():
        assert right_after[shard]["generation"] >= generation  # kept, never reset

    rest = set(names) - {victim}
    after = cluster.wait_balanced(f"after SIGTERM to {victim}", rest)
    assert all(after[s]["generation"] > g for s, g in held.items())
    events = wait_events(cluster, f"{victim}'s shards opened elsewhere",
                         lambda ev: set(held) <= opened_elsewhere(ev, victim, 0.0))
    # Closed there before opened here. The store may name the victim for a
    # shard it never opened: a claim whose answer came too late for the round
    # lands as a stray, which is freed, never opened (warm run at dad338a:
    # shard 1, on the Kubernetes store); such a shard has nothing to close.
    opened_there = {e["shard"] for e in events if e["event"] == "open_end"
                    and e["node"] == victim}
    for shard in held:
        if shard not in opened_there:
            assert not any(e["event"] == "close_start" and e["shard"] == shard
                           and e["node"] == victim for e in events), shard
            continue
        closed = max(e["wall"] for e in events if e["event"] == "close_end"
                     and e["shard"] == shard and e["node"] == victim)
        opened = min(e["wall"] for e in events if e["event"] == "open_start"
                     and e["shard"] == shard and e["node"] != victim
                     and e["generation"] > held[shard])
        assert closed < opened
    assert any(e["event"] == "release" and e["node"] == victim for e in events)
    stop_and_check(cluster)

