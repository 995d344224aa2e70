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
