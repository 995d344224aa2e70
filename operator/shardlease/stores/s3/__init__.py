"""Leases and heartbeats as objects in S3 (or an S3-compatible store).

Layout under `s3://bucket/prefix`::

    <prefix>/<cluster>/leases/<shard>        one JSON lease per shard
    <prefix>/<cluster>/heartbeats/<node>     one JSON heartbeat per node
    <prefix>/<cluster>/epochs/<node>@<epoch> one JSON epoch record per node
                                             incarnation (node-mode renewal)
    <prefix>/<cluster>/epochs/moved          the move marker: random bytes,
                                             rewritten after every lease move
    <prefix>/.shardlease-probe/<random>      written and removed by `check()`

Versions are ETags without their quotes. Every lease write is conditional:
`If-None-Match: *` to create, `If-Match: "<etag>"` to update, so a node that
lost a race gets `Conflict` and never overwrites. S3 refuses a conditional
write in two ways, and they mean different things:

- 412 PreconditionFailed: the condition is false (the object exists, or its
  ETag moved). The race is lost: `Conflict`.
- 409 ConditionalRequestConflict: another write to the key was in flight. The
  condition may still hold, so the write is retried a few times after a short
  jittered pause, as long as a re-read shows the object still at the expected
  version (or still missing, for a create); otherwise `Conflict`.

An S3-compatible server that ignores the conditions would let two nodes own a
shard, so `check()` probes them at start and refuses such a store.

Request economy: `list_leases` makes one listing (one request per page of
1000 keys) and GETs only the leases whose ETag differs from what this store
object last read or wrote; `list_heartbeats` is one listing and no GET, since
liveness is judged from ETags changing.

In a node-mode steady state no lease record changes, yet the lease listing
is most of the requests (a page per 1,000 shards, every round). So a lease
write that readers must learn of (a claim, a free, a conversion: anything but
a shard-mode renewal) is followed by a blind PUT of random bytes to the move
marker, and `list_leases` answers from its last listing while the marker's
ETag has not moved and nothing in that listing changes by itself (see
`list_leases` for the rules, and why a stale answer is safe).

What that needs besides, the caller tells it (`stores.base.Listed`), and the
store checks rather than assumes:

- the marker's ETag, read since the previous `list_leases` returned. The
  marker lives in `epochs/`, which the node-mode loop lists every round just
  before the leases: `list_epochs` leaves the ETag it saw in its answer
  (`EpochListing.mark`, with this store object, the cluster and when the
  listing started), and `list_leases` takes it from the epoch listing it is
  given only if this object made it, of that cluster, after its previous
  call returned; else it HEADs the marker (when the answer can matter);
- that nobody heartbeats (a peer of an older version puts no marks): from
  the heartbeat listings it is told of, the last one each time.

Told nothing, it lists: `shardlease owners` and any one-shot reader see the
truth at the cost of a listing.

The package's parts, one job each: `url` (the store URL), `keys` (where each
record lives), `transport` (the aiobotocore session, its hooks, the errors it
maps), `cache` (the records by ETag, the move marker and what a listing
may skip), `probe` (the start-up check of conditional writes), `store`
(`S3Store`: the interface, the listing).
"""

from __future__ import annotations

from shardlease.stores.s3.cache import FULL_LIST_EVERY, MOVED, QUIET_LISTINGS
from shardlease.stores.s3.keys import clean_etag
from shardlease.stores.s3.store import S3Store
from shardlease.stores.s3.transport import read_at_most
from shardlease.stores.s3.url import URL_FORM

__all__ = ["FULL_LIST_EVERY", "MOVED", "QUIET_LISTINGS", "URL_FORM", "S3Store", "clean_etag",
           "read_at_most"]
