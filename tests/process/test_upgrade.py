"""Rolling upgrades between a version before node-epoch renewal and this one,
on real processes: the old version's own code (the package as it was at
commit 5ee082a, kept in tests/process/data) next to this one on one store.

A node of the old version reads a node-mode lease as a shard-mode one: it
sees the record unchanged and takes it after a TTL. So while such a node is
live, node-mode nodes must keep their leases the shard way (loop.py, "Older
peers"). Each test ends with the overlap checker over what every node's
recording host saw, both versions included: no shard open on two nodes at
once, generations increasing per shard.
"""

from __future__ import annotations

import tarfile
from pathlib import Path

import pytest

from .cluster import LocalCluster, Owners, counts
from .conftest import MakeCluster

pytestmark = pytest.mark.slow

#: The last commit before node-epoch renewal: what a rolling upgrade to this
#: version starts from (and what a rollback goes back to). Its package is kept
#: here as made by `git archive 5ee082a operator/shardlease | gzip -9n`, so
#: that a shallow clone runs these tests too.
OLD = Path(__file__).parent / "data" / "shardlease-5ee082a.tar.gz"
SHARDS = 12
TTL = 2.0


@pytest.fixture(scope="module")
def old_version(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The old version's `shardlease` package, unpacked."""
    dest = tmp_path_factory.mktemp("old-version")
    with tarfile.open(OLD) as tar:
        tar.extractall(dest, filter="data")
    assert (dest / "operator" / "shardlease" / "loop.py").is_file()
    return dest / "operator"


@pytest.fixture
def cluster(make_cluster: MakeCluster, tmp_path: Path) -> LocalCluster:
    return make_cluster(f"file://{tmp_path / 'store'}", shards=SHARDS, ttl=TTL,
                        renewal="node")


def renewal_of(owners: Owners, nodes: set[str]) -> set[str]:
    return {s["renewal"] for s in owners if s["owner"] in nodes}


def check(cluster: LocalCluster) -> None:
    codes = cluster.stop_all()
    assert set(codes.values()) <= {0}, codes
    report = cluster.check()
    assert report.ok, "\n".join(report.violations[:20])
    assert report.shards == SHARDS


def test_a_node_of_the_old_version_joining_node_mode_nodes_never_doubles_an_owner(
        cluster: LocalCluster, old_version: Path) -> None:
    # A rollback, or an old pod started by hand: the dangerous direction.
    cluster.start("n0")
    cluster.start("n1")
    owners = cluster.wait_owners("balanced on node-mode leases", lambda o: cluster.balanced(o)
                                 and renewal_of(o, {"n0", "n1"}) == {"node"})
    cluster.start("old", version=old_version)
    try:
        owners = cluster.wait_balanced("with the old node")
    except AssertionError as e:
        # Without the guard the old node takes node-mode leases it sees
        # unchanged: say so, not only that the shares are off.
        report = cluster.check()
        raise AssertionError(f"{e}\n" + "\n".join(report.violations[:10])) from None
    # The new nodes keep their leases the shard way while it is live.
    assert renewal_of(owners, {"n0", "n1"}) == {"shard"}
    assert counts(owners)["old"] == SHARDS // 3
    assert cluster.terminate("old") == 0
    cluster.wait_owners("back on node-mode leases", lambda o: cluster.balanced(o)
                        and renewal_of(o, {"n0", "n1"}) == {"node"})
    check(cluster)


def test_a_rolling_upgrade_from_the_old_version(
        cluster: LocalCluster, old_version: Path) -> None:
    # As a StatefulSet rolls: the highest ordinal first, one pod at a time.
    for k in range(3):
        cluster.start(f"old{k}", version=old_version)
    cluster.wait_balanced("on the old version")
    for k in (2, 1, 0):
        assert cluster.terminate(f"old{k}") == 0
        cluster.start(f"new{k}")
        owners = cluster.wait_balanced(f"after new{k} replaced old{k}")
        if k > 0:
            new = {f"new{j}" for j in range(k, 3)}
            assert renewal_of(owners, new) == {"shard"}, owners
    cluster.wait_owners("every lease on its owner's epoch", lambda o: cluster.balanced(o)
                        and renewal_of(o, {"new0", "new1", "new2"}) == {"node"})
    check(cluster)
