"""The behaviour every lease store must have, written once.

Subclass `StoreContract` in a `test_*.py` module, as a class named `Test...`,
and define these fixtures on the subclass (plain `@pytest.fixture`; async
fixtures work as is, pytest-asyncio runs in auto mode):

`store` (required)
    A fresh, empty `LeaseStore` (no leases or heartbeats in any cluster the
    tests use). An async generator fixture is fine; close the store after
    `yield`.

`put_raw` (required)
    A callable `async (cluster: str, shard: int, data: bytes) -> None` that
    plants `data` as the stored lease record of `shard` in `cluster`, bypassing
    encoding and validation, in the backing storage `store` reads (for the
    corrupt record tests). It must create the record if missing and replace it
    otherwise.

`delete_raw` (required)
    A callable `async (cluster: str, shard: int) -> None` that deletes the
    stored lease record of `shard` in `cluster` behind the store's back, as
    an operator with `kubectl delete` or `aws s3 rm` would.

`make_second_store` (optional)
    A callable `async () -> LeaseStore` that opens another client on the same
    backing storage as `store`, as another process would (a new connection /
    session / directory handle). It is called up to twenty times per test; the
    fixture closes what it opened at teardown. The default returns `store`
    itself, for a backend that has no second client.

`second_store` is derived from `make_second_store`; subclasses need not define it.

The contract never sleeps and never depends on wall-clock time; the tests use
the clusters named in `CLUSTER` and `OTHER_CLUSTER`.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import pytest

from shardlease.errors import Conflict, StoreError
from shardlease.records import (
    MAX_KEEPS_SHARD,
    MAX_LEASE_TTL,
    MAX_RECORD_BYTES,
    Epoch,
    Heartbeat,
    Lease,
    Stored,
    decode_shards,
    encode,
    encode_shards,
    new_write_id,
)
from shardlease.stores.base import VANISHED, Change, LeaseStore, Listed, ended_hints
from shardlease.stores.requests import count_requests

CLUSTER = "contract"
OTHER_CLUSTER = "contract-other"
CLAIMERS = 20

PutRaw = Callable[[str, int, bytes], Awaitable[None]]
DeleteRaw = Callable[[str, int], Awaitable[None]]
MakeStore = Callable[[], Awaitable[LeaseStore]]


def make_lease(shard: int = 0, owner: str | None = "node-a", generation: int = 1,
               cluster: str = CLUSTER, **extra: Any) -> Lease:
    """A valid lease with a fresh write_id."""
    return Lease(cluster=cluster, shard=shard, owner=owner, generation=generation,
                 incarnation="inc-1", write_id=new_write_id(), renewed_at=1000.0, ttl=15.0,
                 **extra)


def rewrite(lease: Lease, **changes: Any) -> Lease:
    """The same lease as a new write (fresh write_id), with `changes`."""
    return lease.model_copy(update={"write_id": new_write_id(), **changes})


def make_heartbeat(node: str = "node-a", seq: int = 0, cluster: str = CLUSTER) -> Heartbeat:
    return Heartbeat(cluster=cluster, node=node, incarnation="inc-1", seq=seq,
                     write_id=new_write_id(), at=1000.0)


def valid(stored: Stored[Lease] | None) -> Lease:
    """The record of a stored lease that must be present and valid."""
    assert stored is not None, "lease is missing"
    assert stored.error is None, stored.error
    assert stored.record is not None
    return stored.record


class LostAnswerStore(LeaseStore):
    """Another client on `inner`'s storage whose next write answer is lost.

    With `happen=True` the write really happens, then the call raises
    `StoreError` as a dropped connection would; with `happen=False` it raises
    before reaching the store. Everything else is passed through, so the
    inherited `write_lease` runs its recovery against the real store.
    """

    def __init__(self, inner: LeaseStore, happen: bool = True) -> None:
        super().__init__()
        self.inner = inner
        self.happen = happen
        self.lose_next = True

    def describe(self) -> str:
        return f"lost-answer({self.inner.describe()})"

    def _lose(self) -> None:
        if self.lose_next:
            self.lose_next = False
            raise StoreError("connection reset by peer (simulated lost answer)")

    async def list_leases(self, cluster: str, *,
                          seen: Listed | None = None) -> dict[int, Stored[Lease]]:
        return await self.inner.list_leases(cluster, seen=seen)

    async def get_lease(self, cluster: str, shard: int) -> Stored[Lease] | None:
        return await self.inner.get_lease(cluster, shard)

    async def create_lease(self, lease: Lease) -> str:
        if not self.happen:
            self._lose()
        version = await self.inner.create_lease(lease)
        self._lose()
        return version

    async def update_lease(self, lease: Lease, version: str) -> str:
        if not self.happen:
            self._lose()
        new = await self.inner.update_lease(lease, version)
        self._lose()
        return new

    async def list_heartbeats(self, cluster: str) -> dict[str, str]:
        return await self.inner.list_heartbeats(cluster)

    async def get_heartbeat(self, cluster: str, node: str) -> Heartbeat | None:
        return await self.inner.get_heartbeat(cluster, node)

    async def put_heartbeat(self, heartbeat: Heartbeat) -> None:
        await self.inner.put_heartbeat(heartbeat)

    async def delete_heartbeat(self, cluster: str, node: str) -> None:
        await self.inner.delete_heartbeat(cluster, node)

    async def list_epochs(self, cluster: str) -> dict[tuple[str, str], str]:
        return await self.inner.list_epochs(cluster)

    async def get_epoch(self, cluster: str, node: str, epoch: str) -> Stored[Epoch] | None:
        return await self.inner.get_epoch(cluster, node, epoch)

    async def create_epoch(self, record: Epoch) -> str:
        if not self.happen:
            self._lose()
        version = await self.inner.create_epoch(record)
        self._lose()
        return version

    async def update_epoch(self, record: Epoch, version: str) -> str:
        if not self.happen:
            self._lose()
        new = await self.inner.update_epoch(record, version)
        self._lose()
        return new

    async def delete_epoch(self, cluster: str, node: str, epoch: str) -> None:
        await self.inner.delete_epoch(cluster, node, epoch)


def make_epoch(node: str = "node-a", epoch: str = "e1", seq: int = 0,
               cluster: str = CLUSTER, **extra: Any) -> Epoch:
    return Epoch(cluster=cluster, node=node, epoch=epoch, seq=seq, write_id=new_write_id(),
                 at=1000.0, ttl=15.0, **extra)


class StoreContract:
    """Tests every `LeaseStore` must pass; see the module docstring for the fixtures."""

    # -- fixtures a subclass provides -----------------------------------------

    @pytest.fixture
    async def store(self) -> AsyncIterator[LeaseStore]:
        raise NotImplementedError("the store's test class must define the `store` fixture")
        yield  # pragma: no cover

    @pytest.fixture
    def put_raw(self, store: LeaseStore) -> PutRaw:
        raise NotImplementedError("the store's test class must define the `put_raw` fixture")

    @pytest.fixture
    def delete_raw(self, store: LeaseStore) -> DeleteRaw:
        raise NotImplementedError("the store's test class must define the `delete_raw` fixture")

    @pytest.fixture
    def make_second_store(self, store: LeaseStore) -> MakeStore:
        async def same() -> LeaseStore:
            return store
        return same

    @pytest.fixture
    async def second_store(self, make_second_store: MakeStore) -> LeaseStore:
        return await make_second_store()

    # -- epochs (node-mode renewal) -----------------------------------------------

    async def test_epochs_are_created_once_listed_read_and_swapped(
            self, store: LeaseStore, second_store: LeaseStore) -> None:
        assert await store.list_epochs(CLUSTER) == {}
        first = make_epoch("node-a", "e1")
        v1 = await store.create_epoch(first)
        with pytest.raises(Conflict):
            await second_store.create_epoch(make_epoch("node-a", "e1"))
        await store.create_epoch(make_epoch("node-a", "e2"))
        await store.create_epoch(make_epoch("node-b", "e1", cluster=OTHER_CLUSTER))
        listed = await store.list_epochs(CLUSTER)
        assert set(listed) == {("node-a", "e1"), ("node-a", "e2")}
        assert listed[("node-a", "e1")] == v1
        got = await second_store.get_epoch(CLUSTER, "node-a", "e1")
        assert got is not None and got.record == first and got.version == v1
        assert await store.get_epoch(CLUSTER, "node-a", "e9") is None
        renewed = make_epoch("node-a", "e1", seq=1)
        v2 = await store.update_epoch(renewed, v1)
        assert v2 != v1
        assert (await store.list_epochs(CLUSTER))[("node-a", "e1")] == v2
        # A peer that read v1 cannot end it any more: the owner wrote since.
        with pytest.raises(Conflict):
            await second_store.update_epoch(make_epoch("node-a", "e1", ended_by="node-b"), v1)
        ended = make_epoch("node-a", "e1", ended_by="node-b")
        v3 = await second_store.update_epoch(ended, v2)
        # ...and once it is ended, the owner's next write is refused.
        with pytest.raises(Conflict):
            await store.update_epoch(make_epoch("node-a", "e1", seq=2), v2)
        got = await store.get_epoch(CLUSTER, "node-a", "e1")
        assert got is not None and got.record is not None and got.version == v3
        assert got.record.ended_by == "node-b"

    async def test_an_epoch_says_what_it_keeps_even_every_shard_scattered(
            self, store: LeaseStore, second_store: LeaseStore) -> None:
        # The largest `keeps` a node writes (8,192 shards) fits every store's
        # record limit; a peer reads the set back as written.
        every = make_epoch("node-a", "e1").model_copy(
            update={"keeps": encode_shards(range(MAX_KEEPS_SHARD + 1))})
        odd = make_epoch("node-a", "e2").model_copy(
            update={"keeps": encode_shards(range(1, MAX_KEEPS_SHARD + 1, 2))})
        await store.create_epoch(every)
        await store.create_epoch(odd)
        for record, shards in ((every, range(MAX_KEEPS_SHARD + 1)),
                               (odd, range(1, MAX_KEEPS_SHARD + 1, 2))):
            got = await second_store.get_epoch(CLUSTER, record.node, record.epoch)
            assert got is not None and got.record == record
            assert got.record.keeps is not None
            assert decode_shards(got.record.keeps) == frozenset(shards)

    async def test_a_listing_tells_which_epochs_are_ended(
            self, store: LeaseStore, second_store: LeaseStore) -> None:
        # A graceful stop ends its own epoch; peers learn it from their next
        # listing (a hint they confirm by a read) instead of a TTL of silence.
        # (Written by the second client, listed by the first: a watch-fed
        # store's second client returns once the first's cache shows a write.)
        v1 = await second_store.create_epoch(make_epoch("node-a", "e1"))
        await second_store.create_epoch(make_epoch("node-b", "e1"))
        listed = await store.list_epochs(CLUSTER)
        assert ended_hints(listed) == frozenset()
        await second_store.update_epoch(make_epoch("node-a", "e1", ended_by="node-a"), v1)
        listed = await store.list_epochs(CLUSTER)
        assert set(listed) == {("node-a", "e1"), ("node-b", "e1")}
        assert ended_hints(listed) == {("node-a", "e1")}
        # Gone with its record (garbage collection), hint and all.
        await second_store.delete_epoch(CLUSTER, "node-a", "e1")
        listed = await store.list_epochs(CLUSTER)
        assert set(listed) == {("node-b", "e1")} and ended_hints(listed) == frozenset()

    async def test_a_watching_store_tells_of_frees_ends_joins_and_leaves(
            self, store: LeaseStore, second_store: LeaseStore) -> None:
        # What wakes a peer's round at once (loop.wakes): on a store without
        # a watch, nothing (hints do it), and it says so.
        seen: list[Change] = []
        unwatch = store.watch_changes(CLUSTER, seen.append)
        assert (unwatch is not None) is store.watches
        if unwatch is None:
            return
        try:
            await store.list_leases(CLUSTER)  # (the watch runs from the first read)
            v = await second_store.create_lease(make_lease(0, owner="node-b"))
            await second_store.update_lease(rewrite(make_lease(0, owner="node-b"), owner=None), v)
            ve = await second_store.create_epoch(make_epoch("node-b", "e1"))
            await second_store.update_epoch(make_epoch("node-b", "e1", ended_by="node-b"), ve)
            await second_store.put_heartbeat(make_heartbeat("node-c"))
            await second_store.delete_heartbeat(CLUSTER, "node-c")
            wanted = [Change("lease", "added"), Change("lease", "modified", free=True),
                      Change("epoch", "added", node="node-b"),
                      Change("epoch", "modified", node="node-b", ended=True),
                      Change("heartbeat", "added", node="node-c"),
                      Change("heartbeat", "deleted", node="node-c")]
            async with asyncio.timeout(30):
                while [c for c in wanted if c not in seen]:  # noqa: ASYNC110 - a callback's list
                    await asyncio.sleep(0.05)
            unwatch()
            count = len(seen)
            await second_store.put_heartbeat(make_heartbeat("node-d"))
            await store.list_heartbeats(CLUSTER)
            await asyncio.sleep(0.5)
            assert len(seen) == count  # told nothing after unwatch()
        finally:
            unwatch()

    async def test_a_reserved_lease_and_a_held_epoch_end_read_back_as_written(
            self, store: LeaseStore) -> None:
        # `handoff: hold`: a free lease kept for a node's name, and an epoch
        # its owner ended with a hold, as every store keeps them.
        lease = rewrite(make_lease(3, owner=None), reserved_for="node-a", hold=30.0)
        version = await store.create_lease(lease)
        assert valid(await store.get_lease(CLUSTER, 3)) == lease
        assert valid((await store.list_leases(CLUSTER))[3]) == lease
        # Claimed by the node it was kept for, then freed for anyone: no
        # reservation is left behind by either write.
        claimed = rewrite(make_lease(3, owner="node-a", generation=2))
        version = await store.update_lease(claimed, version)
        assert valid(await store.get_lease(CLUSTER, 3)) == claimed
        freed = rewrite(claimed, owner=None)
        await store.update_lease(freed, version)
        assert valid(await store.get_lease(CLUSTER, 3)) == freed
        assert valid((await store.list_leases(CLUSTER))[3]).reserved() is None
        version = await store.create_epoch(make_epoch("node-a", "e1"))
        ended = make_epoch("node-a", "e1", ended_by="node-a").model_copy(update={"hold": 30.0})
        await store.update_epoch(ended, version)
        read = await store.get_epoch(CLUSTER, "node-a", "e1")
        assert read is not None and read.record == ended

    async def test_an_update_never_creates_a_deleted_epoch(self, store: LeaseStore) -> None:
        version = await store.create_epoch(make_epoch("node-a", "e1"))
        await store.delete_epoch(CLUSTER, "node-a", "e1")
        await store.delete_epoch(CLUSTER, "node-a", "e1")  # missing: not an error
        assert await store.list_epochs(CLUSTER) == {}
        with pytest.raises(Conflict):
            await store.update_epoch(make_epoch("node-a", "e1", seq=1), version)
        assert await store.list_epochs(CLUSTER) == {}
        assert await store.get_epoch(CLUSTER, "node-a", "e1") is None

    async def test_an_epoch_write_whose_answer_was_lost_is_recognised(
            self, store: LeaseStore) -> None:
        lossy = LostAnswerStore(store, happen=True)
        record = make_epoch("node-a", "e1")
        version = await lossy.write_epoch(record, None)
        got = await store.get_epoch(CLUSTER, "node-a", "e1")
        assert got is not None and got.record == record and got.version == version
        lossy.lose_next = True
        renewed = make_epoch("node-a", "e1", seq=1)
        again = await lossy.write_epoch(renewed, version)
        got = await store.get_epoch(CLUSTER, "node-a", "e1")
        assert got is not None and got.record == renewed and got.version == again
        # A refusal that was not ours stays a Conflict.
        with pytest.raises(Conflict):
            await store.write_epoch(make_epoch("node-a", "e1", seq=2), version)

    async def test_one_of_many_concurrent_enders_wins(
            self, store: LeaseStore, make_second_store: MakeStore) -> None:
        version = await store.create_epoch(make_epoch("node-a", "e1"))
        others = [await make_second_store() for _ in range(5)]

        async def end(peer: LeaseStore, k: int) -> bool:
            try:
                await peer.update_epoch(make_epoch("node-a", "e1", ended_by=f"p{k}"), version)
            except Conflict:
                return False
            return True

        won = await asyncio.gather(*(end(p, k) for k, p in enumerate(others)))
        assert sum(won) == 1

    async def test_a_lease_says_how_it_is_renewed(self, store: LeaseStore) -> None:
        await store.create_lease(make_lease(3, renewal="node"))
        await store.create_lease(make_lease(4))
        leases = await store.list_leases(CLUSTER)
        assert valid(leases[3]).renewal == "node"
        assert valid(leases[4]).renewal == "shard"

    # -- creating and reading ---------------------------------------------------

    async def test_an_empty_store_has_no_leases_and_no_heartbeats(self, store: LeaseStore) -> None:
        assert await store.list_leases(CLUSTER) == {}
        assert await store.get_lease(CLUSTER, 0) is None
        assert await store.list_heartbeats(CLUSTER) == {}

    async def test_a_created_lease_reads_back_from_get_and_list_with_its_version(
            self, store: LeaseStore) -> None:
        lease = make_lease(shard=3, owner="node-a", generation=7)
        version = await store.create_lease(lease)
        assert isinstance(version, str) and version

        got = await store.get_lease(CLUSTER, 3)
        assert got is not None
        assert got.version == version
        assert valid(got) == lease

        listed = await store.list_leases(CLUSTER)
        assert list(listed) == [3]
        assert listed[3].version == version
        assert valid(listed[3]) == lease

    async def test_a_free_lease_without_owner_round_trips(self, store: LeaseStore) -> None:
        lease = make_lease(shard=0, owner=None, generation=0)
        await store.create_lease(lease)
        assert valid(await store.get_lease(CLUSTER, 0)) == lease

    async def test_several_shards_are_listed_each_under_its_own_number(
            self, store: LeaseStore) -> None:
        leases = {shard: make_lease(shard=shard, owner=f"node-{shard}") for shard in (0, 1, 2, 10)}
        for lease in leases.values():
            await store.create_lease(lease)
        listed = await store.list_leases(CLUSTER)
        assert sorted(listed) == [0, 1, 2, 10]
        assert {shard: valid(s) for shard, s in listed.items()} == leases

    async def test_a_second_client_sees_the_first_clients_writes(
            self, store: LeaseStore, second_store: LeaseStore) -> None:
        lease = make_lease(shard=1)
        version = await store.create_lease(lease)
        got = await second_store.get_lease(CLUSTER, 1)
        assert got is not None and got.version == version and valid(got) == lease
        newer = rewrite(lease, generation=2, owner="node-b")
        new_version = await second_store.update_lease(newer, version)
        got = await store.get_lease(CLUSTER, 1)
        assert got is not None and got.version == new_version and valid(got) == newer

    async def test_telling_list_leases_what_was_listed_never_changes_its_answer(
            self, store: LeaseStore) -> None:
        """`seen=` may spare a store requests, never change what it answers:
        rounds as the loop makes them (the epochs and heartbeats listed, then
        the leases told of them) answer what is there, at rest (where a
        listing cache may serve) and after each write, as a listing told
        nothing does."""
        versions = {shard: await store.create_lease(make_lease(shard, renewal="node"))
                    for shard in range(4)}

        async def told() -> dict[int, Stored[Lease]]:
            seen = Listed(epochs=await store.list_epochs(CLUSTER),
                          heartbeats=await store.list_heartbeats(CLUSTER))
            return await store.list_leases(CLUSTER, seen=seen)

        for _ in range(4):
            answer = await told()
            assert {shard: e.version for shard, e in answer.items()} == versions
        assert answer == await store.list_leases(CLUSTER)
        freed = rewrite(make_lease(1, renewal="node"), owner=None)
        versions[1] = await store.update_lease(freed, versions[1])
        claim = make_lease(5, owner="node-a", renewal="node")
        for round_ in range(4):
            answer = await told()
            assert {shard: e.version for shard, e in answer.items()} == versions
            assert valid(answer[1]) == freed
            if round_ == 0:
                versions[5] = await store.create_lease(claim)
        assert valid(answer[5]) == claim
        assert answer == await store.list_leases(CLUSTER)

    # -- compare-and-swap ---------------------------------------------------------

    async def test_creating_a_lease_that_exists_is_a_conflict_and_changes_nothing(
            self, store: LeaseStore) -> None:
        first = make_lease(shard=0, owner="node-a")
        version = await store.create_lease(first)
        with pytest.raises(Conflict):
            await store.create_lease(make_lease(shard=0, owner="node-b"))
        got = await store.get_lease(CLUSTER, 0)
        assert got is not None and got.version == version and valid(got) == first

    async def test_updating_with_a_stale_version_is_a_conflict_and_changes_nothing(
            self, store: LeaseStore) -> None:
        lease = make_lease(shard=0)
        stale = await store.create_lease(lease)
        renewed = rewrite(lease)
        current = await store.update_lease(renewed, stale)
        with pytest.raises(Conflict):
            await store.update_lease(rewrite(lease, owner="node-b", generation=2), stale)
        got = await store.get_lease(CLUSTER, 0)
        assert got is not None and got.version == current and valid(got) == renewed

    async def test_updating_a_missing_lease_is_a_conflict_and_creates_nothing(
            self, store: LeaseStore) -> None:
        lease = make_lease(shard=5)
        version = await store.create_lease(lease)
        with pytest.raises(Conflict):
            await store.update_lease(make_lease(shard=6), version)
        assert await store.get_lease(CLUSTER, 6) is None
        assert sorted(await store.list_leases(CLUSTER)) == [5]

    async def test_a_swap_against_the_loops_probe_version_is_a_conflict_and_writes_nothing(
            self, store: LeaseStore) -> None:
        # A withdrawn node probes lease writes with this (keeper.NO_SUCH_VERSION):
        # the store must answer Conflict, over a record and over none.
        from shardlease.keeper import NO_SUCH_VERSION

        lease = make_lease(shard=0)
        version = await store.create_lease(lease)
        with pytest.raises(Conflict):
            await store.update_lease(rewrite(lease, owner="node-b"), NO_SUCH_VERSION)
        with pytest.raises(Conflict):
            await store.update_lease(make_lease(shard=3), NO_SUCH_VERSION)
        got = await store.get_lease(CLUSTER, 0)
        assert got is not None and got.version == version and valid(got) == lease
        assert await store.get_lease(CLUSTER, 3) is None

    async def test_every_write_gets_a_new_version_even_when_only_the_write_id_changes(
            self, store: LeaseStore) -> None:
        lease = make_lease(shard=0)
        versions = [await store.create_lease(lease)]
        for _ in range(5):
            # Identical but for the write_id: a renewal of the same holder.
            versions.append(await store.update_lease(rewrite(lease), versions[-1]))
            got = await store.get_lease(CLUSTER, 0)
            assert got is not None and got.version == versions[-1]
        assert len(set(versions)) == len(versions), versions

    async def test_a_conflict_is_an_answer_not_a_store_error(self) -> None:
        # The loop retries StoreError (transient); a lost swap must never be
        # retried blindly, so `except StoreError` must not catch it.
        assert not issubclass(Conflict, StoreError)

    # -- the safety rules -------------------------------------------------------------

    async def test_freeing_a_lease_keeps_its_generation_and_its_record(
            self, store: LeaseStore) -> None:
        lease = make_lease(shard=2, owner="node-a", generation=4)
        version = await store.create_lease(lease)
        freed = rewrite(lease, owner=None)
        await store.update_lease(freed, version)

        got = valid(await store.get_lease(CLUSTER, 2))
        assert got.owner is None
        assert got.generation == 4
        listed = await store.list_leases(CLUSTER)
        assert 2 in listed and valid(listed[2]).generation == 4

    async def test_nothing_in_the_interface_deletes_a_lease(self, store: LeaseStore) -> None:
        def deleting(obj: object) -> list[str]:
            return sorted(
                name for name in dir(obj)
                if not name.startswith("_")
                and any(word in name for word in ("delete", "remove", "drop", "purge"))
            )
        # Epochs are deleted (ended or dead ones), never leases.
        assert deleting(LeaseStore) == ["delete_epoch", "delete_heartbeat"]
        assert deleting(store) == ["delete_epoch", "delete_heartbeat"]

    async def test_twenty_concurrent_creates_of_a_missing_lease_have_exactly_one_winner(
            self, make_second_store: MakeStore) -> None:
        clients = [await make_second_store() for _ in range(CLAIMERS)]
        claims = [make_lease(shard=7, owner=f"node-{i}") for i in range(CLAIMERS)]
        results = await asyncio.gather(
            *(client.create_lease(claim) for client, claim in zip(clients, claims, strict=True)),
            return_exceptions=True)

        winners = [i for i, r in enumerate(results) if isinstance(r, str)]
        others = [r for r in results if not isinstance(r, str | Conflict)]
        assert others == [], f"losers must get Conflict, got {others!r}"
        assert len(winners) == 1, results
        got = await clients[0].get_lease(CLUSTER, 7)
        assert got is not None and got.version == results[winners[0]]
        assert valid(got) == claims[winners[0]]

    async def test_twenty_concurrent_updates_from_one_version_have_exactly_one_winner(
            self, store: LeaseStore, make_second_store: MakeStore) -> None:
        lease = make_lease(shard=8, owner=None, generation=3)
        version = await store.create_lease(lease)
        clients = [await make_second_store() for _ in range(CLAIMERS)]
        claims = [rewrite(lease, owner=f"node-{i}", generation=4) for i in range(CLAIMERS)]
        results = await asyncio.gather(
            *(client.update_lease(claim, version)
              for client, claim in zip(clients, claims, strict=True)),
            return_exceptions=True)

        winners = [i for i, r in enumerate(results) if isinstance(r, str)]
        others = [r for r in results if not isinstance(r, str | Conflict)]
        assert others == [], f"losers must get Conflict, got {others!r}"
        assert len(winners) == 1, results
        got = await store.get_lease(CLUSTER, 8)
        assert got is not None and got.version == results[winners[0]]
        assert valid(got) == claims[winners[0]]

    # -- write_lease and lost answers ---------------------------------------------------

    async def test_write_lease_creates_when_there_is_no_version_and_swaps_otherwise(
            self, store: LeaseStore) -> None:
        lease = make_lease(shard=0)
        version = await store.write_lease(lease, None)
        renewed = rewrite(lease)
        new = await store.write_lease(renewed, version)
        got = await store.get_lease(CLUSTER, 0)
        assert got is not None and got.version == new != version and valid(got) == renewed

    async def test_write_lease_recognises_its_own_update_when_the_answer_was_lost(
            self, store: LeaseStore, second_store: LeaseStore) -> None:
        lease = make_lease(shard=1, generation=1)
        version = await store.create_lease(lease)
        lossy = LostAnswerStore(second_store, happen=True)
        claim = rewrite(lease, owner="node-b", generation=2)

        returned = await lossy.write_lease(claim, version)

        got = await store.get_lease(CLUSTER, 1)
        assert got is not None and valid(got) == claim
        assert returned == got.version
        assert not lossy.lose_next, "the simulated loss did not happen"

    async def test_write_lease_recognises_its_own_create_when_the_answer_was_lost(
            self, store: LeaseStore, second_store: LeaseStore) -> None:
        lossy = LostAnswerStore(second_store, happen=True)
        claim = make_lease(shard=2, owner="node-b")

        returned = await lossy.write_lease(claim, None)

        got = await store.get_lease(CLUSTER, 2)
        assert got is not None and valid(got) == claim
        assert returned == got.version

    async def test_write_lease_does_not_claim_a_write_that_never_happened(
            self, store: LeaseStore, second_store: LeaseStore) -> None:
        lease = make_lease(shard=3)
        version = await store.create_lease(lease)
        lossy = LostAnswerStore(second_store, happen=False)
        with pytest.raises(StoreError):
            await lossy.write_lease(rewrite(lease, owner="node-b", generation=2), version)
        got = await store.get_lease(CLUSTER, 3)
        assert got is not None and got.version == version and valid(got) == lease

    async def test_write_lease_still_raises_conflict_when_the_race_was_really_lost(
            self, store: LeaseStore, second_store: LeaseStore) -> None:
        lease = make_lease(shard=4, owner=None, generation=1)
        version = await store.create_lease(lease)
        theirs = rewrite(lease, owner="node-b", generation=2)
        their_version = await second_store.write_lease(theirs, version)

        with pytest.raises(Conflict):
            await store.write_lease(rewrite(lease, owner="node-a", generation=2), version)
        with pytest.raises(Conflict):
            await store.write_lease(make_lease(shard=4, owner="node-a", generation=2), None)
        got = await store.get_lease(CLUSTER, 4)
        assert got is not None and got.version == their_version and valid(got) == theirs

    # -- corrupt records ------------------------------------------------------------------

    @staticmethod
    def corrupt_records() -> dict[int, tuple[bytes, str]]:
        """shard -> (planted bytes, a word the error message must contain)."""
        oversize = encode(make_lease(shard=3))[:-1] + (
            b', "padding": "' + b"x" * (MAX_RECORD_BYTES + 100) + b'"}')
        return {
            1: (b"\xff\xfe not json at all \x00", "invalid"),
            2: (b'{"hello": "world", "shard": 2}', "invalid"),
            3: (oversize, "bytes"),
            # A valid lease of shard 4, stored as shard 5.
            5: (encode(make_lease(shard=4)), "shard"),
        }

    async def plant_corrupt(self, store: LeaseStore, put_raw: PutRaw) -> Lease:
        good = make_lease(shard=0)
        await store.create_lease(good)
        for shard, (data, _) in self.corrupt_records().items():
            await put_raw(CLUSTER, shard, data)
        return good

    async def test_corrupt_leases_are_listed_with_an_error_beside_the_good_ones(
            self, store: LeaseStore, put_raw: PutRaw) -> None:
        good = await self.plant_corrupt(store, put_raw)
        listed = await store.list_leases(CLUSTER)
        assert sorted(listed) == [0, 1, 2, 3, 5]
        assert valid(listed[0]) == good
        for shard, (_, word) in self.corrupt_records().items():
            entry = listed[shard]
            assert entry.record is None, shard
            assert entry.error and word in entry.error.lower(), (shard, entry.error)
            assert entry.version, shard

    async def test_a_corrupt_lease_is_returned_by_get_with_an_error(
            self, store: LeaseStore, put_raw: PutRaw) -> None:
        await self.plant_corrupt(store, put_raw)
        for shard, (_, word) in self.corrupt_records().items():
            entry = await store.get_lease(CLUSTER, shard)
            assert entry is not None, shard
            assert entry.record is None, shard
            assert entry.error and word in entry.error.lower(), (shard, entry.error)

    async def test_a_corrupt_lease_can_be_replaced_only_by_a_swap_on_its_version(
            self, store: LeaseStore, put_raw: PutRaw) -> None:
        await put_raw(CLUSTER, 1, b"garbage")
        entry = await store.get_lease(CLUSTER, 1)
        assert entry is not None and entry.record is None
        with pytest.raises(Conflict):
            await store.create_lease(make_lease(shard=1))
        claim = make_lease(shard=1, owner="node-a", generation=1)
        version = await store.update_lease(claim, entry.version)
        got = await store.get_lease(CLUSTER, 1)
        assert got is not None and got.version == version and valid(got) == claim

    async def test_a_lease_stored_in_another_cluster_is_corrupt(
            self, store: LeaseStore, put_raw: PutRaw) -> None:
        await put_raw(CLUSTER, 0, encode(make_lease(shard=0, cluster=OTHER_CLUSTER)))
        entry = (await store.list_leases(CLUSTER))[0]
        assert entry.record is None and entry.error and "cluster" in entry.error

    async def test_a_corrupt_lease_still_shows_the_generation_its_raw_record_carries(
            self, store: LeaseStore, put_raw: PutRaw) -> None:
        # A hand edit that dropped the write id of a lease at generation 57:
        # a claim over it must go above 57, so the entry says 57.
        record = json.loads(encode(make_lease(shard=1, owner="node-a", generation=57)))
        del record["write_id"]
        await put_raw(CLUSTER, 1, json.dumps(record).encode())
        await put_raw(CLUSTER, 2, b"garbage without any generation")
        listed = await store.list_leases(CLUSTER)
        got = await store.get_lease(CLUSTER, 1)
        for entry in (listed[1], got):
            assert entry is not None and entry.record is None and entry.error
            assert entry.generation == 57
        assert listed[2].record is None and listed[2].generation is None

    async def test_a_lease_claiming_a_ttl_above_the_limit_is_corrupt(
            self, store: LeaseStore, put_raw: PutRaw) -> None:
        record = json.loads(encode(make_lease(shard=0, generation=6)))
        record["ttl"] = MAX_LEASE_TTL * 1000
        await put_raw(CLUSTER, 0, json.dumps(record).encode())
        entry = (await store.list_leases(CLUSTER))[0]
        assert entry.record is None and entry.error and "ttl" in entry.error
        assert entry.generation == 6

    async def test_a_lease_of_a_newer_format_is_listed_and_read_but_never_as_a_record(
            self, store: LeaseStore, put_raw: PutRaw) -> None:
        # Written by a later version (records.FORMAT + 1), with a field this
        # version does not know: valid to this version's model, yet not read.
        record = json.loads(encode(make_lease(shard=1, owner="node-b", generation=23)))
        record.update(format=2, quorum=3)
        await put_raw(CLUSTER, 1, json.dumps(record).encode())
        listed = await store.list_leases(CLUSTER)
        got = await store.get_lease(CLUSTER, 1)
        for entry in (listed[1], got):
            assert entry is not None and entry.record is None and entry.newer_format == 2
            assert entry.error and "format 2" in entry.error
            assert entry.generation == 23 and entry.version
        assert got is not None and got.version == listed[1].version
        # It is replaced only by a swap on its version, as a corrupt record is.
        with pytest.raises(Conflict):
            await store.create_lease(make_lease(shard=1))
        claim = make_lease(shard=1, owner="node-a", generation=24)
        version = await store.update_lease(claim, got.version)
        again = await store.get_lease(CLUSTER, 1)
        assert again is not None and again.version == version and valid(again) == claim
        assert again.newer_format is None

    # -- leases deleted out of band ---------------------------------------------------------

    async def test_a_lease_deleted_after_it_was_seen_held_is_reported_not_missing(
            self, store: LeaseStore, second_store: LeaseStore, delete_raw: DeleteRaw) -> None:
        held = make_lease(shard=3, owner="node-a", generation=9)
        await second_store.create_lease(held)
        free = make_lease(shard=4, owner=None, generation=2)
        await second_store.create_lease(free)
        assert sorted(await store.list_leases(CLUSTER)) == [3, 4]
        await delete_raw(CLUSTER, 3)
        await delete_raw(CLUSTER, 4)

        listed = await store.list_leases(CLUSTER)
        assert sorted(listed) == [3], "a free lease that vanished is simply gone"
        entry = listed[3]
        assert entry.record is None and entry.error and "deleted" in entry.error
        assert entry.generation == 9
        assert entry.version.startswith(VANISHED)
        again = await store.get_lease(CLUSTER, 3)
        assert again == entry, "the entry keeps its version while the lease stays away"
        assert (await store.list_leases(CLUSTER))[3] == entry
        # Another client never saw it: to it the lease is simply missing.
        fresh_eyes = second_store if second_store is not store else None
        if fresh_eyes is not None:
            assert 3 not in await fresh_eyes.list_leases(CLUSTER)

    async def test_a_claim_on_a_vanished_lease_creates_it_and_it_reads_as_usual(
            self, store: LeaseStore, second_store: LeaseStore, delete_raw: DeleteRaw) -> None:
        await second_store.create_lease(make_lease(shard=5, owner="node-a", generation=4))
        await store.get_lease(CLUSTER, 5)
        await delete_raw(CLUSTER, 5)
        entry = await store.get_lease(CLUSTER, 5)
        assert entry is not None and entry.generation == 4
        claim = make_lease(shard=5, owner="node-b", generation=5)
        version = await store.write_lease(claim, entry.version)
        got = await store.get_lease(CLUSTER, 5)
        assert got is not None and got.version == version and valid(got) == claim
        assert valid((await store.list_leases(CLUSTER))[5]) == claim

    async def test_a_vanished_lease_created_again_elsewhere_conflicts_and_reads_as_it_is(
            self, store: LeaseStore, second_store: LeaseStore, delete_raw: DeleteRaw) -> None:
        await store.write_lease(make_lease(shard=6, owner="node-a", generation=4), None)
        await delete_raw(CLUSTER, 6)
        entry = (await store.list_leases(CLUSTER))[6]
        theirs = make_lease(shard=6, owner="node-c", generation=5)
        await second_store.create_lease(theirs)
        with pytest.raises(Conflict):
            await store.write_lease(make_lease(shard=6, owner="node-b", generation=5),
                                    entry.version)
        assert valid((await store.list_leases(CLUSTER))[6]) == theirs

    # -- heartbeats -------------------------------------------------------------------------

    async def test_heartbeats_are_listed_by_node_and_each_put_changes_the_version(
            self, store: LeaseStore) -> None:
        await store.put_heartbeat(make_heartbeat("node-a", seq=0))
        await store.put_heartbeat(make_heartbeat("node-b", seq=0))
        first = await store.list_heartbeats(CLUSTER)
        assert sorted(first) == ["node-a", "node-b"]
        assert all(isinstance(v, str) and v for v in first.values())

        seen = {first["node-a"]}
        for seq in range(1, 4):
            await store.put_heartbeat(make_heartbeat("node-a", seq=seq))
            now = await store.list_heartbeats(CLUSTER)
            assert now["node-a"] not in seen
            seen.add(now["node-a"])
            assert now["node-b"] == first["node-b"], "another node's heartbeat changed"

    async def test_a_heartbeat_with_the_same_content_but_a_new_write_id_changes_the_version(
            self, store: LeaseStore) -> None:
        beat = make_heartbeat("node-a", seq=5)
        await store.put_heartbeat(beat)
        before = (await store.list_heartbeats(CLUSTER))["node-a"]
        await store.put_heartbeat(beat.model_copy(update={"write_id": new_write_id()}))
        assert (await store.list_heartbeats(CLUSTER))["node-a"] != before

    async def test_a_heartbeat_reads_back_as_written_and_a_missing_one_as_none(
            self, store: LeaseStore) -> None:
        # What a node refused as outdated reads of every peer (`holds_by`):
        # each node's own, the last one written, gone once deleted.
        assert await store.get_heartbeat(CLUSTER, "node-a") is None
        await store.put_heartbeat(make_heartbeat("node-a", seq=1)
                                  .model_copy(update={"holds_by": 30.0}))
        last = make_heartbeat("node-a", seq=2).model_copy(update={"holds_by": 6.5})
        await store.put_heartbeat(last)
        await store.put_heartbeat(make_heartbeat("node-b", seq=1))
        got = await store.get_heartbeat(CLUSTER, "node-a")
        assert got is not None
        assert (got.node, got.incarnation, got.write_id, got.holds_by) == (
            "node-a", last.incarnation, last.write_id, 6.5)
        other = await store.get_heartbeat(CLUSTER, "node-b")
        assert other is not None and other.node == "node-b" and other.holds_by == 0.0
        assert await store.get_heartbeat("other-cluster", "node-a") is None
        await store.delete_heartbeat(CLUSTER, "node-a")
        assert await store.get_heartbeat(CLUSTER, "node-a") is None

    async def test_a_deleted_heartbeat_is_no_longer_listed(self, store: LeaseStore) -> None:
        await store.put_heartbeat(make_heartbeat("node-a"))
        await store.put_heartbeat(make_heartbeat("node-b"))
        await store.delete_heartbeat(CLUSTER, "node-a")
        assert sorted(await store.list_heartbeats(CLUSTER)) == ["node-b"]

    async def test_deleting_a_missing_heartbeat_is_fine(self, store: LeaseStore) -> None:
        await store.delete_heartbeat(CLUSTER, "never-was")
        await store.put_heartbeat(make_heartbeat("node-a"))
        await store.delete_heartbeat(CLUSTER, "node-a")
        await store.delete_heartbeat(CLUSTER, "node-a")
        assert await store.list_heartbeats(CLUSTER) == {}

    async def test_a_second_client_sees_heartbeats_and_their_deletion(
            self, store: LeaseStore, second_store: LeaseStore) -> None:
        await store.put_heartbeat(make_heartbeat("node-a"))
        assert sorted(await second_store.list_heartbeats(CLUSTER)) == ["node-a"]
        await second_store.delete_heartbeat(CLUSTER, "node-a")
        assert await store.list_heartbeats(CLUSTER) == {}

    async def test_clusters_do_not_see_each_others_leases_or_heartbeats(
            self, store: LeaseStore) -> None:
        ours = make_lease(shard=0, cluster=CLUSTER, owner="node-a")
        theirs = make_lease(shard=0, cluster=OTHER_CLUSTER, owner="node-z")
        await store.create_lease(ours)
        await store.create_lease(theirs)  # same shard, other cluster: no conflict
        await store.create_lease(make_lease(shard=1, cluster=OTHER_CLUSTER))
        await store.put_heartbeat(make_heartbeat("node-a", cluster=CLUSTER))
        await store.put_heartbeat(make_heartbeat("node-z", cluster=OTHER_CLUSTER))

        listed = await store.list_leases(CLUSTER)
        assert sorted(listed) == [0] and valid(listed[0]) == ours
        assert valid(await store.get_lease(OTHER_CLUSTER, 0)) == theirs
        assert await store.get_lease(CLUSTER, 1) is None
        assert sorted(await store.list_heartbeats(CLUSTER)) == ["node-a"]
        assert sorted(await store.list_heartbeats(OTHER_CLUSTER)) == ["node-z"]

        await store.delete_heartbeat(OTHER_CLUSTER, "node-a")  # not theirs: no effect
        assert sorted(await store.list_heartbeats(CLUSTER)) == ["node-a"]

    # -- accounting ---------------------------------------------------------------------------

    async def test_request_counts_grow_with_every_kind_of_call(self, store: LeaseStore) -> None:
        counted = count_requests(store)

        def total() -> int:
            return sum(counted.values())

        before = total()
        await store.list_leases(CLUSTER)
        assert counted["list"] >= 1
        after_list = total()
        assert after_list > before

        version = await store.create_lease(make_lease(shard=0))
        await store.update_lease(rewrite(make_lease(shard=0)), version)
        assert counted["put"] >= 2
        after_put = total()
        assert after_put > after_list

        await store.get_lease(CLUSTER, 0)
        assert counted["get"] >= 1
        after_get = total()
        assert after_get > after_put

        await store.put_heartbeat(make_heartbeat())
        await store.list_heartbeats(CLUSTER)
        after_heartbeats = total()
        assert after_heartbeats > after_get

        await store.delete_heartbeat(CLUSTER, "node-a")
        assert counted["delete"] >= 1
        assert total() > after_heartbeats

    async def test_the_store_describes_itself_without_secrets(self, store: LeaseStore) -> None:
        description = store.describe()
        assert isinstance(description, str) and "://" in description
        for secret in ("secret", "password", "token"):
            assert secret not in description.lower()
