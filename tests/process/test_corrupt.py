"""Lease records corrupted under their live owners, on real `shardlease node`
processes (finding F of issue 16): each owner writes its record back over the
damage and keeps its shard (docs/renewal.md, "Records written by others"),
and the overlap checker finds nothing.

Assertions are orderings and invariants, never durations: every wait is a
poll with a generous timeout.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path

import pytest

from shardlease.stores.file import FileStore
from tests.support.fencelog import fenced_unanswered
from tests.support.s3server import S3Server

from .cluster import LocalCluster, counts, held_by
from .conftest import MakeCluster

pytestmark = pytest.mark.slow
pytest_plugins = ["tests.support.s3server"]

NAMES = ["n0", "n1", "n2"]
SHARDS = 12
#: 6 s, not 3: on a loaded 2-core machine moto once took over a second per
#: listing, so a repair's renewal missed a 3 s TTL and its owner rightly
#: fenced itself (CI at 823d2a3, s3-shard): the test is about the repair,
#: which needs a store that answers within the TTL. It missed 6 s too on a
#: slow phase of the machine (a warm run at e7113ce), so the process tests now
#: run on MinIO (conftest.py's s3_server says why).
TTL = 6.0
GARBAGE = b"\x00 not a lease \xff"

Corrupt = Callable[[int], None]


@pytest.fixture(params=["file-shard", "file-node", "s3-shard", "s3-node"])
def setup(request: pytest.FixtureRequest, make_cluster: MakeCluster,
          tmp_path: Path) -> tuple[LocalCluster, Corrupt]:
    store, renewal = request.param.split("-")
    if store == "file":
        cluster = make_cluster(f"file://{tmp_path / 'store'}", shards=SHARDS, ttl=TTL,
                               renewal=renewal)
        files = FileStore(tmp_path / "store")

        def corrupt_file(shard: int) -> None:
            files.put_raw_lease(cluster.name, shard, GARBAGE)
        return cluster, corrupt_file
    server: S3Server = request.getfixturevalue("s3_server")
    bucket = server.create_bucket()
    cluster = make_cluster(server.url(bucket, "sl"), shards=SHARDS, ttl=TTL,
                           env=server.env(), renewal=renewal)
    client = server.client()

    def corrupt_s3(shard: int) -> None:
        # The layout stores/s3.py documents: <prefix>/<cluster>/leases/<shard>.
        client.put_object(Bucket=bucket, Key=f"sl/{cluster.name}/leases/{shard}",
                          Body=GARBAGE)
    return cluster, corrupt_s3


def test_owners_write_their_records_back_over_garbage_and_keep_their_shards(
        setup: tuple[LocalCluster, Corrupt]) -> None:
    cluster, corrupt = setup
    for name in NAMES:
        cluster.start(name)
    before = cluster.wait_balanced("after the start")
    assert set(counts(before)) == set(NAMES)
    damaged = {name: min(held_by(before, name)) for name in NAMES}
    damaged_at = time.time()
    for shard in damaged.values():
        corrupt(shard)
    # `owners` shows each damaged shard unowned (corrupt) at first, then, once
    # its owner repaired it, owned again by the same node at the same
    # generation.
    try:
        after = cluster.wait_owners(
            "each damaged record repaired by its owner",
            lambda owners: all(owners[s]["owner"] == name
                               and owners[s]["generation"] == before[s]["generation"]
                               for name, s in damaged.items()))
    except AssertionError as e:
        # Say which of the two it was: a repair that failed (a bug), or an
        # owner that fenced because the store left a renewal unanswered
        # within the TTL (the design, on a store too slow for this test).
        slow = {name: sorted(fenced_unanswered(cluster.log_tail(name, 10_000)) & {s})
                for name, s in damaged.items()}
        raise AssertionError(f"{e}\ndamaged shards fenced after a renewal with no answer, "
                             f"by owner: {slow}") from None
    assert cluster.balanced(after)
    events = cluster.events()
    moved = [e for e in events if e["event"] == "open_end" and e["wall"] > damaged_at
             and e["shard"] in damaged.values()]
    assert moved == []  # nobody else opened them; their owners kept them open
    # (The damage was seen, not missed: each owner said so.)
    logs = "\n".join(cluster.log_tail(name, 400) for name in NAMES)
    assert logs.count("by another writer: writing ours back over it") >= len(NAMES), logs
    codes = cluster.stop_all()
    assert set(codes.values()) <= {0}, codes
    report = cluster.check()
    assert report.ok, "\n".join(report.violations[:20])

