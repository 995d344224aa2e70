"""Kubernetes store: one `coordination.k8s.io/v1` Lease per shard and per node.

`kubernetes://NAMESPACE` (in-cluster config, else KUBECONFIG; `?context=NAME`
picks a kubeconfig context). A shard's Lease is named
`shardlease.<cluster>.shard.<shard>`, a node's heartbeat
`shardlease.<cluster>.node.<node>` (see `lease_name`: names are injective),
and both are labelled with the cluster (and the shard), so
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

A Lease whose labels were removed (`kubectl label ... shardlease.io/cluster-`)
drops out of the label-selected LIST, but its name still takes the shard: a
create then conflicts with a lease the LIST did not show. The store reads it
by name, reports it, and from then on lists it with the others (a corrupt
record, since its labels are wrong), so the loop holds it until it expires and
then claims through it, which writes the labels back.

Upgrading from the names before `shardlease.<cluster>.shard.<shard>`: they were
`shardlease-<cluster>-<shard>` and `shardlease-<cluster>-node-<node>`, which
could collide across clusters (cluster `c` node `c-0` and cluster `c-node-c`
shard 0 were both `shardlease-c-node-c-0`). A shard Lease under its old name,
labelled for its cluster and shard, stays that shard's lease for as long as it
exists: it is listed, renewed and claimed under the old name (its version says
so), so old and new nodes running side by side during a rolling upgrade share
one object per shard and the generation carries on. Only shards that had no
Lease at all get the new name. What is not safe: a shard that gets its first
Lease while old and new nodes run side by side (a cluster started, or its
shard count raised, during the rollout) can get one object under each name,
so finish a rollout before changing the shard count; the store reports a
shard with both. Old heartbeat objects are left behind: a node's current
heartbeat wins over its old one in the listing, and an old one that no longer
changes counts as a dead node's. Once no old version runs they can be deleted
by name (old names start `shardlease-` but not `shardlease-h.`); do not delete
the heartbeats by label: deleting a live node's heartbeat reads as that node
stopping, and moves shards.

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
from shardlease.records import (
    MAX_RECORD_BYTES,
    Epoch,
    Heartbeat,
    Lease,
    Stored,
    encode,
    stored_epoch,
)
from shardlease.stores.base import LeaseStore

logger = logging.getLogger("shardlease.store.kubernetes")

GROUP = "shardlease.io"
LABEL_CLUSTER = f"{GROUP}/cluster"
LABEL_SHARD = f"{GROUP}/shard"
LABEL_KIND = f"{GROUP}/kind"
ANN_INCARNATION = f"{GROUP}/incarnation"
ANN_WRITE_ID = f"{GROUP}/write-id"
ANN_TTL = f"{GROUP}/ttl"
#: The record's `since`, exactly (acquireTime shows it to kubectl users too,
#: but only to the microsecond, and the record must read back as written).
ANN_SINCE = f"{GROUP}/since"
ANN_NODE = f"{GROUP}/node"
#: "node" on a lease kept by its owner's epoch (absent: "shard").
ANN_RENEWAL = f"{GROUP}/renewal"
ANN_EPOCH = f"{GROUP}/epoch"
#: An epoch record, whole (its JSON), on the epoch's Lease object.
ANN_RECORD = f"{GROUP}/record"
LEASES = "/apis/coordination.k8s.io/v1/namespaces/{ns}/leases"
PAGE = 500
#: Largest Lease object accepted (without managedFields), in bytes.
OBJECT_LIMIT = MAX_RECORD_BYTES
_DNS_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
#: A Lease object name is a DNS subdomain: at most this long.
_NAME_MAX = 253
#: Version prefix of a shard Lease stored under its pre-injective name.
_LEGACY = "legacy:"


def _micro(ts: float) -> str:
    return dt.datetime.fromtimestamp(ts, dt.UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def _epoch(text: str | None) -> float:
    if not text:
        return 0.0
    return dt.datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp()


def _informational_float(text: Any) -> float:
    """`since` only feeds `shardlease owners`: a bad one is 0, not a corrupt record."""
    try:
        value = float(text) if isinstance(text, str) else 0.0
    except ValueError:
        return 0.0
    return value if math.isfinite(value) and value > 0 else 0.0


def _is_label(text: str) -> bool:
    return len(text) <= 63 and bool(_DNS_LABEL.match(text))


def object_name(cluster: str, kind: str, name: str) -> str:
    """The Lease object name of (cluster, kind, name); no two triples share one.

    Readable form `shardlease.<cluster>.<kind>.<name>`: the cluster is one DNS
    label (no dot) and the kind a fixed word, so the name can be read back
    into its parts and two triples never meet. When a part does not fit that
    form (a cluster that is not a DNS label, a node name with capitals or
    `_`, a name too long), the hashed form `shardlease-h.<kind>.<sha256 of the
    triple>` is used: its first label is `shardlease-h`, never `shardlease`,
    so it cannot meet a readable name, and the old (pre-injective) names all
    start `shardlease-<cluster>-` and end in `-<digits>` or hold `-node-`,
    which 40 hex digits never do.
    """
    readable = f"shardlease.{cluster}.{kind}.{name}"
    if _is_label(cluster) and len(readable) <= _NAME_MAX \
            and all(_is_label(part) for part in name.split(".")):
        return readable
    digest = hashlib.sha256(json.dumps([cluster, kind, name]).encode()).hexdigest()[:40]
    return f"shardlease-h.{kind}.{digest}"


def node_object_name(cluster: str, node: str) -> str:
    """A heartbeat Lease's name."""
    return object_name(cluster, "node", node)


def epoch_object_name(cluster: str, node: str, epoch: str) -> str:
    """An epoch Lease's name (epoch ids have no dot, so the pair reads back)."""
    return object_name(cluster, "epoch", f"{node}.{epoch}")


def lease_name(cluster: str, shard: int) -> str:
    """A shard Lease's name."""
    return object_name(cluster, "shard", str(shard))


def _shard_named(name: str, prefix: str) -> int | None:
    """The shard number after `prefix` in `name` (canonical decimal), or None."""
    rest = name.removeprefix(prefix)
    if rest == name or not rest.isascii() or not rest.isdigit() or str(int(rest)) != rest:
        return None
    return int(rest)


def legacy_lease_name(cluster: str, shard: int) -> str:
    """A shard Lease's name before names were injective (see the module doc)."""
    return f"shardlease-{cluster}-{shard}"


def lease_to_object(lease: Lease, namespace: str, version: str | None,
                    acquired: float | None, name: str | None = None) -> dict[str, Any]:
    spec: dict[str, Any] = {
        "leaseTransitions": lease.generation,
        "leaseDurationSeconds": max(1, math.ceil(lease.ttl)),
        "renewTime": _micro(lease.renewed_at),
    }
    if lease.owner is not None:
        spec["holderIdentity"] = lease.owner
        spec["acquireTime"] = _micro(lease.since or (acquired if acquired is not None
                                                     else lease.renewed_at))
    annotations = {ANN_WRITE_ID: lease.write_id, ANN_TTL: repr(lease.ttl)}
    if lease.since:
        annotations[ANN_SINCE] = repr(lease.since)
    if lease.incarnation:
        annotations[ANN_INCARNATION] = lease.incarnation
    if lease.renewal != "shard":
        annotations[ANN_RENEWAL] = lease.renewal
    meta: dict[str, Any] = {
        "name": name or lease_name(lease.cluster, lease.shard),
        "namespace": namespace,
        "labels": {LABEL_CLUSTER: lease.cluster, LABEL_SHARD: str(lease.shard),
                   LABEL_KIND: "shard"},
        "annotations": annotations,
    }
    if version is not None:
        meta["resourceVersion"] = version
    return {"apiVersion": "coordination.k8s.io/v1", "kind": "Lease", "metadata": meta,
            "spec": spec}


def _size(obj: dict[str, Any]) -> int:
    meta = {k: v for k, v in (obj.get("metadata") or {}).items() if k != "managedFields"}
    return len(json.dumps({"metadata": meta, "spec": obj.get("spec")}))


def _recovered_generation(obj: dict[str, Any]) -> int | None:
    """`spec.leaseTransitions` of a Lease that is not a valid record, if usable."""
    spec = obj.get("spec")
    value = spec.get("leaseTransitions") if isinstance(spec, dict) else None
    if isinstance(value, int) and not isinstance(value, bool) and value >= 0:
        return value
    return None


def object_to_lease(obj: dict[str, Any], cluster: str, shard: int,
                    version_prefix: str = "") -> Stored[Lease]:
    """Validate a Lease object stored as `cluster`'s shard `shard`; never raises.

    The object's name is where it is stored; its labels, spec and annotations
    are its content, checked like any record read from a shared store. A
    corrupt one still gives its `leaseTransitions` as the recovered generation.
    """
    meta = obj.get("metadata") or {}
    version = version_prefix + str(meta.get("resourceVersion", ""))
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
            "since": _informational_float(ann.get(ANN_SINCE)),
            "ttl": max(ttl, float(spec.get("leaseDurationSeconds") or 0)),
            "renewal": ann.get(ANN_RENEWAL) or "shard",
        })
        return Stored(version, lease)
    except ValidationError as e:
        first = e.errors()[0]
        msg = (f"{e.error_count()} problem(s); first: "
               f"{'.'.join(map(str, first['loc']))}: {first['msg']}")
        return Stored(version, None, f"invalid lease object {name!r}: {msg}",
                      _recovered_generation(obj))
    except (ValueError, TypeError, AttributeError) as e:
        return Stored(version, None, f"invalid lease object {name!r}: {e}",
                      _recovered_generation(obj))


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
        #: Shard Leases found by name that the label-selected LIST does not show
        #: (labels removed), listed by name until the LIST shows them again.
        self._hidden: set[tuple[str, int]] = set()
        #: Shards reported as having a Lease under both the old and the new name.
        self._reported_twice: set[tuple[str, int]] = set()

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
        current: dict[int, Stored[Lease]] = {}
        legacy: dict[int, Stored[Lease]] = {}
        for obj in items:
            meta = obj.get("metadata") or {}
            name = str(meta.get("name", ""))
            # The name says where a record is stored (its labels are content,
            # checked by object_to_lease); the shard label only helps find a
            # hashed name.
            label = str((meta.get("labels") or {}).get(LABEL_SHARD, ""))
            hint = int(label) if label.isascii() and label.isdigit() else None
            if (shard := _shard_named(name, f"shardlease.{cluster}.shard.")) is not None \
                    and name == lease_name(cluster, shard):
                current[shard] = object_to_lease(obj, cluster, shard)
            elif hint is not None and name == lease_name(cluster, hint):
                current[hint] = object_to_lease(obj, cluster, hint)
            elif (shard := _shard_named(name, f"shardlease-{cluster}-")) is not None:
                legacy[shard] = object_to_lease(obj, cluster, shard, _LEGACY)
            else:
                logger.warning("Lease %s/%s carries the labels of cluster %s but is not named "
                               "like one of its shards; ignored", self.namespace, name, cluster)
        out = {**legacy, **current}
        for shard in sorted(set(legacy) & set(current)):
            if (cluster, shard) not in self._reported_twice:
                self._reported_twice.add((cluster, shard))
                logger.error(
                    "shard %d of cluster %s has a Lease under its old name %s and one under "
                    "its new name %s (created while old and new versions ran side by side); "
                    "the new one is used: delete the old one once no old version runs",
                    shard, cluster, legacy_lease_name(cluster, shard), lease_name(cluster, shard))
        for key in sorted(self._hidden):
            hidden_cluster, shard = key
            if hidden_cluster != cluster:
                continue
            if shard in out:
                self._hidden.discard(key)  # labelled again: the LIST shows it
                continue
            found = await self._get_named(lease_name(cluster, shard), cluster, shard)
            if found is None:
                self._hidden.discard(key)
            else:
                out[shard] = found
        return self._observed_all(cluster, out)

    async def _get_named(self, name: str, cluster: str, shard: int,
                         legacy: bool = False) -> Stored[Lease] | None:
        status, payload = await self._request("GET", self._path(name), kind="get")
        if status == 404:
            return None
        if status != 200:
            raise self._fail(f"reading lease {cluster}/{shard}", status, payload)
        if legacy:
            # An old name may belong to something else (they collided): only
            # an object labelled as this very shard's lease is one.
            labels = (payload.get("metadata") or {}).get("labels") or {}
            if (labels.get(LABEL_CLUSTER), labels.get(LABEL_KIND), labels.get(LABEL_SHARD)) \
                    != (cluster, "shard", str(shard)):
                return None
            return object_to_lease(payload, cluster, shard, _LEGACY)
        return object_to_lease(payload, cluster, shard)

    async def get_lease(self, cluster: str, shard: int) -> Stored[Lease] | None:
        found = await self._get_named(lease_name(cluster, shard), cluster, shard)
        if found is None:
            found = await self._get_named(legacy_lease_name(cluster, shard), cluster, shard,
                                          legacy=True)
        return self._observed_one(cluster, shard, found)

    async def create_lease(self, lease: Lease) -> str:
        body = lease_to_object(lease, self.namespace, None, lease.renewed_at)
        status, payload = await self._request("POST", self._path(), body=body, kind="put")
        if status == 409:
            await self._look_for_hidden(lease.cluster, lease.shard)
            raise Conflict(f"lease {lease.cluster}/{lease.shard} exists")
        if status not in (200, 201):
            raise self._fail(f"creating lease {lease.cluster}/{lease.shard}", status, payload)
        self._acquired[(lease.cluster, lease.shard)] = (lease.generation, lease.renewed_at)
        return str(payload["metadata"]["resourceVersion"])

    async def _look_for_hidden(self, cluster: str, shard: int) -> None:
        """A create conflicted: if the object in the way is one the label-
        selected LIST cannot show, report it and list it by name from now on."""
        key = (cluster, shard)
        if key in self._hidden:
            return
        name = lease_name(cluster, shard)
        status, payload = await self._request("GET", self._path(name), kind="get")
        if status != 200:
            return
        labels = (payload.get("metadata") or {}).get("labels") or {}
        if labels.get(LABEL_CLUSTER) == cluster and labels.get(LABEL_KIND) == "shard":
            return  # the LIST shows it: an ordinary lost race
        self._hidden.add(key)
        logger.warning(
            "Lease %s/%s (shard %d of cluster %s) has lost its labels %s=%s and %s=shard, so "
            "listings miss it, but its name still takes the shard: it is treated as a corrupt "
            "record (held until it expires, then claimed, which labels it again)",
            self.namespace, name, shard, cluster, LABEL_CLUSTER, cluster, LABEL_KIND)

    async def update_lease(self, lease: Lease, version: str) -> str:
        key = (lease.cluster, lease.shard)
        # acquireTime moves only on a claim (a new generation): a renewal keeps
        # the claim time this store wrote.
        claim = self._acquired.get(key)
        if claim is None or claim[0] != lease.generation:
            claim = (lease.generation, lease.renewed_at)
        name = lease_name(lease.cluster, lease.shard)
        if version.startswith(_LEGACY):
            version = version.removeprefix(_LEGACY)
            name = legacy_lease_name(lease.cluster, lease.shard)
        body = lease_to_object(lease, self.namespace, version, claim[1], name)
        # A merge patch carrying metadata.resourceVersion, not a PUT: the API
        # server honours the version as a precondition either way (409), but
        # a PUT of a missing Lease *creates* it (Leases allow create on
        # update), which would let a stale owner resurrect a deleted lease.
        spec = body["spec"]
        for field in ("holderIdentity", "acquireTime"):
            spec.setdefault(field, None)
        body["metadata"]["annotations"].setdefault(ANN_INCARNATION, None)
        body["metadata"]["annotations"].setdefault(ANN_RENEWAL, None)
        status, payload = await self._request("PATCH", self._path(name), body=body, kind="put")
        if status in (409, 404):
            raise Conflict(f"lease {lease.cluster}/{lease.shard} changed since version {version}")
        if status == 400 and not version.isdigit():
            # Not a resourceVersion the API server could have given.
            raise Conflict(f"lease {lease.cluster}/{lease.shard}: {version!r} is not a version "
                           "of this store")
        if status != 200:
            raise self._fail(f"replacing lease {lease.cluster}/{lease.shard}", status, payload)
        if lease.owner is None:
            self._acquired.pop(key, None)
        else:
            self._acquired[key] = claim
        new = str(payload["metadata"]["resourceVersion"])
        return _LEGACY + new if name != lease_name(lease.cluster, lease.shard) else new

    async def list_heartbeats(self, cluster: str) -> dict[str, str]:
        items = await self._list(f"{LABEL_CLUSTER}={cluster},{LABEL_KIND}=heartbeat")
        out: dict[str, str] = {}
        for obj in items:
            meta = obj.get("metadata") or {}
            node = (meta.get("annotations") or {}).get(ANN_NODE)
            if not isinstance(node, str) or not node:
                continue
            # A node's heartbeat under its old name (an earlier version, see
            # the module doc) must not hide the current one, whatever the order.
            if node in out and meta.get("name") != node_object_name(cluster, node):
                continue
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

    # -- epochs (node-mode renewal) -----------------------------------------------------

    async def list_epochs(self, cluster: str) -> dict[tuple[str, str], str]:
        items = await self._list(f"{LABEL_CLUSTER}={cluster},{LABEL_KIND}=epoch")
        out: dict[tuple[str, str], str] = {}
        for obj in items:
            meta = obj.get("metadata") or {}
            ann = meta.get("annotations") or {}
            node, epoch = ann.get(ANN_NODE), ann.get(ANN_EPOCH)
            if not isinstance(node, str) or not isinstance(epoch, str) or not node or not epoch:
                continue
            if meta.get("name") != epoch_object_name(cluster, node, epoch):
                continue  # not where that epoch is stored: not its record
            out[(node, epoch)] = str(meta.get("resourceVersion", ""))
        return out

    async def get_epoch(self, cluster: str, node: str, epoch: str) -> Stored[Epoch] | None:
        name = epoch_object_name(cluster, node, epoch)
        status, payload = await self._request("GET", self._path(name), kind="get")
        if status == 404:
            return None
        if status != 200:
            raise self._fail(f"reading the epoch {node}@{epoch}", status, payload)
        meta = payload.get("metadata") or {}
        data = str((meta.get("annotations") or {}).get(ANN_RECORD, "")).encode()
        return stored_epoch(data, str(meta.get("resourceVersion", "")), cluster, node, epoch)

    def _epoch_object(self, record: Epoch, version: str | None) -> dict[str, Any]:
        meta: dict[str, Any] = {
            "name": epoch_object_name(record.cluster, record.node, record.epoch),
            "namespace": self.namespace,
            "labels": {LABEL_CLUSTER: record.cluster, LABEL_KIND: "epoch"},
            "annotations": {ANN_NODE: record.node, ANN_EPOCH: record.epoch,
                            ANN_RECORD: encode(record).decode()},
        }
        if version is not None:
            meta["resourceVersion"] = version
        return {"apiVersion": "coordination.k8s.io/v1", "kind": "Lease", "metadata": meta,
                "spec": {"holderIdentity": record.ended_by or record.node,
                         "leaseDurationSeconds": max(1, math.ceil(record.ttl)),
                         "renewTime": _micro(record.at)}}

    async def create_epoch(self, record: Epoch) -> str:
        what = f"epoch {record.node}@{record.epoch}"
        status, payload = await self._request("POST", self._path(),
                                              body=self._epoch_object(record, None), kind="put")
        if status == 409:
            raise Conflict(f"{what} exists")
        if status not in (200, 201):
            raise self._fail(f"creating the {what}", status, payload)
        return str(payload["metadata"]["resourceVersion"])

    async def update_epoch(self, record: Epoch, version: str) -> str:
        # A merge patch carrying resourceVersion, as for leases: never a
        # create, so an ended or deleted epoch stays over.
        what = f"epoch {record.node}@{record.epoch}"
        name = epoch_object_name(record.cluster, record.node, record.epoch)
        status, payload = await self._request(
            "PATCH", self._path(name), body=self._epoch_object(record, version), kind="put")
        if status in (409, 404):
            raise Conflict(f"{what} changed since version {version}")
        if status == 400 and not version.isdigit():
            raise Conflict(f"{what}: {version!r} is not a version of this store")
        if status != 200:
            raise self._fail(f"replacing the {what}", status, payload)
        return str(payload["metadata"]["resourceVersion"])

    async def delete_epoch(self, cluster: str, node: str, epoch: str) -> None:
        name = epoch_object_name(cluster, node, epoch)
        status, payload = await self._request("DELETE", self._path(name), kind="delete")
        if status not in (200, 202, 404):
            raise self._fail(f"deleting the epoch {node}@{epoch}", status, payload)
