"""The S3 store's start-up probe: is the bucket usable, and does the server
enforce conditional writes? A server that ignores them would let two nodes
own a shard, so a node refuses such a store before it claims anything."""

from __future__ import annotations

import json
import logging
import uuid
from typing import TYPE_CHECKING, NoReturn

from shardlease.errors import StoreError, StoreUnsafe
from shardlease.stores.s3.keys import clean_etag
from shardlease.stores.s3.transport import _SAFE_STORES, _S3Failure

if TYPE_CHECKING:
    from shardlease.stores.s3.store import S3Store

log = logging.getLogger("shardlease.stores.s3")


async def probe(store: S3Store) -> None:
    """`S3Store.check()`: what it verifies is said there.

    Every probe write carries a nonce. A write whose answer was lost after
    it landed is retried by botocore and then refused (412: the object now
    exists, or moved): reading the object back and finding our nonce tells
    our own write from a server that refuses the condition, so a node
    starting on a lossy network neither fails nor judges a sound store
    unsafe.
    """
    probe_dir = f"{store._root()}.shardlease-probe/"
    key = f"{probe_dir}{uuid.uuid4().hex}"
    missing = f"{probe_dir}{uuid.uuid4().hex}-never-created"
    endpoint = store._endpoint()

    def unsafe(what: str) -> NoReturn:
        raise StoreUnsafe(
            f"the S3 endpoint {endpoint} (bucket {store.bucket!r}) {what}: shardlease "
            f"would let two nodes own a shard; use a store that supports conditional "
            f"writes ({_SAFE_STORES})")

    def body() -> bytes:
        return json.dumps({"probe": True, "nonce": uuid.uuid4().hex}).encode()

    async def read_back(target: str) -> tuple[str, bytes] | None:
        got = await store._read(target)
        return None if got is None else (got[0], got[1])

    async def put(target: str, data: bytes, expect_refusal: bool = False,
                  **condition: str) -> str | _S3Failure:
        """The new ETag, or the refusal. A refusal of a write that in fact
        landed (its answer lost, the retry refused) is the new ETag too;
        not checked for writes meant to be refused (a server that ignores
        the condition lets the retry through as well)."""
        try:
            answer = await store._call("put_object", target, Key=target, Body=data,
                                      **condition)
        except _S3Failure as e:
            if e.status in (409, 412) and not expect_refusal:
                found = await read_back(target)
                if found is not None and found[1] == data:
                    log.info("the answer to the probe's write of %s was lost; it landed",
                             store._url(target))
                    return found[0]
            return e
        return clean_etag(answer.get("ETag", ""))

    # Listing is how nodes find the leases: it must be allowed.
    await store._call("list_objects_v2", probe_dir, Prefix=probe_dir, MaxKeys=1)
    try:
        data = body()
        first = await put(key, data, IfNoneMatch="*")
        if isinstance(first, _S3Failure):
            if first.status in (400, 501) \
                    and first.code in ("NotImplemented", "InvalidArgument"):
                unsafe(f"refused a PUT with If-None-Match ({first.code}: {first})")
            raise first
        # Reading and listing what was written: a node that may write but
        # not read or list the leases could never see who holds them.
        found = await read_back(key)
        if found is None or found[1] != data:
            what = "it is missing" if found is None else "other bytes"
            raise StoreError(
                f"the S3 endpoint {endpoint} did not give back the probe object "
                f"{store._url(key)} just written ({what})")
        if key not in await store._list(probe_dir):
            raise StoreError(
                f"the S3 endpoint {endpoint} did not list the probe object {store._url(key)} "
                "just written: nodes would not see each other's leases")
        again = await put(key, body(), True, IfNoneMatch="*")
        if isinstance(again, str):
            unsafe("ignored If-None-Match: a second create of one object succeeded")
        if again.status not in (409, 412):
            raise again
        wrong = "0" * 32 if first != "0" * 32 else "1" * 32
        stale = await put(key, body(), True, IfMatch=f'"{wrong}"')
        if isinstance(stale, str):
            unsafe("ignored If-Match: an update with a wrong ETag succeeded")
        if stale.status != 412:
            raise stale
        right = await put(key, body(), IfMatch=f'"{first}"')
        if isinstance(right, _S3Failure):
            if right.status == 412:
                unsafe(f"refused an update with the object's own ETag {first!r} "
                       "(If-Match never matches)")
            raise right
        absent = await put(missing, body(), IfMatch=f'"{first}"')
        if isinstance(absent, str):
            log.warning(
                "the S3 endpoint %s created an object on a PUT with If-Match although "
                "there was none (AWS answers 404); an update of a lease someone deleted "
                "recreates it; safe, but consider upgrading the store", endpoint)
        elif absent.status not in (404, 412):
            raise absent
    finally:
        for target in (key, missing):
            try:
                await store._call("delete_object", target, Key=target)
            except StoreError as e:
                log.warning("could not remove the probe object %s: %s", store._url(target), e)
