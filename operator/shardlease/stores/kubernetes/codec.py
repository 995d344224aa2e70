"""The Kubernetes store's codec: how a lease, an epoch and a heartbeat are
named, labelled and written as `coordination.k8s.io/v1` Lease objects, and
read back (see the package's doc)."""

from __future__ import annotations

import datetime as dt
import hashlib
import json
import logging
import math
import re
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from pydantic import ValidationError

from shardlease.errors import CorruptRecord, StoreError
from shardlease.records import (
    FORMAT,
    MAX_RECORD_BYTES,
    Heartbeat,
    Lease,
    NewerFormat,
    Stored,
)

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
#: A heartbeat's `holds_by` (absent: 0, as heartbeats before the field).
ANN_HOLDS_BY = f"{GROUP}/holds-by"
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


def heartbeat_to_object(heartbeat: Heartbeat, namespace: str) -> dict[str, Any]:
    """A heartbeat as the Lease object that creates it (`seq` is not kept)."""
    return {
        "apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
        "metadata": {"name": node_object_name(heartbeat.cluster, heartbeat.node),
                     "namespace": namespace,
                     "labels": {LABEL_CLUSTER: heartbeat.cluster, LABEL_KIND: "heartbeat"},
                     "annotations": {ANN_NODE: heartbeat.node,
                                     ANN_WRITE_ID: heartbeat.write_id,
                                     ANN_INCARNATION: heartbeat.incarnation,
                                     ANN_HOLDS_BY: repr(heartbeat.holds_by)}},
        "spec": {"holderIdentity": heartbeat.node, "renewTime": _micro(heartbeat.at)},
    }


def object_to_heartbeat(obj: dict[str, Any], cluster: str, node: str) -> Heartbeat:
    """A heartbeat Lease object as a `Heartbeat` (its `seq` is not kept: 0).
    Raises `CorruptRecord` if it is not one of this cluster's node's, or if
    its format annotation is above `FORMAT` (`NewerFormat`)."""
    meta = obj.get("metadata") or {}
    name = meta.get("name")
    try:
        if (size := _size(obj)) > OBJECT_LIMIT:
            raise ValueError(f"the object is {size} bytes, more than the {OBJECT_LIMIT} allowed")
        labels = meta.get("labels") or {}
        ann = meta.get("annotations") or {}
        spec = obj.get("spec") or {}
        if (format := _format(ann)) > FORMAT:
            raise NewerFormat("heartbeat", format)
        if labels.get(LABEL_CLUSTER) != cluster or ann.get(ANN_NODE) != node:
            raise ValueError(f"it names cluster {labels.get(LABEL_CLUSTER)!r} node "
                             f"{ann.get(ANN_NODE)!r}, not {cluster!r} {node!r}")
        return Heartbeat.model_validate({
            "cluster": cluster, "node": node,
            "incarnation": ann.get(ANN_INCARNATION), "seq": 0,
            "write_id": ann.get(ANN_WRITE_ID), "at": _epoch(spec.get("renewTime")),
            "holds_by": float(ann.get(ANN_HOLDS_BY) or 0), "format": format})
    except NewerFormat:
        raise
    except ValidationError as e:
        first = e.errors()[0]
        raise CorruptRecord(f"invalid heartbeat object {name!r}: {e.error_count()} problem(s); "
                            f"first: {'.'.join(map(str, first['loc']))}: {first['msg']}"
                            ) from None
    except (ValueError, TypeError, AttributeError) as e:
        raise CorruptRecord(f"invalid heartbeat object {name!r}: {e}") from None


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


def _status_error(what: str, status: int, payload: dict[str, Any]) -> StoreError:
    """A refused request as a StoreError, from the API server's Status object."""
    return StoreError(f"kubernetes store: {what}: {status} {payload.get('reason', '')} "
                      f"{payload.get('message', '')}".rstrip())


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
