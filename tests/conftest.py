"""Fixtures shared by every test directory.

The real control plane (etcd + kube-apiserver) is defined once here so that
tests/k8s, tests/chart and the others share one instance per session; it only
starts when a test asks for it.
"""

from tests.k8s.fixtures import api_client, controlplane, kube, kubeconfig, namespace

__all__ = ["api_client", "controlplane", "kube", "kubeconfig", "namespace"]
