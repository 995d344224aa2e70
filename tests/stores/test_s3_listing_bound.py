"""The S3 listing cache's bound, case by case: a move is missed for at most
one `list_leases` after its marker PUT (`S3Store.list_leases`). Each test
holds a reader at one of the moments the argument rests on (an epoch
listing that started before the reader's last return, another object's
listing, an unreadable lease, a `get_lease`, a marker HEAD that fails, a
mark of the reader's own that lands during its HEAD) and checks that the
reader's next answer shows the move, or that it lists. On moto's S3 server;
only the reader's own `_list`, `_head` and `_call` are wrapped, to hold or
fail one request at a chosen moment."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from shardlease.errors import StoreError
from shardlease.records import Lease, encode
from shardlease.stores.base import EpochListing, Listed
from shardlease.stores.requests import RequestCounter
from shardlease.stores.s3 import S3Store
from tests.support.s3server import S3Server

from .contract import CLUSTER, make_lease, rewrite
from .test_s3 import (
    lease_key,
    leases_listed,
    marker_etag,
    marker_key,
    node_mode_cluster,
    quiet_reader,
    settled,
)

# The fixtures s3_server (session), s3_endpoint and s3_bucket (a fresh bucket);
# store (the reader), counted (its requests) and other (the writer, another
# node's client on the same bucket): tests/stores/s3_fixtures.py.
pytest_plugins = ["tests.support.s3server", "tests.stores.s3_fixtures"]


async def free_shard_3(writer: S3Store, versions: dict[int, str]) -> Lease:
    """`writer` frees shard 3 of `node_mode_cluster` (a move: it marks), and
    its mark lands. The freed lease."""
    freed = make_lease(shard=3, owner=None, renewal="node")
    await writer.update_lease(freed, versions[3])
    await settled(writer)
    return freed


async def test_an_epoch_listing_that_started_before_the_last_return_is_no_marker_read(
        store: S3Store, counted: RequestCounter, other: S3Store, s3_server: S3Server,
        s3_bucket: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """The listing's LIST answers (it saw the marker before the move), then
    the reader's `list_leases` returns, then the move's mark lands, then the
    listing returns: its marker read is older than that return, and the
    next call does not take it for a read made since. (Another epoch
    listing of the reader's, started after the return, ends meanwhile.)"""
    versions = await node_mode_cluster(other)
    at_rest, quiet = await quiet_reader(store)
    before = marker_etag(s3_server, s3_bucket)
    real_list = store._list
    answered, release = asyncio.Event(), asyncio.Event()
    held: list[str] = []

    async def list_held(prefix: str) -> dict[str, tuple[str, int]]:
        found = await real_list(prefix)
        if prefix.endswith("/epochs/") and not held:
            held.append(prefix)
            answered.set()
            await release.wait()
        return found

    monkeypatch.setattr(store, "_list", list_held)
    listing = asyncio.create_task(store.list_epochs(CLUSTER))
    await answered.wait()  # its LIST has answered, before the move
    assert await store.list_leases(CLUSTER, seen=quiet) == at_rest  # and returned
    freed = await free_shard_3(other, versions)
    assert marker_etag(s3_server, s3_bucket) != before, "the move's mark landed"
    await store.list_epochs(CLUSTER)  # another one, started after that return
    release.set()
    stale = await listing
    assert isinstance(stale, EpochListing)

    counted.clear()
    answer = await store.list_leases(CLUSTER, seen=Listed(epochs=stale,
                                                          heartbeats=quiet.heartbeats))
    assert answer[3].record == freed, "the move, its mark landed before this call"
    assert dict(counted) == {"get": 2, "list": 1}, "a HEAD, the listing, shard 3's GET"


async def test_another_store_objects_epoch_listing_is_no_marker_read_whatever_its_ticks(
        store: S3Store, counted: RequestCounter, other: S3Store, s3_server: S3Server,
        s3_bucket: str) -> None:
    """An object's `_ticks` order its own listings and returns only: another
    object's listing, however far its counter has gone, is not the reader's
    read of the marker."""
    versions = await node_mode_cluster(other)
    _, quiet = await quiet_reader(store)
    other._ticks = 10**6
    theirs = await other.list_epochs(CLUSTER)  # the marker before the move
    freed = await free_shard_3(other, versions)

    counted.clear()
    answer = await store.list_leases(CLUSTER, seen=Listed(epochs=theirs,
                                                          heartbeats=quiet.heartbeats))
    assert answer[3].record == freed
    assert dict(counted) == {"get": 2, "list": 1}, "a HEAD of its own, the listing, a GET"


async def test_a_view_holding_an_unreadable_lease_is_listed_every_call(
        store: S3Store, counted: RequestCounter, other: S3Store, s3_server: S3Server,
        s3_bucket: str) -> None:
    """An unreadable record changes without a mark (a hand repair, a
    version that writes no marks): a view holding one is never served."""
    await node_mode_cluster(other)
    client = s3_server.client()
    client.put_object(Bucket=s3_bucket, Key=lease_key(CLUSTER, 8), Body=b"{not a lease")
    at_rest, quiet = await quiet_reader(store)
    assert at_rest[8].record is None and at_rest[8].error
    epochs = await store.list_epochs(CLUSTER)  # a read of its own: it would serve
    counted.clear()
    for _ in range(5):
        assert await store.list_leases(CLUSTER, seen=Listed(
            epochs=epochs, heartbeats=quiet.heartbeats)) == at_rest
    assert dict(counted) == {"list": 5}, "a listing each call, no HEAD, no GET"

    # Repaired by hand (no mark): the next call shows it.
    repaired = make_lease(shard=8, owner="node-z", generation=4, renewal="node")
    client.put_object(Bucket=s3_bucket, Key=lease_key(CLUSTER, 8), Body=encode(repaired))
    answer = await store.list_leases(CLUSTER, seen=Listed(
        epochs=await store.list_epochs(CLUSTER), heartbeats=quiet.heartbeats))
    assert answer[8].record == repaired


async def test_a_get_lease_voids_the_view_so_the_next_listing_agrees_with_it(
        store: S3Store, counted: RequestCounter, other: S3Store, s3_server: S3Server,
        s3_bucket: str) -> None:
    """A hand edit puts no mark; the reader's `get_lease` finds it, and its
    next `list_leases` (told of a fresh epoch listing of its own, the marker
    unchanged) lists rather than answer older than what it just read."""
    await node_mode_cluster(other)
    _, quiet = await quiet_reader(store)
    before = marker_etag(s3_server, s3_bucket)
    hand = make_lease(shard=2, owner="node-z", generation=7, renewal="node")
    s3_server.client().put_object(Bucket=s3_bucket, Key=lease_key(CLUSTER, 2),
                                  Body=encode(hand))
    got = await store.get_lease(CLUSTER, 2)
    assert got is not None and got.record == hand

    epochs = await store.list_epochs(CLUSTER)
    counted.clear()
    answer = await store.list_leases(CLUSTER, seen=Listed(epochs=epochs,
                                                          heartbeats=quiet.heartbeats))
    assert marker_etag(s3_server, s3_bucket) == before, "nothing marked"
    assert answer[2].record == hand and answer[2].version == got.version
    assert leases_listed(counted) == 1


async def test_a_failed_marker_head_is_no_read_even_before_the_first_mark(
        store: S3Store, counted: RequestCounter, other: S3Store, s3_server: S3Server,
        s3_bucket: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """In a cluster without a marker object, the reader's view was listed
    after a HEAD that found none. A HEAD that fails is not "still none": the
    first mark may have landed, and the reader lists."""
    client = s3_server.client()
    for shard in range(4):  # put by hand: no marker object
        client.put_object(Bucket=s3_bucket, Key=lease_key(CLUSTER, shard), Body=encode(
            make_lease(shard=shard, owner="node-b", renewal="node")))
    at_rest, quiet = await quiet_reader(store)
    assert marker_etag(s3_server, s3_bucket) is None
    counted.clear()
    assert await store.list_leases(CLUSTER, seen=quiet) == at_rest
    assert dict(counted) == {"get": 1}, "a HEAD (no marker), served"

    real_head = store._head
    failed: list[str] = []

    async def head_failing(key: str) -> str | None:
        if key == marker_key():
            failed.append(key)
            raise StoreError(f"HEAD {key}: injected failure")
        return await real_head(key)

    monkeypatch.setattr(store, "_head", head_failing)
    claim = make_lease(shard=9, owner="node-b", renewal="node")
    await other.create_lease(claim)
    await settled(other)
    assert marker_etag(s3_server, s3_bucket) is not None, "the first mark landed"

    counted.clear()
    answer = await store.list_leases(CLUSTER, seen=quiet)
    assert failed, "the reader tried to HEAD the marker"
    assert 9 in answer and answer[9].record == claim
    assert leases_listed(counted) == 1


async def test_a_store_sees_its_own_write_when_its_mark_lands_during_its_marker_head(
        store: S3Store, counted: RequestCounter, other: S3Store, s3_server: S3Server,
        s3_bucket: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """The reader's own marker PUT is held until its next call's HEAD has
    read the marker (still as before the write), and lands before that HEAD
    returns: it then has no mark due, and the marker reads unchanged, yet
    its write must void its view."""
    await node_mode_cluster(other)
    listed, quiet = await quiet_reader(store)
    before = marker_etag(s3_server, s3_bucket)
    assert before is not None
    unmarked = before.strip('"')
    real_head, real_call = store._head, store._call
    head_read = asyncio.Event()
    order: list[str] = []

    async def call_holding_the_mark(operation: str, key: str, **params: Any) -> Any:
        if operation == "put_object" and key == marker_key():
            await head_read.wait()
            order.append("mark put")
        return await real_call(operation, key, **params)

    async def head_then_settle(key: str) -> str | None:
        etag = await real_head(key)
        if key == marker_key():
            order.append(f"head read {etag}")
            head_read.set()
            await settled(store)  # its own mark lands while the HEAD is in flight
            order.append("head returns")
        return etag

    monkeypatch.setattr(store, "_call", call_holding_the_mark)
    monkeypatch.setattr(store, "_head", head_then_settle)
    claim = rewrite(listed[4].record, owner="node-a", generation=2)  # type: ignore[arg-type]
    version = await store.update_lease(claim, listed[4].version)

    counted.clear()
    after = await store.list_leases(CLUSTER, seen=quiet)
    assert order == [f"head read {unmarked}", "mark put", "head returns"]
    assert marker_etag(s3_server, s3_bucket) != before, "its mark landed"
    assert after[4].version == version and after[4].record == claim
    assert leases_listed(counted) == 1
