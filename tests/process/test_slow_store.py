"""A slow and a throttling S3, on real node processes (issue #8, item 1).

Three `shardlease node` processes on MinIO, lease TTL 3 s, 12 shards; one of
them (n1) reaches MinIO through the fault-injecting proxy, so every request
it makes (heartbeats, listings, GETs, claims and renewals alike) gets the
phase's fault, and its peers none. Phases of 4 TTLs each, one after the
other: no fault, +0.15 x TTL of latency, +0.3 x TTL, 30% of the requests
answered 503 SlowDown, +0.5 x TTL; then no fault again until balanced.

Asserted: no two open owners of one shard at any time (the overlap checker,
conservative window), over the whole run; in every phase but the last the
slowed node fences nothing, loses nothing and keeps every shard it had (it
renews on a schedule of its own, within budgets, retried by the loop and not
by botocore); and it gets its fair share back once the faults end.

At +0.5 x TTL holding is impossible for any engine that renews by
compare-and-swap: a renewal needs the version the previous one returned, so
renewals are at least one latency apart and each is answered a latency after
it was sent: 2 x 1.5 s > TTL - margin = 2.5 s. The node fences in time (the
checker's rule); its shards then stay open nowhere until the fault ends,
because its heartbeats still land and its peers, counting it live, stay at
their share (printed as shard-seconds open nowhere; not asserted).

The figures per phase are printed (pytest -s), never asserted as durations;
the proxy's request history is written beside the nodes' logs.
"""

from __future__ import annotations

import dataclasses
import json
import time
from collections import Counter

import pytest

from shardlease.checker import check_events, load_events
from shardlease_tools.bench import SLOW_KEEPS, SLOW_PHASES, open_on, phase_figures
from shardlease_tools.faultproxy import Faults
from tests.support.faultproxy import MakeProxy
from tests.support.s3server import S3Server

from .cluster import counts
from .conftest import MakeCluster
from .test_nodes import wait_events

pytestmark = pytest.mark.slow

pytest_plugins = ["tests.support.s3server", "tests.support.faultproxy"]

NAMES = ["n0", "n1", "n2"]
SLOWED = "n1"
SHARDS = 12
TTL = 3.0
PHASE = 4 * TTL


def test_one_slow_node_keeps_its_shards_and_nobody_overlaps(
        minio: S3Server, make_cluster: MakeCluster, fault_proxy: MakeProxy) -> None:
    bucket = minio.create_bucket()
    proxy = fault_proxy(minio.endpoint)
    through_proxy = S3Server(kind="proxy", endpoint=proxy.endpoint).url(bucket, "sl")
    cluster = make_cluster(minio.url(bucket, "sl"), shards=SHARDS, ttl=TTL, env=minio.env())
    for name in NAMES:
        cluster.start(name, store_url=through_proxy if name == SLOWED else None)
    owners = cluster.wait_balanced("after the start")
    assert counts(owners)[SLOWED] == SHARDS // len(NAMES)

    marks: list[tuple[str, float, float, Counter[str]]] = []
    for label, latency, errors in SLOW_PHASES:
        proxy.set(Faults(latency=latency * TTL, error_rate=errors))
        before, start = proxy.counts(), time.time()
        time.sleep(PHASE)
        marks.append((label, start, time.time(), proxy.counts() - before))
        assert cluster.running() == set(NAMES), f"a node exited during {label}"
    proxy.set(Faults())
    recovered_at, before = time.time(), proxy.counts()
    # Liveness after the fault: the slowed node gets a fair share back, open
    # on its host (the store alone may still name it for leases it fenced).
    wait_events(cluster, f"{SLOWED}'s share open again",
                lambda ev: len(open_on(ev, SLOWED)) == SHARDS // len(NAMES))
    cluster.wait_balanced("after the faults", set(NAMES))
    ended_at = time.time()

    codes = cluster.stop_all()
    assert set(codes.values()) <= {0}, codes
    with open(cluster.workdir / "proxy.jsonl", "w") as out:  # every request of the slowed node
        for seen in proxy.history():
            out.write(json.dumps(dataclasses.asdict(seen)) + "\n")
    recorded = cluster.events()
    logged = load_events([cluster.nodes[SLOWED].log])
    figures = [phase_figures(label, SLOWED, start, end, recorded, logged, requests)
               for label, start, end, requests in marks]
    figures.append(phase_figures("until balanced again", SLOWED, recovered_at, ended_at,
                                 recorded, logged, proxy.counts() - before))
    print(f"\n{SLOWED} behind the proxy; {len(NAMES)} nodes, {SHARDS} shards, "
          f"lease TTL {TTL:g}s, phases of {PHASE:g}s (files in {cluster.workdir})")
    for f in figures:
        print("  " + f.row())
        for error in f.errors:
            print(f"      renew_failed: {error}")

    # Safety over the whole run, faults included.
    report = check_events(recorded, conservative=True)
    assert report.ok, "\n".join(report.violations[:20])
    assert report.shards == SHARDS
    # A slow store costs claims, never renewals: in these phases the slowed
    # node fences nothing, loses nothing, and every shard it had stays open.
    share = SHARDS // len(NAMES)
    for f in figures:
        if f.label in SLOW_KEEPS:
            assert (f.self_fences, f.lost) == (0, 0), f.row()
            assert f.held_start == f.held_min == f.held_end == share, f.row()
    # The faults were really there: the proxy delayed or refused its requests.
    by_label = {f.label: f for f in figures}
    assert by_label["30% 503 SlowDown"].requests.get("slowdown", 0) > 0
    assert all(sum(f.requests.values()) > 0 for f in figures[:len(SLOW_PHASES)])
