"""A hot key of the store, on real node processes: every write of one shard's
lease hangs, the rest of the store is healthy (sim (o) and the swarm's hot_key
kind; the bug of a55dbba, found in the simulation).

Three `shardlease node` processes on MinIO, lease TTL 3 s, 9 shards; n1
reaches MinIO through the fault-injecting proxy. Once balanced, the proxy
holds every PUT of one of n1's leases for 2 TTLs (`Faults.keys`) for 5 TTLs.

Asserted: n1 fences that shard (its renewals cannot land: the fault is real)
and no other (before a55dbba the hung free of the fenced shard held up the
renewals of the rest, and they were fenced too); no two open owners of one
shard at any time (the overlap checker, conservative window); balanced again
once the fault ends. A fence after a stall of the machine itself is excused
and printed (tests/support/stalls.py), never silently.
"""

from __future__ import annotations

import time

import pytest

from shardlease.checker import check_events, load_events
from shardlease_tools.faultproxy import Faults
from tests.support.faultproxy import MakeProxy
from tests.support.s3server import S3Server
from tests.support.stalls import StallWatch

from .cluster import held_by
from .conftest import MakeCluster, one_behind_a_proxy

pytestmark = pytest.mark.slow

pytest_plugins = ["tests.support.s3server", "tests.support.faultproxy"]

NAMES = ["n0", "n1", "n2"]
SLOWED = "n1"
SHARDS = 9
TTL = 3.0


def test_a_hot_key_fences_its_shard_and_no_other(
        minio: S3Server, make_cluster: MakeCluster, fault_proxy: MakeProxy) -> None:
    cluster, proxy, owners = one_behind_a_proxy(minio, make_cluster, fault_proxy, names=NAMES,
                                                slowed=SLOWED, shards=SHARDS, ttl=TTL)
    mine = sorted(held_by(owners, SLOWED))
    assert len(mine) == SHARDS // len(NAMES), owners
    hot = mine[0]

    with StallWatch() as watch:
        proxy.set(Faults(latency=2 * TTL, kinds=frozenset({"put-lease"}),
                         keys=frozenset({f"leases/{hot}"})))
        start = time.time()
        time.sleep(5 * TTL)
        proxy.set(Faults())
        end = time.time()
        assert cluster.running() == set(NAMES), "a node exited under the hot key"
    cluster.wait_balanced("after the fault", set(NAMES))

    codes = cluster.stop_all()
    assert set(codes.values()) <= {0}, codes
    report = check_events(cluster.events(), conservative=True)
    assert report.ok, "\n".join(report.violations[:20])

    # (A write the proxy held may land up to 2 TTLs after the fault ends.)
    fences = [e for e in load_events([cluster.nodes[SLOWED].log])
              if e.get("event") == "self_fence" and start <= float(e["ts"]) <= end + 2 * TTL]
    fenced = {int(s) for e in fences for s in e["shards"]}
    print(f"\n{SLOWED} held {mine}; every PUT of leases/{hot} held {2 * TTL:g}s for "
          f"{end - start:.1f}s; fenced {sorted(fenced)} (files in {cluster.workdir})")
    for stall in watch.stalls:
        print(f"  the machine stalled {stall.late:.2f}s at +{stall.woke - start:.1f}s")
    assert hot in fenced, f"shard {hot}'s renewals were held past its deadline: it must fence"
    others = [e for e in fences if set(e["shards"]) - {hot}]
    excused = [e for e in others if watch.before(float(e["ts"]), TTL)]
    for fence in excused:
        print(f"  fence of {fence['shards']} excused: the machine stalled "
              f"{[round(s.late, 2) for s in watch.before(float(fence['ts']), TTL)]}s "
              "in the TTL before it")
    assert [e for e in others if e not in excused] == [], \
        f"a shard whose lease the store served was fenced: {others}"
