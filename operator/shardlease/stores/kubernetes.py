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
    shardlease.io/format       the record format, only when it is not 1
                               (above records.FORMAT: not read, see records)

Every write is a replace carrying the resourceVersion last read, so the API
server refuses a stale one with 409 (the race is lost).

Reads (`list_leases`, `list_heartbeats`) come from a cache per cluster fed by
one label-selected WATCH of the cluster's Leases (its shard leases and its
heartbeats), as client-go's informers do: the first read LISTs them (one
request, both kinds), and the watch starts from that LIST's resourceVersion
with bookmarks (`allowWatchBookmarks`) and `timeoutSeconds=watch_timeout`:
the server ends each watch after that long and the store opens the next one
from the last resourceVersion it saw (an event's or a bookmark's), so no event
is missed and nothing is listed again. A read is answered from the cache only
while the cache is *in sync and fresh*:

- in sync: loaded by a LIST, and every watch since went on from the last
  resourceVersion. A watch the server refuses with `410 Gone` (the version is
  older than the server keeps: after a compaction, or an API server restart
  whose new watch cache starts later) ends that;
- fresh: a sign of life came less than `stale_after` seconds ago (default
  `watch_timeout` + 5). A sign of life is a watch request answered, an event,
  or a bookmark. A healthy watch with nothing to report still gives one at
  least every `watch_timeout` seconds (the next watch's answer; and a bookmark
  about 2 s before the end of a watch over about 8 s), so a silent watch
  (a dead connection, a stopped API server) goes stale after `stale_after`;
- echoed: every write of this store answered more than `ECHO_LIMIT` seconds
  ago came back as its watch event. A connection that died without a word (a
  middlebox dropped it) while new requests still work shows here first: a
  running node writes its heartbeat every interval.

Otherwise the read LISTs again, replaces the cache and restarts the watch from
that LIST; a LIST that fails raises `StoreError`, so a broken or stale watch
is a failed read (no claims, `lookup` keeps its last good view) exactly as a
failed LIST is, and a stale cache is never served. A watch that fails to
connect is retried from its last resourceVersion (with backoff) until it is
stale. `get_lease` is always a GET (it decides whether a write of ours
landed). A write of this store goes into the cache from the write's answer at
once, and the watch events of that object that came before it (in flight
when the answer arrived) are skipped until the write's own event arrives, so
the cache never shows an object older than what this store wrote; later
events win. resourceVersions are only ever compared for equality.

Requests are counted by kind: `list` (each LIST page), `watch` (each watch
opened), `get`, `put`, `delete`; watch events and bookmarks are not requests.
Decoded records are kept by resourceVersion: a LIST or an event decodes only
the objects whose version changed.

`?watch=0` turns the watch off: every read is then a LIST (one for the
leases, one for the heartbeats), as before; `?watch_timeout=SECONDS` sets the
watch's server-side timeout (default 10, at least 1).

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
import contextlib
import dataclasses
import datetime as dt
import hashlib
import json
import logging
import math
import random
import re
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any, Literal
from urllib.parse import parse_qs, urlsplit

from pydantic import ValidationError

from shardlease.errors import ConfigError, Conflict, KubeAPIError, StoreError
from shardlease.kubeapi import KubeClient
from shardlease.records import (
    FORMAT,
    MAX_RECORD_BYTES,
    Epoch,
    Heartbeat,
    Lease,
    Stored,
    encode,
    stored_epoch,
)
from shardlease.stores.base import Change, EpochListing, LeaseStore

logger = logging.getLogger("shardlease.store.kubernetes")

GROUP = "shardlease.io"
LABEL_CLUSTER = f"{GROUP}/cluster"
LABEL_SHARD = f"{GROUP}/shard"
LABEL_KIND = f"{GROUP}/kind"
#: On an epoch object whose record is ended: the listing (the watch) tells.
LABEL_ENDED = f"{GROUP}/ended"
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
#: A free lease kept for a node (`Lease.reserved_for`), and for how long.
ANN_RESERVED_FOR = f"{GROUP}/reserved-for"
ANN_HOLD = f"{GROUP}/hold"
#: A lease record's `format`, written only when it is not 1 (so a Lease object
#: of format 1 is what versions before the field wrote); absent: 1.
ANN_FORMAT = f"{GROUP}/format"
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
#: Server-side timeout of one watch request (`timeoutSeconds`), by default.
WATCH_TIMEOUT = 10.0
#: A cache is stale once no sign of life came for watch_timeout + this long.
STALE_MARGIN = 5.0
#: A cache is stale once a write of ours answered this long ago has not come
#: back as a watch event (the API server sends events within milliseconds).
ECHO_LIMIT = 5.0
#: Longest line (one watch event) accepted from a watch, in bytes (etcd's
#: own limit on an object is 1.5 MiB).
WATCH_LINE_LIMIT = 4 * 1024 * 1024
#: Pause before re-opening a watch that failed: doubling up to the second.
WATCH_RETRY_FIRST, WATCH_RETRY_MAX = 0.2, 2.0


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
    if lease.reserved_for is not None:
        annotations[ANN_RESERVED_FOR] = lease.reserved_for
    if lease.hold:
        annotations[ANN_HOLD] = repr(lease.hold)
    if lease.format != 1:
        annotations[ANN_FORMAT] = str(lease.format)
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


def _format(ann: dict[str, Any]) -> int:
    """The record format an object's annotations give (absent: 1); an
    annotation that is not a decimal number is a ValueError."""
    value = ann.get(ANN_FORMAT)
    if value is None:
        return 1
    if not isinstance(value, str) or not value.isascii() or not value.isdigit() \
            or len(value) > 19 or str(int(value)) != value:
        raise ValueError(f"its format annotation {ANN_FORMAT} is {value!r}, not a format number")
    return int(value)


def object_to_lease(obj: dict[str, Any], cluster: str, shard: int,
                    version_prefix: str = "") -> Stored[Lease]:
    """Validate a Lease object stored as `cluster`'s shard `shard`; never raises.

    The object's name is where it is stored; its labels, spec and annotations
    are its content, checked like any record read from a shared store. A
    corrupt one still gives its `leaseTransitions` as the recovered generation,
    and so does one whose format annotation is above `FORMAT`, which is not
    read at all (`newer_format`).
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
        if (format := _format(ann)) > FORMAT:
            return Stored(version, None,
                          f"lease object {name!r} is format {format}, newer than the format "
                          f"{FORMAT} this version knows: not read (written by a newer "
                          "shardlease?)", _recovered_generation(obj), format)
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
            "reserved_for": ann.get(ANN_RESERVED_FOR) or None,
            "hold": float(ann.get(ANN_HOLD) or 0),
            "format": format,
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


@dataclass
class _Entry:
    """One Lease object of a cluster as listed, decoded once per resourceVersion."""

    version: str
    kind: str  # "shard", "heartbeat", or "" (neither: not ours to read)
    #: shard Leases: "current" (its name now), "legacy" (its old name), or ""
    #: (labelled for the cluster but not named like one of its shards: ignored).
    slot: str = ""
    shard: int = -1
    stored: Stored[Lease] | None = None
    #: heartbeats: the node (None: no node annotation, ignored) and whether the
    #: object has the node's current name (it wins over an old-named one).
    node: str | None = None
    current_name: bool = False
    #: epochs: the epoch id (None: not a valid epoch object, ignored), and
    #: whether its labels say it is ended (a hint, see `EpochListing`).
    epoch: str | None = None
    ended: bool = False


def _decode(obj: dict[str, Any], cluster: str, namespace: str,
            known: dict[str, _Entry] | None = None) -> tuple[str, _Entry]:
    """(name, entry) of a Lease object listed or watched for `cluster`; the
    entry `known` has under that name is reused when the version is the same
    (an object's resourceVersion changes with every write to it)."""
    meta = obj.get("metadata") or {}
    name = str(meta.get("name", ""))
    version = str(meta.get("resourceVersion", ""))
    if known is not None and (seen := known.get(name)) is not None and seen.version == version:
        return name, seen
    labels = meta.get("labels") or {}
    kind = labels.get(LABEL_KIND)
    if kind == "heartbeat":
        node = (meta.get("annotations") or {}).get(ANN_NODE)
        if not isinstance(node, str) or not node:
            return name, _Entry(version, "heartbeat")
        return name, _Entry(version, "heartbeat", node=node,
                            current_name=name == node_object_name(cluster, node))
    if kind == "epoch":
        ann = meta.get("annotations") or {}
        node, epoch = ann.get(ANN_NODE), ann.get(ANN_EPOCH)
        if not isinstance(node, str) or not isinstance(epoch, str) or not node or not epoch \
                or name != epoch_object_name(cluster, node, epoch):
            return name, _Entry(version, "epoch")  # not where that epoch is stored
        return name, _Entry(version, "epoch", node=node, epoch=epoch,
                            ended=labels.get(LABEL_ENDED) == "true")
    if kind != "shard":
        return name, _Entry(version, "")
    # The name says where a record is stored (its labels are content, checked
    # by object_to_lease); the shard label only helps find a hashed name.
    label = str(labels.get(LABEL_SHARD, ""))
    hint = int(label) if label.isascii() and label.isdigit() else None
    if (shard := _shard_named(name, f"shardlease.{cluster}.shard.")) is not None \
            and name == lease_name(cluster, shard):
        return name, _Entry(version, "shard", "current", shard,
                            object_to_lease(obj, cluster, shard))
    if hint is not None and name == lease_name(cluster, hint):
        return name, _Entry(version, "shard", "current", hint,
                            object_to_lease(obj, cluster, hint))
    if (shard := _shard_named(name, f"shardlease-{cluster}-")) is not None:
        return name, _Entry(version, "shard", "legacy", shard,
                            object_to_lease(obj, cluster, shard, _LEGACY))
    logger.warning("Lease %s/%s carries the labels of cluster %s but is not named like one of "
                   "its shards; ignored", namespace, name, cluster)
    return name, _Entry(version, "shard")


def _heartbeats_of(cluster: str, entries: Iterable[_Entry]) -> dict[str, str]:
    out: dict[str, str] = {}
    for entry in entries:
        if entry.kind != "heartbeat" or entry.node is None:
            continue
        # A node's heartbeat under its old name (an earlier version, see the
        # module doc) must not hide the current one, whatever the order.
        if entry.node in out and not entry.current_name:
            continue
        out[entry.node] = entry.version
    return out


def _retrieve(future: asyncio.Future[Any]) -> None:
    """Done callback: a failure nobody waited for is not logged as unretrieved."""
    if not future.cancelled():
        future.exception()


class _Expired(Exception):
    """The server no longer has the history a watch asked for (410 Gone)."""


@dataclass
class _View:
    """The watch-fed cache of one cluster's Leases (see the module doc)."""

    cluster: str
    #: The last resourceVersion the cache is complete up to (a LIST's, then
    #: each event's and bookmark's): the next watch starts there.
    version: str
    entries: dict[str, _Entry]
    #: monotonic time of the last sign of life (watch answered, event, bookmark).
    sign: float
    #: Why the cache is no longer in sync (410, a watch that gave up), or None.
    broken: str | None = None
    #: name -> (the version our write made, None for a deletion; monotonic time
    #: its answer arrived): our writes whose watch event has not come yet.
    pending: dict[str, tuple[str | None, float]] = dataclasses.field(default_factory=dict)
    task: asyncio.Task[None] | None = None
    #: Watch events applied and skipped, watches opened (for tests and figures).
    events: int = 0
    bookmarks: int = 0

    def stale(self, now: float, stale_after: float) -> str | None:
        """Why this cache may not answer a read now, or None if it may."""
        if self.broken is not None:
            return self.broken
        if self.task is None or self.task.done():
            return "its watch is not running"
        if now - self.sign > stale_after:
            return (f"no event, bookmark or watch answer for {now - self.sign:.1f}s "
                    f"(more than {stale_after:g}s)")
        if self.pending:
            name, (_, when) = min(self.pending.items(), key=lambda item: item[1][1])
            if now - when > ECHO_LIMIT:
                return (f"our write of {name} did not come back on the watch within "
                        f"{ECHO_LIMIT:g}s")
        return None

    def apply(self, kind: str, obj: dict[str, Any], namespace: str) -> _Entry | None:
        """One watch event (ADDED, MODIFIED or DELETED): the entry it shows
        (for a deletion, the object as it was), None if it was skipped."""
        meta = obj.get("metadata") or {}
        name = str(meta.get("name", ""))
        version = str(meta.get("resourceVersion", ""))
        if (mine := self.pending.get(name)) is not None:
            if (mine[0] is None) != (kind == "DELETED") or (mine[0] is not None
                                                           and mine[0] != version):
                return None  # from before our write (events of one object come in order)
            del self.pending[name]
        if kind == "DELETED":
            gone = self.entries.pop(name, None)
            return gone if gone is not None else _decode(obj, self.cluster, namespace)[1]
        name, entry = _decode(obj, self.cluster, namespace, self.entries)
        self.entries[name] = entry
        return entry

    def wrote(self, name: str, obj: dict[str, Any] | None, namespace: str, now: float) -> None:
        """A write of ours to `name` was answered: `obj` is the object it
        returned (None: we deleted it)."""
        if obj is None:
            self.entries.pop(name, None)
            self.pending[name] = (None, now)
            return
        known = self.entries.get(str((obj.get("metadata") or {}).get("name", "")))
        name, entry = _decode(obj, self.cluster, namespace, self.entries)
        self.entries[name] = entry
        if known is None or known.version != entry.version:  # (a no-op write has no event)
            self.pending[name] = (entry.version, now)


class KubernetesStore(LeaseStore):
    def __init__(self, namespace: str, *, context: str | None = None,
                 kubeconfig: str | None = None, timeout: float = 10.0, watch: bool = True,
                 watch_timeout: float = WATCH_TIMEOUT) -> None:
        super().__init__()
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
        #: cluster -> its watch-fed cache.
        self._views: dict[str, _View] = {}
        #: cluster -> who is told of each change its watch sees (`watch_changes`).
        self._watchers: dict[str, list[Callable[[Change], None]]] = {}
        self.watches = watch
        #: cluster -> its (re)LIST in progress, so concurrent reads share one.
        self._syncing: dict[str, asyncio.Future[_View]] = {}
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
        tasks: list[asyncio.Future[Any]] = [v.task for v in self._views.values()
                                             if v.task is not None]
        tasks += self._syncing.values()
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        self._views.clear()
        self._syncing.clear()
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
            status, payload = await api.call(method, path, body, content_type,
                                             request_timeout=self.timeout, query=query)
        except KubeAPIError as e:
            raise StoreError(f"kubernetes store: {method} {path} failed: {e!r}") from None
        if method != "GET" and status in (200, 201, 202) and self._views:
            self._wrote(method, path, payload)
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
            view = await self._view(cluster)
            return [entry for entry in view.entries.values() if entry.kind == kind]
        known = self._listed.get((cluster, kind))
        items, _ = await self._list(self._selector(cluster, kind))
        entries = dict(_decode(obj, cluster, self.namespace, known) for obj in items)
        self._listed[(cluster, kind)] = entries
        return list(entries.values())

    # -- the watch-fed cache (see the module doc) -----------------------------

    async def _view(self, cluster: str) -> _View:
        """The cluster's cache, LISTed again first unless in sync and fresh."""
        view = self._views.get(cluster)
        if view is not None and view.stale(time.monotonic(), self.stale_after) is None:
            return view
        syncing = self._syncing.get(cluster)
        if syncing is None or syncing.done():
            # One LIST for every read that finds the cache unusable meanwhile
            # (the leases and the heartbeats of a round); it goes on if they
            # stop waiting, like any request the loop abandons.
            syncing = asyncio.ensure_future(self._resync(cluster))
            syncing.add_done_callback(_retrieve)
            self._syncing[cluster] = syncing
        return await asyncio.shield(syncing)

    async def _resync(self, cluster: str) -> _View:
        """LIST the cluster's Leases into a new cache and watch from there."""
        old = self._views.get(cluster)
        if old is not None:
            why = old.stale(time.monotonic(), self.stale_after)
            if why is None:
                return old  # (a LIST finished just before this one started)
            logger.warning("kubernetes store: the cache of cluster %s is out of date (%s); "
                           "listing its leases again", cluster, why)
            if old.task is not None:
                old.task.cancel()
        started = time.monotonic()
        items, version = await self._list(self._selector(cluster))
        known = old.entries if old is not None else None
        entries = dict(_decode(obj, cluster, self.namespace, known) for obj in items)
        view = _View(cluster, version, entries, time.monotonic())
        if old is not None:
            for name, (written, when) in old.pending.items():
                if when < started:
                    continue  # answered before the LIST was sent: the LIST shows it or later
                # Answered while the LIST ran: the LIST may predate it.
                view.pending[name] = (written, when)
                if written is None:
                    entries.pop(name, None)
                elif name in old.entries:
                    entries[name] = old.entries[name]
        self._views[cluster] = view
        self.resyncs.append(cluster)
        view.task = asyncio.create_task(self._watch(view), name=f"watch leases of {cluster}")
        return view

    def _wrote(self, method: str, path: str, payload: dict[str, Any]) -> None:
        """A write of ours was answered: its result goes into the cluster's cache."""
        now = time.monotonic()
        if method == "DELETE":
            name = path.rsplit("/", 1)[-1]
            for seen in self._views.values():
                if name in seen.entries:
                    seen.wrote(name, None, self.namespace, now)
            return
        meta = payload.get("metadata") or {}
        labels = meta.get("labels") or {}
        view = self._views.get(str(labels.get(LABEL_CLUSTER)))
        if view is not None and labels.get(LABEL_KIND) in ("shard", "heartbeat", "epoch") \
                and meta.get("resourceVersion") and meta.get("name"):
            view.wrote(str(meta["name"]), payload, self.namespace, now)

    async def _watch(self, view: _View) -> None:
        """Keep `view` up to date: watch after watch from its last version,
        until the server says that version is gone or the cache is stale."""
        delay = WATCH_RETRY_FIRST
        while True:
            try:
                await self._watch_once(view)
                delay = WATCH_RETRY_FIRST
                continue
            except _Expired as e:
                view.broken = f"the server no longer has version {view.version} ({e})"
                logger.info("kubernetes store: watch of cluster %s: %s", view.cluster,
                            view.broken)
                return
            except Exception as e:  # the connection, the server, a malformed event
                failure = e
            if (silent := time.monotonic() - view.sign) > self.stale_after:
                view.broken = (f"no event, bookmark or watch answer for {silent:.1f}s (more than "
                               f"{self.stale_after:g}s); the watch: {failure}")
                logger.warning("kubernetes store: watch of cluster %s: %s", view.cluster,
                               view.broken)
                return
            logger.info("kubernetes store: watch of cluster %s failed, watching again from "
                        "version %s: %s", view.cluster, view.version, failure)
            await asyncio.sleep(delay * (0.5 + random.random()))
            delay = min(2 * delay, WATCH_RETRY_MAX)

    async def _watch_once(self, view: _View) -> None:
        """One watch request, read to its end (the server's timeoutSeconds)."""
        import aiohttp

        api = await self._client()
        query = [("watch", "1"), ("labelSelector", self._selector(view.cluster)),
                 ("resourceVersion", view.version), ("allowWatchBookmarks", "true"),
                 ("timeoutSeconds", str(int(self.watch_timeout)))]
        self._count("watch")
        # No total timeout (the server ends the watch), but a read that waits
        # longer than the staleness bound means the connection is dead.
        timeout = aiohttp.ClientTimeout(total=None, connect=self.timeout,
                                        sock_connect=self.timeout, sock_read=self.stale_after)
        try:
            async with api.stream(self._path(), query, timeout) as resp:
                if resp.status != 200:
                    data = await resp.read()
                    try:
                        payload = json.loads(data) if data else {}
                    except ValueError:
                        payload = {"message": data[:300].decode(errors="replace")}
                    if resp.status == 410:
                        raise _Expired(str(payload.get("message", "410 Gone")))
                    raise self._fail(f"watching leases of {view.cluster}", int(resp.status),
                                     payload)
                view.sign = time.monotonic()
                buffer = bytearray()
                async for chunk in resp.content.iter_any():
                    buffer += chunk
                    while (end := buffer.find(b"\n")) >= 0:
                        line = bytes(buffer[:end])
                        del buffer[:end + 1]
                        if line.strip():
                            self._event(view, line)
                    if len(buffer) > WATCH_LINE_LIMIT:
                        raise StoreError(f"kubernetes store: a watch event of cluster "
                                         f"{view.cluster} is over {WATCH_LINE_LIMIT} bytes")
        except KubeAPIError as e:
            raise StoreError(f"kubernetes store: watching leases of {view.cluster} failed: "
                             f"{e}") from None

    def _event(self, view: _View, line: bytes) -> None:
        event = json.loads(line)
        kind = event.get("type")
        obj = event.get("object") or {}
        if kind == "ERROR":
            if obj.get("code") == 410:
                raise _Expired(str(obj.get("message", "410 Gone")))
            raise self._fail(f"watching leases of {view.cluster}", int(obj.get("code") or 0), obj)
        if kind == "BOOKMARK":
            view.bookmarks += 1
        elif kind in ("ADDED", "MODIFIED", "DELETED"):
            entry = view.apply(kind, obj, self.namespace)
            view.events += 1
            if entry is not None and self._watchers.get(view.cluster):
                self._notify(view.cluster, kind, entry)
        else:
            raise StoreError(f"kubernetes store: unknown watch event type {kind!r}")
        version = (obj.get("metadata") or {}).get("resourceVersion")
        if version:
            view.version = str(version)
        view.sign = time.monotonic()

    def watch_changes(self, cluster: str,
                      callback: Callable[[Change], None]) -> Callable[[], None] | None:
        if not self.watch:
            return None
        self._watchers.setdefault(cluster, []).append(callback)

        def unsubscribe() -> None:
            with contextlib.suppress(ValueError):
                self._watchers.get(cluster, []).remove(callback)

        return unsubscribe

    def _notify(self, cluster: str, kind: str, entry: _Entry) -> None:
        what: Literal["added", "modified", "deleted"] = \
            "added" if kind == "ADDED" else "deleted" if kind == "DELETED" else "modified"
        if entry.kind == "shard":
            rec = entry.stored.record if entry.stored is not None else None
            change = Change("lease", what, free=rec is not None and rec.owner is None)
        elif entry.kind == "heartbeat" and entry.node is not None:
            change = Change("heartbeat", what, node=entry.node)
        elif entry.kind == "epoch" and entry.node is not None:
            change = Change("epoch", what, node=entry.node, ended=entry.ended)
        else:
            return
        for callback in list(self._watchers.get(cluster, [])):
            try:
                callback(change)
            except Exception:  # a watcher's bug must not end the watch
                logger.exception("kubernetes store: a change watcher of cluster %s failed",
                                 cluster)

    # -- leases -----------------------------------------------------------------

    async def list_leases(self, cluster: str) -> dict[int, Stored[Lease]]:
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
