"""The lease store interface: the one thing the loop knows about storage.

Modelled on client-go's `resourcelock`: a handful of calls on backend-neutral
records, where every write is a compare-and-swap on the version last read.
A store never decides anything; it reports what is there and refuses writes
whose version is stale (`Conflict`). Other failures are `StoreError`.
"""

from __future__ import annotations

import abc
import collections

from shardlease.errors import StoreError
from shardlease.records import Heartbeat, Lease, Stored


class LeaseStore(abc.ABC):
    """Where the leases and heartbeats of clusters live.

    Versions are opaque strings (an S3 ETag, a Kubernetes resourceVersion, a
    content hash): they only need to change whenever the record is written.
    Every record written by shardlease carries a fresh `write_id`, so every
    write changes the version even where the version is a content hash.
    """

    def __init__(self) -> None:
        #: Backend requests made, by kind ("list", "get", "put", ...): for the
        #: metrics and the benchmark's requests per round.
        self.requests: collections.Counter[str] = collections.Counter()

    def _count(self, kind: str, n: int = 1) -> None:
        self.requests[kind] += n

    @abc.abstractmethod
    def describe(self) -> str:
        """A short human description (URL without secrets)."""

    async def check(self) -> None:  # noqa: B027 - optional hook
        """Verify at start that the store is reachable and enforces conditional
        writes. Raises `StoreUnsafe` or `StoreError` with a message saying what
        to do. The default does nothing (stores that enforce it by design)."""

    async def aclose(self) -> None:  # noqa: B027 - optional hook, nothing to close by default
        """Release connections."""

    # -- leases ---------------------------------------------------------------

    @abc.abstractmethod
    async def list_leases(self, cluster: str) -> dict[int, Stored[Lease]]:
        """Every lease of the cluster, by shard. Corrupt records are returned
        with `record=None` and an error, never raised."""

    @abc.abstractmethod
    async def get_lease(self, cluster: str, shard: int) -> Stored[Lease] | None:
        """One lease, or None when there is none."""

    @abc.abstractmethod
    async def create_lease(self, lease: Lease) -> str:
        """Create the lease if no record exists for its shard; return its version.
        Raises `Conflict` if one exists."""

    @abc.abstractmethod
    async def update_lease(self, lease: Lease, version: str) -> str:
        """Replace the lease if its version is still `version`; return the new
        version. Raises `Conflict` otherwise (changed or gone)."""

    # -- heartbeats -----------------------------------------------------------

    @abc.abstractmethod
    async def list_heartbeats(self, cluster: str) -> dict[str, str]:
        """The heartbeat versions of the cluster, by node name. Liveness is
        judged from a version changing, so the contents are not needed."""

    @abc.abstractmethod
    async def put_heartbeat(self, heartbeat: Heartbeat) -> None:
        """Write this node's heartbeat (each node writes only its own)."""

    @abc.abstractmethod
    async def delete_heartbeat(self, cluster: str, node: str) -> None:
        """Remove a node's heartbeat (graceful stop), so that peers stop
        counting it at once. Missing is not an error."""

    # -- shared behaviour -----------------------------------------------------

    async def write_lease(self, lease: Lease, version: str | None) -> str:
        """Create (version None) or compare-and-swap a lease, and recognise a
        write of our own whose answer was lost.

        Clients retry on lost connections: a retried conditional write whose
        first attempt succeeded is refused (the version moved, by us). The
        record's `write_id` tells our success from a lost race; without this a
        node could believe it lost a lease it holds (harmless) or, worse, retry
        the claim with a newer generation and run twice.
        """
        try:
            if version is None:
                return await self.create_lease(lease)
            return await self.update_lease(lease, version)
        except StoreError as first:
            try:
                current = await self.get_lease(lease.cluster, lease.shard)
            except StoreError:
                raise first from None
            if current is not None and current.record is not None \
                    and current.record.write_id == lease.write_id:
                return current.version
            raise
