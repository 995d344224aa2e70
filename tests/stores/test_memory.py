"""The store contract for the in-process reference store."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest

from shardlease.stores import open_store
from shardlease.stores.base import LeaseStore
from shardlease.stores.memory import MemoryBackend, MemoryStore

from .contract import DeleteRaw, MakeStore, PutRaw, StoreContract


class TestMemoryStore(StoreContract):
    @pytest.fixture
    async def store(self) -> AsyncIterator[LeaseStore]:
        store = MemoryStore(MemoryBackend(), name="contract")
        yield store
        await store.aclose()

    @pytest.fixture
    def put_raw(self, store: LeaseStore) -> PutRaw:
        assert isinstance(store, MemoryStore)

        async def put(cluster: str, shard: int, data: bytes) -> None:
            store.put_raw_lease(cluster, shard, data)
        return put

    @pytest.fixture
    def delete_raw(self, store: LeaseStore) -> DeleteRaw:
        assert isinstance(store, MemoryStore)

        async def delete(cluster: str, shard: int) -> None:
            store.backend.leases.pop((cluster, shard), None)
        return delete

    @pytest.fixture
    def make_second_store(self, store: LeaseStore) -> MakeStore:
        assert isinstance(store, MemoryStore)

        async def make() -> LeaseStore:
            return MemoryStore(store.backend, name=store.name)
        return make


def test_memory_urls_with_one_name_share_one_backend() -> None:
    first = open_store("memory://contract-shared")
    second = open_store("memory://contract-shared")
    other = open_store("memory://contract-elsewhere")
    assert isinstance(first, MemoryStore) and isinstance(second, MemoryStore)
    assert isinstance(other, MemoryStore)
    assert first is not second and first.backend is second.backend
    assert other.backend is not first.backend
    assert first.describe() == "memory://contract-shared"
