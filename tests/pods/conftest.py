"""Real pods, on the kind cluster made on this machine (tests/support/kind.py:
one control plane and two workers), with the project's image loaded into
every node. The cluster is shared with tests/kind in one pytest process.

e2e/cluster.py (`clmod`) is the image's builder (its Docker engine, the
bases made here, the runtime image's report) and the versions of what was
built; its single node is not used by the tests any more.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support.cluster import Cluster, fresh_namespace
from tests.support.kind import Kind, kindmod

__all__ = ["ROOT", "Cluster", "clmod", "fresh_namespace"]

ROOT = Path(__file__).resolve().parents[2]
#: e2e/cluster.py, as kind's module loaded it (one instance of its state).
clmod = kindmod.node


@pytest.fixture(scope="session")
def cluster(kind_with_image: Kind) -> Kind:
    """The kind cluster with shardlease:dev loaded; a Cluster."""
    return kind_with_image


@pytest.fixture
def node_namespace(cluster: Cluster) -> Iterator[str]:
    """A fresh namespace (see fresh_namespace)."""
    with fresh_namespace(cluster) as name:
        yield name
