"""The S3 store's test fixtures, shared by tests/stores/test_s3.py and
tests/stores/test_s3_listing_bound.py (each lists this module in its
`pytest_plugins`): `store` (the reader, or the store under test), `counted`
(its requests, counted from its making) and `other` (another node's client on
the same bucket), all on moto's S3 server (tests/support/s3server.py). Only
pytest imports it (as a plugin: a module imported before would be warned of)."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest

from shardlease.stores.requests import RequestCounter, count_requests
from shardlease.stores.s3 import S3Store
from tests.support.s3server import S3Server

from .s3_helpers import s3_store


@pytest.fixture
async def store(s3_server: S3Server, s3_bucket: str) -> AsyncIterator[S3Store]:
    store = s3_store(s3_server, s3_bucket)
    yield store
    await store.aclose()


@pytest.fixture
def counted(store: S3Store) -> RequestCounter:
    """`store`'s requests, counted from its making."""
    return count_requests(store)


@pytest.fixture
async def other(s3_server: S3Server, s3_bucket: str) -> AsyncIterator[S3Store]:
    """Another node's client on the same bucket."""
    store = s3_store(s3_server, s3_bucket)
    yield store
    await store.aclose()
