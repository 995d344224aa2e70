"""Fixtures of the process tests: a local cluster of node processes per test."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from .cluster import LocalCluster

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


def cluster_on(param: str, request: pytest.FixtureRequest, make_cluster: MakeCluster,
               tmp_path: Path, **kwargs: object) -> LocalCluster:
    """A cluster on the store and renewal `param` names ("file-node", "s3-shard"):
    the embedded file store, or S3 (moto's server over HTTP, session-wide)."""
    store, renewal = param.split("-")
    if store == "file":
        return make_cluster(f"file://{tmp_path / 'store'}", renewal=renewal, **kwargs)
    server = request.getfixturevalue("s3_server")
    return make_cluster(server.url(server.create_bucket(), "sl"), env=server.env(),
                        renewal=renewal, **kwargs)
