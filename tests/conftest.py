"""Fixtures shared by every test directory.

The real control plane (etcd + kube-apiserver) is defined once here so that
tests/k8s, tests/chart and the others share one instance per session, and so
is the kind cluster of the real-pod tests (tests/pods, tests/kind); each
only starts when a test asks for it.

Also the garbage collector of the pytest process: what collection made
(modules, fixtures, some 1,400 test items in one run) lives until the end,
yet every full collection walked it again. In a warm run at dad338a the four
pytest processes made 103 full collections of over 50 ms (35 s in all, up to
2.6 s each on the loaded machine; nine of them while one run was still
collecting), and a pause that long stops the threads of the process too (a
fault proxy's, a sampler's). So the collector is off while pytest collects,
and what collection left is frozen out of every later collection.
"""

import gc

import pytest

from tests.k8s.fixtures import api_client, controlplane, kube, kubeconfig, namespace
from tests.support.kind import kind, kind_with_image

__all__ = ["api_client", "controlplane", "kind", "kind_with_image", "kube", "kubeconfig",
           "namespace"]


def pytest_configure(config: pytest.Config) -> None:
    gc.disable()


def pytest_collection_finish(session: pytest.Session) -> None:
    gc.collect()
    gc.freeze()
    gc.enable()
