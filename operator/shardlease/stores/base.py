"""The lease store interface: the one thing the loop knows about storage.

Modelled on client-go's `resourcelock`: a handful of calls on backend-neutral
records, where every write is a compare-and-swap on the version last read.
A store never decides anything; it reports what is there and refuses writes
whose version is stale (`Conflict`). Other failures are `StoreError`.

A lease that vanishes (deleted out of band: the loop never deletes one) after
this store object saw it held or corrupt is reported as what it last was, a
lease nobody may take yet, rather than as missing: a corrupt entry whose
version starts with `VANISHED` and that carries the last generation seen.
The loop treats it like any corrupt record, held until a whole TTL has passed
since it first saw it (here: since it vanished), then claims it above that
generation; `write_lease` turns a claim on such a version into a create.
Without this, a deleted lease would be claimable at once, at generation 1,
while its holder may still be acting on it. A store object that never saw the
lease (a node started after the deletion) cannot know; nothing can.
"""

from __future__ import annotations

import abc
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Literal

from shardlease.errors import Conflict, StoreError
from shardlease.records import Epoch, Heartbeat, Lease, Stored

#: The version prefix of a lease reported after it vanished (see the module doc).
VANISHED = "vanished:"


class EpochListing(dict[tuple[str, str], str]):
    """The epoch records of a cluster, (node, epoch) -> version, and `ended`:
    the ones the listing itself shows ended (`Epoch.ended_by` set), where a
    store's listing can tell at no extra request. A hint only: the loop reads
    such a record before it takes the epoch for ended (a graceful stop ends
    its own epoch, and peers then take its leases within a round instead of
    after a TTL of silence).

    `mark`: opaque to everyone but the store that made the listing, which may
    leave there what the listing saw for its own use when the listing is
    passed back to its `list_leases` (`Listed`); None for most stores (the S3
    store: the move marker's ETag, `stores.s3`)."""

    def __init__(self, versions: dict[tuple[str, str], str] | None = None,
                 ended: frozenset[tuple[str, str]] = frozenset(),
                 mark: object | None = None) -> None:
        super().__init__(versions or {})
        self.ended = ended
        self.mark = mark


def ended_hints(listing: Mapping[tuple[str, str], str]) -> frozenset[tuple[str, str]]:
    """The epochs a listing shows ended (none for a plain mapping)."""
    return listing.ended if isinstance(listing, EpochListing) else frozenset()


@dataclass(frozen=True)
class Listed:
    """What a caller of `list_leases` tells the store of its own other
    listings of the cluster, for a store whose listing answers from a cache
    to check that cache by (the S3 store's move marker, `stores.s3`).

    Optional, and never needed to be right: a store that is passed nothing
    (or `Listed()`) reads what it needs itself or lists in full. What a
    store can check, it checks: the S3 store takes the marker from
    `epochs` only if the listing's origin is its own (this very object
    made it, of this cluster, and it started after its previous
    `list_leases` of it returned), and does as if told no epoch listing
    otherwise. `heartbeats` it cannot check: it trusts the caller that it
    is the caller's own latest heartbeat listing of that cluster (a stale
    or foreign one may make it serve its cache when somebody beats).
    Stores without such a cache ignore it."""

    #: The epoch listing of the cluster the caller made since its previous
    #: `list_leases` of it returned, as `list_epochs` gave it (None: none,
    #: or it failed).
    epochs: Mapping[tuple[str, str], str] | None = None
    #: The caller's last heartbeat listing of the cluster, as
    #: `list_heartbeats` gave it (None: it made none, or its last one
    #: failed). A caller with no newer one tells the same object again,
    #: which is not counted as another listing.
    heartbeats: Mapping[str, str] | None = None


@dataclass(frozen=True)
class Change:
    """One record of a cluster as a store's watch saw it change (any
    writer's, this node's too). A hint only, like `EpochListing.ended`: the
    loop only wakes a round on it (`loop.wakes`), which reads as any round."""

    kind: Literal["lease", "epoch", "heartbeat"]
    what: Literal["added", "modified", "deleted"]
    #: The node the record is of (epochs, heartbeats), if it says.
    node: str | None = None
    #: leases: the record is readable and names no owner (freed).
    free: bool = False
    #: epochs: the record says it is ended (a graceful stop ended it).
    ended: bool = False


class LeaseStore(abc.ABC):
    """Where the leases and heartbeats of clusters live.

    Versions are opaque strings (an S3 ETag, a Kubernetes resourceVersion, a
    content hash): they only need to change whenever the record is written.
    Every record written by shardlease carries a fresh `write_id`, so every
    write changes the version even where the version is a content hash.
    """

    def __init__(self) -> None:
        #: (cluster, shard) -> the last entry seen of each lease that was held
        #: or corrupt, to report it if it vanishes (see the module doc).
        self._last_held: dict[tuple[str, int], Stored[Lease]] = {}

    @abc.abstractmethod
    def describe(self) -> str:
        """A short human description (URL without secrets)."""

    def retried_by_caller(self) -> None:  # noqa: B027 - optional hook
        """The caller retries every failed call itself, within budgets of its
        own (the placement loop): from now on the store should make one
        attempt per call and fail fast, rather than retry with pauses of its
        own inside the caller's budget. The default does nothing (stores that
        do not retry)."""

    #: Whether the store watches its backend (`watch_changes` works).
    watches = False

    def watch_changes(self, cluster: str,
                      callback: Callable[[Change], None]) -> Callable[[], None] | None:
        """Call `callback` for every change the store's watch sees of the
        cluster's records, from the store's own task, until the returned
        function is called. None: this store has no watch (its readers
        learn changes by listing)."""
        return None

    async def check(self) -> None:  # noqa: B027 - optional hook
        """Verify at start that the store is reachable and enforces conditional
        writes. Raises `StoreUnsafe` or `StoreError` with a message saying what
        to do. The default does nothing (stores that enforce it by design)."""

    async def check_readable(self) -> None:  # noqa: B027 - optional hook
        """Verify, writing nothing, that the store exists and can be read (for
        read-only commands such as `shardlease owners`, where an empty answer
        from a store that is not there would look like "no owners"). Raises
        `StoreError` saying what is missing. The default does nothing."""

    async def aclose(self) -> None:  # noqa: B027 - optional hook, nothing to close by default
        """Release connections."""

    # -- leases ---------------------------------------------------------------

    @abc.abstractmethod
    async def list_leases(self, cluster: str, *,
                          seen: Listed | None = None) -> dict[int, Stored[Lease]]:
        """Every lease of the cluster, by shard. Corrupt records are returned
        with `record=None`, an error and the generation recovered from them,
        never raised; so are leases that vanished after being seen held (see
        the module doc). Implementations end with `_observed_all`.

        `seen`: the caller's other listings of the cluster (`Listed`), which
        may spare a store with a listing cache requests; the answer is as
        right without them."""

    @abc.abstractmethod
    async def get_lease(self, cluster: str, shard: int) -> Stored[Lease] | None:
        """One lease, or None when there is none (or the vanished entry, as in
        `list_leases`). Implementations end with `_observed_one`."""

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
    async def get_heartbeat(self, cluster: str, node: str) -> Heartbeat | None:
        """One node's heartbeat, or None when it has none. Raises
        `CorruptRecord` (a `NewerFormat` too) when what is there cannot be
        read as one: its content matters only to a node that must know how
        long its peers may hold leases (`Heartbeat.holds_by`)."""

    @abc.abstractmethod
    async def put_heartbeat(self, heartbeat: Heartbeat) -> None:
        """Write this node's heartbeat (each node writes only its own)."""

    @abc.abstractmethod
    async def delete_heartbeat(self, cluster: str, node: str) -> None:
        """Remove a node's heartbeat (graceful stop), so that peers stop
        counting it at once. Missing is not an error."""

    # -- epochs (node-mode renewal) --------------------------------------------
    #
    # One record per (node, epoch), so that a listing alone tells each epoch
    # apart (no GET per node per round). A missing record on update is a
    # `Conflict`, never a create: an epoch that was ended or deleted can never
    # be written again by its owner.

    @abc.abstractmethod
    async def list_epochs(self, cluster: str) -> dict[tuple[str, str], str]:
        """The epoch records of the cluster: (node, epoch) -> version; an
        `EpochListing` where the store can also tell which are ended."""

    @abc.abstractmethod
    async def get_epoch(self, cluster: str, node: str, epoch: str) -> Stored[Epoch] | None:
        """One epoch record, or None."""

    @abc.abstractmethod
    async def create_epoch(self, record: Epoch) -> str:
        """Create the record if none exists; its version. `Conflict` if one does."""

    @abc.abstractmethod
    async def update_epoch(self, record: Epoch, version: str) -> str:
        """Replace the record if its version is still `version` (`Conflict`
        if it changed or is gone); the new version."""

    @abc.abstractmethod
    async def delete_epoch(self, cluster: str, node: str, epoch: str) -> None:
        """Remove an epoch record (missing is not an error)."""

    async def write_epoch(self, record: Epoch, version: str | None) -> str:
        """Create (version None) or compare-and-swap an epoch record,
        recognising a write of our own whose answer was lost, as `write_lease`."""
        try:
            if version is None:
                return await self.create_epoch(record)
            return await self.update_epoch(record, version)
        except (StoreError, Conflict) as first:
            try:
                current = await self.get_epoch(record.cluster, record.node, record.epoch)
            except StoreError as e:
                if isinstance(first, Conflict):
                    # Perhaps our own earlier attempt: a Conflict here would
                    # fence every shard of the epoch, so say "unknown" instead.
                    raise StoreError(f"{first}; and the record could not be read to tell "
                                     f"whether the write was ours: {e}") from e
                raise first from None
            if current is not None and current.record is not None \
                    and current.record.write_id == record.write_id:
                return current.version
            raise

    # -- shared behaviour -----------------------------------------------------

    def _note(self, cluster: str, shard: int, stored: Stored[Lease]) -> None:
        """Remember a lease read or written, if it is one nobody may take yet."""
        if stored.version.startswith(VANISHED):
            return
        if stored.record is not None and stored.record.owner is None:
            self._last_held.pop((cluster, shard), None)  # free: claimable if it vanishes
        else:
            self._last_held[(cluster, shard)] = stored

    def _vanished(self, cluster: str, shard: int) -> Stored[Lease] | None:
        """The entry standing for a lease that vanished after being seen held."""
        last = self._last_held.get((cluster, shard))
        if last is None or last.version.startswith(VANISHED):
            return last
        seen = [f"held by {last.record.owner!r}" if last.record is not None else "corrupt"]
        if last.generation is not None:
            seen.append(f"at generation {last.generation}")
        entry: Stored[Lease] = Stored(
            VANISHED + last.version, None,
            f"lease {cluster}/{shard} was deleted out of band (last seen {' '.join(seen)}); "
            "treated as held until it expires", last.generation)
        self._last_held[(cluster, shard)] = entry
        return entry

    def _observed_all(self, cluster: str,
                      found: dict[int, Stored[Lease]]) -> dict[int, Stored[Lease]]:
        """A complete listing of `cluster`'s leases, with the vanished ones
        added back as entries that say so. Every store's `list_leases` ends here."""
        last = self._last_held
        for shard, stored in found.items():
            if last.get((cluster, shard)) is not stored:  # (unchanged: noted already)
                self._note(cluster, shard, stored)
        gone = sorted(s for c, s in self._last_held if c == cluster and s not in found)
        for shard in gone:
            entry = self._vanished(cluster, shard)
            if entry is not None:
                found[shard] = entry
        return dict(sorted(found.items()))

    def _observed_one(self, cluster: str, shard: int,
                      stored: Stored[Lease] | None) -> Stored[Lease] | None:
        """One lease as read by `get_lease`, like `_observed_all` for one shard."""
        if stored is None:
            return self._vanished(cluster, shard)
        self._note(cluster, shard, stored)
        return stored

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
            if version is None or version.startswith(VANISHED):
                written = await self.create_lease(lease)
            else:
                written = await self.update_lease(lease, version)
        except (StoreError, Conflict) as first:
            # A Conflict too: the retry of a write that had landed conflicts with it.
            try:
                current = await self.get_lease(lease.cluster, lease.shard)
            except StoreError:
                raise first from None
            if current is not None and current.record is not None \
                    and current.record.write_id == lease.write_id:
                return current.version
            raise
        self._note(lease.cluster, lease.shard, Stored(written, lease))
        return written
