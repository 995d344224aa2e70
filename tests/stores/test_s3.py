"""The S3 store: the store contract on moto's S3 server, and what only S3 has
(request economy, 412 versus 409, bounded reads, the start-up probe)."""

from __future__ import annotations

import asyncio
import hashlib
import http.client
import logging
import socket
import threading
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, ClassVar
from urllib.parse import parse_qsl, urlsplit

import pytest
from aiobotocore.stub import AioStubber  # type: ignore[import-untyped]
from botocore.exceptions import ClientError  # type: ignore[import-untyped]

from shardlease.errors import ConfigError, Conflict, StoreError, StoreUnsafe
from shardlease.records import MAX_RECORD_BYTES, Lease, Stored, encode
from shardlease.stores import open_store
from shardlease.stores.base import LeaseStore, Listed
from shardlease.stores.requests import RequestCounter, count_requests
from shardlease.stores.s3 import FULL_LIST_EVERY, QUIET_LISTINGS, S3Store
from tests.support.s3server import S3Server

from .contract import (
    CLUSTER,
    DeleteRaw,
    MakeStore,
    PutRaw,
    StoreContract,
    make_epoch,
    make_heartbeat,
    make_lease,
    rewrite,
)
from .s3_helpers import PREFIX, s3_store

# The fixtures s3_server (session), s3_endpoint and s3_bucket (a fresh bucket).
pytest_plugins = ["tests.support.s3server", "tests.stores.s3_fixtures"]



def lease_key(cluster: str, shard: int) -> str:
    return f"{PREFIX}/{cluster}/leases/{shard}"


# -- the contract ----------------------------------------------------------------------------------


class TestS3StoreOnMoto(StoreContract):
    @pytest.fixture
    async def store(self, s3_server: S3Server, s3_bucket: str) -> AsyncIterator[LeaseStore]:
        store = s3_store(s3_server, s3_bucket)
        yield store
        await store.aclose()

    @pytest.fixture
    def put_raw(self, s3_server: S3Server, s3_bucket: str) -> PutRaw:
        client = s3_server.client()

        async def put(cluster: str, shard: int, data: bytes) -> None:
            await asyncio.to_thread(client.put_object, Bucket=s3_bucket,
                                    Key=lease_key(cluster, shard), Body=data)
        return put

    @pytest.fixture
    def delete_raw(self, s3_server: S3Server, s3_bucket: str) -> DeleteRaw:
        client = s3_server.client()

        async def delete(cluster: str, shard: int) -> None:
            await asyncio.to_thread(client.delete_object, Bucket=s3_bucket,
                                    Key=lease_key(cluster, shard))
        return delete

    @pytest.fixture
    async def make_second_store(self, s3_server: S3Server,
                                s3_bucket: str) -> AsyncIterator[MakeStore]:
        opened: list[S3Store] = []

        async def make() -> LeaseStore:
            opened.append(s3_store(s3_server, s3_bucket))
            return opened[-1]
        yield make
        for store in opened:
            await store.aclose()


class TestS3StoreOnMinIO(TestS3StoreOnMoto):
    """The same contract on a real MinIO server: conditional writes as a
    production S3-compatible store implements them, concurrency included."""

    @pytest.fixture
    def s3_server(self, minio: S3Server) -> S3Server:
        return minio

    async def test_the_start_up_probe_accepts_minio(self, store: LeaseStore) -> None:
        await store.check()


# -- URLs ------------------------------------------------------------------------------------------


def test_a_url_names_bucket_prefix_endpoint_region_and_addressing() -> None:
    store = open_store("s3://Leases-1/team/prod/?endpoint=http://127.0.0.1:9000/"
                       "&region=eu-west-1&path_style=true")
    assert isinstance(store, S3Store)
    assert (store.bucket, store.prefix) == ("Leases-1", "team/prod")
    assert store.endpoint_url == "http://127.0.0.1:9000"
    assert store.region == "eu-west-1"
    assert store.path_style is True
    assert store.describe() == "s3://Leases-1/team/prod (endpoint http://127.0.0.1:9000)"


def test_a_url_without_prefix_or_parameters_uses_the_aws_settings(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AWS_ENDPOINT_URL_S3", "https://s3.example.test:8443")
    monkeypatch.setenv("AWS_REGION", "ap-south-1")
    store = S3Store.from_url("s3://leases")
    assert (store.bucket, store.prefix, store.endpoint_url) == ("leases", "", None)
    assert store.region == "ap-south-1"
    assert store.describe() == "s3://leases/ (endpoint https://s3.example.test:8443)"


@pytest.mark.parametrize(("url", "words"), [
    ("s3://", "bucket"),
    ("s3:///prefix", "bucket"),
    ("s3://leases?endpoint=http://x:1&color=blue", "unknown parameter 'color'"),
    ("s3://leases?region=a&region=b", "twice"),
    ("s3://leases?path_style=maybe", "path_style"),
    ("s3://leases?endpoint=ftp://x", "http"),
    ("s3://leases?endpoint=", "empty"),
    ("s3://key:secret@leases/p", "credentials"),
    ("s3://leases/p?endpoint=http://key:secret@minio:9000", "credentials"),
    ("s3://leases/a//b", "prefix"),
    ("s3://leases/../b", "prefix"),
    ("s3://leases#frag", "fragment"),
])
def test_a_bad_url_is_refused_with_the_accepted_form(url: str, words: str) -> None:
    with pytest.raises(ConfigError) as refused:
        S3Store.from_url(url)
    assert words in str(refused.value)
    assert "s3://BUCKET[/PREFIX]" in str(refused.value)
    assert "secret" not in str(refused.value).replace("AWS_SECRET", "")


def test_the_description_holds_no_credentials(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AWS_ENDPOINT_URL", "http://user:pass@minio.local:9000/?token=x")
    monkeypatch.delenv("AWS_ENDPOINT_URL_S3", raising=False)
    description = S3Store.from_url("s3://leases/p").describe()
    assert description == "s3://leases/p (endpoint http://minio.local:9000/)"


async def test_a_store_opened_from_a_url_works_against_that_endpoint(
        s3_server: S3Server, s3_bucket: str) -> None:
    store = open_store(s3_server.url(s3_bucket, "from/url"))
    try:
        await store.check()
        await store.create_lease(make_lease(shard=2))
        assert sorted(await store.list_leases(CLUSTER)) == [2]
    finally:
        await store.aclose()
    keys = [o["Key"] for o in s3_server.client().list_objects_v2(Bucket=s3_bucket)["Contents"]]
    # The claim, and the move marker put after it.
    assert keys == [f"from/url/{CLUSTER}/epochs/moved", f"from/url/{CLUSTER}/leases/2"]


async def test_without_an_endpoint_in_the_url_the_aws_variable_names_it(
        s3_server: S3Server, s3_bucket: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AWS_ENDPOINT_URL_S3", s3_server.endpoint)
    store = S3Store.from_url(f"s3://{s3_bucket}/env?path_style=true")
    try:
        await store.create_lease(make_lease(shard=1))
        assert s3_server.endpoint in store.describe()
    finally:
        await store.aclose()
    assert s3_server.client().list_objects_v2(Bucket=s3_bucket)["KeyCount"] == 2  # and the marker


async def test_a_cluster_or_node_name_with_a_slash_is_refused(store: S3Store) -> None:
    with pytest.raises(ConfigError):
        await store.list_leases("a/b")
    with pytest.raises(ConfigError):
        await store.delete_heartbeat(CLUSTER, "../x")


# -- request economy -------------------------------------------------------------------------------


async def test_listing_unchanged_leases_again_costs_one_list_and_no_get(
        store: S3Store, counted: RequestCounter, other: S3Store) -> None:
    leases = {shard: make_lease(shard=shard, owner=f"node-{shard % 5}") for shard in range(64)}
    versions = dict(zip(leases, await asyncio.gather(
        *(other.create_lease(lease) for lease in leases.values())), strict=True))

    counted.clear()
    first = await store.list_leases(CLUSTER)
    assert dict(counted) == {"list": 1, "get": 64}
    assert {shard: s.record for shard, s in first.items()} == leases

    counted.clear()
    second = await store.list_leases(CLUSTER)
    assert dict(counted) == {"list": 1}
    assert second == first

    changed = {shard: rewrite(leases[shard], owner="node-x") for shard in (3, 17, 60)}
    for shard, lease in changed.items():
        versions[shard] = await other.update_lease(lease, versions[shard])
    counted.clear()
    third = await store.list_leases(CLUSTER)
    assert dict(counted) == {"list": 1, "get": 3}
    assert {shard: third[shard].record for shard in changed} == changed
    assert {shard: s.version for shard, s in third.items()} == versions


async def test_a_store_does_not_fetch_back_what_it_wrote_itself(
        store: S3Store, counted: RequestCounter) -> None:
    version = await store.create_lease(make_lease(shard=0))
    await store.update_lease(rewrite(make_lease(shard=0)), version)
    counted.clear()
    await store.list_leases(CLUSTER)
    assert dict(counted) == {"list": 1}


async def test_every_page_of_a_listing_is_a_request(s3_server: S3Server, s3_bucket: str,
                                                    other: S3Store) -> None:
    await asyncio.gather(*(other.create_lease(make_lease(shard=s)) for s in range(25)))
    paged = s3_store(s3_server, s3_bucket, page_size=10)
    counted = count_requests(paged)
    try:
        listed = await paged.list_leases(CLUSTER)
        assert sorted(listed) == list(range(25))
        assert dict(counted) == {"list": 3, "get": 25}
    finally:
        await paged.aclose()


async def test_listing_heartbeats_is_one_request_and_fetches_nothing(
        store: S3Store, counted: RequestCounter, other: S3Store) -> None:
    for n in range(10):
        await other.put_heartbeat(make_heartbeat(f"node-{n}"))
    counted.clear()
    beats = await store.list_heartbeats(CLUSTER)
    assert sorted(beats) == sorted(f"node-{n}" for n in range(10))
    assert dict(counted) == {"list": 1}


async def test_gets_run_concurrently_but_no_more_than_the_bound(
        s3_server: S3Server, s3_bucket: str, other: S3Store,
        monkeypatch: pytest.MonkeyPatch) -> None:
    await asyncio.gather(*(other.create_lease(make_lease(shard=s)) for s in range(40)))
    bounded = s3_store(s3_server, s3_bucket, max_parallel_gets=4)
    running = peak = 0
    real = S3Store._call

    async def watched(self: S3Store, operation: str, key: str, **params: Any) -> Any:
        nonlocal running, peak
        if operation != "get_object":
            return await real(self, operation, key, **params)
        running += 1
        peak = max(peak, running)
        try:
            await asyncio.sleep(0.01)
            return await real(self, operation, key, **params)
        finally:
            running -= 1

    monkeypatch.setattr(S3Store, "_call", watched)
    try:
        assert len(await bounded.list_leases(CLUSTER)) == 40
    finally:
        await bounded.aclose()
    assert peak == 4


# -- the move marker: unchanged leases are not listed again ----------------------------------------


def marker_key(cluster: str = CLUSTER) -> str:
    return f"{PREFIX}/{cluster}/epochs/moved"


def marker_etag(server: S3Server, bucket: str) -> str | None:
    try:
        return str(server.client().head_object(Bucket=bucket, Key=marker_key())["ETag"])
    except ClientError:
        return None


async def settled(store: S3Store) -> None:
    """Until every mark `store` owes has landed."""
    async with asyncio.timeout(60):
        await store.marks_settled()


def leases_listed(counted: RequestCounter) -> int:
    """How many listings of the leases the store counted made (it lists nothing
    else here)."""
    return counted["list"]


async def told_beats(reader: S3Store) -> Listed:
    """`reader`'s heartbeat listing, to tell its `list_leases` of."""
    return Listed(heartbeats=await reader.list_heartbeats(CLUSTER))


async def quiet_reader(reader: S3Store) -> tuple[dict[int, Stored[Lease]], Listed]:
    """Have `reader` list the heartbeats (nobody beats) and the leases twice,
    told of that listing: the second listing finds nothing new, so it may
    answer from it next. The answer, and what to tell it from now on."""
    seen = await told_beats(reader)
    assert seen.heartbeats == {}
    first = await reader.list_leases(CLUSTER, seen=seen)
    again = await reader.list_leases(CLUSTER, seen=seen)
    assert again == first
    return again, seen


async def node_mode_cluster(holder: S3Store, shards: int = 8) -> dict[int, str]:
    """`shards` leases held by node-b in node mode (nobody heartbeats), every
    mark landed; their versions."""
    versions = {shard: await holder.create_lease(make_lease(shard=shard, owner="node-b",
                                                            renewal="node"))
                for shard in range(shards)}
    await settled(holder)
    return versions


async def test_a_reader_lists_again_only_after_a_move_and_sees_it_the_call_after_its_mark(
        store: S3Store, counted: RequestCounter, other: S3Store, s3_server: S3Server,
        s3_bucket: str) -> None:
    versions = await node_mode_cluster(other)
    seen = await told_beats(store)
    assert seen.heartbeats == {}
    first = await store.list_leases(CLUSTER, seen=seen)
    assert sorted(first) == list(range(8))
    # Everything was new to the first listing: a second one (and a HEAD of
    # the marker) makes sure the leases are at rest.
    counted.clear()
    assert await store.list_leases(CLUSTER, seen=seen) == first
    assert dict(counted) == {"get": 1, "list": 1}

    # Nothing moved: the marker's ETag (a HEAD here) says so, and the answer
    # is the same entries, without a listing.
    counted.clear()
    second = await store.list_leases(CLUSTER, seen=seen)
    assert dict(counted) == {"get": 1}
    assert second == first and all(second[s] is first[s] for s in first)

    # node-b frees shard 3 and claims shard 9: each write is followed by a mark.
    before = marker_etag(s3_server, s3_bucket)
    freed = rewrite(second[3].record, owner=None)  # type: ignore[arg-type]
    await other.update_lease(freed, versions[3])
    claim = make_lease(shard=9, owner="node-b", generation=1, renewal="node")
    await other.create_lease(claim)
    await store.list_leases(CLUSTER, seen=seen)  # may be before the mark landed: either answer
    await settled(other)
    assert marker_etag(s3_server, s3_bucket) != before
    counted.clear()
    third = await store.list_leases(CLUSTER, seen=seen)
    assert leases_listed(counted) == 1
    assert third[3].record == freed and third[9].record == claim
    assert all(third[s] is first[s] for s in first if s != 3), "unchanged: not fetched again"

    # Quiet again: once a listing found no move, answered from it.
    assert await store.list_leases(CLUSTER, seen=seen) == third
    counted.clear()
    assert await store.list_leases(CLUSTER, seen=seen) == third
    assert leases_listed(counted) == 0


async def test_the_epoch_listing_carries_the_marker_so_a_quiet_round_lists_no_lease(
        store: S3Store, counted: RequestCounter, other: S3Store) -> None:
    await node_mode_cluster(other)
    await other.create_epoch(make_epoch("node-b", "e1"))
    _, seen = await quiet_reader(store)
    beats = seen.heartbeats

    async def epochs_then_leases() -> dict[tuple[str, str], str]:
        epochs = await store.list_epochs(CLUSTER)
        await store.list_leases(CLUSTER, seen=Listed(epochs=epochs, heartbeats=beats))
        return epochs

    for _ in range(3):  # a node-mode round, as the loop makes it
        counted.clear()
        beats, epochs = await asyncio.gather(store.list_heartbeats(CLUSTER),
                                             epochs_then_leases())
        assert beats == {}
        assert list(epochs) == [("node-b", "e1")], "the marker is no epoch"
        assert dict(counted) == {"list": 2}, "heartbeats and epochs, no lease listing"
    # Told of no epoch listing (a round without one), and a heartbeat
    # listing under way: the last one's word stands.
    counted.clear()
    await asyncio.gather(store.list_leases(CLUSTER, seen=Listed(heartbeats=beats)),
                         store.list_heartbeats(CLUSTER))
    assert dict(counted) == {"get": 1, "list": 1}, "a HEAD, and the heartbeats"


# What `list_leases` is told, and what it does with it: a cluster at rest
# (node mode, nobody beats, the reader's view listed twice), then one call
# told of the listings each case makes. Its requests say what it chose:
SERVE: dict[str, int] = {}  # the marker read is good and unmoved: no request
HEAD = {"get": 1}  # no marker read it may use: a HEAD, then served
LIST = {"list": 1}  # somebody may beat (or it was told nothing): a listing
Tell = Callable[[S3Store, S3Store, Listed], Awaitable["Listed | None"]]


async def own_fresh(store: S3Store, other: S3Store, quiet: Listed) -> Listed:
    return Listed(epochs=await store.list_epochs(CLUSTER), heartbeats=quiet.heartbeats)


async def another_objects(store: S3Store, other: S3Store, quiet: Listed) -> Listed:
    # The same bucket, the same marker: but not this object's read.
    return Listed(epochs=await other.list_epochs(CLUSTER), heartbeats=quiet.heartbeats)


async def another_clusters(store: S3Store, other: S3Store, quiet: Listed) -> Listed:
    return Listed(epochs=await store.list_epochs("elsewhere"), heartbeats=quiet.heartbeats)


async def started_before_the_last_return(store: S3Store, other: S3Store,
                                         quiet: Listed) -> Listed:
    listing = asyncio.create_task(store.list_epochs(CLUSTER))
    await asyncio.sleep(0)  # it has started
    await store.list_leases(CLUSTER, seen=quiet)  # served (a HEAD), and returned
    return Listed(epochs=await listing, heartbeats=quiet.heartbeats)


async def used_already(store: S3Store, other: S3Store, quiet: Listed) -> Listed:
    seen = await own_fresh(store, other, quiet)
    await store.list_leases(CLUSTER, seen=seen)
    return seen


async def no_mark(store: S3Store, other: S3Store, quiet: Listed) -> Listed:
    listing = await store.list_epochs(CLUSTER)
    return Listed(epochs=dict(listing), heartbeats=quiet.heartbeats)  # a plain mapping


async def no_epochs(store: S3Store, other: S3Store, quiet: Listed) -> Listed:
    return Listed(heartbeats=quiet.heartbeats)


async def heartbeats_failed(store: S3Store, other: S3Store, quiet: Listed) -> Listed:
    return Listed(epochs=await store.list_epochs(CLUSTER), heartbeats=None)


async def heartbeats_failed_no_epochs(store: S3Store, other: S3Store,
                                      quiet: Listed) -> Listed:
    return Listed()


async def nothing(store: S3Store, other: S3Store, quiet: Listed) -> None:
    return None


async def a_peer_beats(store: S3Store, other: S3Store, quiet: Listed) -> Listed:
    await other.put_heartbeat(make_heartbeat("node-old"))
    return Listed(epochs=await store.list_epochs(CLUSTER),
                  heartbeats=await store.list_heartbeats(CLUSTER))


def a_leftover_heartbeat(listings: int) -> Tell:
    """A heartbeat nobody rewrites, seen in `listings` listings told of
    (the last one the case's), a round each."""

    async def tell(store: S3Store, other: S3Store, quiet: Listed) -> Listed:
        await other.put_heartbeat(make_heartbeat("node-gone"))
        for _ in range(listings - 1):
            await store.list_leases(CLUSTER, seen=Listed(
                epochs=await store.list_epochs(CLUSTER),
                heartbeats=await store.list_heartbeats(CLUSTER)))
        return Listed(epochs=await store.list_epochs(CLUSTER),
                      heartbeats=await store.list_heartbeats(CLUSTER))
    return tell


async def the_same_heartbeats_again(store: S3Store, other: S3Store, quiet: Listed) -> Listed:
    # A beating peer's listing, told QUIET_LISTINGS times: one listing, not quiet.
    await other.put_heartbeat(make_heartbeat("node-old"))
    beats = await store.list_heartbeats(CLUSTER)
    for _ in range(QUIET_LISTINGS):
        await store.list_leases(CLUSTER, seen=Listed(heartbeats=beats))
    return Listed(epochs=await store.list_epochs(CLUSTER), heartbeats=beats)


@pytest.mark.parametrize(("tell", "chosen"), [
    pytest.param(own_fresh, SERVE, id="its own epoch listing, since its last return"),
    pytest.param(another_objects, HEAD, id="another store object's epoch listing"),
    pytest.param(another_clusters, HEAD, id="its epoch listing of another cluster"),
    pytest.param(started_before_the_last_return, HEAD,
                 id="its epoch listing, started before its last return"),
    pytest.param(used_already, HEAD, id="its epoch listing, told twice"),
    pytest.param(no_mark, HEAD, id="an epoch listing without a mark"),
    pytest.param(no_epochs, HEAD, id="no epoch listing"),
    pytest.param(heartbeats_failed, LIST, id="no heartbeat listing"),
    pytest.param(heartbeats_failed_no_epochs, LIST, id="no listing at all"),
    pytest.param(nothing, LIST, id="told nothing"),
    pytest.param(a_peer_beats, LIST, id="a heartbeat that changed"),
    pytest.param(a_leftover_heartbeat(QUIET_LISTINGS - 1), LIST,
                 id="a heartbeat unchanged over QUIET_LISTINGS - 1 listings"),
    pytest.param(a_leftover_heartbeat(QUIET_LISTINGS), SERVE,
                 id="a heartbeat unchanged over QUIET_LISTINGS listings"),
    pytest.param(the_same_heartbeats_again, LIST,
                 id="one heartbeat listing told QUIET_LISTINGS times"),
])
async def test_what_list_leases_is_told_decides_between_serving_a_head_and_a_listing(
        store: S3Store, counted: RequestCounter, other: S3Store, tell: Tell,
        chosen: dict[str, int]) -> None:
    await node_mode_cluster(other)
    at_rest, quiet = await quiet_reader(store)
    seen = await tell(store, other, quiet)
    counted.clear()
    answer = await store.list_leases(CLUSTER, seen=seen)
    assert dict(counted) == chosen
    assert answer == at_rest


async def test_a_reader_lists_at_least_every_few_calls_and_so_sees_an_unmarked_change(
        store: S3Store, counted: RequestCounter, other: S3Store, s3_server: S3Server,
        s3_bucket: str) -> None:
    await node_mode_cluster(other)
    _, seen = await quiet_reader(store)
    # A hand edit puts no mark: the safety net finds it.
    hand = make_lease(shard=2, owner="node-z", generation=7, renewal="node")
    s3_server.client().put_object(Bucket=s3_bucket, Key=lease_key(CLUSTER, 2),
                                  Body=encode(hand))
    counted.clear()
    calls = 0
    while (await store.list_leases(CLUSTER, seen=seen))[2].record != hand:
        calls += 1
        assert calls < FULL_LIST_EVERY
    assert leases_listed(counted) == 1
    await store.list_leases(CLUSTER, seen=seen)  # (it found a change: listed again)
    counted.clear()
    for _ in range(2 * FULL_LIST_EVERY):
        await store.list_leases(CLUSTER, seen=seen)
    assert leases_listed(counted) == 2


async def test_a_store_sees_its_own_writes_at_once(store: S3Store, other: S3Store) -> None:
    await node_mode_cluster(other)
    listed, seen = await quiet_reader(store)
    claim = rewrite(listed[4].record, owner="node-a", generation=2)  # type: ignore[arg-type]
    version = await store.update_lease(claim, listed[4].version)
    # Its own mark may not have landed yet: its view is void anyway.
    after = await store.list_leases(CLUSTER, seen=seen)
    assert after[4].version == version and after[4].record == claim


async def test_a_refused_write_marks_too_and_voids_the_writers_view(
        store: S3Store, counted: RequestCounter, other: S3Store, s3_server: S3Server,
        s3_bucket: str) -> None:
    versions = await node_mode_cluster(other)
    listed, seen = await quiet_reader(store)
    before = marker_etag(s3_server, s3_bucket)
    # The refusal of a retry whose first attempt landed looks the same.
    with pytest.raises(Conflict):
        await store.create_lease(make_lease(shard=0, owner="node-a"))
    await settled(store)
    assert marker_etag(s3_server, s3_bucket) != before
    counted.clear()
    assert await store.list_leases(CLUSTER, seen=seen) == listed
    assert leases_listed(counted) == 1
    assert listed[0].version == versions[0]


async def test_a_shard_mode_renewal_puts_no_mark_and_anything_else_does(
        other: S3Store, s3_server: S3Server, s3_bucket: str) -> None:
    lease = make_lease(shard=0, owner="node-b", generation=3)
    version = await other.create_lease(lease)
    await settled(other)
    before = marker_etag(s3_server, s3_bucket)
    assert before is not None, "a claim marks"
    for _ in range(3):
        lease = rewrite(lease)
        version = await other.update_lease(lease, version)
    await settled(other)
    assert marker_etag(s3_server, s3_bucket) == before, "renewals in place put no mark"
    for change in ({"renewal": "node"}, {"owner": None}):  # a conversion, a free
        lease = rewrite(lease, **change)
        version = await other.update_lease(lease, version)
        await settled(other)
        assert marker_etag(s3_server, s3_bucket) != before, change
        before = marker_etag(s3_server, s3_bucket)
    # A renewal of a record this client never saw: it cannot tell, so it marks.
    unknown = s3_store(s3_server, s3_bucket)
    try:
        await unknown.update_lease(rewrite(lease, owner="node-b"), version)
        await settled(unknown)
    finally:
        await unknown.aclose()
    assert marker_etag(s3_server, s3_bucket) != before


async def test_shard_mode_leases_or_a_beating_peer_make_every_call_list(
        store: S3Store, counted: RequestCounter, other: S3Store) -> None:
    await node_mode_cluster(other)
    shard_mode = make_lease(shard=20, owner="node-c", generation=1)  # renewed in place
    version = await other.create_lease(shard_mode)
    await settled(other)
    seen = await told_beats(store)
    await store.list_leases(CLUSTER, seen=seen)
    counted.clear()
    for _ in range(3):
        await store.list_leases(CLUSTER, seen=seen)
    assert dict(counted) == {"list": 3}, "no HEAD either: it would not be used"

    # Freed (a mark): the cluster is quiet again once a listing found no move...
    await other.update_lease(rewrite(shard_mode, owner=None), version)
    await settled(other)
    await store.list_leases(CLUSTER, seen=seen)
    await store.list_leases(CLUSTER, seen=seen)
    counted.clear()
    await store.list_leases(CLUSTER, seen=seen)
    assert leases_listed(counted) == 0
    # ...until a peer heartbeats: it may run a version that puts no marks.
    for seq in range(QUIET_LISTINGS + 1):
        await other.put_heartbeat(make_heartbeat("node-old", seq=seq))
        seen = await told_beats(store)
        counted.clear()
        await store.list_leases(CLUSTER, seen=seen)
        assert leases_listed(counted) == 1, seq
    # A heartbeat left unchanged over QUIET_LISTINGS listings is nobody's.
    for _ in range(QUIET_LISTINGS - 1):
        seen = await told_beats(store)
        await store.list_leases(CLUSTER, seen=seen)
    seen = await told_beats(store)
    await store.list_leases(CLUSTER, seen=seen)
    counted.clear()
    await store.list_leases(CLUSTER, seen=seen)
    assert leases_listed(counted) == 0


async def test_a_reader_that_never_listed_the_heartbeats_always_lists_the_leases(
        store: S3Store, counted: RequestCounter, other: S3Store) -> None:
    """`shardlease owners` and any one-shot reader see the truth."""
    await node_mode_cluster(other)
    for _ in range(3):
        await store.list_leases(CLUSTER)
    assert dict(counted) == {"list": 3, "get": 8}, "8 GETs, the first time"


async def test_closing_a_store_puts_the_marks_it_owes(
        other: S3Store, s3_server: S3Server, s3_bucket: str) -> None:
    await other.create_lease(make_lease(shard=0, renewal="node"))
    await other.aclose()
    assert marker_etag(s3_server, s3_bucket) is not None


# -- untrusted records -----------------------------------------------------------------------------


async def test_an_empty_record_is_judged_from_the_listing_and_an_oversize_one_read_bounded(
        store: S3Store, counted: RequestCounter, s3_server: S3Server, s3_bucket: str) -> None:
    client = s3_server.client()
    big = (encode(make_lease(shard=1, generation=31))[:-1]
           + b', "pad": "' + b"x" * 1_000_000 + b'"}')
    client.put_object(Bucket=s3_bucket, Key=lease_key(CLUSTER, 1), Body=big)
    client.put_object(Bucket=s3_bucket, Key=lease_key(CLUSTER, 2), Body=b"")
    listed = await store.list_leases(CLUSTER)
    # The oversize one is fetched once, its first bytes only, for its generation.
    assert dict(counted) == {"list": 1, "get": 1}
    assert listed[1].record is None and f"{len(big)} bytes" in (listed[1].error or "")
    assert listed[1].generation == 31
    assert listed[2].record is None and listed[2].error
    assert listed[1].version and listed[2].version
    await store.list_leases(CLUSTER)
    assert dict(counted) == {"list": 2, "get": 1}, "not read again while unchanged"


async def test_a_get_reads_a_bounded_range_and_refuses_an_oversize_record(
        store: S3Store, s3_server: S3Server, s3_bucket: str) -> None:
    client = s3_server.client()
    etag = client.put_object(Bucket=s3_bucket, Key=lease_key(CLUSTER, 1),
                             Body=b"y" * (MAX_RECORD_BYTES * 50))["ETag"].strip('"')
    got = await store.get_lease(CLUSTER, 1)
    assert got is not None and got.record is None and got.version == etag
    assert f"{MAX_RECORD_BYTES * 50} bytes" in (got.error or "")


async def test_an_empty_object_read_by_get_is_corrupt_and_has_a_version(
        store: S3Store, s3_server: S3Server, s3_bucket: str) -> None:
    etag = s3_server.client().put_object(
        Bucket=s3_bucket, Key=lease_key(CLUSTER, 4), Body=b"")["ETag"].strip('"')
    got = await store.get_lease(CLUSTER, 4)
    assert got is not None and got.record is None and got.error and got.version == etag
    # It can be replaced by a swap on that version.
    await store.update_lease(make_lease(shard=4), got.version)


async def test_keys_that_are_not_shard_numbers_are_reported_once_and_skipped(
        store: S3Store, s3_server: S3Server, s3_bucket: str,
        caplog: pytest.LogCaptureFixture) -> None:
    await store.create_lease(make_lease(shard=7))
    client = s3_server.client()
    for name in ("notes.txt", "007", "-1", "1e3", "sub/8"):
        client.put_object(Bucket=s3_bucket, Key=f"{PREFIX}/{CLUSTER}/leases/{name}",
                          Body=encode(make_lease(shard=8)))
    with caplog.at_level(logging.WARNING, logger="shardlease.stores.s3"):
        assert sorted(await store.list_leases(CLUSTER)) == [7]
        assert sorted(await store.list_leases(CLUSTER)) == [7]
    reported = [r.getMessage() for r in caplog.records if r.name == "shardlease.stores.s3"]
    assert len(reported) == 4, reported  # "sub/8" is below leases/, not in it
    assert all("not a lease" in message for message in reported)


async def test_a_lease_deleted_behind_the_stores_back_disappears_from_the_listing(
        store: S3Store, s3_server: S3Server, s3_bucket: str) -> None:
    await store.create_lease(make_lease(shard=1))
    await store.create_lease(make_lease(shard=2))
    s3_server.client().delete_object(Bucket=s3_bucket, Key=lease_key(CLUSTER, 1))
    assert sorted(await store.list_leases(CLUSTER)) == [2]
    assert await store.get_lease(CLUSTER, 1) is None


async def test_one_lease_object_that_cannot_be_read_is_corrupt_not_a_failed_listing(
        store: S3Store, other: S3Store, s3_server: S3Server, s3_bucket: str) -> None:
    # moto answers a GET of an archived object 403 InvalidObjectState, as S3
    # does; a bucket policy denying one key gives the same 403 on GET.
    good = make_lease(shard=0)
    await store.create_lease(good)
    record = encode(make_lease(shard=1, owner="node-b", generation=8))
    s3_server.client().put_object(Bucket=s3_bucket, Key=lease_key(CLUSTER, 1), Body=record,
                                  StorageClass="GLACIER")
    listed = await store.list_leases(CLUSTER)
    assert sorted(listed) == [0, 1]
    assert listed[0].record == good
    unreadable = listed[1]
    assert unreadable.record is None and unreadable.error
    assert "403" in unreadable.error and "InvalidObjectState" in unreadable.error
    assert unreadable.version == hashlib.md5(record).hexdigest()
    # It is taken over like any corrupt record: a swap on its version.
    claim = make_lease(shard=1, owner="node-a", generation=9)
    version = await other.write_lease(claim, unreadable.version)
    again = await store.list_leases(CLUSTER)
    assert again[1].version == version and again[1].record == claim


# -- 412 and 409 -----------------------------------------------------------------------------------


def conditional_error(status: int, code: str) -> dict[str, Any]:
    return {"service_error_code": code, "service_message": code,
            "http_status_code": status}


@pytest.fixture
async def stubbed(s3_server: S3Server) -> AsyncIterator[tuple[S3Store, Any]]:
    """A store whose client answers from a strict script (botocore's Stubber).
    The scripts are the lease writes alone: the move marks that follow them
    (tested on the servers) are not put."""
    store = S3Store("stubbed", PREFIX, endpoint_url="http://127.0.0.1:9", region="us-east-1")
    store._mark = lambda *_: None  # type: ignore[method-assign]
    client = await store._s3()
    with AioStubber(client) as stubber:
        yield store, stubber
        stubber.assert_no_pending_responses()
    await store.aclose()


def put_ok(etag: str) -> dict[str, Any]:
    return {"ETag": f'"{etag}"'}


async def test_a_409_on_create_is_retried_while_the_object_is_still_missing(
        stubbed: tuple[S3Store, Any]) -> None:
    store, stub = stubbed
    lease = make_lease(shard=3)
    key = lease_key(CLUSTER, 3)
    stub.add_client_error("put_object", **conditional_error(409, "ConditionalRequestConflict"),
                          expected_params={"Bucket": "stubbed", "Key": key, "Body": encode(lease),
                                           "ContentType": "application/json", "IfNoneMatch": "*"})
    stub.add_client_error("head_object", http_status_code=404, service_error_code="404")
    stub.add_response("put_object", put_ok("new"))
    assert await store.create_lease(lease) == "new"


async def test_a_409_on_update_is_retried_while_the_version_still_holds(
        stubbed: tuple[S3Store, Any]) -> None:
    store, stub = stubbed
    stub.add_client_error("put_object", **conditional_error(409, "ConditionalRequestConflict"))
    stub.add_response("head_object", {"ETag": '"v1"'})
    stub.add_client_error("put_object", **conditional_error(409, "ConditionalRequestConflict"))
    stub.add_response("head_object", {"ETag": '"v1"'})
    stub.add_response("put_object", put_ok("v2"),
                      expected_params={"Bucket": "stubbed", "Key": lease_key(CLUSTER, 0),
                                       "Body": stub_any(), "ContentType": "application/json",
                                       "IfMatch": '"v1"'})
    assert await store.update_lease(make_lease(shard=0), "v1") == "v2"


async def test_a_409_after_which_the_version_moved_is_a_conflict(
        stubbed: tuple[S3Store, Any]) -> None:
    store, stub = stubbed
    stub.add_client_error("put_object", **conditional_error(409, "ConditionalRequestConflict"))
    stub.add_response("head_object", {"ETag": '"theirs"'})
    with pytest.raises(Conflict, match="theirs"):
        await store.update_lease(make_lease(shard=0), "v1")


async def test_a_409_on_create_after_which_the_object_exists_is_a_conflict(
        stubbed: tuple[S3Store, Any]) -> None:
    store, stub = stubbed
    stub.add_client_error("put_object", **conditional_error(409, "ConditionalRequestConflict"))
    stub.add_response("head_object", {"ETag": '"theirs"'})
    with pytest.raises(Conflict):
        await store.create_lease(make_lease(shard=0))


async def test_409s_that_never_stop_end_as_a_store_error_not_a_lost_lease(
        stubbed: tuple[S3Store, Any]) -> None:
    store, stub = stubbed
    for attempt in range(4):
        stub.add_client_error("put_object", **conditional_error(409, "ConditionalRequestConflict"))
        if attempt < 3:
            stub.add_response("head_object", {"ETag": '"v1"'})
    with pytest.raises(StoreError, match="ConditionalRequestConflict") as failed:
        await store.update_lease(make_lease(shard=0), "v1")
    assert not isinstance(failed.value, Conflict)


@pytest.mark.parametrize(("status", "code"), [(412, "PreconditionFailed"), (404, "NoSuchKey")])
async def test_a_412_or_a_missing_object_is_a_conflict_at_once(
        stubbed: tuple[S3Store, Any], status: int, code: str) -> None:
    store, stub = stubbed
    stub.add_client_error("put_object", **conditional_error(status, code))
    with pytest.raises(Conflict):
        await store.update_lease(make_lease(shard=0), "v1")


async def test_a_412_on_create_is_a_conflict_at_once(stubbed: tuple[S3Store, Any]) -> None:
    store, stub = stubbed
    stub.add_client_error("put_object", **conditional_error(412, "PreconditionFailed"))
    with pytest.raises(Conflict, match="exists"):
        await store.create_lease(make_lease(shard=0))


async def test_access_denied_is_a_store_error_naming_code_bucket_and_key(
        stubbed: tuple[S3Store, Any]) -> None:
    store, stub = stubbed
    stub.add_client_error("put_object", **conditional_error(403, "AccessDenied"))
    with pytest.raises(StoreError) as failed:
        await store.create_lease(make_lease(shard=5))
    assert not isinstance(failed.value, Conflict)
    message = str(failed.value)
    for word in ("AccessDenied", "403", f"s3://stubbed/{lease_key(CLUSTER, 5)}",
                 "http://127.0.0.1:9"):
        assert word in message, message


def stub_any() -> Any:
    from botocore.stub import ANY  # type: ignore[import-untyped]
    return ANY


# -- the start-up probe, and failures --------------------------------------------------------------


async def test_check_passes_on_moto_and_leaves_nothing_behind(
        store: S3Store, counted: RequestCounter, s3_server: S3Server, s3_bucket: str) -> None:
    await store.check()
    assert s3_server.client().list_objects_v2(Bucket=s3_bucket).get("KeyCount") == 0
    assert dict(counted) == {"list": 2, "get": 1, "put": 5, "delete": 2}


class LossyProxy(BaseHTTPRequestHandler):
    """An HTTP proxy to a real S3 server that forwards every request but drops
    the answer of the requests `lose` picks (the connection closes unanswered),
    as a network that fails after the server acted does."""

    upstream: ClassVar[tuple[str, int]]
    lose: ClassVar[Any]
    lost: ClassVar[list[str]]

    def log_message(self, format: str, *args: Any) -> None:
        pass

    def forward(self) -> None:
        data = self.rfile.read(int(self.headers.get("Content-Length", 0) or 0))
        connection = http.client.HTTPConnection(*self.upstream, timeout=30)
        try:
            connection.request(self.command, self.path, body=data or None,
                               headers={k: v for k, v in self.headers.items()})
            answer = connection.getresponse()
            payload = answer.read()
        finally:
            connection.close()
        if self.lose(self.command, self.path):
            self.lost.append(f"{self.command} {self.path}")
            self.close_connection = True
            self.connection.shutdown(socket.SHUT_RDWR)
            return
        self.send_response(answer.status)
        for name, value in answer.getheaders():
            if name.lower() not in ("content-length", "transfer-encoding", "connection",
                                    "server", "date"):
                self.send_header(name, value)
        self.send_header("Content-Length", str(len(payload)))
        self.end_headers()
        self.wfile.write(payload)

    do_GET = do_PUT = do_DELETE = do_HEAD = do_POST = forward


@pytest.fixture
def lossy(s3_server: S3Server) -> Iterator[type[LossyProxy]]:
    parts = urlsplit(s3_server.endpoint)
    handler = type("Lossy", (LossyProxy,), {
        "upstream": (parts.hostname, parts.port), "lose": staticmethod(lambda m, p: False),
        "lost": []})
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    handler.endpoint = f"http://127.0.0.1:{server.server_port}"  # type: ignore[attr-defined]
    try:
        yield handler
    finally:
        server.shutdown()
        thread.join()
        server.server_close()


def first_only(method: str, marker: str) -> Any:
    """Lose the answer of the first `method` request whose path contains `marker`."""
    done: list[bool] = []

    def lose(m: str, path: str) -> bool:
        if done or m != method or marker not in path:
            return False
        done.append(True)
        return True
    return lose


@pytest.mark.parametrize("lost_write", ["If-None-Match", "If-Match"])
async def test_check_survives_a_probe_write_whose_answer_was_lost_and_cleans_up(
        s3_server: S3Server, s3_bucket: str, lossy: type[LossyProxy], lost_write: str) -> None:
    puts: list[str] = []

    def lose(method: str, path: str) -> bool:
        if method != "PUT" or ".shardlease-probe" not in path or "never-created" in path:
            return False
        puts.append(path)
        # The create is the first probe PUT; the update with the right ETag the fourth.
        return len(puts) == (1 if lost_write == "If-None-Match" else 4)

    lossy.lose = staticmethod(lose)
    store = S3Store(s3_bucket, PREFIX, endpoint_url=lossy.endpoint,  # type: ignore[attr-defined]
                    path_style=True)
    try:
        await store.check()
    finally:
        await store.aclose()
    assert len(lossy.lost) == 1, lossy.lost
    assert s3_server.client().list_objects_v2(Bucket=s3_bucket).get("KeyCount") == 0


async def test_check_removes_the_probe_object_whatever_the_outcome(
        s3_server: S3Server, s3_bucket: str, lossy: type[LossyProxy]) -> None:
    # Every answer to a read of the probe object is lost: the check fails
    # after the probe object was written, and must remove it all the same.
    lossy.lose = staticmethod(lambda method, path: method == "GET" and "probe/" in path)
    store = S3Store(s3_bucket, PREFIX, endpoint_url=lossy.endpoint,  # type: ignore[attr-defined]
                    path_style=True)
    try:
        with pytest.raises(StoreError):
            await store.check()
    finally:
        await store.aclose()
    assert lossy.lost, "no read was lost"
    assert s3_server.client().list_objects_v2(Bucket=s3_bucket).get("KeyCount") == 0


class StubS3(BaseHTTPRequestHandler):
    """A minimal S3 on loopback that honours only the conditions it is told to."""

    honour_if_none_match: ClassVar[bool] = False
    honour_if_match: ClassVar[bool] = False
    fail_with: ClassVar[int] = 0
    reject_conditions: ClassVar[bool] = False
    deny_reads: ClassVar[bool] = False
    objects: ClassVar[dict[str, bytes]]
    seen: ClassVar[list[str]]

    def log_message(self, format: str, *args: Any) -> None:
        pass

    def reply(self, status: int, body: bytes = b"", **headers: str) -> None:
        self.send_response(status)
        for name, value in headers.items():
            self.send_header(name.replace("_", "-"), value)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def error(self, status: int, code: str) -> None:
        self.reply(status, f"<Error><Code>{code}</Code><Message>{code}</Message></Error>".encode(),
                   Content_Type="application/xml")

    def do_GET(self) -> None:
        self.seen.append("GET")
        if self.fail_with:
            return self.error(self.fail_with, "InternalError")
        path, _, query = self.path.partition("?")
        if "list-type" not in query and self.deny_reads:
            return self.error(403, "AccessDenied")
        if "list-type" not in query:
            found = self.objects.get(path)
            if found is None:
                return self.error(404, "NoSuchKey")
            return self.reply(206, found, ETag=f'"{hashlib.md5(found).hexdigest()}"',
                              Content_Range=f"bytes 0-{len(found) - 1}/{len(found)}")
        prefix = "/" + path.strip("/") + "/" + dict(parse_qsl(query)).get("prefix", "")
        contents = b"".join(
            b"<Contents><Key>%s</Key><ETag>&quot;%s&quot;</ETag><Size>%d</Size></Contents>"
            % (name[len(path.rstrip("/")) + 1:].encode(), hashlib.md5(data).hexdigest().encode(),
               len(data))
            for name, data in sorted(self.objects.items()) if name.startswith(prefix))
        self.reply(200, b'<?xml version="1.0" encoding="UTF-8"?><ListBucketResult>'
                   b"<Name>b</Name>" + contents + b"<IsTruncated>false</IsTruncated>"
                   b"</ListBucketResult>", Content_Type="application/xml")

    def do_PUT(self) -> None:
        self.seen.append("PUT")
        body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
        current = self.objects.get(self.path)
        etag = f'"{hashlib.md5(current).hexdigest()}"' if current is not None else None
        if self.reject_conditions and ("If-None-Match" in self.headers
                                       or "If-Match" in self.headers):
            return self.error(501, "NotImplemented")
        if self.honour_if_none_match and self.headers.get("If-None-Match") and current is not None:
            return self.error(412, "PreconditionFailed")
        if self.honour_if_match and (wanted := self.headers.get("If-Match")):
            if current is None:
                return self.error(404, "NoSuchKey")
            if wanted != etag:
                return self.error(412, "PreconditionFailed")
        self.objects[self.path] = body
        self.reply(200, ETag=f'"{hashlib.md5(body).hexdigest()}"')

    def do_DELETE(self) -> None:
        self.seen.append("DELETE")
        self.objects.pop(self.path, None)
        self.reply(204)


@pytest.fixture
def stub_s3() -> Iterator[tuple[str, type[StubS3]]]:
    handler = type("Stub", (StubS3,), {"objects": {}, "seen": []})
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_port}", handler
    finally:
        server.shutdown()
        thread.join()
        server.server_close()


@pytest.mark.parametrize(("honour_none", "honour_match", "ignored"), [
    (False, False, "ignored If-None-Match"),
    (True, False, "ignored If-Match"),
])
async def test_check_refuses_a_server_that_ignores_a_condition(
        s3_server: S3Server, stub_s3: tuple[str, type[StubS3]],
        honour_none: bool, honour_match: bool, ignored: str) -> None:
    endpoint, handler = stub_s3
    handler.honour_if_none_match = honour_none
    handler.honour_if_match = honour_match
    store = S3Store("bucket", "p", endpoint_url=endpoint, path_style=True)
    try:
        with pytest.raises(StoreUnsafe) as refused:
            await store.check()
    finally:
        await store.aclose()
    message = str(refused.value)
    assert ignored in message and endpoint in message and "two nodes own a shard" in message
    assert handler.objects == {}, "the probe object was left behind"


async def test_check_refuses_a_server_that_does_not_implement_conditions(
        s3_server: S3Server, stub_s3: tuple[str, type[StubS3]]) -> None:
    endpoint, handler = stub_s3
    handler.reject_conditions = True
    store = S3Store("bucket", "p", endpoint_url=endpoint, path_style=True)
    try:
        with pytest.raises(StoreUnsafe, match="NotImplemented"):
            await store.check()
    finally:
        await store.aclose()


async def test_check_passes_on_a_server_that_honours_both_conditions(
        s3_server: S3Server, stub_s3: tuple[str, type[StubS3]]) -> None:
    endpoint, handler = stub_s3
    handler.honour_if_none_match = handler.honour_if_match = True
    store = S3Store("bucket", "p", endpoint_url=endpoint, path_style=True)
    try:
        await store.check()
    finally:
        await store.aclose()
    assert handler.objects == {}


async def test_check_refuses_credentials_that_may_write_but_not_read_and_cleans_up(
        s3_server: S3Server, stub_s3: tuple[str, type[StubS3]]) -> None:
    endpoint, handler = stub_s3
    handler.honour_if_none_match = handler.honour_if_match = True
    handler.deny_reads = True
    store = S3Store("bucket", "p", endpoint_url=endpoint, path_style=True)
    try:
        with pytest.raises(StoreError) as refused:
            await store.check()
    finally:
        await store.aclose()
    message = str(refused.value)
    assert "AccessDenied" in message and "get_object" in message, message
    assert not isinstance(refused.value, StoreUnsafe)
    assert handler.objects == {}, "the probe object was left behind"


async def test_server_errors_are_retried_a_few_times_then_a_store_error(
        s3_server: S3Server, stub_s3: tuple[str, type[StubS3]]) -> None:
    endpoint, handler = stub_s3
    handler.fail_with = 500
    store = S3Store("bucket", "p", endpoint_url=endpoint, path_style=True)
    counted = count_requests(store)
    try:
        with pytest.raises(StoreError) as failed:
            await store.list_leases(CLUSTER)
    finally:
        await store.aclose()
    assert not isinstance(failed.value, Conflict)
    assert "InternalError" in str(failed.value) and "500" in str(failed.value)
    assert handler.seen == ["GET"] * 3
    assert dict(counted) == {"list": 3}


async def test_an_endpoint_that_is_not_s3_is_reported_as_answering_200_not_500(
        s3_server: S3Server, not_s3: str) -> None:
    store = S3Store("bucket", "p", endpoint_url=not_s3, path_style=True)
    try:
        for call in (lambda: store.list_leases(CLUSTER), store.check):
            with pytest.raises(StoreError) as failed:
                await call()
            message = str(failed.value)
            assert "does not look like S3" in message and "HTTP 200" in message, message
            assert "text/html" in message and not_s3 in message, message
            assert "500" not in message, message
    finally:
        await store.aclose()


def closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


async def test_an_unreachable_endpoint_is_a_store_error_saying_so(s3_server: S3Server) -> None:
    endpoint = f"http://127.0.0.1:{closed_port()}"
    store = S3Store("bucket", "p", endpoint_url=endpoint, path_style=True)
    started = time.monotonic()
    try:
        with pytest.raises(StoreError) as failed:
            await store.check()
    finally:
        await store.aclose()
    assert not isinstance(failed.value, StoreUnsafe)
    assert "cannot reach the S3 endpoint" in str(failed.value)
    assert endpoint in str(failed.value)
    assert time.monotonic() - started < 10


async def test_a_missing_bucket_is_a_store_error_saying_so(s3_server: S3Server) -> None:
    store = S3Store("no-such-bucket-here", "p", endpoint_url=s3_server.endpoint, path_style=True)
    try:
        with pytest.raises(StoreError, match="'no-such-bucket-here' does not exist"):
            await store.check()
    finally:
        await store.aclose()


async def test_missing_credentials_are_a_store_error_saying_what_to_set(
        s3_server: S3Server, s3_bucket: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("AWS_ACCESS_KEY_ID")
    monkeypatch.delenv("AWS_SECRET_ACCESS_KEY")
    store = s3_store(s3_server, s3_bucket)
    try:
        with pytest.raises(StoreError, match=r"no AWS credentials.*AWS_ACCESS_KEY_ID"):
            await store.list_leases(CLUSTER)
    finally:
        await store.aclose()


async def test_a_closed_store_opens_a_new_client_when_used_again(store: S3Store) -> None:
    await store.create_lease(make_lease(shard=0))
    await store.aclose()
    await store.aclose()
    assert sorted(await store.list_leases(CLUSTER)) == [0]
