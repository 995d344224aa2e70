"""Stop, then free, on the Kubernetes Lease store: the scenario of
tests/process/test_abort.py (an application that refuses every close, two
SIGTERMs) with real node processes against a real kube-apiserver."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.process.cluster import LocalCluster
from tests.process.conftest import MakeCluster, make_cluster
from tests.process.test_abort import (
    SHARDS,
    TTL,
    apps,
    test_a_node_stopped_short_leaves_what_its_application_did_not_close_to_expire,
)

__all__ = [
    "apps",
    "make_cluster",
    "test_a_node_stopped_short_leaves_what_its_application_did_not_close_to_expire",
]


@pytest.fixture(params=["shard", "node"])
def cluster(request: pytest.FixtureRequest, make_cluster: MakeCluster, namespace: str,
            kubeconfig: str, tmp_path: Path) -> LocalCluster:
    return make_cluster(f"kubernetes://{namespace}", shards=SHARDS, ttl=TTL,
                        env={"KUBECONFIG": kubeconfig}, renewal=request.param)
