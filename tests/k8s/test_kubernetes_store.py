"""The store contract, run against a real kube-apiserver with Lease objects."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from typing import Any

import pytest
from kubernetes_asyncio import client

from shardlease.errors import ConfigError, Conflict, StoreError
from shardlease.records import Lease
from shardlease.stores import open_store
from shardlease.stores.base import LeaseStore
from shardlease.stores.kubernetes import (
    ANN_INCARNATION,
    ANN_TTL,
    ANN_WRITE_ID,
    LABEL_CLUSTER,
    LABEL_KIND,
    LABEL_SHARD,
    KubernetesStore,
    lease_name,
)

from ..stores.contract import CLUSTER, OTHER_CLUSTER, MakeStore, PutRaw, StoreContract, make_lease


def raw_lease_object(namespace: str, cluster: str, shard: int, data: bytes) -> dict[str, Any]:
    """A Lease object stored as `cluster`'s shard `shard` whose content comes
    from `data`: the fields of a JSON lease record where it is one, garbage in
    an annotation where it is not. This is how a hand-written or foreign Lease
    looks to the store."""
    labels = {LABEL_CLUSTER: cluster, LABEL_SHARD: str(shard), LABEL_KIND: "shard"}
    annotations: dict[str, str] = {}
    spec: dict[str, Any] = {}
    try:
        record = json.loads(data)
        if not isinstance(record, dict):
            raise ValueError
    except ValueError:
        annotations["shardlease.io/garbage"] = data.decode("utf-8", "replace")
        record = {}
    if "cluster" in record:
        labels[LABEL_CLUSTER] = str(record["cluster"])
    if "shard" in record:
        labels[LABEL_SHARD] = str(record["shard"])
    if record.get("owner"):
        spec["holderIdentity"] = record["owner"]
    if isinstance(record.get("generation"), int):
        spec["leaseTransitions"] = record["generation"]
    for key, ann in (("write_id", ANN_WRITE_ID), ("incarnation", ANN_INCARNATION),
                     ("ttl", ANN_TTL), ("padding", "shardlease.io/padding")):
        if record.get(key) is not None:
            annotations[ann] = str(record[key])
    return {"apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
            "metadata": {"name": lease_name(CLUSTER if cluster == CLUSTER else cluster, shard),
                         "namespace": namespace, "labels": labels,
                         "annotations": annotations},
            "spec": spec}


class TestKubernetesStore(StoreContract):
    @pytest.fixture
    async def store(self, namespace: str, kubeconfig: str) -> AsyncIterator[LeaseStore]:
        store = open_store(f"kubernetes://{namespace}")
        await store.check()
        yield store
        await store.aclose()

    @pytest.fixture
    def put_raw(self, namespace: str, api_client: Any) -> PutRaw:
        coord = client.CoordinationV1Api(api_client)

        async def put(cluster: str, shard: int, data: bytes) -> None:
            body = raw_lease_object(namespace, cluster, shard, data)
            name = body["metadata"]["name"]
            try:
                current = await coord.read_namespaced_lease(name, namespace)
                body["metadata"]["resourceVersion"] = current.metadata.resource_version
                await coord.replace_namespaced_lease(name, namespace, body)
            except client.ApiException as e:
                if e.status != 404:
                    raise
                await coord.create_namespaced_lease(namespace, body)
        return put

    @pytest.fixture
    async def make_second_store(self, namespace: str) -> AsyncIterator[MakeStore]:
        opened: list[LeaseStore] = []

        async def make() -> LeaseStore:
            s = open_store(f"kubernetes://{namespace}")
            opened.append(s)
            return s
        yield make
        for s in opened:
            await s.aclose()

    async def test_a_lease_stored_in_another_cluster_is_corrupt(
            self, store: LeaseStore, put_raw: PutRaw) -> None:
        # Kubernetes lists by label: a Lease named as our shard 0 but labelled
        # for another cluster is not in our listing, and reading it by name
        # reports it as not ours.
        await put_raw(CLUSTER, 0, b'{"cluster": "%s"}' % OTHER_CLUSTER.encode())
        assert 0 not in await store.list_leases(CLUSTER)
        entry = await store.get_lease(CLUSTER, 0)
        assert entry is not None and entry.record is None
        assert entry.error and "cluster" in entry.error


async def test_leases_carry_holder_generation_and_labels_kubectl_can_select(
        namespace: str, kubeconfig: str, api_client: Any) -> None:
    store = open_store(f"kubernetes://{namespace}")
    try:
        lease = make_lease(shard=7, owner="db-1", generation=3)
        await store.create_lease(lease)
        coord = client.CoordinationV1Api(api_client)
        found = await coord.list_namespaced_lease(
            namespace, label_selector=f"{LABEL_CLUSTER}={CLUSTER}")
        assert [i.metadata.name for i in found.items] == [lease_name(CLUSTER, 7)]
        obj = found.items[0]
        assert obj.spec.holder_identity == "db-1"
        assert obj.spec.lease_transitions == 3
        assert obj.spec.lease_duration_seconds >= lease.ttl
        assert obj.spec.acquire_time is not None and obj.spec.renew_time is not None
        assert obj.metadata.labels[LABEL_SHARD] == "7"
    finally:
        await store.aclose()


async def test_a_replace_with_a_stale_resource_version_is_refused_by_the_api_server(
        namespace: str, kubeconfig: str) -> None:
    a = open_store(f"kubernetes://{namespace}")
    b = open_store(f"kubernetes://{namespace}")
    try:
        v1 = await a.create_lease(make_lease(shard=1, owner="a", generation=1))
        await b.update_lease(make_lease(shard=1, owner="b", generation=2), v1)
        with pytest.raises(Conflict):
            await a.update_lease(make_lease(shard=1, owner="a", generation=1), v1)
        got = await a.get_lease(CLUSTER, 1)
        assert got is not None and isinstance(got.record, Lease)
        assert (got.record.owner, got.record.generation) == ("b", 2)
    finally:
        await a.aclose()
        await b.aclose()


async def test_a_missing_namespace_fails_the_check_with_a_clear_message(kubeconfig: str) -> None:
    store = open_store("kubernetes://no-such-namespace-here")
    try:
        # Listing in a namespace that does not exist returns an empty list on
        # Kubernetes, so the check passes and the first write tells.
        await store.check()
        with pytest.raises(StoreError, match="no-such-namespace-here"):
            await store.create_lease(make_lease(shard=0))
    finally:
        await store.aclose()


def test_a_malformed_kubernetes_url_is_refused() -> None:
    for url in ("kubernetes://", "kubernetes://ns/extra", "kubernetes://Bad_NS",
                "kubernetes://ns?colour=blue"):
        with pytest.raises(ConfigError):
            KubernetesStore.from_url(url)
