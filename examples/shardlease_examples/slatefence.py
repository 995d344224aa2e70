"""Fencing for SlateDB shards placed by shardlease (docs/slatedb.md).

Every shard is a SlateDB database at ``<prefix>/shard-<n>`` in one bucket.
shardlease hands each open a generation (its fencing token); SlateDB fences
by the order of writer opens instead: a newer writer's open makes the older
writer's next durable write fail (``Error.Closed``, ``CloseReason.FENCED``).
The two orders differ when an open arrives late (the agent gave up on it,
the host contract warns of that), and a fenced writer that is idle keeps
serving its old state. What this module adds, and why each piece is needed:

- `GenerationGuard`: the highest generation opened for each shard, kept
  durably beside the database (``<prefix>/shard-<n>.generation``), only ever
  raised, and only with S3 conditional writes. An open at or below it is
  refused: generation order, not arrival order, decides who may write.
- `SlateShards.open`: claim the guard, open the writer (which fences every
  older writer), then read the guard again and close if a newer generation
  claimed it meanwhile: an open that passed the guard just before a newer
  one and reached SlateDB just after it would otherwise keep a writer that
  SlateDB ranks above the rightful owner.
- The reopen: the rightful owner, fenced by such a late open, finds the
  guard still at its own generation and opens its writer again (which
  fences the late one, and the late one closes itself anyway).
- Durable writes: `put` returns only after ``await_durable()``; SlateDB's
  ``put`` returns a handle even on a fenced writer.
- Bounded reads: `get` reads durable data only, and only while the shard's
  validity (``validity_ms`` of the open and of ``/lease``) runs: the agent
  closes the shard before its lease can expire, so no newer owner can have
  opened while it runs. A fenced writer's reads are no evidence of anything.
- Every value is stored with the generation that wrote it (`Stored`), so a
  history judge can tell which owner stored what.

`host_routes` serves the host protocol (docs/host-api.yaml) on top of it, so
an application adds only its own API: see `shardlease_examples.slatekv`.
"""

from __future__ import annotations

import asyncio
import contextlib
import ipaddress
import json
import logging
import math
import os
import socket
import struct
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

from aiobotocore.session import get_session  # type: ignore[import-untyped]
from aiohttp import web
from botocore.config import Config  # type: ignore[import-untyped]
from botocore.exceptions import BotoCoreError, ClientError  # type: ignore[import-untyped]
from slatedb.uniffi import (  # type: ignore[import-untyped]
    CloseReason,
    DbBuilder,
    DurabilityLevel,
    Error,
    ObjectStoreBuilder,
    ObjectStoreType,
    ReadOptions,
    Settings,
)

from shardlease.stores.s3 import S3Store, clean_etag, read_at_most

log = logging.getLogger("shardlease_examples.slatefence")

#: How often `GenerationGuard.claim` re-reads after losing a race on the object.
CLAIM_ATTEMPTS = 10
#: Largest guard object read, and largest control request body.
MAX_SMALL_BYTES = 4096
#: Largest `/lease` body.
MAX_LEASE_BYTES = 256 * 1024
#: How long a close waits for the writes in flight to become durable (each
#: then gets its answer) before it shuts SlateDB down under them.
DRAIN_SECONDS = 5.0
#: Reads see only what is durable in the object store: SlateDB's default
#: also returns writes still in memory, which a crash or a fence may lose
#: after a reader saw them.
DURABLE_ONLY = ReadOptions(durability_filter=DurabilityLevel.REMOTE, dirty=False,
                           cache_blocks=True)
_GENERATION = struct.Struct(">Q")


# -- errors, each with the HTTP answer it deserves -----------------------------------------------


class ShardError(Exception):
    status = 500
    code = "error"

    def __init__(self, message: str, **details: Any) -> None:
        super().__init__(message)
        self.details = details

    def body(self) -> dict[str, Any]:
        return {"error": self.code, "message": str(self), **self.details}


class BadRequest(ShardError):
    status, code = 400, "bad_request"


class Forbidden(ShardError):
    status, code = 403, "forbidden"


class NotOpen(ShardError):
    """The shard is not open here, or past its validity (served as closed)."""

    status, code = 421, "misdirected"


class Outdated(ShardError):
    """The host protocol's refusal of an open: a generation at or above it
    exists; the agent claims above `highest`."""

    status, code = 409, "outdated_generation"

    def __init__(self, message: str, *, shard: int, generation: int, highest: int) -> None:
        super().__init__(message, shard=shard, generation=generation, highest_generation=highest)


class Fenced(ShardError):
    """A newer generation owns the shard: it was closed here."""

    status, code = 409, "fenced"


class Unavailable(ShardError):
    """The storage failed. ``applied``: whether a write may have landed ("no"
    or "unknown"): a write that reached SlateDB and failed is never "no",
    since the object store may have taken it and lost only its answer."""

    status, code = 503, "unavailable"

    def __init__(self, message: str, *, applied: str = "no", **details: Any) -> None:
        super().__init__(message, applied=applied, **details)


# -- where the shards live ----------------------------------------------------------------------


@dataclass(frozen=True)
class Bucket:
    """``s3://BUCKET[/PREFIX][?endpoint=...&region=...&path_style=...]`` (the
    form of shardlease's S3 lease store); credentials from the AWS
    environment variables, never the URL."""

    bucket: str
    prefix: str = ""
    endpoint_url: str | None = None
    region: str | None = None
    path_style: bool | None = None

    @classmethod
    def from_url(cls, url: str) -> Bucket:
        parsed = S3Store.from_url(url)  # checks the URL; makes no client
        endpoint = (parsed.endpoint_url or os.environ.get("AWS_ENDPOINT_URL_S3")
                    or os.environ.get("AWS_ENDPOINT_URL"))
        region = (parsed.region or os.environ.get("AWS_REGION")
                  or os.environ.get("AWS_DEFAULT_REGION") or "us-east-1")
        return cls(parsed.bucket, parsed.prefix, endpoint, region, parsed.path_style)

    def _key(self, name: str) -> str:
        return f"{self.prefix}/{name}" if self.prefix else name

    def db_path(self, shard: int) -> str:
        return self._key(f"shard-{shard}")

    def guard_key(self, shard: int) -> str:
        # Beside the database, not inside it: SlateDB owns its directory.
        return self._key(f"shard-{shard}.generation")

    def object_store(self) -> Any:
        """SlateDB's object store for this bucket (one for every shard)."""
        builder = ObjectStoreBuilder.from_env(ObjectStoreType.S3)
        builder.with_config("bucket", self.bucket)
        builder.with_config("region", self.region or "us-east-1")
        if self.endpoint_url:
            builder.with_config("endpoint", self.endpoint_url)
            if self.endpoint_url.startswith("http://"):
                builder.with_config("allow_http", "true")
        if self.path_style is not None:
            builder.with_config("virtual_hosted_style_request",
                                "false" if self.path_style else "true")
        return builder.build()


# -- the generation guard ------------------------------------------------------------------------


@dataclass(frozen=True)
class GuardRecord:
    generation: int
    holder: str
    etag: str


class GenerationGuard:
    """The highest generation opened for each shard: one small JSON object
    per shard, ``{"generation": G, "holder": H}``, created with
    ``If-None-Match: *`` and replaced with ``If-Match: <etag read>``, so two
    opens racing cannot both raise it, and it never goes down. `holder`
    names the process that claimed it: a retry of that process's own open
    (whose answer was lost) is not taken for another owner's."""

    def __init__(self, bucket: Bucket, holder: str) -> None:
        self.bucket = bucket
        self.holder = holder
        self._config = Config(
            connect_timeout=3, read_timeout=10,
            retries={"mode": "standard", "total_max_attempts": 3},
            s3={"addressing_style": {None: "auto", True: "path", False: "virtual"}[
                bucket.path_style]},
            request_checksum_calculation="when_required",
            response_checksum_validation="when_required")
        self._client: Any = None
        self._stack = contextlib.AsyncExitStack()
        self._making = asyncio.Lock()

    async def _s3(self) -> Any:
        async with self._making:  # (two first calls at once would make two clients)
            if self._client is None:
                self._client = await self._stack.enter_async_context(
                    get_session().create_client(
                        "s3", region_name=self.bucket.region,
                        endpoint_url=self.bucket.endpoint_url, config=self._config))
        return self._client

    async def aclose(self) -> None:
        self._client = None
        await self._stack.aclose()

    async def read(self, shard: int) -> GuardRecord | None:
        key = self.bucket.guard_key(shard)
        try:
            answer = await (await self._s3()).get_object(Bucket=self.bucket.bucket, Key=key)
            async with answer["Body"] as body:
                raw = await read_at_most(body, MAX_SMALL_BYTES + 1)
        except ClientError as e:
            if e.response.get("Error", {}).get("Code") in ("NoSuchKey", "404"):
                return None
            raise Unavailable(f"reading s3://{self.bucket.bucket}/{key}: {e}") from None
        except (BotoCoreError, OSError, TimeoutError) as e:
            raise Unavailable(f"reading s3://{self.bucket.bucket}/{key}: {e!r}") from None
        try:
            doc = json.loads(raw)
            generation, holder = doc["generation"], doc["holder"]
            if not (isinstance(generation, int) and isinstance(holder, str)):
                raise TypeError
        except (ValueError, KeyError, TypeError):
            # Never guess a generation: a guard nobody can read stops every open.
            raise Unavailable(f"s3://{self.bucket.bucket}/{key} is not a generation guard; "
                              "every open of this shard is refused until it is repaired",
                              shard=shard) from None
        return GuardRecord(generation, holder, clean_etag(answer.get("ETag", "")))

    async def claim(self, shard: int, generation: int) -> None:
        """Raise the guard to `generation`, or `Outdated` if it is there or above
        (unless this holder claimed exactly it already: a retry)."""
        key = self.bucket.guard_key(shard)
        body = json.dumps({"generation": generation, "holder": self.holder}).encode()
        for _ in range(CLAIM_ATTEMPTS):
            seen = await self.read(shard)
            if seen is not None and seen.generation == generation and seen.holder == self.holder:
                return
            if seen is not None and seen.generation >= generation:
                raise Outdated(f"shard {shard}: generation {seen.generation} was opened "
                               f"(by {seen.holder}); {generation} may not open",
                               shard=shard, generation=generation, highest=seen.generation)
            condition = {"IfNoneMatch": "*"} if seen is None else {"IfMatch": f'"{seen.etag}"'}
            try:
                await (await self._s3()).put_object(Bucket=self.bucket.bucket, Key=key,
                                                    Body=body, **condition)
                return
            except ClientError as e:
                status = e.response.get("ResponseMetadata", {}).get("HTTPStatusCode")
                if status not in (409, 412):
                    raise Unavailable(f"writing s3://{self.bucket.bucket}/{key}: {e}",
                                      shard=shard) from None
                # Lost a race (or our own write landed and its answer was lost):
                # read again and decide again.
            except (BotoCoreError, OSError, TimeoutError) as e:
                raise Unavailable(f"writing s3://{self.bucket.bucket}/{key}: {e!r}",
                                  shard=shard) from None
        raise Unavailable(f"shard {shard}: the guard kept changing ({CLAIM_ATTEMPTS} reads)",
                          shard=shard)


# -- the shards open here -----------------------------------------------------------------------


@dataclass(frozen=True)
class Stored:
    """A value and the generation of the owner that stored it."""

    value: bytes
    generation: int


def encode(value: bytes, generation: int) -> bytes:
    return _GENERATION.pack(generation) + value


def decode(raw: bytes) -> Stored:
    (generation,) = _GENERATION.unpack_from(raw)
    return Stored(raw[_GENERATION.size:], generation)


@dataclass(eq=False)
class Shard:
    """A shard open here at `generation`, writing through `db`."""

    number: int
    generation: int
    db: Any
    #: Set by close, abort and a fence: no new operation may start.
    closed: bool = False
    #: Writes waiting for their durability, which a close lets finish.
    writing: int = 0
    drained: asyncio.Event = field(default_factory=asyncio.Event)


#: What an open/close record hook gets: event ("open", "close"), shard, generation.
Recorder = Callable[[str, int, int | None], None]


@dataclass
class SlateShards:
    """The shards of one process, each a SlateDB database under `bucket`."""

    bucket: Bucket
    shards: int
    settings: Any = None  # slatedb Settings; None: its defaults
    holder: str = field(
        default_factory=lambda: f"{socket.gethostname()}/{os.getpid()}/{uuid.uuid4().hex[:8]}")
    #: Told of every writer opened ("open", before SlateDB is touched) and
    #: shut down ("close", after): the double-open check of `shardlease verify`.
    record: Recorder | None = None
    #: Keep the agent's validity deadlines (False: rely on SlateDB alone, for comparison).
    enforce_validity: bool = True
    #: Shut a shard's writer down when its validity runs out unextended.
    close_on_expiry: bool = True
    open_shards: dict[int, Shard] = field(default_factory=dict)
    #: shard -> the highest generation closed (or aborted) here: later opens of it are late.
    closed_at: dict[int, int] = field(default_factory=dict)
    #: shard -> (generation, deadline on time.monotonic()), from opens and /lease.
    valid_until: dict[int, tuple[int, float]] = field(default_factory=dict)
    stats: dict[str, int] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.shards < 1:
            raise ValueError("shards must be at least 1")
        self.guard = GenerationGuard(self.bucket, self.holder)
        self._store = self.bucket.object_store()
        self._locks: dict[int, asyncio.Lock] = {}
        self._background: set[asyncio.Task[None]] = set()
        self._watchdogs: set[asyncio.Task[None]] = set()

    def _count(self, what: str) -> None:
        self.stats[what] = self.stats.get(what, 0) + 1

    def _lock(self, shard: int) -> asyncio.Lock:
        """Serializes a shard's opens, closes and reopens (not its reads and writes)."""
        return self._locks.setdefault(shard, asyncio.Lock())

    def check_shard(self, shard: int) -> None:
        if not 0 <= shard < self.shards:
            raise BadRequest(f"shard {shard} is out of range 0..{self.shards - 1}")

    # -- validity --------------------------------------------------------------------------

    def extend(self, shard: int, generation: int, until: float) -> bool:
        """The agent says `shard` at `generation` may act until `until` (monotonic).
        Counts for the generation open here or being opened (a /lease may
        overtake its open); ignored for an older one. Whether it was taken."""
        if generation <= self.closed_at.get(shard, -1):
            return False
        held = self.open_shards.get(shard)
        if held is not None and held.generation > generation:
            return False
        known = self.valid_until.get(shard)
        if known is not None and known[0] > generation:
            return False
        if known is not None and known[0] == generation:
            until = max(until, known[1])
        self.valid_until[shard] = (generation, until)
        return True

    def acting(self, shard: int) -> Shard:
        """The shard, if this process may act on it now: open, not closed, and
        inside its validity. Else `NotOpen` (the caller answers 421)."""
        self.check_shard(shard)
        state = self.open_shards.get(shard)
        if state is None or state.closed:
            raise NotOpen(f"shard {shard} is not open on this instance", shard=shard)
        known = self.valid_until.get(shard)
        if self.enforce_validity and (known is None or known[0] != state.generation
                                      or time.monotonic() >= known[1]):
            self._count("expired")
            raise NotOpen(f"shard {shard}: generation {state.generation} is past its validity "
                          "here (the agent did not renew it in time); served as closed",
                          shard=shard, generation=state.generation, expired=True)
        return state

    # -- the host protocol ---------------------------------------------------------------------

    async def open(self, shard: int, generation: int, validity: float | None = None) -> Shard:
        """Open `shard` at `generation`; `validity`: seconds from now it may act
        (None: no deadline). `Outdated` if a generation at or above it exists."""
        self.check_shard(shard)
        until = math.inf if validity is None else time.monotonic() + validity
        async with self._lock(shard):
            held = self.open_shards.get(shard)
            if held is not None and held.generation > generation:
                raise Outdated(f"shard {shard} is open here at generation {held.generation}",
                               shard=shard, generation=generation, highest=held.generation)
            if generation <= self.closed_at.get(shard, -1):
                # Its close came first: opening it now would hold a shard with no lease.
                raise Outdated(f"shard {shard}: generation {generation} was closed here",
                               shard=shard, generation=generation,
                               highest=self.closed_at[shard])
            if held is not None and held.generation == generation and not held.closed:
                self.extend(shard, generation, until)  # a retry: idempotent
                return held
            if held is not None:
                await self._shut(held)
            await self.guard.claim(shard, generation)
            db = await self._writer(shard, generation)
            try:
                await self._still_newest(shard, generation)
            except BaseException:
                with contextlib.suppress(ShardError):  # (the refusal is what to answer)
                    await self._shut_db(shard, generation, db)
                raise
            if not self.extend(shard, generation, until):
                # Closed or aborted while it opened (the agent gave up on it).
                await self._shut_db(shard, generation, db)
                raise Outdated(f"shard {shard}: generation {generation} was closed during "
                               "its open", shard=shard, generation=generation,
                               highest=max(generation, self.closed_at.get(shard, 0)))
            state = self.open_shards[shard] = Shard(shard, generation, db)
            if self.close_on_expiry and until != math.inf:
                watchdog = asyncio.create_task(self._expiry(state))
                self._watchdogs.add(watchdog)
                watchdog.add_done_callback(self._watchdogs.discard)
            self._count("opens")
            log.info("opened shard %d at generation %d", shard, generation)
            return state

    async def _writer(self, shard: int, generation: int) -> Any:
        """Open SlateDB's writer: from here on every older writer is fenced."""
        if self.record is not None:
            self.record("open", shard, generation)
        builder = DbBuilder(self.bucket.db_path(shard), self._store)
        if self.settings is not None:
            builder.with_settings(self.settings)
        try:
            return await builder.build()
        except Error as e:
            if self.record is not None:
                self.record("close", shard, generation)
            raise Unavailable(f"shard {shard}: SlateDB did not open: {e}", shard=shard) from None

    async def _still_newest(self, shard: int, generation: int) -> None:
        """After the writer opened: the guard must still name this open. If a
        newer generation claimed it between our claim and our writer's open,
        our open may have fenced that newer owner: step back (it reopens)."""
        seen = await self.guard.read(shard)
        if seen is None or (seen.generation, seen.holder) != (generation, self.guard.holder):
            highest = generation if seen is None else seen.generation
            self._count("opens_overtaken")
            raise Outdated(f"shard {shard}: generation {highest} claimed the shard while "
                           f"{generation} opened", shard=shard, generation=generation,
                           highest=highest)

    async def _shut_db(self, shard: int, generation: int | None, db: Any) -> None:
        """Flush and shut a writer down. A fenced or already closed writer is shut
        (it writes nothing more); any other failure is raised, to be retried."""
        try:
            await db.shutdown()
        except Error.Closed:
            pass
        except Error as e:
            raise Unavailable(f"shard {shard}: SlateDB did not shut down: {e}",
                              shard=shard) from None
        if self.record is not None:
            self.record("close", shard, generation)

    async def _shut(self, state: Shard) -> None:
        state.closed = True
        if state.writing:
            # A write that was put() is flushed by the shutdown anyway, but
            # its await_durable() then fails and its client is left unsure.
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(state.drained.wait(), DRAIN_SECONDS)
        await self._shut_db(state.number, state.generation, state.db)
        if self.open_shards.get(state.number) is state:
            del self.open_shards[state.number]

    async def close(self, shard: int, generation: int | None = None) -> bool:
        """Close `shard` (flush, shut SlateDB down) before answering; whether it
        was open. A close of an older generation than the one open is ignored."""
        self.check_shard(shard)
        async with self._lock(shard):
            held = self.open_shards.get(shard)
            if generation is not None and held is not None and held.generation > generation:
                return False
            closing = generation if generation is not None else (
                held.generation if held is not None else None)
            if closing is not None:
                self.closed_at[shard] = max(closing, self.closed_at.get(shard, -1))
            if held is None:
                return False
            # Every acknowledged write is already durable (in SlateDB's WAL), so
            # a shutdown that fails loses none: the agent retries the close.
            await self._shut(held)
            self._count("closes")
            log.info("closed shard %d at generation %d", shard, held.generation)
            return True

    def abort(self, shard: int, generation: int) -> bool:
        """The agent gave up on a close: drop the shard now; SlateDB shuts down
        in the background. An abort of an older generation is ignored."""
        self.check_shard(shard)
        held = self.open_shards.get(shard)
        if held is not None and held.generation > generation:
            return False
        self.closed_at[shard] = max(generation, self.closed_at.get(shard, -1))
        if held is None:
            return False
        held.closed = True
        del self.open_shards[shard]
        self._spawn(self._shut_db(shard, held.generation, held.db))
        self._count("aborts")
        return True

    async def _expiry(self, state: Shard) -> None:
        """Shut `state`'s writer down once its validity has run out without
        being extended (the agent paused, or cut off from the store): its
        lease may then be taken, and the next owner should open a closed
        database, not fence a live one. Counted as a close here; the agent's
        own close, if it comes, finds nothing open."""
        while True:
            known = self.valid_until.get(state.number)
            if state.closed or self.open_shards.get(state.number) is not state:
                return
            if known is None or known[0] != state.generation:
                deadline = time.monotonic()
            else:
                deadline = known[1]
            if deadline == math.inf:
                return
            if time.monotonic() < deadline:
                await asyncio.sleep(deadline - time.monotonic() + 0.01)
                continue
            async with self._lock(state.number):
                known = self.valid_until.get(state.number)
                if (state.closed or self.open_shards.get(state.number) is not state
                        or (known is not None and known[0] == state.generation
                            and time.monotonic() < known[1])):
                    continue
                log.warning("shard %d: generation %d past its validity; shutting its writer "
                            "down", state.number, state.generation)
                self._count("expired_closes")
                await self._drop(state)
            return

    def _spawn(self, work: Awaitable[None]) -> None:
        async def quietly() -> None:
            try:
                await work
            except ShardError as e:
                log.warning("%s", e)

        task = asyncio.create_task(quietly())
        self._background.add(task)
        task.add_done_callback(self._background.discard)

    async def aclose(self) -> None:
        """Shut every shard down (the process is stopping)."""
        for watchdog in list(self._watchdogs):
            watchdog.cancel()
        for shard in list(self.open_shards):
            async with self._lock(shard):
                if (held := self.open_shards.get(shard)) is not None:
                    with contextlib.suppress(ShardError):
                        await self._shut(held)
        if self._background:
            await asyncio.gather(*self._background, return_exceptions=True)
        await self.guard.aclose()

    # -- data ------------------------------------------------------------------------------------

    async def put(self, shard: int, key: bytes, value: bytes) -> int:
        """Store key=value, stamped with this owner's generation; return once it
        is durable in the object store (never before): that generation."""
        state = self.acting(shard)
        db = state.db
        state.writing += 1
        state.drained.clear()
        failure = None
        try:
            # put() succeeds even on a fenced writer: only durability tells.
            handle = await db.put(key, encode(value, state.generation))
            await handle.await_durable()
        except Error as e:
            failure = e
        finally:
            state.writing -= 1
            if not state.writing:
                state.drained.set()
        if failure is not None:
            # (Out of the count first: a close waiting for it holds the lock.)
            raise await self._failed(state, db, failure, applied="unknown")
        self._count("writes")
        return state.generation

    async def get(self, shard: int, key: bytes) -> Stored | None:
        """The durable value of `key`, if this process may act on `shard` both
        when the read starts and when it ends."""
        state = self.acting(shard)
        db = state.db
        try:
            raw = await db.get_with_options(key, DURABLE_ONLY)
        except Error as e:
            raise await self._failed(state, db, e, applied="no") from None
        # A read that outlived the validity (this process paused mid-read) may
        # have read a state a newer owner has changed since.
        if self.acting(shard) is not state:
            raise NotOpen(f"shard {shard} was closed here during the read", shard=shard)
        return None if raw is None else decode(raw)

    async def _failed(self, state: Shard, db: Any, error: Any, *, applied: str) -> ShardError:
        """What a SlateDB error on `db` means, once dealt with; the error to
        answer with. A writer fenced while this process still holds the
        newest generation was fenced by a late open of an older one: it is
        reopened. Any other closed writer closes the shard here."""
        shard = state.number
        if not isinstance(error, Error.Closed):
            return Unavailable(f"shard {shard}: {error}", applied=applied, shard=shard)
        fenced = error.reason == CloseReason.FENCED
        async with self._lock(shard):
            if state.closed and not fenced:
                return Unavailable(f"shard {shard} was closed here during the request",
                                   applied=applied, shard=shard)
            if not state.closed and state.db is not db:
                return Unavailable(f"shard {shard}: its writer was reopened; try again",
                                   applied=applied, shard=shard)
            if not state.closed and fenced and await self._holds_newest(state):
                try:
                    await self._shut_db(shard, state.generation, db)
                    new = await self._writer(shard, state.generation)
                    try:
                        await self._still_newest(shard, state.generation)
                    except BaseException:
                        with contextlib.suppress(ShardError):
                            await self._shut_db(shard, state.generation, new)
                        raise
                except ShardError as e:
                    await self._drop(state)
                    return Unavailable(f"shard {shard}: fenced by a late open, and could not "
                                       f"reopen ({e}); closed here", applied=applied,
                                       shard=shard)
                # Our new writer fences the late one in turn (which closes itself).
                state.db = new
                self._count("reopens")
                log.warning("shard %d: fenced by a late open, reopened at generation %d",
                            shard, state.generation)
                return Unavailable(f"shard {shard}: its writer was fenced by a late open and "
                                   "reopened; try again", applied=applied, shard=shard)
            if not state.closed:
                await self._drop(state)
                self._count("fences")
                log.warning("shard %d: writer closed (%s); closed here at generation %d",
                            shard, error.reason.name, state.generation)
        if not fenced:
            return Unavailable(f"shard {shard}: its writer closed ({error.reason.name}); "
                               "closed here", applied=applied, shard=shard)
        seen = await self.guard.read(shard)
        by = None if seen is None else seen.generation
        return Fenced(f"shard {shard}: fenced by generation {by}; closed here", shard=shard,
                      generation=state.generation, fenced_by=by, applied=applied)

    async def _holds_newest(self, state: Shard) -> bool:
        seen = await self.guard.read(state.number)
        return seen is not None and (seen.generation, seen.holder) == (
            state.generation, self.guard.holder)

    async def _drop(self, state: Shard) -> None:
        """Close the shard here whatever SlateDB says: its writer is dead."""
        with contextlib.suppress(ShardError):
            await self._shut(state)
        if self.open_shards.get(state.number) is state:
            del self.open_shards[state.number]


# -- the host protocol over HTTP --------------------------------------------------------------


def is_loopback(remote: str | None) -> bool:
    try:
        address = ipaddress.ip_address((remote or "").split("%", 1)[0])
    except ValueError:
        return False
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        address = address.ipv4_mapped
    return address.is_loopback


def _count_field(body: dict[str, Any], name: str, *, required: bool = True) -> int | None:
    value = body.get(name)
    if value is None and not required:
        return None
    if not isinstance(value, int) or isinstance(value, bool) or value < 0:
        raise BadRequest(f"{name} must be an integer >= 0, not {value!r:.50}")
    return value


async def json_body(request: web.Request, limit: int = MAX_SMALL_BYTES) -> dict[str, Any]:
    raw = await request.content.read(limit + 1)
    if len(raw) > limit:
        raise BadRequest(f"the body is larger than {limit} bytes")
    try:
        body = json.loads(raw or b"{}")
    except ValueError as e:
        raise BadRequest(f"the body is not JSON: {e}") from None
    if not isinstance(body, dict):
        raise BadRequest("the body must be a JSON object")
    return body


def host_routes(shards: SlateShards, *, allow_remote_control: bool = False
                ) -> list[web.RouteDef]:
    """open, close, abort and /lease of the host protocol (docs/host-api.yaml).
    Only from loopback unless `allow_remote_control`: whoever can call open
    can fence the real owner."""

    async def control(request: web.Request) -> tuple[int, dict[str, Any]]:
        if not allow_remote_control and not is_loopback(request.remote):
            raise Forbidden("open and close are accepted from loopback only")
        try:
            shard = int(request.match_info["shard"])
        except ValueError:
            raise BadRequest(f"shard {request.match_info['shard']!r} is no number") from None
        shards.check_shard(shard)
        body = await json_body(request)
        if body.get("shard", shard) != shard:
            raise BadRequest(f"the body names shard {body['shard']!r}, the path {shard}")
        return shard, body

    async def do_open(request: web.Request) -> web.Response:
        received = time.monotonic()
        shard, body = await control(request)
        generation = _count_field(body, "generation")
        assert generation is not None
        ms = _count_field(body, "validity_ms", required=False)
        # validity_ms counts from when the call arrived, not from now.
        validity = None if ms is None else ms / 1000 - (time.monotonic() - received)
        state = await shards.open(shard, generation, validity)
        return web.json_response({"shard": shard, "generation": state.generation})

    async def do_close(request: web.Request) -> web.Response:
        shard, body = await control(request)
        was_open = await shards.close(shard, _count_field(body, "generation", required=False))
        return web.json_response({"shard": shard, "closed": True, "was_open": was_open})

    async def do_abort(request: web.Request) -> web.Response:
        shard, body = await control(request)
        generation = _count_field(body, "generation")
        assert generation is not None
        return web.json_response({"shard": shard, "aborted": True,
                                  "was_open": shards.abort(shard, generation)})

    async def do_lease(request: web.Request) -> web.Response:
        received = time.monotonic()
        if not allow_remote_control and not is_loopback(request.remote):
            raise Forbidden("/lease is accepted from loopback only")
        entries = (await json_body(request, MAX_LEASE_BYTES)).get("leases")
        if not isinstance(entries, list) or not all(isinstance(e, dict) for e in entries):
            raise BadRequest('the body must be {"leases": [{"shard", "generation", '
                             '"validity_ms"}, ...]}')
        parsed = []
        for entry in entries:
            shard, generation, ms = (_count_field(entry, name)
                                     for name in ("shard", "generation", "validity_ms"))
            assert shard is not None and generation is not None and ms is not None
            shards.check_shard(shard)
            parsed.append((shard, generation, received + ms / 1000))
        taken = [s for s, g, until in parsed if shards.extend(s, g, until)]
        return web.json_response({"extended": taken,
                                  "ignored": sorted({s for s, _, _ in parsed} - set(taken))})

    return [web.post("/shards/{shard}/open", do_open),
            web.post("/shards/{shard}/close", do_close),
            web.post("/shards/{shard}/abort", do_abort),
            web.post("/lease", do_lease)]


@web.middleware
async def errors_middleware(
        request: web.Request,
        handler: Callable[[web.Request], Awaitable[web.StreamResponse]]) -> web.StreamResponse:
    """A `ShardError` becomes its JSON answer."""
    try:
        return await handler(request)
    except ShardError as e:
        if e.status >= 500:
            log.warning("%s %s: %s", request.method, request.path, e)
        return web.json_response(e.body(), status=e.status)


async def lifetime(shards: SlateShards) -> AsyncIterator[None]:
    """For ``web.Application.cleanup_ctx``: shut every shard down at exit."""
    yield
    await shards.aclose()


def default_settings(manifest_poll_ms: int | None = None) -> Any:
    """SlateDB's default settings, with a manifest poll interval if given."""
    settings = Settings.default()
    if manifest_poll_ms is not None:
        settings.set("manifest_poll_interval", json.dumps(f"{manifest_poll_ms}ms"))
    return settings
