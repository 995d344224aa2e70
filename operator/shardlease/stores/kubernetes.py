"""Kubernetes store: one `coordination.k8s.io/v1` Lease per shard and per node.

`kubernetes://NAMESPACE` (in-cluster config, else KUBECONFIG; `?context=NAME`
picks a kubeconfig context). A shard's Lease is named
`shardlease-<cluster>-<shard>` and labelled with the cluster and the shard, so
`kubectl get leases -l shardlease.io/cluster=<cluster>` shows the holders:

    spec.holderIdentity        owner (absent when free)
    spec.leaseTransitions      generation (the fencing token)
    spec.acquireTime           when the current owner claimed it
    spec.renewTime             last renewal (wall clock, informational)
    spec.leaseDurationSeconds  lease_ttl, rounded up
    annotations                incarnation and write id (see records.Lease)

Every write is a replace carrying the resourceVersion last read, so the API
server refuses a stale one with 409 (the race is lost). Reads are one
label-selected LIST per round for the leases and one for the heartbeats.

Responses are read as raw JSON rather than the client's typed models: the
typed deserializer is slow for a thousand Leases a round, and a Lease written
by hand must reach our own validation (reported, not raised) intact.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import hashlib
import json
import logging
import math
import os
import re
from typing import Any
from urllib.parse import parse_qs, urlsplit

from pydantic import ValidationError

from shardlease.errors import ConfigError, Conflict, StoreError
from shardlease.records import MAX_RECORD_BYTES, Heartbeat, Lease, Stored
from shardlease.stores.base import LeaseStore

logger = logging.getLogger("shardlease.store.kubernetes")

GROUP = "shardlease.io"
LABEL_CLUSTER = f"{GROUP}/cluster"
LABEL_SHARD = f"{GROUP}/shard"
LABEL_KIND = f"{GROUP}/kind"
ANN_INCARNATION = f"{GROUP}/incarnation"
ANN_WRITE_ID = f"{GROUP}/write-id"
ANN_TTL = f"{GROUP}/ttl"
ANN_NODE = f"{GROUP}/node"
LEASES = "/apis/coordination.k8s.io/v1/namespaces/{ns}/leases"
PAGE = 500
#: Largest Lease object accepted (without managedFields), in bytes.
OBJECT_LIMIT = MAX_RECORD_BYTES
_DNS_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")


def _micro(ts: float) -> str:
    return dt.datetime.fromtimestamp(ts, dt.UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def _epoch(text: str | None) -> float:
    if not text:
        return 0.0
    return dt.datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp()


def node_object_name(cluster: str, node: str) -> str:
    """A heartbeat Lease's name: readable when the node name fits, hashed when not."""
    name = f"shardlease-{cluster}-node-{node}".lower()
    if len(name) <= 253 and all(_DNS_LABEL.match(p) for p in name.split(".")):
        return name
    digest = hashlib.sha256(node.encode()).hexdigest()[:16]
    return f"shardlease-{cluster}-node-{digest}"


def lease_to_object(lease: Lease, namespace: str, version: str | None,
                    acquired: float | None) -> dict[str, Any]:
    spec: dict[str, Any] = {
        "leaseTransitions": lease.generation,
        "leaseDurationSeconds": max(1, math.ceil(lease.ttl)),
        "renewTime": _micro(lease.renewed_at),
    }
    if lease.owner is not None:
        spec["holderIdentity"] = lease.owner
        spec["acquireTime"] = _micro(acquired if acquired is not None else lease.renewed_at)
    annotations = {ANN_WRITE_ID: lease.write_id, ANN_TTL: repr(lease.ttl)}
    if lease.incarnation:
        annotations[ANN_INCARNATION] = lease.incarnation
    meta: dict[str, Any] = {
        "name": lease_name(lease.cluster, lease.shard),
        "namespace": namespace,
        "labels": {LABEL_CLUSTER: lease.cluster, LABEL_SHARD: str(lease.shard),
                   LABEL_KIND: "shard"},
        "annotations": annotations,
    }
    if version is not None:
        meta["resourceVersion"] = version
    return {"apiVersion": "coordination.k8s.io/v1", "kind": "Lease", "metadata": meta,
            "spec": spec}


def lease_name(cluster: str, shard: int) -> str:
    return f"shardlease-{cluster}-{shard}"


def shard_of(name: str, cluster: str) -> int | None:
    """The shard a Lease name stands for in `cluster`, or None if it is not one."""
    suffix = name.removeprefix(f"shardlease-{cluster}-")
    return int(suffix) if suffix != name and suffix.isdigit() else None


def _size(obj: dict[str, Any]) -> int:
    meta = {k: v for k, v in (obj.get("metadata") or {}).items() if k != "managedFields"}
    return len(json.dumps({"metadata": meta, "spec": obj.get("spec")}))


def object_to_lease(obj: dict[str, Any], cluster: str, shard: int) -> Stored[Lease]:
    """Validate a Lease object stored as `cluster`'s shard `shard`; never raises.

    The object's name is where it is stored; its labels, spec and annotations
    are its content, checked like any record read from a shared store.
    """
    meta = obj.get("metadata") or {}
    version = str(meta.get("resourceVersion", ""))
    name = meta.get("name")
    try:
        size = _size(obj)
        if size > OBJECT_LIMIT:
            raise ValueError(f"the object is {size} bytes, more than the {OBJECT_LIMIT} allowed")
        labels = meta.get("labels") or {}
        ann = meta.get("annotations") or {}
        spec = obj.get("spec") or {}
        if labels.get(LABEL_CLUSTER) != cluster:
            raise ValueError(f"its cluster label is {labels.get(LABEL_CLUSTER)!r}, "
                             f"not {cluster!r}")
        if labels.get(LABEL_SHARD) != str(shard):
            raise ValueError(f"its shard label is {labels.get(LABEL_SHARD)!r}, "
                             f"but it is stored as shard {shard}")
        ttl = float(ann.get(ANN_TTL) or spec.get("leaseDurationSeconds") or 0)
        lease = Lease.model_validate({
            "cluster": cluster,
            "shard": shard,
            "owner": spec.get("holderIdentity") or None,
            "generation": spec.get("leaseTransitions"),
            "incarnation": ann.get(ANN_INCARNATION),
            "write_id": ann.get(ANN_WRITE_ID),
            "renewed_at": _epoch(spec.get("renewTime")),
            "ttl": max(ttl, float(spec.get("leaseDurationSeconds") or 0)),
        })
        return Stored(version, lease)
    except ValidationError as e:
        first = e.errors()[0]
        msg = (f"{e.error_count()} problem(s); first: "
               f"{'.'.join(map(str, first['loc']))}: {first['msg']}")
        return Stored(version, None, f"invalid lease object {name!r}: {msg}")
    except (ValueError, TypeError) as e:
        return Stored(version, None, f"invalid lease object {name!r}: {e}")


async def call(api: Any, method: str, path: str, body: Any = None,
               content_type: str = "application/json", request_timeout: float = 15.0,
               query: list[tuple[str, str]] | None = None) -> tuple[int, dict[str, Any]]:
    """One raw JSON call to the API server: (HTTP status, decoded JSON body);
    never raises for an HTTP status. Shared with the agent and the operator.

    kubernetes_asyncio's typed models are skipped on purpose: they are slow to
    deserialize and hide the server's error message, which is what a user needs.
    """
    resp = await api.call_api(
        path, method, query_params=query or [],
        header_params={"Content-Type": content_type, "Accept": "application/json"},
        body=body, auth_settings=["BearerToken"], _preload_content=False,
        _request_timeout=request_timeout)
    if isinstance(resp, tuple):
        resp = resp[0]
    try:
        data = await resp.read()
    finally:
        resp.release()
    try:
        payload = json.loads(data) if data else {}
    except ValueError:
        payload = {"message": data[:300].decode(errors="replace")}
    return int(resp.status), payload


async def api_client(kubeconfig: str | None = None, context: str | None = None) -> Any:
    """A kubernetes_asyncio ApiClient: in-cluster config inside a pod (unless a
    kubeconfig or context is named), else KUBECONFIG / ~/.kube/config."""
    from kubernetes_asyncio import config
    from kubernetes_asyncio.client import ApiClient, Configuration

    conf = Configuration()
    try:
        if os.environ.get("KUBERNETES_SERVICE_HOST") and not kubeconfig and not context:
            config.load_incluster_config(client_configuration=conf)  # type: ignore[no-untyped-call]
        else:
            # Read KUBECONFIG now: the client library reads it once, at import.
            await config.load_kube_config(
                config_file=kubeconfig or os.environ.get("KUBECONFIG"), context=context,
                client_configuration=conf)
    except Exception as e:
        raise StoreError(
            f"no usable Kubernetes configuration (in-cluster or KUBECONFIG): {e}") from None
    return ApiClient(configuration=conf)


class KubernetesStore(LeaseStore):
    def __init__(self, namespace: str, *, context: str | None = None,
                 kubeconfig: str | None = None, timeout: float = 10.0) -> None:
        super().__init__()
        if not _DNS_LABEL.match(namespace) or len(namespace) > 63:
            raise ConfigError(f"kubernetes store: {namespace!r} is not a namespace name")
        self.namespace = namespace
        self.context = context
        self.kubeconfig = kubeconfig
        self.timeout = timeout
        self._api: Any = None
        self._lock = asyncio.Lock()
        self._beat_versions: dict[tuple[str, str], str] = {}
        #: (cluster, shard) -> (generation, acquireTime) of the claims this store wrote.
        self._acquired: dict[tuple[str, int], tuple[int, float]] = {}

    @classmethod
    def from_url(cls, url: str) -> KubernetesStore:
        parts = urlsplit(url)
        query = parse_qs(parts.query)
        unknown = set(query) - {"context", "kubeconfig"}
        if not parts.netloc or parts.path not in ("", "/") or unknown:
            raise ConfigError(
                f"kubernetes store URL {url!r} must look like kubernetes://NAMESPACE "
                "(optional ?context=NAME&kubeconfig=PATH)")
        return cls(parts.netloc, context=query.get("context", [None])[0],
                   kubeconfig=query.get("kubeconfig", [None])[0])

    def describe(self) -> str:
        return f"kubernetes://{self.namespace}"

    async def _client(self) -> Any:
        async with self._lock:
            if self._api is None:
                self._api = await api_client(self.kubeconfig, self.context)
            return self._api

    async def aclose(self) -> None:
        if self._api is not None:
            await self._api.close()
            self._api = None

    async def _request(self, method: str, path: str, *, query: list[tuple[str, str]] | None = None,
                       body: Any = None, kind: str) -> tuple[int, dict[str, Any]]:
        api = await self._client()
        self._count(kind)
        content_type = ("application/merge-patch+json" if method == "PATCH"
                        else "application/json")
        try:
            status, payload = await call(api, method, path, body, content_type,
                                         request_timeout=self.timeout, query=query)
        except Exception as e:  # connection errors, timeouts (aiohttp's are not OSErrors)
            raise StoreError(f"kubernetes store: {method} {path} failed: {e!r}") from None
        if status in (401, 403):
            raise StoreError(
                f"kubernetes store: {method} {path} was refused ({status}): "
                f"{payload.get('message', '')}; the service account needs get, list, create, "
                f"update, patch and delete on leases.coordination.k8s.io in namespace "
                f"{self.namespace}")
        return status, payload

    def _fail(self, what: str, status: int, payload: dict[str, Any]) -> StoreError:
        return StoreError(f"kubernetes store: {what}: {status} {payload.get('reason', '')} "
                          f"{payload.get('message', '')}".rstrip())

    def _path(self, name: str | None = None) -> str:
        base = LEASES.format(ns=self.namespace)
        return base if name is None else f"{base}/{name}"

    async def check(self) -> None:
        status, payload = await self._request(
            "GET", self._path(), query=[("limit", "1")], kind="list")
        if status == 404:
            raise StoreError(f"kubernetes store: namespace {self.namespace!r} or the "
                             "coordination.k8s.io/v1 API does not exist")
        if status != 200:
            raise self._fail(f"listing leases in {self.namespace}", status, payload)

    async def _list(self, selector: str) -> list[dict[str, Any]]:
        items: list[dict[str, Any]] = []
        cont = ""
        while True:
            query = [("labelSelector", selector), ("limit", str(PAGE))]
            if cont:
                query.append(("continue", cont))
            status, payload = await self._request("GET", self._path(), query=query, kind="list")
            if status != 200:
                raise self._fail(f"listing leases {selector}", status, payload)
            items.extend(payload.get("items") or [])
            cont = (payload.get("metadata") or {}).get("continue") or ""
            if not cont:
                return items

    async def list_leases(self, cluster: str) -> dict[int, Stored[Lease]]:
        items = await self._list(f"{LABEL_CLUSTER}={cluster},{LABEL_KIND}=shard")
        out: dict[int, Stored[Lease]] = {}
        for obj in items:
            name = (obj.get("metadata") or {}).get("name", "")
            shard = shard_of(name, cluster)
            if shard is None:
                logger.warning("Lease %s/%s carries the labels of cluster %s but is not named "
                               "like one of its shards; ignored", self.namespace, name, cluster)
                continue
            out[shard] = object_to_lease(obj, cluster, shard)
        return out

    async def get_lease(self, cluster: str, shard: int) -> Stored[Lease] | None:
        status, payload = await self._request(
            "GET", self._path(lease_name(cluster, shard)), kind="get")
        if status == 404:
            return None
        if status != 200:
            raise self._fail(f"reading lease {cluster}/{shard}", status, payload)
        return object_to_lease(payload, cluster, shard)

    async def create_lease(self, lease: Lease) -> str:
        body = lease_to_object(lease, self.namespace, None, lease.renewed_at)
        status, payload = await self._request("POST", self._path(), body=body, kind="put")
        if status == 409:
            raise Conflict(f"lease {lease.cluster}/{lease.shard} exists")
        if status not in (200, 201):
            raise self._fail(f"creating lease {lease.cluster}/{lease.shard}", status, payload)
        self._acquired[(lease.cluster, lease.shard)] = (lease.generation, lease.renewed_at)
        return str(payload["metadata"]["resourceVersion"])

    async def update_lease(self, lease: Lease, version: str) -> str:
        key = (lease.cluster, lease.shard)
        # acquireTime moves only on a claim (a new generation): a renewal keeps
        # the claim time this store wrote.
        claim = self._acquired.get(key)
        if claim is None or claim[0] != lease.generation:
            claim = (lease.generation, lease.renewed_at)
        body = lease_to_object(lease, self.namespace, version, claim[1])
        name = body["metadata"]["name"]
        # A merge patch carrying metadata.resourceVersion, not a PUT: the API
        # server honours the version as a precondition either way (409), but
        # a PUT of a missing Lease *creates* it (Leases allow create on
        # update), which would let a stale owner resurrect a deleted lease.
        spec = body["spec"]
        for field in ("holderIdentity", "acquireTime"):
            spec.setdefault(field, None)
        body["metadata"]["annotations"].setdefault(ANN_INCARNATION, None)
        status, payload = await self._request("PATCH", self._path(name), body=body, kind="put")
        if status in (409, 404):
            raise Conflict(f"lease {lease.cluster}/{lease.shard} changed since version {version}")
        if status != 200:
            raise self._fail(f"replacing lease {lease.cluster}/{lease.shard}", status, payload)
        if lease.owner is None:
            self._acquired.pop(key, None)
        else:
            self._acquired[key] = claim
        return str(payload["metadata"]["resourceVersion"])

    async def list_heartbeats(self, cluster: str) -> dict[str, str]:
        items = await self._list(f"{LABEL_CLUSTER}={cluster},{LABEL_KIND}=heartbeat")
        out = {}
        for obj in items:
            meta = obj.get("metadata") or {}
            node = (meta.get("annotations") or {}).get(ANN_NODE)
            if isinstance(node, str) and node:
                out[node] = str(meta.get("resourceVersion", ""))
        return out

    async def put_heartbeat(self, heartbeat: Heartbeat) -> None:
        # Each node writes only its own heartbeat: a merge patch needs no
        # version, and a create follows only the first beat.
        name = node_object_name(heartbeat.cluster, heartbeat.node)
        patch = {"metadata": {"annotations": {ANN_WRITE_ID: heartbeat.write_id,
                                              ANN_INCARNATION: heartbeat.incarnation}},
                 "spec": {"renewTime": _micro(heartbeat.at)}}
        key = (heartbeat.cluster, heartbeat.node)
        if key in self._beat_versions:
            status, payload = await self._request("PATCH", self._path(name), body=patch,
                                                  kind="put")
            if status == 200:
                return
            if status != 404:
                raise self._fail(f"heartbeat of {heartbeat.node}", status, payload)
        body = {
            "apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
            "metadata": {"name": name, "namespace": self.namespace,
                         "labels": {LABEL_CLUSTER: heartbeat.cluster, LABEL_KIND: "heartbeat"},
                         "annotations": {ANN_NODE: heartbeat.node,
                                         ANN_WRITE_ID: heartbeat.write_id,
                                         ANN_INCARNATION: heartbeat.incarnation}},
            "spec": {"holderIdentity": heartbeat.node, "renewTime": _micro(heartbeat.at)},
        }
        status, payload = await self._request("POST", self._path(), body=body, kind="put")
        if status == 409:
            status, payload = await self._request("PATCH", self._path(name), body=patch,
                                                  kind="put")
        if status not in (200, 201):
            raise self._fail(f"heartbeat of {heartbeat.node}", status, payload)
        self._beat_versions[key] = str(payload["metadata"]["resourceVersion"])

    async def delete_heartbeat(self, cluster: str, node: str) -> None:
        name = node_object_name(cluster, node)
        status, payload = await self._request("DELETE", self._path(name), kind="delete")
        self._beat_versions.pop((cluster, node), None)
        if status not in (200, 202, 404):
            raise self._fail(f"deleting the heartbeat of {node}", status, payload)
