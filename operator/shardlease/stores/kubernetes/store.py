"""The Kubernetes store itself: requests, the listing, the caches' informers
(one a cluster, handed the LIST and the watch to call), and every read and
compare-and-swap of the interface (see the package's doc)."""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import math
import time
from collections.abc import AsyncIterator, Callable
from typing import Any
from urllib.parse import parse_qs, urlsplit

import aiohttp

from shardlease.errors import ConfigError, Conflict, KubeAPIError, StoreError
from shardlease.kubeapi import KubeClient
from shardlease.records import (
    Epoch,
    Heartbeat,
    Lease,
    Stored,
    encode,
    stored_epoch,
)
from shardlease.stores.base import Change, EpochListing, LeaseStore, Listed
from shardlease.stores.kubernetes.codec import (
    _DNS_LABEL,
    _LEGACY,
    ANN_EPOCH,
    ANN_FORMAT,
    ANN_HOLD,
    ANN_HOLDS_BY,
    ANN_INCARNATION,
    ANN_NODE,
    ANN_RECORD,
    ANN_RENEWAL,
    ANN_RESERVED_FOR,
    ANN_WRITE_ID,
    LABEL_CLUSTER,
    LABEL_ENDED,
    LABEL_KIND,
    LABEL_SHARD,
    LEASES,
    PAGE,
    _decode,
    _Entry,
    _heartbeats_of,
    _micro,
    _status_error,
    epoch_object_name,
    heartbeat_to_object,
    lease_name,
    lease_to_object,
    legacy_lease_name,
    node_object_name,
    object_to_heartbeat,
    object_to_lease,
)
from shardlease.stores.kubernetes.informer import (
    STALE_MARGIN,
    WATCH_TIMEOUT,
    Informer,
    _View,
)
from shardlease.stores.requests import RequestObservers

logger = logging.getLogger("shardlease.store.kubernetes")


class KubernetesStore(LeaseStore):
    def __init__(self, namespace: str, *, context: str | None = None,
                 kubeconfig: str | None = None, timeout: float = 10.0, watch: bool = True,
                 watch_timeout: float = WATCH_TIMEOUT) -> None:
        super().__init__()
        #: Told of every backend request this store makes (`stores.requests`).
        self.backend_requests = RequestObservers()
        if not _DNS_LABEL.match(namespace) or len(namespace) > 63:
            raise ConfigError(f"kubernetes store: {namespace!r} is not a namespace name")
        if not (math.isfinite(watch_timeout) and watch_timeout >= 1):
            raise ConfigError(f"kubernetes store: watch_timeout must be at least 1 second, "
                              f"not {watch_timeout!r}")
        self.namespace = namespace
        self.context = context
        self.kubeconfig = kubeconfig
        self.timeout = timeout
        #: Reads from a watch-fed cache (see the module doc), or a LIST each.
        self.watch = watch
        self.watch_timeout = float(math.ceil(watch_timeout))
        #: A cache with no sign of life for this long is stale.
        self.stale_after = self.watch_timeout + STALE_MARGIN
        #: cluster -> the informer keeping its watch-fed cache and telling its
        #: subscribers (`watch_changes`) of each change.
        self._informers: dict[str, Informer] = {}
        self.watches = watch
        #: (cluster, kind selector) -> entries of the last LIST (watch off):
        #: their decoded records, reused while an object's version is unchanged.
        self._listed: dict[tuple[str, str], dict[str, _Entry]] = {}
        #: LISTs that loaded a cache (the first and every resync), for tests.
        self.resyncs: list[str] = []
        self._api: KubeClient | None = None
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
        unknown = set(query) - {"context", "kubeconfig", "watch", "watch_timeout"}
        usage = (f"kubernetes store URL {url!r} must look like kubernetes://NAMESPACE "
                 "(optional ?context=NAME&kubeconfig=PATH&watch=0|1&watch_timeout=SECONDS)")
        if not parts.netloc or parts.path not in ("", "/") or unknown \
                or any(len(v) > 1 for v in query.values()):
            raise ConfigError(usage)
        watch = query.get("watch", ["1"])[0]
        if watch not in ("0", "1"):
            raise ConfigError(usage)
        try:
            watch_timeout = float(query.get("watch_timeout", [WATCH_TIMEOUT])[0])
        except ValueError:
            raise ConfigError(usage) from None
        return cls(parts.netloc, context=query.get("context", [None])[0],
                   kubeconfig=query.get("kubeconfig", [None])[0], watch=watch == "1",
                   watch_timeout=watch_timeout)

    def describe(self) -> str:
        return f"kubernetes://{self.namespace}"

    async def _client(self) -> KubeClient:
        async with self._lock:
            if self._api is None:
                try:
                    self._api = KubeClient.from_config(self.kubeconfig, self.context)
                except ConfigError as e:
                    raise StoreError(f"kubernetes store: no usable Kubernetes configuration "
                                     f"(in-cluster or kubeconfig): {e}") from None
            return self._api

    async def aclose(self) -> None:
        await asyncio.gather(*(informer.stop() for informer in self._informers.values()))
        if self._api is not None:
            await self._api.close()
            self._api = None

    async def _request(self, method: str, path: str, *, query: list[tuple[str, str]] | None = None,
                       body: Any = None, kind: str) -> tuple[int, dict[str, Any]]:
        api = await self._client()
        self.backend_requests.report(kind)
        content_type = ("application/merge-patch+json" if method == "PATCH"
                        else "application/json")
        try:
            status, payload = await api.call(method, path, body, content_type,
                                             request_timeout=self.timeout, query=query)
        except KubeAPIError as e:
            raise StoreError(f"kubernetes store: {method} {path} failed: {e!r}") from None
        if method != "GET" and status in (200, 201, 202) and self._informers:
            self._wrote(method, path, payload)
        if status in (401, 403):
            raise StoreError(
                f"kubernetes store: {method} {path} was refused ({status}): "
                f"{payload.get('message', '')}; the service account needs get, list, create, "
                f"update, patch and delete on leases.coordination.k8s.io in namespace "
                f"{self.namespace}")
        return status, payload

    def _fail(self, what: str, status: int, payload: dict[str, Any]) -> StoreError:
        return _status_error(what, status, payload)

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

    async def _list(self, selector: str) -> tuple[list[dict[str, Any]], str]:
        """Every Lease `selector` selects, and the resourceVersion of the listing."""
        items: list[dict[str, Any]] = []
        cont = ""
        version = ""
        while True:
            query = [("labelSelector", selector), ("limit", str(PAGE))]
            if cont:
                query.append(("continue", cont))
            status, payload = await self._request("GET", self._path(), query=query, kind="list")
            if status != 200:
                raise self._fail(f"listing leases {selector}", status, payload)
            items.extend(payload.get("items") or [])
            meta = payload.get("metadata") or {}
            version = version or str(meta.get("resourceVersion") or "")
            cont = meta.get("continue") or ""
            if not cont:
                return items, version

    @staticmethod
    def _selector(cluster: str, kind: str | None = None) -> str:
        if kind is None:
            return f"{LABEL_CLUSTER}={cluster},{LABEL_KIND} in (epoch,heartbeat,shard)"
        return f"{LABEL_CLUSTER}={cluster},{LABEL_KIND}={kind}"

    async def _entries(self, cluster: str, kind: str) -> list[_Entry]:
        """Every Lease object of `cluster` of `kind` ("shard" or "heartbeat"),
        decoded: from the cluster's watch-fed cache, or a LIST with the watch off."""
        if self.watch:
            view = await self._informer(cluster).read()
            return [entry for entry in view.entries.values() if entry.kind == kind]
        known = self._listed.get((cluster, kind))
        items, _ = await self._list(self._selector(cluster, kind))
        entries = dict(_decode(obj, cluster, self.namespace, known) for obj in items)
        self._listed[(cluster, kind)] = entries
        return list(entries.values())

    # -- the watch-fed caches (see the package's doc) ---------------------------

    @property
    def _views(self) -> dict[str, _View]:
        """cluster -> its watch-fed cache, for the clusters that have one."""
        return {cluster: informer.view for cluster, informer in self._informers.items()
                if informer.view is not None}

    def _informer(self, cluster: str) -> Informer:
        informer = self._informers.get(cluster)
        if informer is None:
            informer = self._informers[cluster] = Informer(
                cluster, self.namespace, self.stale_after,
                list_leases=functools.partial(self._list, self._selector(cluster)),
                watch_leases=functools.partial(self._open_watch, cluster),
                loaded=self.resyncs.append)
        return informer

    @contextlib.asynccontextmanager
    async def _open_watch(self, cluster: str,
                          version: str) -> AsyncIterator[aiohttp.ClientResponse]:
        """A watch of the cluster's Leases from `version`, until the server ends it."""
        api = await self._client()
        query = [("watch", "1"), ("labelSelector", self._selector(cluster)),
                 ("resourceVersion", version), ("allowWatchBookmarks", "true"),
                 ("timeoutSeconds", str(int(self.watch_timeout)))]
        self.backend_requests.report("watch")
        # No total timeout (the server ends the watch), but a read that waits
        # longer than the staleness bound means the connection is dead.
        timeout = aiohttp.ClientTimeout(total=None, connect=self.timeout,
                                        sock_connect=self.timeout, sock_read=self.stale_after)
        async with api.stream(self._path(), query, timeout) as resp:
            yield resp

    def _wrote(self, method: str, path: str, payload: dict[str, Any]) -> None:
        """A write of ours was answered: its result goes into the cluster's cache."""
        now = time.monotonic()
        if method == "DELETE":
            name = path.rsplit("/", 1)[-1]
            for each in self._informers.values():
                each.wrote(name, None, now)
            return
        meta = payload.get("metadata") or {}
        labels = meta.get("labels") or {}
        informer = self._informers.get(str(labels.get(LABEL_CLUSTER)))
        if informer is not None and labels.get(LABEL_KIND) in ("shard", "heartbeat", "epoch") \
                and meta.get("resourceVersion") and meta.get("name"):
            informer.wrote(str(meta["name"]), payload, now)

    def watch_changes(self, cluster: str,
                      callback: Callable[[Change], None]) -> Callable[[], None] | None:
        if not self.watch:
            return None
        return self._informer(cluster).subscribe(callback)

    # -- leases -----------------------------------------------------------------

    async def list_leases(self, cluster: str, *,
                          seen: Listed | None = None) -> dict[int, Stored[Lease]]:
        current: dict[int, Stored[Lease]] = {}
        legacy: dict[int, Stored[Lease]] = {}
        for entry in await self._entries(cluster, "shard"):
            if entry.stored is not None:
                (current if entry.slot == "current" else legacy)[entry.shard] = entry.stored
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
        body["metadata"]["annotations"].setdefault(ANN_FORMAT, None)
        # (A merge patch keeps what it does not name: a reservation a free
        # wrote must be cleared by the writes after it.)
        body["metadata"]["annotations"].setdefault(ANN_RESERVED_FOR, None)
        body["metadata"]["annotations"].setdefault(ANN_HOLD, None)
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
        return _heartbeats_of(cluster, await self._entries(cluster, "heartbeat"))

    async def get_heartbeat(self, cluster: str, node: str) -> Heartbeat | None:
        name = node_object_name(cluster, node)
        status, payload = await self._request("GET", self._path(name), kind="get")
        if status == 404:
            return None
        if status != 200:
            raise self._fail(f"reading the heartbeat of {node}", status, payload)
        return object_to_heartbeat(payload, cluster, node)

    async def put_heartbeat(self, heartbeat: Heartbeat) -> None:
        # Each node writes only its own heartbeat: a merge patch needs no
        # version, and a create follows only the first beat.
        name = node_object_name(heartbeat.cluster, heartbeat.node)
        patch = {"metadata": {"annotations": {ANN_WRITE_ID: heartbeat.write_id,
                                              ANN_INCARNATION: heartbeat.incarnation,
                                              ANN_HOLDS_BY: repr(heartbeat.holds_by)}},
                 "spec": {"renewTime": _micro(heartbeat.at)}}
        key = (heartbeat.cluster, heartbeat.node)
        if key in self._beat_versions:
            status, payload = await self._request("PATCH", self._path(name), body=patch,
                                                  kind="put")
            if status == 200:
                return
            if status != 404:
                raise self._fail(f"heartbeat of {heartbeat.node}", status, payload)
        body = heartbeat_to_object(heartbeat, self.namespace)
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
        # From the same watch-fed cache as the leases and heartbeats.
        entries = [entry for entry in await self._entries(cluster, "epoch")
                   if entry.node is not None and entry.epoch is not None]
        return EpochListing({(e.node or "", e.epoch or ""): e.version for e in entries},
                            frozenset((e.node or "", e.epoch or "") for e in entries if e.ended))

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
            "labels": {LABEL_CLUSTER: record.cluster, LABEL_KIND: "epoch",
                       **({LABEL_ENDED: "true"} if record.ended_by is not None else {})},
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
