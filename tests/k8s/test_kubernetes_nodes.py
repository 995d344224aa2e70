"""Real `shardlease node` processes on the Kubernetes Lease store: the same
scenarios as on the file store (tests/process), against a real kube-apiserver."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.process.cluster import LocalCluster
from tests.process.conftest import MakeCluster, make_cluster
from tests.process.test_nodes import (
    SHARDS,
    TTL,
    test_a_node_paused_beyond_the_ttl_is_fenced_and_rejoins,
    test_a_terminated_node_frees_its_leases_before_it_exits,
    test_nodes_share_fairly_and_a_killed_nodes_shards_reopen_elsewhere,
)

__all__ = [
    "make_cluster",
    "test_a_node_paused_beyond_the_ttl_is_fenced_and_rejoins",
    "test_a_terminated_node_frees_its_leases_before_it_exits",
    "test_nodes_share_fairly_and_a_killed_nodes_shards_reopen_elsewhere",
]


@pytest.fixture(params=["shard", "node"])
def cluster(request: pytest.FixtureRequest, make_cluster: MakeCluster, namespace: str,
            kubeconfig: str, tmp_path: Path) -> LocalCluster:
    return make_cluster(f"kubernetes://{namespace}", shards=SHARDS, ttl=TTL,
                        env={"KUBECONFIG": kubeconfig}, renewal=request.param)
