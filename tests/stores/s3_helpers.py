"""How the S3 store's tests make a store: the key prefix and the client."""

from __future__ import annotations

from typing import Any

from shardlease.stores.s3 import S3Store
from tests.support.s3server import S3Server

PREFIX = "sl"


def s3_store(server: S3Server, bucket: str, **options: Any) -> S3Store:
    return S3Store(bucket, PREFIX, endpoint_url=server.endpoint, path_style=True, **options)
