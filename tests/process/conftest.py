"""Fixtures of the process tests: a local cluster of node processes per test."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from shardlease_tools.faultproxy import ProxyThread
from tests.support.faultproxy import MakeProxy
from tests.support.s3server import S3Server

from .cluster import LocalCluster, Owners

MakeCluster = Callable[..., LocalCluster]


@pytest.fixture
def make_cluster(tmp_path: Path) -> Iterator[MakeCluster]:
    """Build a `LocalCluster`; every process it started is gone after the test."""
    made: list[LocalCluster] = []

    def make(store_url: str, **kwargs: object) -> LocalCluster:
        cluster = LocalCluster(store_url, tmp_path / f"cluster-{len(made)}", **kwargs)  # type: ignore[arg-type]
        made.append(cluster)
        return cluster

    yield make
    for cluster in made:
        cluster.cleanup()


def one_behind_a_proxy(minio: S3Server, make_cluster: MakeCluster, fault_proxy: MakeProxy, *,
                       names: list[str], slowed: str, shards: int,
                       ttl: float) -> tuple[LocalCluster, ProxyThread, Owners]:
    """Nodes `names` on a new bucket of MinIO, `slowed` reaching it through
    a fault proxy of its own and the others straight: started, and balanced."""
    bucket = minio.create_bucket()
    proxy = fault_proxy(minio.endpoint)
    through_proxy = S3Server(kind="proxy", endpoint=proxy.endpoint).url(bucket, "sl")
    cluster = make_cluster(minio.url(bucket, "sl"), shards=shards, ttl=ttl, env=minio.env())
    for name in names:
        cluster.start(name, store_url=through_proxy if name == slowed else None)
    return cluster, proxy, cluster.wait_balanced("after the start")


def cluster_on(param: str, request: pytest.FixtureRequest, make_cluster: MakeCluster,
               tmp_path: Path, **kwargs: object) -> LocalCluster:
    """A cluster on the store and renewal `param` names ("file-node", "s3-shard"):
    the embedded file store, or S3 (the session's MinIO over HTTP)."""
    store, renewal = param.split("-")
    if store == "file":
        return make_cluster(f"file://{tmp_path / 'store'}", renewal=renewal, **kwargs)
    server = request.getfixturevalue("s3_server")
    return make_cluster(server.url(server.create_bucket(), "sl"), env=server.env(),
                        renewal=renewal, **kwargs)


@pytest.fixture(scope="session")
def s3_server(minio: S3Server) -> S3Server:
    """The process tests' S3 is MinIO, not moto: their node processes renew
    with deadlines of one to three seconds, and moto, in Python and one
    request at a time (tests/support/motoserve.py), left renewals unanswered
    for 3 s on slow phases of the 2-core machine while the three test groups
    ran (a warm CI run at e7113ce: test_corrupt[s3-shard] fenced its repaired
    shard). MinIO serves requests in parallel and, for the S3 process tests,
    took 47 s of CPU where moto took 68 (test processes included). The store
    conformance suite still runs on both (tests/stores/test_s3.py)."""
    return minio
