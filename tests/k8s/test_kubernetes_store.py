"""The store contract, run against a real kube-apiserver with Lease objects."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator
from typing import Any

import pytest
from kubernetes_asyncio import client

from shardlease.errors import ConfigError, Conflict, StoreError
from shardlease.kubeapi import KubeClient
from shardlease.loop import PlacementLoop
from shardlease.options import Options
from shardlease.records import Epoch, Heartbeat, Lease, Stored
from shardlease.sim.fakes import StrictHost
from shardlease.stores import open_store
from shardlease.stores.base import LeaseStore, Listed
from shardlease.stores.kubernetes import (
    ANN_INCARNATION,
    ANN_TTL,
    ANN_WRITE_ID,
    LABEL_CLUSTER,
    LABEL_KIND,
    LABEL_SHARD,
    LEASES,
    KubernetesStore,
    lease_name,
    lease_to_object,
    legacy_lease_name,
    node_object_name,
)
from shardlease.stores.requests import ReportsRequests, RequestCounter, count_requests
from shardlease.telemetry import Claim, Telemetry

from ..stores.contract import (
    CLUSTER,
    OTHER_CLUSTER,
    DeleteRaw,
    MakeStore,
    PutRaw,
    StoreContract,
    make_heartbeat,
    make_lease,
    rewrite,
    valid,
)


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
                     ("ttl", ANN_TTL), ("padding", "shardlease.io/padding"),
                     ("format", "shardlease.io/format")):
        if record.get(key) is not None:
            annotations[ann] = str(record[key])
    return {"apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
            "metadata": {"name": lease_name(CLUSTER if cluster == CLUSTER else cluster, shard),
                         "namespace": namespace, "labels": labels,
                         "annotations": annotations},
            "spec": spec}


async def settle(store: LeaseStore, namespace: str) -> None:
    """Return once every watch-fed cache of `store` agrees with a LIST.

    A watching store learns of another client's write from its watch, a moment
    after the write: it is eventually consistent, as an informer is. The
    contract's tests read right after another client wrote, so the raw
    writers and the second stores of the watching store's tests wait here
    (at most 10 s) before returning: what the contract then checks is what
    the cache shows once the watch caught up.
    """
    if not isinstance(store, KubernetesStore) or not store.watch:
        return
    probe = KubernetesStore(namespace, watch=False)
    try:
        deadline = asyncio.get_running_loop().time() + 10
        while True:
            behind = []
            for cluster, view in list(store._views.items()):
                if view.stale(time.monotonic(), store.stale_after) is not None:
                    continue  # the next read LISTs anyway
                items, _ = await probe._list(probe._selector(cluster))
                want = {o["metadata"]["name"]: o["metadata"]["resourceVersion"] for o in items}
                if want != {name: e.version for name, e in view.entries.items()}:
                    behind.append(cluster)
            if not behind:
                return
            assert asyncio.get_running_loop().time() < deadline, f"caches behind: {behind}"
            await asyncio.sleep(0.02)
    finally:
        await probe.aclose()


class Settling(LeaseStore):
    """Another client whose writes return once `watcher`'s cache shows them."""

    def __init__(self, inner: LeaseStore, watcher: LeaseStore, namespace: str) -> None:
        super().__init__()
        self.inner, self.watcher, self.namespace = inner, watcher, namespace
        assert isinstance(inner, ReportsRequests)
        self.backend_requests = inner.backend_requests

    def describe(self) -> str:
        return self.inner.describe()

    async def aclose(self) -> None:
        await self.inner.aclose()

    async def _settled(self) -> None:
        await settle(self.watcher, self.namespace)

    async def list_leases(self, cluster: str, *,
                          seen: Listed | None = None) -> dict[int, Stored[Lease]]:
        return await self.inner.list_leases(cluster, seen=seen)

    async def get_lease(self, cluster: str, shard: int) -> Stored[Lease] | None:
        return await self.inner.get_lease(cluster, shard)

    async def create_lease(self, lease: Lease) -> str:
        try:
            return await self.inner.create_lease(lease)
        finally:
            await self._settled()

    async def update_lease(self, lease: Lease, version: str) -> str:
        try:
            return await self.inner.update_lease(lease, version)
        finally:
            await self._settled()

    async def list_heartbeats(self, cluster: str) -> dict[str, str]:
        return await self.inner.list_heartbeats(cluster)

    async def get_heartbeat(self, cluster: str, node: str) -> Heartbeat | None:
        return await self.inner.get_heartbeat(cluster, node)

    async def put_heartbeat(self, heartbeat: Heartbeat) -> None:
        await self.inner.put_heartbeat(heartbeat)
        await self._settled()

    async def delete_heartbeat(self, cluster: str, node: str) -> None:
        await self.inner.delete_heartbeat(cluster, node)
        await self._settled()

    async def list_epochs(self, cluster: str) -> dict[tuple[str, str], str]:
        return await self.inner.list_epochs(cluster)

    async def get_epoch(self, cluster: str, node: str, epoch: str) -> Stored[Epoch] | None:
        return await self.inner.get_epoch(cluster, node, epoch)

    async def create_epoch(self, record: Epoch) -> str:
        try:
            return await self.inner.create_epoch(record)
        finally:
            await self._settled()

    async def update_epoch(self, record: Epoch, version: str) -> str:
        try:
            return await self.inner.update_epoch(record, version)
        finally:
            await self._settled()

    async def delete_epoch(self, cluster: str, node: str, epoch: str) -> None:
        await self.inner.delete_epoch(cluster, node, epoch)
        await self._settled()


class TestKubernetesStore(StoreContract):
    """The contract with the watch on (the default)."""

    URL = "kubernetes://{namespace}"

    @pytest.fixture
    async def counted_store(self, namespace: str, kubeconfig: str
                            ) -> AsyncIterator[tuple[LeaseStore, RequestCounter]]:
        """The store, checked, and its requests counted from its making."""
        store = open_store(self.URL.format(namespace=namespace))
        counted = count_requests(store)
        await store.check()
        yield store, counted
        await store.aclose()

    @pytest.fixture
    def store(self, counted_store: tuple[LeaseStore, RequestCounter]) -> LeaseStore:
        return counted_store[0]

    @pytest.fixture
    def counted(self, counted_store: tuple[LeaseStore, RequestCounter]) -> RequestCounter:
        return counted_store[1]

    @pytest.fixture
    def put_raw(self, namespace: str, api_client: Any, store: LeaseStore) -> PutRaw:
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
            await settle(store, namespace)
        return put

    @pytest.fixture
    def delete_raw(self, namespace: str, api_client: Any, store: LeaseStore) -> DeleteRaw:
        coord = client.CoordinationV1Api(api_client)

        async def delete(cluster: str, shard: int) -> None:
            await coord.delete_namespaced_lease(lease_name(cluster, shard), namespace)
            await settle(store, namespace)
        return delete

    @pytest.fixture
    async def make_second_store(self, namespace: str,
                                store: LeaseStore) -> AsyncIterator[MakeStore]:
        opened: list[LeaseStore] = []

        async def make() -> LeaseStore:
            s = Settling(open_store(self.URL.format(namespace=namespace)), store, namespace)
            opened.append(s)
            return s
        yield make
        for s in opened:
            await s.aclose()

    async def test_the_store_reads_as_configured(self, store: LeaseStore,
                                                 counted: RequestCounter) -> None:
        assert isinstance(store, KubernetesStore)
        await store.list_leases(CLUSTER)
        await store.list_heartbeats(CLUSTER)
        if store.watch:
            assert counted["list"] == 2, "the check, then one LIST for both kinds"
            assert store.resyncs == [CLUSTER] and CLUSTER in store._views
        else:
            assert counted["list"] == 3, "the check, then one LIST per read"
            assert counted["watch"] == 0 and not store._views

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


class TestKubernetesStoreWithoutWatch(TestKubernetesStore):
    """The contract with `?watch=0`: every read a LIST."""

    URL = "kubernetes://{namespace}?watch=0"


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
                "kubernetes://ns?colour=blue", "kubernetes://ns?watch=2",
                "kubernetes://ns?watch=0&watch=1", "kubernetes://ns?watch_timeout=soon",
                "kubernetes://ns?watch_timeout=0.5", "kubernetes://ns?watch_timeout=nan"):
        with pytest.raises(ConfigError):
            KubernetesStore.from_url(url)


# -- names -----------------------------------------------------------------------------------------

#: (cluster, kind, name) triples whose old names collided or could have.
TRICKY = [
    ("c", "node", "c-0"), ("c-node-c", "shard", "0"),
    ("a", "node", "b-node-c"), ("a-node-b", "node", "c"),
    ("a", "shard", "12"), ("a-1", "shard", "2"), ("a-12", "shard", "0"),
    ("c", "node", "Pod-0"), ("c", "node", "pod-0"), ("c", "node", "pod_0"),
    ("c", "node", "p.q"), ("c.p", "node", "q"), ("c", "shard", "1"), ("c", "node", "1"),
    ("x" * 63, "node", "y" * 63 + "." + "z" * 63 + "." + "w" * 63),
    ("x" * 63, "node", "y" * 63 + "." + "z" * 63 + "." + "v" * 63),
    ("UPPER", "shard", "0"), ("upper", "shard", "0"),
]


def names_of(triples: list[tuple[str, str, str]]) -> list[str]:
    return [node_object_name(c, n) if kind == "node" else lease_name(c, int(n))
            for c, kind, n in triples]


async def test_lease_names_are_injective_and_valid_object_names(
        namespace: str, api_client: Any, kube: KubeClient) -> None:
    names = names_of(TRICKY)
    assert len(set(names)) == len(TRICKY), sorted(names)
    for name in names:
        assert len(name) <= 253
        assert all(0 < len(label) <= 63 for label in name.split(".")), name
    assert lease_name("c-node-c", 0) != node_object_name("c", "c-0")
    assert legacy_lease_name("c-node-c", 0) == "shardlease-c-node-c-0", "the old name"
    assert not set(names) & {legacy_lease_name(c, int(n)) for c, k, n in TRICKY
                             if k == "shard"}, "a new name met an old one"
    for name in names:  # the API server takes every one of them
        status, payload = await kube.call("POST", LEASES.format(ns=namespace), {
            "apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
            "metadata": {"name": name}, "spec": {}})
        assert status == 201, payload


async def test_a_heartbeat_and_a_shard_lease_whose_old_names_collided_both_exist(
        namespace: str, kubeconfig: str, api_client: Any) -> None:
    # Before: cluster `c` node `c-0`'s heartbeat and cluster `c-node-c` shard 0
    # were both `shardlease-c-node-c-0`, so the shard's create conflicted forever.
    store = open_store(f"kubernetes://{namespace}")
    try:
        await store.put_heartbeat(make_heartbeat("c-0", cluster="c"))
        version = await store.create_lease(make_lease(shard=0, cluster="c-node-c"))
        got = await store.get_lease("c-node-c", 0)
        assert got is not None and got.version == version and got.record is not None
        assert sorted(await store.list_heartbeats("c")) == ["c-0"]
    finally:
        await store.aclose()


# -- records edited or deleted by hand -------------------------------------------------------------


async def test_a_fresh_node_claims_above_a_hand_edited_lease_at_generation_57(
        namespace: str, kubeconfig: str, api_client: Any, kube: KubeClient) -> None:
    # `kubectl edit` dropped the write id of a Lease at generation 57: before,
    # a fresh node took it over at generation 1.
    body = lease_to_object(make_lease(shard=0, owner="gone", generation=57, cluster="hand"),
                           namespace, None, 1000.0)
    del body["metadata"]["annotations"][ANN_WRITE_ID]
    status, payload = await kube.call("POST", LEASES.format(ns=namespace), body)
    assert status == 201, payload
    store = open_store(f"kubernetes://{namespace}")
    telemetry = Telemetry()
    claims: list[Claim] = []
    claimed = asyncio.Event()

    def on_event(event: object) -> None:
        if isinstance(event, Claim):
            claims.append(event)
            claimed.set()

    telemetry.subscribe(on_event)
    loop = PlacementLoop(store, StrictHost(), Options(shards=1, name="fresh", cluster_name="hand",
                                                      lease_ttl=3.0), telemetry=telemetry)
    task = asyncio.create_task(loop.run())
    try:
        await asyncio.wait_for(claimed.wait(), 60)
    finally:
        await loop.stop()
        await task
        await store.aclose()
    assert [c.generation for c in claims] == [58]


async def strip_labels(kube: KubeClient, namespace: str, name: str) -> None:
    """What `kubectl label lease NAME shardlease.io/cluster- ...` does."""
    status, payload = await kube.call("PATCH", f"{LEASES.format(ns=namespace)}/{name}",
                                 {"metadata": {"labels": None}},
                                 "application/merge-patch+json")
    assert status == 200, payload


async def test_a_lease_stripped_of_its_labels_is_found_reported_and_claimed_through(
        namespace: str, kubeconfig: str, api_client: Any, kube: KubeClient,
        caplog: pytest.LogCaptureFixture) -> None:
    ghost = open_store(f"kubernetes://{namespace}")
    node = open_store(f"kubernetes://{namespace}")
    fresh = open_store(f"kubernetes://{namespace}")
    try:
        await ghost.create_lease(make_lease(shard=2, owner="ghost", generation=4))
        await strip_labels(kube, namespace, lease_name(CLUSTER, 2))

        assert 2 not in await node.list_leases(CLUSTER), "the LIST misses it"
        with caplog.at_level("WARNING", logger="shardlease.store.kubernetes"):
            with pytest.raises(Conflict):
                await node.write_lease(make_lease(shard=2, owner="node", generation=1), None)
        assert any("lost its labels" in r.getMessage() for r in caplog.records), caplog.text

        entry = (await node.list_leases(CLUSTER))[2]
        assert entry.record is None and entry.error and "label" in entry.error
        assert entry.generation == 4
        claim = make_lease(shard=2, owner="node", generation=5)
        await node.write_lease(claim, entry.version)
        assert valid((await fresh.list_leases(CLUSTER))[2]) == claim, "labelled again"
    finally:
        for s in (ghost, node, fresh):
            await s.aclose()


async def test_a_lease_under_its_old_name_stays_the_shards_lease(
        namespace: str, kubeconfig: str, api_client: Any, kube: KubeClient) -> None:
    # As an earlier version wrote it: `shardlease-<cluster>-<shard>`, labelled.
    old = make_lease(shard=3, owner="old-node", generation=41)
    body = lease_to_object(old, namespace, None, old.renewed_at,
                           name=legacy_lease_name(CLUSTER, 3))
    status, payload = await kube.call("POST", LEASES.format(ns=namespace), body)
    assert status == 201, payload
    coord = client.CoordinationV1Api(api_client)
    store = open_store(f"kubernetes://{namespace}")
    try:
        listed = await store.list_leases(CLUSTER)
        assert valid(listed[3]) == old
        got = await store.get_lease(CLUSTER, 3)
        assert got is not None and got.version == listed[3].version and valid(got) == old
        claim = rewrite(old, owner="new-node", generation=42)
        version = await store.write_lease(claim, listed[3].version)
        # Written through the old object, which old nodes still read.
        written = await coord.read_namespaced_lease(legacy_lease_name(CLUSTER, 3), namespace)
        assert (written.spec.holder_identity, written.spec.lease_transitions) == ("new-node", 42)
        assert await store.get_lease(CLUSTER, 3) == listed[3].__class__(version, claim)
        with pytest.raises(client.ApiException):
            await coord.read_namespaced_lease(lease_name(CLUSTER, 3), namespace)
        renewed = rewrite(claim)
        await store.write_lease(renewed, version)
        assert valid((await store.list_leases(CLUSTER))[3]) == renewed
    finally:
        await store.aclose()


async def test_a_heartbeat_under_its_old_name_does_not_hide_the_current_one(
        namespace: str, kubeconfig: str, api_client: Any) -> None:
    coord = client.CoordinationV1Api(api_client)
    await coord.create_namespaced_lease(namespace, {
        "apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
        "metadata": {"name": "shardlease-contract-node-zz-0",
                     "labels": {LABEL_CLUSTER: CLUSTER, LABEL_KIND: "heartbeat"},
                     "annotations": {"shardlease.io/node": "zz-0"}},
        "spec": {"holderIdentity": "zz-0"}})
    store = open_store(f"kubernetes://{namespace}")
    try:
        versions = set()
        for seq in range(3):
            await store.put_heartbeat(make_heartbeat("zz-0", seq=seq))
            versions.add((await store.list_heartbeats(CLUSTER))["zz-0"])
        assert len(versions) == 3, "the old object's unchanging version was listed"
    finally:
        await store.aclose()
