"""The tests' polls as API reads (tests/support/apiread.py): which `kubectl
get -o json` arguments are served by a GET, at which path, and which are left
to kubectl."""

from __future__ import annotations

import pytest

from tests.support.apiread import NotServed, api_path


@pytest.mark.parametrize(("args", "path"), [
    (("pods", "-n", "ns", "-l", "app.kubernetes.io/name=shardapp"),
     "/api/v1/namespaces/ns/pods?labelSelector=app.kubernetes.io%2Fname%3Dshardapp"),
    (("-n", "ns", "pods", "-l", "app=smoke"),
     "/api/v1/namespaces/ns/pods?labelSelector=app%3Dsmoke"),
    (("pods", "-n", "ns"), "/api/v1/namespaces/ns/pods"),
    (("nodes",), "/api/v1/nodes"),
    (("node", "kind-worker"), "/api/v1/nodes/kind-worker"),
    (("statefulset", "shardapp", "-n", "ns"), "/apis/apps/v1/namespaces/ns/statefulsets/shardapp"),
    (("shardsets.shardlease.io", "shardapp", "--namespace=ns"),
     "/apis/shardlease.io/v1alpha1/namespaces/ns/shardsets/shardapp"),
    (("events", "-n", "ns"), "/api/v1/namespaces/ns/events"),
])
def test_a_plain_read_is_one_get(args: tuple[str, ...], path: str) -> None:
    assert api_path(args) == path


@pytest.mark.parametrize("args", [
    ("pods,shardsets,events", "-n", "ns"),  # several kinds: kubectl's own merge
    ("service", "kubernetes", "-n", "default"),  # not a resource the polls use
    ("pods",),  # no namespace: kubectl would take the kubeconfig's
    ("pods", "-n", "ns", "-o", "wide"),  # an option not understood here
    ("pods", "-A"),
    ("pod", "a", "b", "-n", "ns"),
    ("pod", "a", "-n", "ns", "-l", "x=y"),
    (),
])
def test_anything_else_is_left_to_kubectl(args: tuple[str, ...]) -> None:
    with pytest.raises(NotServed):
        api_path(args)
