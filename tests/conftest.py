"""Fixtures shared by every test directory.

The real control plane (etcd + kube-apiserver) is defined once here so that
tests/k8s, tests/chart and the others share one instance per session, and so
is the kind cluster of the real-pod tests (tests/pods, tests/kind); each
only starts when a test asks for it.
"""

from tests.k8s.fixtures import api_client, controlplane, kube, kubeconfig, namespace
from tests.support.kind import kind, kind_with_image

__all__ = ["api_client", "controlplane", "kind", "kind_with_image", "kube", "kubeconfig",
           "namespace"]
