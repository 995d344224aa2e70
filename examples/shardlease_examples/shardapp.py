"""An example sharded application: a key-value service fenced by the lease generation.

Run it beside a shardlease agent (or a ``shardlease node --host http://...``)::

    python -m shardlease_examples.shardapp --port 8080 --shards 16 \\
        --store 's3://bucket/prefix?endpoint=http://127.0.0.1:9000&path_style=true'

It speaks the sidecar's HTTP host protocol (any 2xx is success; see
``shardlease.hosts.http``)::

    POST /shards/{shard}/open   {"shard": S, "generation": G, "validity_ms": V}
    POST /shards/{shard}/close  {"shard": S, "generation": G}
    POST /lease                 {"leases": [{"shard": S, "generation": G, "validity_ms": V}]}
    POST /shards/{shard}/abort  {"shard": S, "generation": G}

A call older than what this instance has seen of the shard is ignored (a
close of generation 3 while 4 is open here) or refused (an open of a
generation already closed here: a slow open that arrives after its close).

Its own deadline: per shard, the generation and a deadline on this process's
monotonic clock, = when the open or ``/lease`` arrived + ``validity_ms``
(the agent's own deadline for the shard, at which it would close it). Past
it, the shard is served as if it were closed (421, ``"expired": true``) until
a ``/lease`` of that same generation extends it: an agent that stalls
(paused, OOM-killed, cut off from the app) thus stops this app at the moment
it would have closed the shard itself, before anyone else may open it.
``--ignore-validity`` turns that off (an app that only trusts its storage's
fencing; for comparison). An ``abort`` (the agent gave up on a close) drops
the shard at once, without waiting for its write in flight.

and serves its own API::

    PUT /kv/{key}    the request body (UTF-8 text) becomes the key's value
    GET /kv/{key}    {"key", "value", "shard", "generation"} (404 if the key has no value)
    GET /shards      the shards open here, their generations, counters
    GET /history     what happened to each shard here, on this process's monotonic clock
    GET /healthz

A key belongs to shard ``shardlease.routing.shard_for_key(key, shards)``. A
request for a shard this instance does not have open answers 421 Misdirected
Request, with a hint to ask the agent's ``/lookup?key=K``.

Storage and the fencing rule
----------------------------
Each shard lives in ONE S3 object, ``<prefix>/data/<shard>.json`` =
``{"generation": G, "data": {key: value, ...}}``, and every write to it is
conditional, so that at most one writer is ever effective:

- open(G) reads the object (or creates it with ``If-None-Match: *``). If the
  stored generation is above G, a newer owner exists; if it is G and this
  process does not hold G open, another owner opened G (the lease store lost
  its record and a claim started over). Either way the open is refused: 409
  ``{"error": "outdated_generation", "highest_generation": N}``, and the agent
  claims above N. Otherwise it writes the object back with generation G and
  ``If-Match: <the etag read>``. That write is the fence: from then on, any
  older owner's next conditional write fails. The etag and the data stay in
  memory.
- Every write is a read-modify-write. Read the object: a stored generation
  above ours means a newer owner opened the shard, so the write is refused
  with 409 "fenced by generation N" and the shard is closed here. Otherwise
  write the modified object with ``If-Match: <the etag read>``. If S3 refuses
  that condition (412, or 409 for a concurrent write), the object is read
  again to decide: a newer generation fences the shard the same way. A write
  is never retried blindly. (A stored object still at our generation holding
  exactly what we wrote means our own write landed and its answer was lost,
  for example under an SDK retry: only the holder of a generation writes that
  generation, so it is acknowledged.)
- Reads check the stored object the same way, so a stale owner cannot serve
  data that a newer owner may already have changed.
- close: nothing is buffered (each write is in S3 before it is acknowledged),
  so a close waits for the shard's write in flight, if any, and forgets it.

A node paused beyond its lease TTL (GC pause, SIGSTOP) may still have its app
believe it owns shards; the generation is what stops it: its next write is
refused by S3 because the new owner's open changed the object's etag.

The open and close endpoints are accepted only from loopback (the agent is a
sidecar in the same pod) unless ``--allow-remote-control`` is given: anyone
who can call open can fence the real owner.

Credentials and the default endpoint come from the usual AWS settings
(``AWS_ACCESS_KEY_ID``, ``AWS_SECRET_ACCESS_KEY``, ``AWS_REGION``,
``AWS_ENDPOINT_URL_S3``, ...); the store URL takes the same form as
shardlease's S3 lease store: ``s3://BUCKET[/PREFIX][?endpoint=...&region=...&path_style=...]``.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import ipaddress
import json
import logging
import math
import os
import random
import signal
import sys
import time
from collections import Counter, deque
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, NoReturn
from urllib.parse import quote

from aiobotocore.session import get_session  # type: ignore[import-untyped]
from aiohttp import web
from botocore.config import Config  # type: ignore[import-untyped]
from botocore.exceptions import (  # type: ignore[import-untyped]
    BotoCoreError,
    ClientError,
    ConnectTimeoutError,
    EndpointConnectionError,
    NoCredentialsError,
)

from shardlease.errors import ConfigError
from shardlease.routing import shard_for_key
from shardlease.stores.s3 import clean_etag, read_at_most

log = logging.getLogger("shardlease_examples.shardapp")

#: Largest value a PUT may carry, in bytes.
MAX_VALUE_BYTES = 64 * 1024
#: Longest key, in characters.
MAX_KEY_CHARS = 512
#: Largest shard object this app writes or reads.
MAX_OBJECT_BYTES = 8 * 1024 * 1024
#: Largest open/close request body.
MAX_CONTROL_BYTES = 4096
#: How many times an open re-reads after losing a race on the object (an old
#: owner still writing); then the open fails and the host decides again.
OPEN_ATTEMPTS = 10
#: Largest `/lease` body, and most entries in it.
MAX_LEASE_BYTES = 256 * 1024
#: Events kept for GET /history.
HISTORY = 10_000


# -- errors --------------------------------------------------------------------------------


class AppError(Exception):
    """An error with the HTTP answer it deserves."""

    status = 500
    code = "error"

    def __init__(self, message: str, **details: Any) -> None:
        super().__init__(message)
        self.details = details

    def body(self) -> dict[str, Any]:
        return {"error": self.code, "message": str(self), **self.details}


class BadRequest(AppError):
    status = 400
    code = "bad_request"


class Forbidden(AppError):
    status = 403
    code = "forbidden"


class TooLarge(AppError):
    status = 413
    code = "too_large"


class Misdirected(AppError):
    """The shard is not open on this instance."""

    status = 421
    code = "misdirected"


class NewerOwner(AppError):
    """open(G) found G or a newer generation that another owner opened: the
    agent frees the lease at `highest_generation` and claims above it (the
    host protocol's "outdated generation" answer)."""

    status = 409
    code = "outdated_generation"

    def __init__(self, message: str, *, shard: int, generation: int, highest: int) -> None:
        super().__init__(message, shard=shard, generation=generation,
                         highest_generation=highest, stored_generation=highest)


class Fenced(AppError):
    """A write or read found the shard taken by a newer generation."""

    status = 409
    code = "fenced"


class StorageError(AppError):
    """S3 failed. `applied` says whether a write may have landed: "no" or "unknown"."""

    status = 503
    code = "storage"

    def __init__(self, message: str, *, applied: str = "no", **details: Any) -> None:
        super().__init__(message, applied=applied, **details)
        self.applied = applied


class PreconditionFailed(StorageError):
    """S3 refused a conditional write (412, or 409 ConditionalRequestConflict)."""


class _Missing(StorageError):
    """There is no such object (turned into None by the reader)."""


class CorruptObject(StorageError):
    status = 502
    code = "corrupt_object"


# -- the shard objects in S3 ---------------------------------------------------------------------


@dataclass(frozen=True)
class Snapshot:
    """A shard object as read (or written): its etag, generation and data."""

    etag: str
    generation: int
    data: dict[str, str]


def encode_object(generation: int, data: Mapping[str, str]) -> bytes:
    return json.dumps({"generation": generation, "data": dict(data)},
                      separators=(",", ":"), sort_keys=True).encode()


def decode_object(raw: bytes, where: str) -> tuple[int, dict[str, str]]:
    """(generation, data) of a shard object; `CorruptObject` if it is not one."""
    try:
        doc = json.loads(raw)
    except (UnicodeDecodeError, ValueError) as e:
        raise CorruptObject(f"{where} is not JSON: {e}") from None
    if not isinstance(doc, dict) or set(doc) != {"generation", "data"}:
        raise CorruptObject(f"{where} must be an object with exactly the fields "
                            "'generation' and 'data'")
    generation, data = doc["generation"], doc["data"]
    if not isinstance(generation, int) or isinstance(generation, bool) or generation < 0:
        raise CorruptObject(f"{where}: generation must be an integer >= 0, not {generation!r}")
    if not isinstance(data, dict) or not all(
            isinstance(k, str) and isinstance(v, str) for k, v in data.items()):
        raise CorruptObject(f"{where}: data must map strings to strings")
    return generation, data


class ShardObjects:
    """The shard objects of one app under ``s3://bucket/prefix/data/``.

    One aiobotocore client, made on first use in the running event loop and
    closed by `aclose()`. Every failure is an `AppError`.
    """

    def __init__(self, bucket: str, prefix: str = "", *, endpoint_url: str | None = None,
                 region: str | None = None, path_style: bool | None = None,
                 connect_timeout: float = 3.0, read_timeout: float = 10.0,
                 max_attempts: int = 3) -> None:
        self.bucket = bucket
        self.prefix = prefix.strip("/")
        self.endpoint_url = endpoint_url
        self.region = region
        self._config = Config(
            connect_timeout=connect_timeout,
            read_timeout=read_timeout,
            retries={"mode": "standard", "total_max_attempts": max_attempts},
            s3={"addressing_style": {None: "auto", True: "path", False: "virtual"}[path_style]},
            request_checksum_calculation="when_required",
            response_checksum_validation="when_required",
        )
        self._client: Any = None
        self._stack: contextlib.AsyncExitStack | None = None
        self._lock = asyncio.Lock()

    @classmethod
    def from_url(cls, url: str) -> ShardObjects:
        """``s3://BUCKET[/PREFIX][?endpoint=...&region=...&path_style=...]``, parsed
        and checked exactly like shardlease's S3 lease store; `ConfigError` if bad."""
        from shardlease.stores.s3 import S3Store

        parsed = S3Store.from_url(url)  # validates; makes no client and no request
        return cls(parsed.bucket, parsed.prefix, endpoint_url=parsed.endpoint_url,
                   region=parsed.region, path_style=parsed.path_style)

    def key(self, shard: int) -> str:
        return f"{self.prefix}/data/{shard}.json" if self.prefix else f"data/{shard}.json"

    def describe(self) -> str:
        where = self.endpoint_url or os.environ.get("AWS_ENDPOINT_URL_S3") \
            or os.environ.get("AWS_ENDPOINT_URL") or "AWS S3"
        return f"s3://{self.bucket}/{self.key(0).rsplit('/', 1)[0]}/ at {where}"

    async def _s3(self) -> Any:
        if self._client is None:
            async with self._lock:
                if self._client is None:
                    session = get_session()
                    region = (self.region or os.environ.get("AWS_REGION")
                              or os.environ.get("AWS_DEFAULT_REGION")
                              or session.get_config_variable("region") or "us-east-1")
                    stack = contextlib.AsyncExitStack()
                    self._client = await stack.enter_async_context(session.create_client(
                        "s3", region_name=region, endpoint_url=self.endpoint_url,
                        config=self._config))
                    self._stack = stack
        return self._client

    async def aclose(self) -> None:
        stack, self._stack, self._client = self._stack, None, None
        if stack is not None:
            await stack.aclose()

    async def _call(self, what: str, shard: int, call: Callable[[Any], Awaitable[Any]], *,
                    writing: bool) -> Any:
        """One S3 request; failures become `PreconditionFailed` or `StorageError`.
        A write that failed after it was sent may have landed: ``applied="unknown"``."""
        where = f"{what} s3://{self.bucket}/{self.key(shard)}"
        try:
            return await call(await self._s3())
        except ClientError as e:
            error = e.response.get("Error", {})
            status = int(e.response.get("ResponseMetadata", {}).get("HTTPStatusCode", 0) or 0)
            code = str(error.get("Code") or status)
            if writing and (status == 412 or code in (
                    "PreconditionFailed", "ConditionalRequestConflict")):
                raise PreconditionFailed(f"{where}: S3 refused the condition ({code})",
                                         s3_code=code) from None
            if code in ("NoSuchKey", "404") and not writing:
                raise _Missing(where) from None
            if writing and code in ("NoSuchKey", "404"):
                # An If-Match update of an object that is gone: AWS answers 404.
                raise PreconditionFailed(f"{where}: the object is gone ({code})",
                                         s3_code=code) from None
            hint = ""
            if code == "NoSuchBucket":
                hint = ": create the bucket first"
            elif code in ("AccessDenied", "InvalidAccessKeyId", "SignatureDoesNotMatch"):
                hint = ": check the credentials and the bucket policy"
            applied = "unknown" if writing and status >= 500 else "no"
            raise StorageError(f"{where} failed: {code} (HTTP {status}) "
                               f"{error.get('Message', '')}{hint}".rstrip(),
                               applied=applied, s3_code=code) from None
        except NoCredentialsError:
            raise StorageError(f"{where}: no AWS credentials: set AWS_ACCESS_KEY_ID and "
                               "AWS_SECRET_ACCESS_KEY (or AWS_PROFILE, or a role)") from None
        except (EndpointConnectionError, ConnectTimeoutError) as e:
            raise StorageError(f"{where}: cannot reach S3: {e}") from None
        except (BotoCoreError, OSError, TimeoutError) as e:
            raise StorageError(f"{where} failed: {type(e).__name__}: {e}",
                               applied="unknown" if writing else "no") from None

    async def read(self, shard: int) -> Snapshot | None:
        """The shard's object, or None if there is none."""

        async def get(s3: Any) -> Snapshot:
            answer = await s3.get_object(Bucket=self.bucket, Key=self.key(shard),
                                         Range=f"bytes=0-{MAX_OBJECT_BYTES}")
            async with answer["Body"] as body:
                raw = await read_at_most(body, MAX_OBJECT_BYTES + 1)
            where = f"s3://{self.bucket}/{self.key(shard)}"
            if len(raw) > MAX_OBJECT_BYTES:
                raise CorruptObject(f"{where} is larger than {MAX_OBJECT_BYTES} bytes")
            generation, data = decode_object(raw, where)
            return Snapshot(clean_etag(answer.get("ETag", "")), generation, data)

        try:
            result: Snapshot = await self._call("GetObject", shard, get, writing=False)
        except _Missing:
            return None
        return result

    async def create(self, shard: int, generation: int, data: Mapping[str, str]) -> str:
        """Create the object (``If-None-Match: *``); its etag."""
        body = encode_object(generation, data)
        answer = await self._call("PutObject (create)", shard, lambda s3: s3.put_object(
            Bucket=self.bucket, Key=self.key(shard), Body=body, IfNoneMatch="*",
            ContentType="application/json"), writing=True)
        return clean_etag(answer.get("ETag", ""))

    async def replace(self, shard: int, generation: int, data: Mapping[str, str],
                      etag: str) -> str:
        """Write the object over the version `etag` (``If-Match``); the new etag."""
        body = encode_object(generation, data)
        answer = await self._call("PutObject (update)", shard, lambda s3: s3.put_object(
            Bucket=self.bucket, Key=self.key(shard), Body=body, IfMatch=f'"{etag}"',
            ContentType="application/json"), writing=True)
        return clean_etag(answer.get("ETag", ""))

    async def check(self) -> None:
        """Is the bucket reachable? Raises `StorageError` with the reason."""
        await self._call("HeadBucket", 0, lambda s3: s3.head_bucket(Bucket=self.bucket),
                         writing=False)


# -- the application ----------------------------------------------------------------------------


@dataclass
class OpenShard:
    """A shard open here: the object at `etag` is exactly (generation, data)."""

    shard: int
    generation: int
    etag: str
    data: dict[str, str]
    #: Dropped by an abort: a write in flight must not land any more.
    aborted: bool = False


@dataclass
class ShardApp:
    objects: ShardObjects
    shards: int
    #: The agent's base URL, for the hint of a 421 (``<agent>/lookup?key=K``).
    agent_url: str | None = None
    allow_remote_control: bool = False
    open_shards: dict[int, OpenShard] = field(default_factory=dict)
    #: shard -> the generation that fenced it here (cleared by open and close).
    fenced: dict[int, int | None] = field(default_factory=dict)
    #: shard -> the highest generation closed here: an open at or below it is late.
    closed_at: dict[int, int] = field(default_factory=dict)
    stats: Counter[str] = field(default_factory=Counter)
    #: Keep the agent's deadlines (False: --ignore-validity).
    enforce_validity: bool = True
    #: shard -> (generation, deadline on time.monotonic()), from opens and /lease.
    valid_until: dict[int, tuple[int, float]] = field(default_factory=dict)
    history: deque[dict[str, Any]] = field(default_factory=lambda: deque(maxlen=HISTORY))
    _locks: dict[int, asyncio.Lock] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.shards < 1:
            raise ConfigError("--shards must be at least 1")

    def _lock(self, shard: int) -> asyncio.Lock:
        return self._locks.setdefault(shard, asyncio.Lock())

    def _record(self, event: str, shard: int, generation: int | None, **more: Any) -> None:
        self.history.append({"at": time.monotonic(), "event": event, "shard": shard,
                             "generation": generation, **more})

    # -- validity ---------------------------------------------------------------------------

    def extend(self, shard: int, generation: int, until: float) -> bool:
        """The agent says `shard` at `generation` may act until `until`
        (monotonic). Counts for the generation open here, or one being opened
        (the open may still be on its way); ignored for an older one. Whether
        it was taken."""
        if generation <= self.closed_at.get(shard, -1):
            return False
        held = self.open_shards.get(shard)
        if held is not None and held.generation > generation:
            return False
        known = self.valid_until.get(shard)
        if known is not None and known[0] > generation:
            return False
        if known is None or known[0] < generation:
            self.valid_until[shard] = (generation, until)
        else:
            self.valid_until[shard] = (generation, max(known[1], until))
        return True

    def acting_until(self, state: OpenShard) -> float:
        """Until when this instance may act on an open shard (monotonic)."""
        if not self.enforce_validity:
            return math.inf
        known = self.valid_until.get(state.shard)
        if known is None or known[0] != state.generation:
            return -math.inf  # (an open always records its own)
        return known[1]

    # -- the host protocol ------------------------------------------------------------------

    async def open(self, shard: int, generation: int,
                   validity: float | None = None) -> OpenShard:
        """Open `shard` at `generation`: fence every older owner, or refuse.
        `validity`: seconds from now it may act without hearing more (None:
        no deadline, an agent that sends none)."""
        self._check_shard(shard)
        until = math.inf if validity is None else time.monotonic() + validity
        async with self._lock(shard):
            held = self.open_shards.get(shard)
            if held is not None and held.generation > generation:
                # A late or stray open: never let it close the newer one held here.
                self.stats["opens_refused"] += 1
                raise NewerOwner(f"shard {shard} is open here at generation {held.generation}, "
                                 f"above {generation}", shard=shard, generation=generation,
                                 highest=held.generation)
            if generation <= self.closed_at.get(shard, -1):
                # Its close came first (the agent gave up on it, or it was slow
                # on the way): opening it now would hold a shard with no lease.
                self.stats["opens_refused"] += 1
                raise NewerOwner(f"shard {shard}: generation {generation} was already closed "
                                 f"here", shard=shard, generation=generation,
                                 highest=self.closed_at[shard])
            self.open_shards.pop(shard, None)  # a failed open leaves the shard closed
            # The stored generation may equal ours only if this process holds
            # it open, or this call's own write landed unanswered: otherwise
            # another owner opened it (the lease store lost its record and a
            # claim started again), and sharing it would let both write.
            ours = held is not None and held.generation == generation
            for _ in range(OPEN_ATTEMPTS):
                snap = await self.objects.read(shard)
                try:
                    if snap is None:
                        data: dict[str, str] = {}
                        etag = await self.objects.create(shard, generation, data)
                    elif snap.generation > generation or (snap.generation == generation
                                                          and not ours):
                        self.stats["opens_refused"] += 1
                        raise NewerOwner(
                            f"shard {shard}: the store holds generation {snap.generation}, "
                            f"opened by another owner: claim above it",
                            shard=shard, generation=generation, highest=snap.generation)
                    else:
                        data = dict(snap.data)
                        etag = await self.objects.replace(shard, generation, data, snap.etag)
                except PreconditionFailed:
                    # Lost a race on the object (or our write landed and its
                    # answer was lost): read it again and decide again.
                    ours = True
                    self.stats["open_races"] += 1
                    await asyncio.sleep(random.uniform(0, 0.01))
                    continue
                if not self.extend(shard, generation, until):
                    # Closed (or superseded) while this open was on its way.
                    raise NewerOwner(f"shard {shard}: generation {generation} was closed "
                                     "during its open", shard=shard, generation=generation,
                                     highest=max(generation, self.closed_at.get(shard, 0)))
                state = self.open_shards[shard] = OpenShard(shard, generation, etag, data)
                self.fenced.pop(shard, None)
                self.stats["opens"] += 1
                self._record("open", shard, generation, until=self.valid_until[shard][1])
                log.info("opened shard %d at generation %d (%d keys)", shard, generation,
                         len(data))
                return state
            raise StorageError(f"shard {shard}: the object kept changing during the open "
                               f"({OPEN_ATTEMPTS} attempts); the shard stays closed")

    async def close(self, shard: int, generation: int | None = None) -> bool:
        """Close `shard` at `generation` (after its write in flight); whether it
        was open. A close older than the generation open here is ignored."""
        self._check_shard(shard)
        async with self._lock(shard):
            held = self.open_shards.get(shard)
            if generation is not None and held is not None and held.generation > generation:
                self.stats["closes_ignored"] += 1
                log.info("ignored a close of shard %d at generation %d: %d is open here",
                         shard, generation, held.generation)
                return False
            closing = generation if generation is not None else \
                (held.generation if held is not None else None)
            if closing is not None:
                self.closed_at[shard] = max(closing, self.closed_at.get(shard, -1))
            was_open = self.open_shards.pop(shard, None) is not None
            self.fenced.pop(shard, None)
            self._record("close", shard, closing)
        self.stats["closes"] += 1
        log.info("closed shard %d%s", shard, "" if was_open else " (was not open)")
        return was_open

    def abort(self, shard: int, generation: int) -> bool:
        """The agent gave up closing `shard` at `generation`: drop it now,
        without waiting for its write in flight (which will not land). An
        abort of an older generation than the one open here is ignored."""
        self._check_shard(shard)
        held = self.open_shards.get(shard)
        if held is not None and held.generation > generation:
            self.stats["aborts_ignored"] += 1
            return False
        self.closed_at[shard] = max(generation, self.closed_at.get(shard, -1))
        if held is not None:
            held.aborted = True
            del self.open_shards[shard]
        self.stats["aborts"] += 1
        self._record("abort", shard, generation)
        log.warning("aborted shard %d at generation %d%s", shard, generation,
                    "" if held is not None else " (was not open)")
        return held is not None

    # -- the key-value API -------------------------------------------------------------------

    async def put(self, key: str, value: str) -> OpenShard:
        """Write key=value (read, modify, conditional write); the shard's state after."""
        shard = shard_for_key(key, self.shards)
        async with self._lock(shard):
            state = self._open_state(shard, key)
            await self._reread(state)
            self._check_acting(state, key)  # the read took time
            data = dict(state.data)
            data[key] = value
            if len(encode_object(state.generation, data)) > MAX_OBJECT_BYTES:
                raise TooLarge(f"shard {shard} would exceed {MAX_OBJECT_BYTES} bytes")
            try:
                etag = await self.objects.replace(shard, state.generation, data, state.etag)
            except PreconditionFailed:
                return self._accepted(await self._after_refusal(state, data))
            state.etag, state.data = etag, data
            return self._accepted(state)

    async def get(self, key: str) -> tuple[OpenShard, str | None]:
        """The key's value, read from the stored object (fenced like a write)."""
        shard = shard_for_key(key, self.shards)
        async with self._lock(shard):
            state = self._open_state(shard, key)
            await self._reread(state)
            return state, state.data.get(key)

    def _accepted(self, state: OpenShard) -> OpenShard:
        self.stats["writes_accepted"] += 1
        return state

    def _check_acting(self, state: OpenShard, key: str) -> None:
        if state.aborted or self.open_shards.get(state.shard) is not state:
            raise Misdirected(f"shard {state.shard} was closed here during the request",
                              shard=state.shard, key=key)
        if time.monotonic() >= self.acting_until(state):
            self.stats["expired"] += 1
            raise Misdirected(
                f"shard {state.shard}: generation {state.generation} is past its deadline "
                "here (the agent has not renewed it in time); served as closed",
                shard=state.shard, key=key, generation=state.generation, expired=True)

    def _open_state(self, shard: int, key: str) -> OpenShard:
        state = self.open_shards.get(shard)
        if state is not None:
            self._check_acting(state, key)
        if state is None:
            self.stats["misdirected"] += 1
            details: dict[str, Any] = {"shard": shard, "key": key}
            hint = "ask the shardlease agent which pod owns it: GET /lookup?key=K on port 8470"
            if self.agent_url:
                details["lookup"] = f"{self.agent_url}/lookup?key={quote(key, safe='')}"
                hint = f"ask the shardlease agent which pod owns it: GET {details['lookup']}"
            if shard in self.fenced:
                details["fenced_by"] = self.fenced[shard]
            raise Misdirected(f"shard {shard} is not open on this instance; {hint}", **details)
        return state

    async def _reread(self, state: OpenShard) -> None:
        """The read of a read-modify-write: a stored generation other than ours
        fences the shard here. At our generation the object is ours (only the
        holder of a generation writes it), so it is adopted as the base: that
        also settles a previous write whose outcome was unknown."""
        snap = await self.objects.read(state.shard)
        if snap is None or snap.generation != state.generation:
            self._fence(state, snap)
        state.etag, state.data = snap.etag, dict(snap.data)

    async def _after_refusal(self, state: OpenShard, wanted: dict[str, str]) -> OpenShard:
        """S3 refused our conditional write: read the object and decide."""
        try:
            snap = await self.objects.read(state.shard)
        except StorageError as e:
            # The 412 may answer an SDK retry of an attempt that landed.
            raise StorageError(f"shard {state.shard}: a write was refused by S3 and the "
                               f"object could not be read again: {e}",
                               applied="unknown") from None
        if snap is None or snap.generation != state.generation:
            self._fence(state, snap)
        if snap.data == wanted:
            # Still our generation (only we write it) and exactly what we wrote:
            # our own write landed and its answer was lost.
            state.etag, state.data = snap.etag, dict(snap.data)
            return state
        if snap.etag == state.etag:
            # Refused as concurrent (409), and nothing changed: not applied.
            raise StorageError(f"shard {state.shard}: S3 refused the write as concurrent; "
                               "not applied, safe to retry", applied="no", shard=state.shard)
        # Our generation, but not what we hold nor what we wrote: do not guess.
        self._fence(state, snap)
        raise AssertionError("unreachable")  # pragma: no cover

    def _fence(self, state: OpenShard, snap: Snapshot | None) -> NoReturn:
        """Close the shard here and refuse the request that found it taken."""
        shard = state.shard
        self.open_shards.pop(shard, None)
        by = snap.generation if snap is not None else None
        self.fenced[shard] = by
        self.stats["fences"] += 1
        self._record("fence", shard, state.generation, by=by)
        if snap is None:
            why = "its object is gone from the store"
        elif snap.generation > state.generation:
            why = f"fenced by generation {snap.generation}"
        else:
            why = (f"its object changed under generation {state.generation} "
                   f"(stored generation {snap.generation})")
        log.warning("shard %d (generation %d): %s; closed here", shard, state.generation, why)
        raise Fenced(f"shard {shard}: {why}; this instance closed it, the write was refused",
                     shard=shard, generation=state.generation, fenced_by=by)

    def _check_shard(self, shard: int) -> None:
        if not 0 <= shard < self.shards:
            raise BadRequest(f"shard {shard} is out of range 0..{self.shards - 1}")

    def describe(self) -> dict[str, Any]:
        return {
            "shards": self.shards,
            "open": {str(s): {"generation": st.generation, "keys": len(st.data)}
                     for s, st in sorted(self.open_shards.items())},
            "fenced": {str(s): by for s, by in sorted(self.fenced.items())},
            "stats": dict(self.stats),
        }

    # -- HTTP -------------------------------------------------------------------------------------

    def web_app(self) -> web.Application:
        app = web.Application(client_max_size=MAX_VALUE_BYTES,
                              middlewares=[_errors_middleware])
        app.add_routes([
            web.post("/shards/{shard}/open", self._http_open),
            web.post("/shards/{shard}/close", self._http_close),
            web.post("/shards/{shard}/abort", self._http_abort),
            web.post("/lease", self._http_lease),
            web.get("/history", self._http_history),
            web.get("/shards", self._http_shards),
            web.put("/kv/{key:.+}", self._http_put),
            web.get("/kv/{key:.+}", self._http_get),
            web.get("/healthz", self._http_healthz),
        ])
        app.cleanup_ctx.append(self._lifetime)
        return app

    async def _lifetime(self, _: web.Application) -> AsyncIterator[None]:
        probe = asyncio.create_task(self._probe())
        yield
        probe.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await probe
        await self.objects.aclose()

    async def _probe(self) -> None:
        """Say early (in the log) if the bucket cannot be used; serve anyway."""
        try:
            await self.objects.check()
        except AppError as e:
            log.warning("S3 is not usable yet (opens fail until it is): %s", e)
        else:
            log.info("S3 bucket %s is reachable", self.objects.bucket)

    def _check_control(self, request: web.Request) -> None:
        if not self.allow_remote_control and not is_loopback(request.remote):
            raise Forbidden("open and close are accepted from loopback only (the agent is "
                            "a sidecar); start with --allow-remote-control to change that")

    async def _json_body(self, request: web.Request, limit: int) -> dict[str, Any]:
        if request.content_length is not None and request.content_length > limit:
            raise TooLarge(f"the body is larger than {limit} bytes")
        raw = await request.content.read(limit + 1)
        if len(raw) > limit:
            raise TooLarge(f"the body is larger than {limit} bytes")
        try:
            body = json.loads(raw or b"{}")
        except ValueError as e:
            raise BadRequest(f"the body is not JSON: {e}") from None
        if not isinstance(body, dict):
            raise BadRequest("the body must be a JSON object")
        return body

    async def _control(self, request: web.Request) -> tuple[int, dict[str, Any]]:
        self._check_control(request)
        try:
            shard = int(request.match_info["shard"])
        except ValueError:
            raise BadRequest(f"shard {request.match_info['shard']!r} is not a number") from None
        self._check_shard(shard)
        body = await self._json_body(request, MAX_CONTROL_BYTES)
        if "shard" in body and body["shard"] != shard:
            raise BadRequest(f"the body names shard {body['shard']!r}, the path {shard}")
        return shard, body

    async def _http_open(self, request: web.Request) -> web.Response:
        received = time.monotonic()
        shard, body = await self._control(request)
        generation = _generation(body.get("generation"))
        validity = None
        if body.get("validity_ms") is not None:
            validity = _validity_ms(body["validity_ms"]) / 1000 - (time.monotonic() - received)
        state = await self.open(shard, generation, validity)
        return web.json_response({"shard": shard, "generation": state.generation,
                                  "keys": len(state.data)})

    async def _http_close(self, request: web.Request) -> web.Response:
        shard, body = await self._control(request)
        generation = body.get("generation")
        if generation is not None and (not isinstance(generation, int) or
                                       isinstance(generation, bool) or generation < 0):
            raise BadRequest(f"generation must be an integer >= 0, not {generation!r}")
        was_open = await self.close(shard, generation)
        return web.json_response({"shard": shard, "closed": True, "was_open": was_open})

    async def _http_abort(self, request: web.Request) -> web.Response:
        shard, body = await self._control(request)
        was_open = self.abort(shard, _generation(body.get("generation")))
        return web.json_response({"shard": shard, "aborted": True, "was_open": was_open})

    async def _http_lease(self, request: web.Request) -> web.Response:
        received = time.monotonic()
        self._check_control(request)
        body = await self._json_body(request, MAX_LEASE_BYTES)
        entries = body.get("leases")
        if not isinstance(entries, list):
            raise BadRequest("the body must be {\"leases\": [{\"shard\", \"generation\", "
                             "\"validity_ms\"}, ...]}")
        parsed = []
        for entry in entries:
            if not isinstance(entry, dict) or not isinstance(entry.get("shard"), int) \
                    or isinstance(entry["shard"], bool):
                raise BadRequest(f"a lease entry needs an integer shard: {entry!r:.100}")
            self._check_shard(entry["shard"])
            parsed.append((entry["shard"], _generation(entry.get("generation")),
                           _validity_ms(entry.get("validity_ms"))))
        taken = []
        for shard, generation, ms in parsed:
            until = received + ms / 1000
            if self.extend(shard, generation, until):
                taken.append(shard)
                self._record("lease", shard, generation, until=self.valid_until[shard][1])
        self.stats["lease_calls"] += 1
        return web.json_response({"extended": taken,
                                  "ignored": sorted({s for s, _, _ in parsed} - set(taken))})

    async def _http_history(self, _: web.Request) -> web.Response:
        return web.json_response({"enforced": self.enforce_validity, "now": time.monotonic(),
                                  "events": list(self.history)})

    async def _http_shards(self, _: web.Request) -> web.Response:
        return web.json_response(self.describe())

    async def _http_put(self, request: web.Request) -> web.Response:
        key = _key(request)
        if request.content_length is not None and request.content_length > MAX_VALUE_BYTES:
            raise TooLarge(f"a value is at most {MAX_VALUE_BYTES} bytes")
        try:
            raw = await request.read()
        except web.HTTPRequestEntityTooLarge:
            raise TooLarge(f"a value is at most {MAX_VALUE_BYTES} bytes") from None
        if len(raw) > MAX_VALUE_BYTES:
            raise TooLarge(f"a value is at most {MAX_VALUE_BYTES} bytes")
        try:
            value = raw.decode("utf-8")
        except UnicodeDecodeError:
            raise BadRequest("the value must be UTF-8 text") from None
        state = await self.put(key, value)
        return web.json_response({"key": key, "shard": state.shard,
                                  "generation": state.generation})

    async def _http_get(self, request: web.Request) -> web.Response:
        key = _key(request)
        state, value = await self.get(key)
        if value is None:
            return web.json_response({"error": "not_found", "key": key, "shard": state.shard,
                                      "message": f"no value for {key!r}"}, status=404)
        return web.json_response({"key": key, "value": value, "shard": state.shard,
                                  "generation": state.generation})

    async def _http_healthz(self, _: web.Request) -> web.Response:
        return web.Response(text="ok\n")


def _generation(value: Any) -> int:
    if not isinstance(value, int) or isinstance(value, bool) or value < 0:
        raise BadRequest(f"generation must be an integer >= 0, not {value!r:.50}")
    return value


def _validity_ms(value: Any) -> int:
    if not isinstance(value, int) or isinstance(value, bool) or value < 0:
        raise BadRequest(f"validity_ms must be an integer >= 0, not {value!r:.50}")
    return value


def _key(request: web.Request) -> str:
    key = request.match_info["key"]
    if not key or len(key) > MAX_KEY_CHARS:
        raise BadRequest(f"a key has 1 to {MAX_KEY_CHARS} characters")
    return key


def is_loopback(remote: str | None) -> bool:
    if not remote:
        return False
    try:
        address = ipaddress.ip_address(remote.split("%", 1)[0])
    except ValueError:
        return False
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        address = address.ipv4_mapped
    return address.is_loopback


@web.middleware
async def _errors_middleware(
        request: web.Request,
        handler: Callable[[web.Request], Awaitable[web.StreamResponse]]) -> web.StreamResponse:
    try:
        return await handler(request)
    except AppError as e:
        if e.status >= 500:
            log.warning("%s %s: %s", request.method, request.path, e)
        return web.json_response(e.body(), status=e.status)
    except web.HTTPRequestEntityTooLarge:
        return web.json_response(TooLarge("the request body is too large").body(), status=413)


# -- command line ----------------------------------------------------------------------------------


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m shardlease_examples.shardapp",
        description="Example sharded key-value app, fenced by the shardlease generation.")
    parser.add_argument("--port", type=int, default=8080, help="HTTP port (8080)")
    parser.add_argument("--bind", default="0.0.0.0", help="address to listen on (0.0.0.0)")
    parser.add_argument("--store", default=os.environ.get("SHARDAPP_STORE"),
                        help="s3://BUCKET[/PREFIX][?endpoint=URL&region=R&path_style=true] "
                             "(default $SHARDAPP_STORE)")
    parser.add_argument("--shards", type=int,
                        default=int(os.environ.get("SHARDAPP_SHARDS", "0") or 0),
                        help="number of shards, as the StatefulSet's annotation "
                             "(default $SHARDAPP_SHARDS)")
    parser.add_argument("--agent", default=None, metavar="URL",
                        help="the shardlease agent, for the hint of a 421 "
                             "(e.g. http://127.0.0.1:8470)")
    parser.add_argument("--allow-remote-control", action="store_true",
                        help="accept open/close from other hosts than loopback")
    parser.add_argument("--ignore-validity", action="store_true",
                        help="do not keep the agent's deadlines (act on a shard until told "
                             "to close it or fenced by the storage): for comparison only")
    parser.add_argument("--log-level", default="info",
                        choices=("debug", "info", "warning", "error"))
    parser.add_argument("--parent-pid", type=int, help=argparse.SUPPRESS)
    return parser.parse_args(argv)


async def _watch_parent(pid: int) -> None:
    while os.getppid() == pid:  # noqa: ASYNC110 - no event for a parent's exit
        await asyncio.sleep(0.5)
    log.warning("parent process %d exited: stopping", pid)
    os.kill(os.getpid(), signal.SIGTERM)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    logging.basicConfig(level=args.log_level.upper(),
                        format="%(asctime)s %(levelname)s shardapp %(message)s")
    for noisy in ("botocore", "aiobotocore", "aiohttp.access"):
        logging.getLogger(noisy).setLevel(logging.WARNING)
    if not args.store:
        print("shardapp: error: --store s3://BUCKET[/PREFIX] is required", file=sys.stderr)
        return 2
    try:
        objects = ShardObjects.from_url(args.store)
        app = ShardApp(objects, args.shards, agent_url=(args.agent or "").rstrip("/") or None,
                       allow_remote_control=args.allow_remote_control,
                       enforce_validity=not args.ignore_validity)
    except ConfigError as e:
        print(f"shardapp: error: {e}", file=sys.stderr)
        return 2
    if not 0 < args.port < 65536:
        print(f"shardapp: error: --port {args.port} is not a TCP port", file=sys.stderr)
        return 2
    web_app = app.web_app()
    if args.parent_pid:
        async def watcher(_: web.Application) -> AsyncIterator[None]:
            task = asyncio.create_task(_watch_parent(args.parent_pid))
            yield
            task.cancel()

        web_app.cleanup_ctx.append(watcher)
    log.info("serving %d shards on %s:%d, data in %s", args.shards, args.bind, args.port,
             objects.describe())
    try:
        web.run_app(web_app, host=args.bind, port=args.port, access_log=None, print=None,
                    shutdown_timeout=5)
    except OSError as e:
        print(f"shardapp: error: cannot serve on {args.bind}:{args.port}: {e.strerror or e}",
              file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
