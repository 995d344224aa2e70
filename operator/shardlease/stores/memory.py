"""In-process store: the reference implementation, for tests and the simulation.

Stores sharing one `MemoryBackend` see the same records, like processes sharing
one bucket. The backend keeps bytes, not objects, so the memory store goes
through the same encoding and validation as the real stores.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field

from shardlease.errors import Conflict
from shardlease.records import (
    Epoch,
    Heartbeat,
    Lease,
    Stored,
    decode_heartbeat,
    encode,
    stored_epoch,
    stored_lease,
)
from shardlease.stores.base import EpochListing, LeaseStore, Listed
from shardlease.stores.requests import RequestObservers


@dataclass
class MemoryBackend:
    """The shared state: (cluster, shard) -> (version, bytes)."""

    leases: dict[tuple[str, int], tuple[str, bytes]] = field(default_factory=dict)
    heartbeats: dict[tuple[str, str], tuple[str, bytes]] = field(default_factory=dict)
    epochs: dict[tuple[str, str, str], tuple[str, bytes]] = field(default_factory=dict)
    _versions: itertools.count[int] = field(default_factory=lambda: itertools.count(1))

    def next_version(self) -> str:
        return str(next(self._versions))


_NAMED: dict[str, MemoryBackend] = {}


def named_backend(name: str) -> MemoryBackend:
    """`memory://NAME` stores of one process share the backend called NAME."""
    return _NAMED.setdefault(name, MemoryBackend())


class MemoryStore(LeaseStore):
    def __init__(self, backend: MemoryBackend | None = None, name: str = "") -> None:
        super().__init__()
        #: Told of every backend request this store makes (`stores.requests`).
        self.backend_requests = RequestObservers()
        self.backend = backend if backend is not None else MemoryBackend()
        self.name = name
        self._decoded: dict[tuple[str, int], Stored[Lease]] = {}

    def describe(self) -> str:
        return f"memory://{self.name}"

    async def list_leases(self, cluster: str, *,
                          seen: Listed | None = None) -> dict[int, Stored[Lease]]:
        self.backend_requests.report("list")
        found: dict[int, Stored[Lease]] = {}
        for (c, shard), (version, data) in sorted(self.backend.leases.items()):
            if c != cluster:
                continue
            # Decoded once per version, as a real store GETs only what changed:
            # a listing then costs what changed, not the shard count.
            cached = self._decoded.get((c, shard))
            if cached is None or cached.version != version:
                cached = self._decoded[(c, shard)] = stored_lease(data, version, cluster, shard)
            found[shard] = cached
        return self._observed_all(cluster, found)

    async def get_lease(self, cluster: str, shard: int) -> Stored[Lease] | None:
        self.backend_requests.report("get")
        found = self.backend.leases.get((cluster, shard))
        return self._observed_one(
            cluster, shard,
            None if found is None else stored_lease(found[1], found[0], cluster, shard))

    async def create_lease(self, lease: Lease) -> str:
        self.backend_requests.report("put")
        key = (lease.cluster, lease.shard)
        if key in self.backend.leases:
            raise Conflict(f"lease {lease.cluster}/{lease.shard} exists")
        version = self.backend.next_version()
        self.backend.leases[key] = (version, encode(lease))
        return version

    async def update_lease(self, lease: Lease, version: str) -> str:
        self.backend_requests.report("put")
        key = (lease.cluster, lease.shard)
        found = self.backend.leases.get(key)
        if found is None or found[0] != version:
            raise Conflict(f"lease {lease.cluster}/{lease.shard} changed since version {version}")
        new = self.backend.next_version()
        self.backend.leases[key] = (new, encode(lease))
        return new

    async def list_heartbeats(self, cluster: str) -> dict[str, str]:
        self.backend_requests.report("list")
        return {node: v for (c, node), (v, _) in self.backend.heartbeats.items() if c == cluster}

    async def get_heartbeat(self, cluster: str, node: str) -> Heartbeat | None:
        self.backend_requests.report("get")
        found = self.backend.heartbeats.get((cluster, node))
        return None if found is None else decode_heartbeat(found[1], cluster, node)

    async def put_heartbeat(self, heartbeat: Heartbeat) -> None:
        self.backend_requests.report("put")
        self.backend.heartbeats[(heartbeat.cluster, heartbeat.node)] = (
            self.backend.next_version(), encode(heartbeat))

    async def delete_heartbeat(self, cluster: str, node: str) -> None:
        self.backend_requests.report("delete")
        self.backend.heartbeats.pop((cluster, node), None)

    async def list_epochs(self, cluster: str) -> dict[tuple[str, str], str]:
        self.backend_requests.report("list")
        found = {(node, epoch): (v, data)
                 for (c, node, epoch), (v, data) in self.backend.epochs.items() if c == cluster}
        return EpochListing({key: v for key, (v, _) in found.items()},
                            frozenset(key for key, (v, data) in found.items()
                                      if _ended(data, cluster, *key)))

    async def get_epoch(self, cluster: str, node: str, epoch: str) -> Stored[Epoch] | None:
        self.backend_requests.report("get")
        found = self.backend.epochs.get((cluster, node, epoch))
        return None if found is None else stored_epoch(found[1], found[0], cluster, node, epoch)

    async def create_epoch(self, record: Epoch) -> str:
        self.backend_requests.report("put")
        key = (record.cluster, record.node, record.epoch)
        if key in self.backend.epochs:
            raise Conflict(f"epoch {'/'.join(key)} exists")
        version = self.backend.next_version()
        self.backend.epochs[key] = (version, encode(record))
        return version

    async def update_epoch(self, record: Epoch, version: str) -> str:
        self.backend_requests.report("put")
        key = (record.cluster, record.node, record.epoch)
        found = self.backend.epochs.get(key)
        if found is None or found[0] != version:
            raise Conflict(f"epoch {'/'.join(key)} changed since version {version}")
        new = self.backend.next_version()
        self.backend.epochs[key] = (new, encode(record))
        return new

    async def delete_epoch(self, cluster: str, node: str, epoch: str) -> None:
        self.backend_requests.report("delete")
        self.backend.epochs.pop((cluster, node, epoch), None)

    def put_raw_lease(self, cluster: str, shard: int, data: bytes) -> None:
        """Write arbitrary bytes as a lease (tests of corrupt records)."""
        self.backend.leases[(cluster, shard)] = (self.backend.next_version(), data)


def _ended(data: bytes, cluster: str, node: str, epoch: str) -> bool:
    record = stored_epoch(data, "", cluster, node, epoch).record
    return record is not None and record.ended_by is not None
