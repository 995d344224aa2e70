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

Requests are reported by kind (`stores.requests`): `list` (each LIST page),
`watch` (each watch opened), `get`, `put`, `delete`; watch events and
bookmarks are not requests.
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

The package's parts, one job each: `codec` (names, labels, and a record to a
Lease object and back), `informer` (the watch-fed cache of one cluster: when
it may answer, the LIST and the watch loop that keep it, our writes' echoes,
its subscribers), `store` (`KubernetesStore`: requests, an informer a cluster,
the interface's reads and compare-and-swaps).
"""

from __future__ import annotations

from shardlease.stores.kubernetes.codec import (
    ANN_EPOCH,
    ANN_FORMAT,
    ANN_HOLD,
    ANN_HOLDS_BY,
    ANN_INCARNATION,
    ANN_NODE,
    ANN_RECORD,
    ANN_RENEWAL,
    ANN_RESERVED_FOR,
    ANN_SINCE,
    ANN_TTL,
    ANN_WRITE_ID,
    GROUP,
    LABEL_CLUSTER,
    LABEL_ENDED,
    LABEL_KIND,
    LABEL_SHARD,
    LEASES,
    OBJECT_LIMIT,
    PAGE,
    epoch_object_name,
    heartbeat_to_object,
    lease_name,
    lease_to_object,
    legacy_lease_name,
    node_object_name,
    object_name,
    object_to_heartbeat,
    object_to_lease,
)
from shardlease.stores.kubernetes.informer import (
    ECHO_LIMIT,
    STALE_MARGIN,
    WATCH_LINE_LIMIT,
    WATCH_TIMEOUT,
)
from shardlease.stores.kubernetes.store import KubernetesStore

__all__ = [
    "ANN_EPOCH",
    "ANN_FORMAT",
    "ANN_HOLD",
    "ANN_HOLDS_BY",
    "ANN_INCARNATION",
    "ANN_NODE",
    "ANN_RECORD",
    "ANN_RENEWAL",
    "ANN_RESERVED_FOR",
    "ANN_SINCE",
    "ANN_TTL",
    "ANN_WRITE_ID",
    "ECHO_LIMIT",
    "GROUP",
    "LABEL_CLUSTER",
    "LABEL_ENDED",
    "LABEL_KIND",
    "LABEL_SHARD",
    "LEASES",
    "OBJECT_LIMIT",
    "PAGE",
    "STALE_MARGIN",
    "WATCH_LINE_LIMIT",
    "WATCH_TIMEOUT",
    "KubernetesStore",
    "epoch_object_name",
    "heartbeat_to_object",
    "lease_name",
    "lease_to_object",
    "legacy_lease_name",
    "node_object_name",
    "object_name",
    "object_to_heartbeat",
    "object_to_lease",
]
