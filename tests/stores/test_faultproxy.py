"""The fault-injecting S3 proxy (`shardlease_tools.faultproxy`): transparent when
it injects nothing (the whole store contract passes through it, on MinIO),
and each fault does what it says: latency on the kinds chosen, 503 SlowDown
answers that the S3 store reports as such, a request its client abandoned
still carried out, faults changed while requests run."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable

import pytest

from shardlease.errors import StoreError
from shardlease.sim.fakes import StrictHost
from shardlease.stores.base import LeaseStore
from shardlease.stores.memory import MemoryBackend, MemoryStore
from shardlease.stores.requests import count_requests
from shardlease.stores.s3 import S3Store
from shardlease_tools.faultproxy import FaultProxy, Faults, request_kind
from tests.stores import test_s3
from tests.support.s3server import S3Server

from .contract import CLUSTER, MakeStore, make_heartbeat, make_lease

pytest_plugins = ["tests.support.s3server"]

pytestmark = pytest.mark.slow


@pytest.fixture
async def proxy(s3_server: S3Server) -> AsyncIterator[FaultProxy]:
    proxy = FaultProxy(s3_server.endpoint, seed=0)
    await proxy.start()
    yield proxy
    await proxy.aclose()


async def eventually(ok: Callable[[], bool]) -> None:
    """Poll another thread's or server's state (no event to wait on)."""
    async with asyncio.timeout(60):
        while not ok():  # noqa: ASYNC110
            await asyncio.sleep(0.01)


def proxied(proxy: FaultProxy, bucket: str) -> S3Store:
    return S3Store(bucket, test_s3.PREFIX, endpoint_url=proxy.endpoint, path_style=True)


class TestS3StoreThroughTheProxy(test_s3.TestS3StoreOnMinIO):
    """The store contract on MinIO, every request of the store under test
    through the proxy (with no fault): signatures, conditions, ETags, ranges
    and error answers all arrive as the server sent them."""

    @pytest.fixture
    async def store(self, proxy: FaultProxy, s3_bucket: str) -> AsyncIterator[LeaseStore]:
        store = proxied(proxy, s3_bucket)
        yield store
        await store.aclose()

    @pytest.fixture
    async def make_second_store(self, proxy: FaultProxy,
                                s3_bucket: str) -> AsyncIterator[MakeStore]:
        opened: list[S3Store] = []

        async def make() -> LeaseStore:
            opened.append(proxied(proxy, s3_bucket))
            return opened[-1]
        yield make
        for store in opened:
            await store.aclose()


@pytest.fixture
async def store(proxy: FaultProxy, s3_bucket: str) -> AsyncIterator[S3Store]:
    store = proxied(proxy, s3_bucket)
    yield store
    await store.aclose()


def test_requests_are_told_apart_by_kind() -> None:
    assert request_kind("GET", "/b", "list-type=2&prefix=x") == "list"
    assert request_kind("GET", "/b/sl/c/leases/3", "") == "get"
    assert request_kind("HEAD", "/b/sl/c/leases/3", "") == "head"
    assert request_kind("PUT", "/b/sl/c/leases/3", "") == "put-lease"
    assert request_kind("PUT", "/b/sl/c/heartbeats/n0", "") == "put-heartbeat"
    assert request_kind("PUT", "/b/sl/.shardlease-probe/x", "") == "put"
    assert request_kind("DELETE", "/b/sl/c/heartbeats/n0", "") == "delete"
    with pytest.raises(ValueError):
        Faults(error_rate=1.5)


async def test_every_request_is_counted_by_kind(proxy: FaultProxy, store: S3Store) -> None:
    version = await store.create_lease(make_lease(0))
    await store.update_lease(make_lease(0, generation=2), version)
    await store.put_heartbeat(make_heartbeat("n0"))
    await store.marks_settled()  # the move marks the writes owe: a "put" each, or one for both
    assert proxy.counts()["put"] in (1, 2)
    counted = count_requests(store)
    before = proxy.counts()
    await store.list_leases(CLUSTER)
    await store.get_lease(CLUSTER, 0)
    await store.list_heartbeats(CLUSTER)
    seen = proxy.counts() - before
    # The store counts its own HTTP requests: the proxy saw each of them.
    assert sum(seen.values()) == sum(counted.values())
    assert seen == {"list": 2, "get": 1}
    assert proxy.counts()["put-lease"] == 2 and proxy.counts()["put-heartbeat"] == 1


async def test_slowdown_answers_are_s3_throttling_retried_then_reported(
        proxy: FaultProxy, store: S3Store) -> None:
    # On the lease writes only: the move marks that follow them get through.
    proxy.set(Faults(error_rate=1.0, kinds=frozenset({"put-lease"})))
    with pytest.raises(StoreError, match="SlowDown") as failure:
        await store.create_lease(make_lease(0))
    assert "503" in str(failure.value)
    # botocore retried the throttled request: every attempt was answered 503
    # by the proxy, none reached the server.
    assert proxy.counts()["slowdown"] == proxy.counts()["put-lease"] > 1
    proxy.set(Faults())
    await store.create_lease(make_lease(0))
    assert (await store.get_lease(CLUSTER, 0)) is not None


async def test_faults_hit_only_the_kinds_chosen(proxy: FaultProxy, store: S3Store) -> None:
    proxy.set(Faults(error_rate=1.0, kinds=frozenset({"put-heartbeat"})))
    await store.create_lease(make_lease(0))  # not hit
    assert (await store.list_leases(CLUSTER)).keys() == {0}
    with pytest.raises(StoreError, match="SlowDown"):
        await store.put_heartbeat(make_heartbeat("n0"))
    assert proxy.counts()["slowdown"] == proxy.counts()["put-heartbeat"]


async def test_faults_hit_only_the_keys_chosen(proxy: FaultProxy, store: S3Store) -> None:
    # A hot key: shard 1's lease refused, shard 10's (whose path ends alike
    # but for a digit) and shard 0's served.
    proxy.set(Faults(error_rate=1.0, kinds=frozenset({"put-lease"}),
                     keys=frozenset({"leases/1"})))
    await store.create_lease(make_lease(0))
    await store.create_lease(make_lease(10))
    with pytest.raises(StoreError, match="SlowDown"):
        await store.create_lease(make_lease(1))
    assert (await store.list_leases(CLUSTER)).keys() == {0, 10}
    # (botocore tried shard 1 again: every try of it refused, the others' none.)
    assert proxy.counts()["slowdown"] == proxy.counts()["put-lease"] - 2 >= 1
    assert Faults(keys=frozenset({"leases/1"})).describe() == "of leases/1"
    with pytest.raises(ValueError, match="without a leading /"):
        Faults(keys=frozenset({"/leases/1"}))


async def test_a_request_its_client_abandoned_still_lands(proxy: FaultProxy,
                                                          store: S3Store) -> None:
    """As on S3, a write whose answer nobody waited for may be carried out:
    the proxy forwards it anyway (the loop must cope with that)."""
    await store.list_leases(CLUSTER)  # the client is connected
    proxy.set(Faults(latency=1.0, kinds=frozenset({"put-lease"})))
    writing = asyncio.create_task(store.create_lease(make_lease(0)))
    await eventually(lambda: proxy.counts()["put-lease"] > 0)
    writing.cancel()
    with pytest.raises(asyncio.CancelledError):
        await writing
    proxy.set(Faults())  # for the requests to come; the one waiting keeps its latency
    async with asyncio.timeout(60):
        while await store.get_lease(CLUSTER, 0) is None:  # noqa: ASYNC110 (polls S3)
            await asyncio.sleep(0.1)
    await eventually(lambda: proxy.counts()["abandoned"] > 0)
    assert proxy.counts()["put-lease"] == 1


async def test_a_store_whose_caller_retries_makes_one_attempt_per_call(
        proxy: FaultProxy, store: S3Store) -> None:
    """The placement loop retries within its budgets: botocore's own retries
    would pause rand(0, 1) s, then rand(0, 2) s after each 503 SlowDown, inside
    one call, while a renewal's budget (1.5 s at a TTL of 3 s) runs out."""
    await store.list_leases(CLUSTER)  # the client exists before the switch
    store.retried_by_caller()
    proxy.set(Faults(error_rate=1.0, kinds=frozenset({"put-lease"})))  # (marks get through)
    for shard in range(3):
        with pytest.raises(StoreError, match="SlowDown"):
            await store.create_lease(make_lease(shard))
    assert proxy.counts()["put-lease"] == proxy.counts()["slowdown"] == 3
    proxy.set(Faults())
    await store.create_lease(make_lease(0))
    assert (await store.get_lease(CLUSTER, 0)) is not None


async def test_a_move_mark_that_failed_is_put_again_and_the_move_is_then_seen(
        proxy: FaultProxy, store: S3Store, s3_server: S3Server, s3_bucket: str) -> None:
    reader = test_s3.s3_store(s3_server, s3_bucket)  # straight to the server
    try:
        listed, seen = await test_s3.quiet_reader(reader)
        assert listed == {}
        # Every marker PUT of the writer is refused (503); its lease writes land.
        proxy.set(Faults(error_rate=1.0, kinds=frozenset({"put"})))
        claim = make_lease(0, owner="node-b", renewal="node")
        await store.create_lease(claim)
        await eventually(lambda: proxy.counts()["slowdown"] >= 4)  # retried, beyond botocore
        assert test_s3.marker_etag(s3_server, s3_bucket) is None
        # No mark landed: the reader's view stands (the claim is missed for now).
        counted = count_requests(reader)
        assert await reader.list_leases(CLUSTER, seen=seen) == {}
        assert counted["list"] == 0
        proxy.set(Faults())
        async with asyncio.timeout(60):
            await store.marks_settled()
        assert test_s3.marker_etag(s3_server, s3_bucket) is not None
        found = await reader.list_leases(CLUSTER, seen=seen)
        assert found.keys() == {0} and found[0].record == claim
    finally:
        await reader.aclose()


def test_the_placement_loop_has_its_store_leave_the_retries_to_it() -> None:
    from shardlease.loop import PlacementLoop
    from shardlease.options import Options

    class Told(MemoryStore):
        told = False

        def retried_by_caller(self) -> None:
            self.told = True

    store = Told(MemoryBackend())
    PlacementLoop(store, StrictHost(), Options.make(shards=1, name="a", cluster_name="c"))
    assert store.told
