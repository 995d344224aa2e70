"""The S3 store itself (`S3Store`): the interface's reads and
compare-and-swaps, and the listing."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import random
import uuid
from collections.abc import Awaitable, Callable, Mapping
from typing import Any, TypeVar
from urllib.parse import parse_qsl, urlsplit

from botocore.config import Config  # type: ignore[import-untyped]
from botocore.handlers import (  # type: ignore[import-untyped]
    _handle_200_error,
    add_expect_header,
)

from shardlease.errors import ConfigError, Conflict, StoreError
from shardlease.records import (
    MAX_RECORD_BYTES,
    Epoch,
    Heartbeat,
    Lease,
    Stored,
    decode_heartbeat,
    encode,
    stored_epoch,
    stored_lease,
)
from shardlease.stores.base import EpochListing, LeaseStore, Listed
from shardlease.stores.requests import RequestObservers
from shardlease.stores.s3.cache import (
    _NO_MARKER,
    MARK_RETRY_FIRST,
    MARK_RETRY_MAX,
    MOVED,
    ViewFacts,
    _MarkerRead,
    _Moves,
    _Records,
    head_worth_it,
    serve_view,
)
from shardlease.stores.s3.keys import (
    _ENDED,
    _segment,
    _shard_number,
    clean_etag,
)
from shardlease.stores.s3.probe import probe
from shardlease.stores.s3.transport import (
    _KINDS,
    Where,
    _all,
    _mark_not_s3,
    _S3Failure,
    _session,
    _total_size,
    guarded,
    read_at_most,
)
from shardlease.stores.s3.url import (
    _BUCKET,
    _FALSE,
    _QUERY_KEYS,
    _TRUE,
    URL_FORM,
    _clean_endpoint,
    _clean_prefix,
    _public_url,
    _redacted,
)

log = logging.getLogger("shardlease.stores.s3")

T = TypeVar("T")

class S3Store(LeaseStore):
    """Leases in an S3 bucket, written with conditional PUTs.

    URL: ``s3://BUCKET[/PREFIX]``, with optional query parameters:

    - ``endpoint=http://127.0.0.1:9000``: the S3 endpoint (MinIO, moto, ...);
      default: ``AWS_ENDPOINT_URL_S3``, then ``AWS_ENDPOINT_URL``, then AWS;
    - ``region=eu-west-1``: default ``AWS_REGION``, then ``AWS_DEFAULT_REGION``
      (or the AWS profile's region), then ``us-east-1``;
    - ``path_style=true``: path-style addressing (``http://host/bucket/key``),
      which most self-hosted servers need; ``false`` forces virtual hosts;
      default: botocore's choice.

    Example: ``s3://leases/prod?endpoint=http://127.0.0.1:9000&path_style=true``.
    Credentials never go in the URL: they come from the usual AWS settings
    (``AWS_ACCESS_KEY_ID``/``AWS_SECRET_ACCESS_KEY``, ``AWS_PROFILE``, web
    identity, instance roles).

    One client per store, created on first use in the running event loop (use
    a store from one loop only) and closed by `aclose()`. Requests time out
    after a few seconds and are tried at most `max_attempts` times, so a stuck
    S3 delays a round by seconds, not minutes.
    """

    def __init__(
        self,
        bucket: str,
        prefix: str = "",
        *,
        endpoint_url: str | None = None,
        region: str | None = None,
        path_style: bool | None = None,
        connect_timeout: float = 3.0,
        read_timeout: float = 5.0,
        max_attempts: int = 3,
        max_parallel_gets: int = 16,
        page_size: int = 1000,
        conflict_attempts: int = 4,
    ) -> None:
        super().__init__()
        #: Told of every backend request this store makes (`stores.requests`).
        self.backend_requests = RequestObservers()
        if not _BUCKET.match(bucket):
            raise ConfigError(f"invalid S3 bucket name {bucket!r}: use {URL_FORM}")
        self.bucket = bucket
        self.prefix = _clean_prefix(prefix)
        self.endpoint_url = _clean_endpoint(endpoint_url) if endpoint_url else None
        self.region = region or os.environ.get("AWS_REGION") or None
        self.path_style = path_style
        self._config = Config(
            connect_timeout=connect_timeout,
            read_timeout=read_timeout,
            retries={"mode": "standard", "total_max_attempts": max_attempts},
            max_pool_connections=max(32, max_parallel_gets * 2),
            s3={"addressing_style": {None: "auto", True: "path", False: "virtual"}[path_style]},
            # Records are a few hundred bytes; the default flexible checksums
            # are refused by some S3-compatible servers and add nothing here.
            request_checksum_calculation="when_required",
            response_checksum_validation="when_required",
        )
        #: A backstop over botocore's own timeouts and retries, for whatever
        #: they do not cover: no request holds a round longer than this.
        self._deadline = max_attempts * (connect_timeout + read_timeout) + 5.0
        self._page_size = page_size
        self._conflict_attempts = max(1, conflict_attempts)
        self._gets = asyncio.Semaphore(max_parallel_gets)
        self._client: Any = None
        self._stack: contextlib.AsyncExitStack | None = None
        #: Clients replaced by `retried_by_caller()`, closed by `aclose()`.
        self._replaced: list[contextlib.AsyncExitStack] = []
        self._client_lock = asyncio.Lock()
        self._records = _Records()
        #: cluster -> its moves as this object knows them (see `list_leases`).
        self._moves: dict[str, _Moves] = {}
        #: A counter that orders this object's epoch listings and the returns
        #: of its `list_leases` (`_MarkerRead.started`, `_Moves.returned`).
        self._ticks = 0
        #: How long `aclose()` waits for marks still to be put.
        self._mark_close_wait = connect_timeout + read_timeout

    @classmethod
    def from_url(cls, url: str) -> S3Store:
        """Parse ``s3://BUCKET[/PREFIX][?endpoint=...&region=...&path_style=...]``."""

        def bad(why: str) -> ConfigError:
            return ConfigError(f"S3 store URL {_redacted(url)!r}: {why}; use {URL_FORM} "
                               "(credentials come from the AWS environment, never the URL)")

        try:
            parts = urlsplit(url)
            port = parts.port
        except ValueError as e:
            raise bad(str(e)) from None
        if parts.scheme != "s3":
            raise bad("the scheme must be s3://")
        if parts.username or parts.password:
            raise bad("it must not hold credentials")
        if not parts.hostname or port is not None:
            raise bad("it must name a bucket (and no port)")
        if parts.fragment:
            raise bad("it must have no #fragment")
        query: dict[str, str] = {}
        for key, value in parse_qsl(parts.query, keep_blank_values=True):
            if key not in _QUERY_KEYS:
                raise bad(f"unknown parameter {key!r} (known: {', '.join(_QUERY_KEYS)})")
            if key in query:
                raise bad(f"parameter {key!r} given twice")
            if not value:
                raise bad(f"parameter {key!r} is empty")
            query[key] = value
        path_style: bool | None = None
        if "path_style" in query:
            flag = query["path_style"].lower()
            if flag not in _TRUE + _FALSE:
                raise bad(f"path_style must be true or false, not {query['path_style']!r}")
            path_style = flag in _TRUE
        try:
            # netloc, not hostname: hostname is lowercased, a bucket name is not.
            return cls(parts.netloc, parts.path, endpoint_url=query.get("endpoint"),
                       region=query.get("region"), path_style=path_style)
        except ConfigError as e:
            raise bad(str(e).split(": use ")[0]) from None

    # -- identity --------------------------------------------------------------------

    def _endpoint(self) -> str:
        if self._client is not None:
            return _public_url(str(self._client.meta.endpoint_url))
        configured = (self.endpoint_url or os.environ.get("AWS_ENDPOINT_URL_S3")
                      or os.environ.get("AWS_ENDPOINT_URL"))
        if configured:
            return _public_url(configured)
        return f"AWS S3 {self.region or 'default region'}"

    def describe(self) -> str:
        return f"s3://{self.bucket}/{self.prefix} (endpoint {self._endpoint()})"

    def _url(self, key: str) -> str:
        return f"s3://{self.bucket}/{key}"

    # -- keys --------------------------------------------------------------------------

    def _root(self) -> str:
        return f"{self.prefix}/" if self.prefix else ""

    def _cluster_dir(self, cluster: str) -> str:
        return f"{self._root()}{_segment('cluster', cluster)}/"

    def _lease_dir(self, cluster: str) -> str:
        return self._cluster_dir(cluster) + "leases/"

    def _heartbeat_dir(self, cluster: str) -> str:
        return self._cluster_dir(cluster) + "heartbeats/"

    def _epoch_dir(self, cluster: str) -> str:
        return self._cluster_dir(cluster) + "epochs/"

    def _epoch_key(self, cluster: str, node: str, epoch: str) -> str:
        return f"{self._epoch_dir(cluster)}{_segment('node', node)}@{_segment('epoch', epoch)}"

    def _lease_key(self, cluster: str, shard: int) -> str:
        return f"{self._lease_dir(cluster)}{shard}"

    def _marker_key(self, cluster: str) -> str:
        return self._epoch_dir(cluster) + MOVED

    # -- the client ----------------------------------------------------------------------

    async def _s3(self) -> Any:
        if self._client is None:
            async with self._client_lock:
                if self._client is None:
                    region = (self.region or os.environ.get("AWS_DEFAULT_REGION")
                              or None)
                    session = _session()
                    if region is None:
                        region = session.get_config_variable("region") or "us-east-1"
                    stack = contextlib.AsyncExitStack()
                    client = await stack.enter_async_context(session.create_client(
                        "s3", region_name=region, endpoint_url=self.endpoint_url,
                        config=self._config))
                    # Counted at the HTTP level: every page and every retry.
                    client.meta.events.register("before-send.s3", self._on_send)
                    # botocore asks for "100 Continue" before every PUT body; our
                    # bodies are tiny, and a server that never answers it would
                    # hold the request (outside the read timeout) for good.
                    client.meta.events.unregister("before-call.s3", add_expect_header)
                    # Note a 200 that is not S3 before botocore makes it a 500:
                    # in its place, since botocore's handler runs first.
                    client.meta.events.unregister("before-parse.s3.*", _handle_200_error)
                    client.meta.events.register_first("before-parse.s3.*", _mark_not_s3)
                    self._stack, self._client = stack, client
        return self._client

    def _on_send(self, event_name: str = "", **_: Any) -> None:
        operation = event_name.rsplit(".", 1)[-1]
        self.backend_requests.report(_KINDS.get(operation, operation.lower()))

    def retried_by_caller(self) -> None:
        """One attempt per request from now on. botocore's standard retries
        pause rand(0, 1) s, then rand(0, 2) s after a throttling answer (503
        SlowDown), all inside one call: at a lease TTL of 3 s that is the
        whole 1.5 s budget of a renewal, for at most three attempts. The loop
        retries a failed call itself after 5% of an interval (doubling), so
        many more attempts fit in the same budget. The next request opens a
        new client (one in use is closed by `aclose()`)."""
        self._config = self._config.merge(Config(retries={"mode": "standard",
                                                          "total_max_attempts": 1}))
        if self._stack is not None:
            self._replaced.append(self._stack)
        self._stack, self._client = None, None

    async def aclose(self) -> None:
        """Put the marks still due first (a graceful stop frees its leases just
        before: peers should learn of it now, not at their safety net), for
        at most one request's timeouts; then close the clients."""
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(self._mark_close_wait):
                await self.marks_settled()
        for moves in self._moves.values():
            if moves.flusher is not None and not moves.flusher.done():
                moves.flusher.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await moves.flusher
            moves.flusher = None
        stacks = [*self._replaced, self._stack]
        self._replaced, self._stack, self._client = [], None, None
        for stack in stacks:
            if stack is not None:
                await stack.aclose()

    async def _call(self, operation: str, key: str, **params: Any) -> dict[str, Any]:
        """One S3 call on `key`; every failure becomes a `_S3Failure`."""
        s3 = await self._guard(operation, key, self._s3)  # credentials may fail here
        return await self._guard(
            operation, key, lambda: getattr(s3, operation)(Bucket=self.bucket, **params))

    async def _guard(self, operation: str, key: str,
                     call: Callable[[], Awaitable[T]]) -> T:
        return await guarded(call, self._deadline, Where(
            operation=operation, url=self._url(key), endpoint=self._endpoint(),
            bucket=self.bucket))

    # -- reading -------------------------------------------------------------------------

    async def _list(self, prefix: str) -> dict[str, tuple[str, int]]:
        """key -> (etag, size) of the objects directly under `prefix`."""
        found: dict[str, tuple[str, int]] = {}
        params: dict[str, Any] = {"Prefix": prefix, "Delimiter": "/",
                                  "MaxKeys": self._page_size}
        while True:
            page = await self._call("list_objects_v2", prefix, **params)
            for item in page.get("Contents", ()):
                found[item["Key"]] = (clean_etag(item.get("ETag", "")), int(item.get("Size", 0)))
            token = page.get("NextContinuationToken")
            if not page.get("IsTruncated") or not token:
                return found
            params["ContinuationToken"] = token

    async def _read(self, key: str) -> tuple[str, bytes, int] | None:
        """(etag, first bytes, total size) of an object, reading at most
        MAX_RECORD_BYTES + 1 bytes; None if there is no object."""
        async with self._gets:
            try:
                got = await self._call("get_object", key, Key=key,
                                       Range=f"bytes=0-{MAX_RECORD_BYTES}")
            except _S3Failure as e:
                if e.status == 404 or e.code == "NoSuchKey":
                    return None
                if e.status != 416:
                    raise
                # An empty object: no byte 0 to return. Read it whole (bounded).
                try:
                    got = await self._call("get_object", key, Key=key)
                except _S3Failure as again:
                    if again.status == 404 or again.code == "NoSuchKey":
                        return None
                    raise
            body = got["Body"]

            async def read() -> bytes:
                async with body:
                    return await read_at_most(body, MAX_RECORD_BYTES + 1)

            data = await self._guard("get_object", key, read)
        total = _total_size(got.get("ContentRange"), got.get("ContentLength"), len(data))
        return clean_etag(got.get("ETag", "")), data, total

    def _decode(self, etag: str, data: bytes, total: int,
                cluster: str, shard: int) -> Stored[Lease]:
        return stored_lease(data, etag, cluster, shard, total)

    async def _fetch_lease(self, cluster: str, shard: int) -> Stored[Lease] | None:
        key = self._lease_key(cluster, shard)
        got = await self._read(key)
        if got is None:
            self._records.forget(key)
            return None
        return self._records.remember(key, self._decode(*got, cluster, shard))

    async def _fetch_listed(self, cluster: str, shard: int, etag: str) -> Stored[Lease] | None:
        """A lease seen in a listing. One object this client may not read (a
        403: a bucket policy denying its key, an archived storage class) is
        that lease's problem, reported as a corrupt record, not a failure of
        the whole listing: otherwise one such object would stop every node
        from claiming anything. Not cached: it is read again next round, in
        case the permission was fixed."""
        try:
            return await self._fetch_lease(cluster, shard)
        except _S3Failure as e:
            if e.status != 403:
                raise
            return Stored(etag, None, f"cannot read the lease object: {e}")

    def _moves_of(self, cluster: str) -> _Moves:
        moves = self._moves.get(cluster)
        if moves is None:
            _segment("cluster", cluster)
            moves = self._moves[cluster] = _Moves()
        return moves

    async def list_leases(self, cluster: str, *,
                          seen: Listed | None = None) -> dict[int, Stored[Lease]]:
        """Every lease, from a listing; or the last listing's answer again (the
        very same entries) when nothing since can have moved a lease, as far
        as anyone announces it. That is when:

        - the move marker's ETag, read after the previous call returned, is
          the one read before that listing (every lease write but a
          shard-mode renewal is followed by a PUT of fresh random bytes to
          the marker: `_swap_lease`). The read is the caller's epoch listing
          (`seen.epochs`: the marker is in the epochs prefix, so the listing
          shows its ETag at no extra request) if this object made it, of
          this cluster, and it started after the previous call returned;
          else a HEAD of the marker, when the answer can matter;
        - that listing held no lease that changes without a mark: none kept
          by shard renewal with an owner (its owner rewrites it every
          interval, and readers judge it live from that), none unreadable;
          and it found every lease as the listing before it did;
        - the caller's last heartbeat listing (`seen.heartbeats`) shows nobody
          heartbeating: every heartbeat in it at one ETag over QUIET_LISTINGS
          of the listings this object was told of (a peer that beats may run
          a version that puts no marks). Told none, or that the last one
          failed: a listing;
        - this object wrote no lease since, and has no mark still to put;
        - fewer than FULL_LIST_EVERY - 1 answers in a row came from it.

        So a caller that passes nothing always gets a listing.

        A move is missed for at most one round after its mark: a writer's
        lease write has ended before its marker PUT starts, and a reader
        reads the marker before it lists. A reader that reads the marker
        again at the ETag it read before its listing knows that no marker
        PUT took effect in between (each writes fresh random bytes), so every
        write whose mark took effect before this second read had ended before
        the listing started, and the listing holds it (S3 lists with
        read-after-write consistency). A mark that lands after a reader's
        read is seen by its next call, whose read starts after this one
        returned (which is why an older epoch listing is not taken for a
        read).

        Correctness never depends on it: nothing here decides who owns what.
        Every claim is a compare-and-swap on the version read, so an answer
        that missed a move costs a refused claim (after which this object
        lists again: a write of its own voids its view) or a lookup that
        points at the previous owner for a while, never two owners.
        """
        directory = self._lease_dir(cluster)
        moves = self._moves_of(cluster)
        local = moves.local
        seen = seen or Listed()
        try:
            quiet = moves.quiet(seen.heartbeats)
            marker = await self._marker_now(cluster, moves, seen.epochs, quiet)
            view = moves.view
            facts = ViewFacts(
                has_view=view is not None, moving=moves.view_moving,
                changed=moves.view_changed, quiet=quiet, marking=moves.marking(),
                wrote=not moves.view_local == local == moves.local, served=moves.served)
            if view is not None and serve_view(facts, marker, moves.view_marker) == "serve":
                moves.served += 1
                return dict(view)
            leases = await self._list_all(cluster, directory)
            # While leases move (a start, a join, a crash), peers act on each
            # other's moves within a round, and a mark may land a moment
            # after the write it is for: listed every round until one round
            # shows no move. Unchanged entries are the very same objects.
            before = moves.view
            moves.view, moves.view_marker, moves.view_local = leases, marker, local
            moves.view_moving = any(
                stored.record is None
                or (stored.record.renewal == "shard" and stored.record.owner is not None)
                for stored in leases.values())
            moves.view_changed = before is None or before.keys() != leases.keys() or any(
                stored is not before[shard] for shard, stored in leases.items())
            moves.served = 0
            return dict(leases)
        finally:
            self._ticks += 1
            moves.returned = self._ticks

    async def _marker_now(self, cluster: str, moves: _Moves,
                          epochs: Mapping[tuple[str, str], str] | None,
                          quiet: bool) -> str | None:
        """The marker's ETag as read since the last `list_leases` returned:
        by the caller's epoch listing if it is one this object made of this
        cluster and it started since (`_MarkerRead`), else by a HEAD if the
        answer can matter. None: not known."""
        read = epochs.mark if isinstance(epochs, EpochListing) else None
        if isinstance(read, _MarkerRead) and read.store is self and read.cluster == cluster \
                and read.started > moves.returned:
            return read.etag
        if not head_worth_it(ViewFacts(has_view=moves.view is not None,
                                       moving=moves.view_moving, quiet=quiet)):
            return None  # this call lists anyway: no request for it
        try:
            etag = await self._head(self._marker_key(cluster))
        except StoreError as e:
            log.debug("could not read the move marker of %s: %s", cluster, e)
            return None
        return _NO_MARKER if etag is None else etag

    async def _list_all(self, cluster: str, directory: str) -> dict[int, Stored[Lease]]:
        listed = await self._list(directory)
        leases: dict[int, Stored[Lease]] = {}
        changed: list[tuple[int, str]] = []
        for key, (etag, size) in listed.items():
            shard = _shard_number(key[len(directory):])
            if shard is None:
                self._records.not_a_lease(key, self._url(key))
                continue
            cached = self._records.at(key, etag)
            if cached is not None:
                leases[shard] = cached
            elif size == 0:
                # Judged from the listing alone: no need to fetch it. (An
                # oversize record is fetched, its first bytes only, for the
                # generation they may still show.)
                leases[shard] = self._records.remember(
                    key, stored_lease(b"", etag, cluster, shard))
            else:
                changed.append((shard, etag))
        self._records.keep_listed(directory, listed)

        if changed:
            fetched = await _all([self._fetch_listed(cluster, shard, etag)
                                  for shard, etag in changed])
            for (shard, _), entry in zip(changed, fetched, strict=True):
                if entry is not None:  # None: removed since the listing
                    leases[shard] = entry
        return self._observed_all(cluster, leases)

    async def get_lease(self, cluster: str, shard: int) -> Stored[Lease] | None:
        moves = self._moves_of(cluster)
        # When it starts and when it ends: what it finds may be newer than the view.
        moves.local += 1
        try:
            return self._observed_one(cluster, shard, await self._fetch_lease(cluster, shard))
        finally:
            moves.local += 1

    # -- writing leases --------------------------------------------------------------------

    async def create_lease(self, lease: Lease) -> str:
        return await self._swap_lease(lease, None)

    async def update_lease(self, lease: Lease, version: str) -> str:
        return await self._swap_lease(lease, clean_etag(version))

    async def _swap_lease(self, lease: Lease, expected: str | None) -> str:
        key = self._lease_key(lease.cluster, lease.shard)
        moves = self._moves_of(lease.cluster)
        unmarked = self._renews_in_place(key, lease, expected)
        moves.local += 1
        try:
            version = await self._swap(key, encode(lease),
                                       f"lease {lease.cluster}/{lease.shard} ({self._url(key)})",
                                       expected)
        finally:
            # Whatever the outcome: a refusal or a lost answer may hide a
            # write that landed (a retry refused after the first try landed).
            moves.local += 1
            if not unmarked:
                self._mark(lease.cluster, moves)
        self._records.remember(key, Stored(version, lease))
        return version

    def _renews_in_place(self, key: str, lease: Lease, expected: str | None) -> bool:
        """A shard-mode renewal of the record this object last saw at
        `expected` (same owner, incarnation and generation): no reader needs a
        mark for it, since a view that holds such a record is listed every
        time. When that record is not known, it is a move."""
        if expected is None or lease.renewal != "shard" or lease.owner is None:
            return False
        seen = self._records.at(key, expected)
        old = seen.record if seen is not None else None
        return (old is not None and old.renewal == "shard"
                and (old.owner, old.incarnation, old.generation)
                == (lease.owner, lease.incarnation, lease.generation))

    # -- the move marker ---------------------------------------------------------------------

    def _mark(self, cluster: str, moves: _Moves) -> None:
        """A lease write of ours has ended: PUT the marker (coalesced: one PUT
        after the write covers it, whichever write asked for it)."""
        moves.dirty = True
        if moves.flusher is None or moves.flusher.done():
            moves.flusher = asyncio.get_running_loop().create_task(
                self._put_marks(cluster, moves), name=f"shardlease-marks-{cluster}")

    async def _put_marks(self, cluster: str, moves: _Moves) -> None:
        """PUT the marker while a mark is due. A mark asked for while a PUT is
        under way takes another PUT (that one may have started before the
        write it is for ended); a failed PUT is retried until one lands, or
        the move would stay hidden from cached readers until their safety net."""
        key = self._marker_key(cluster)
        pause, failed = MARK_RETRY_FIRST, 0
        while moves.dirty:
            moves.dirty = False
            try:
                await self._call("put_object", key, Key=key, Body=uuid.uuid4().hex.encode(),
                                 ContentType="text/plain")
            except Exception as e:  # whatever it was, the mark is still due
                moves.dirty = True
                failed += 1
                (log.warning if failed == 1 else log.debug)(
                    "could not put the move marker %s (retrying): %s", self._url(key), e)
                await asyncio.sleep(random.uniform(0.5, 1.0) * pause)
                pause = min(2 * pause, MARK_RETRY_MAX)
                continue
            if failed:
                log.info("put the move marker %s after %d failed attempts", self._url(key),
                         failed)
            pause, failed = MARK_RETRY_FIRST, 0

    async def marks_settled(self) -> None:
        """Until every mark due has been put (bound it with `asyncio.timeout`).
        A mark left due by `aclose()` is put again from here."""
        while True:
            for cluster, moves in self._moves.items():
                if moves.dirty and (moves.flusher is None or moves.flusher.done()):
                    self._mark(cluster, moves)
            busy = [m.flusher for m in self._moves.values()
                    if m.flusher is not None and not m.flusher.done()]
            if not busy:
                return
            await asyncio.wait(busy)

    async def _swap(self, key: str, body: bytes, what: str, expected: str | None) -> str:
        """PUT the object if it is still at `expected` (None: missing)."""
        condition = ({"IfNoneMatch": "*"} if expected is None
                     else {"IfMatch": f'"{expected}"'})
        for attempt in range(1, self._conflict_attempts + 1):
            try:
                answer = await self._call("put_object", key, Key=key, Body=body,
                                          ContentType="application/json", **condition)
            except _S3Failure as e:
                if e.status == 412 or e.code == "PreconditionFailed":
                    if expected is None:
                        raise Conflict(f"{what} exists already") from None
                    raise Conflict(f"{what} changed since version {expected}") from None
                if expected is not None and (e.status == 404 or e.code == "NoSuchKey"):
                    raise Conflict(f"{what} is gone (expected version {expected})") from None
                if not (e.status == 409 or e.code == "ConditionalRequestConflict"):
                    raise
                if attempt == self._conflict_attempts:
                    raise StoreError(
                        f"{what}: S3 kept answering ConditionalRequestConflict (another write "
                        f"in flight) after {attempt} attempts") from None
                # Another write to the key was in flight: wait for it to land,
                # then retry only if it did not move the object.
                await asyncio.sleep(random.uniform(0.5, 1.0) * 0.05 * 2 ** attempt)
                current = await self._head(key)
                if current != expected:
                    self._records.forget(key)
                    raise Conflict(
                        f"{what} changed while our write was refused as concurrent "
                        f"(expected version {expected}, now {current})") from None
                continue
            version = clean_etag(answer.get("ETag", ""))
            if not version:
                raise StoreError(f"S3 PutObject {self._url(key)} at {self._endpoint()} "
                                 "answered without an ETag")
            return version
        raise AssertionError("unreachable")  # pragma: no cover

    async def _head(self, key: str) -> str | None:
        """The object's ETag, or None if there is none."""
        try:
            answer = await self._call("head_object", key, Key=key)
        except _S3Failure as e:
            if e.status == 404 or e.code in ("NoSuchKey", "404", "NotFound"):
                return None
            raise
        return clean_etag(answer.get("ETag", ""))

    # -- heartbeats --------------------------------------------------------------------------

    async def list_heartbeats(self, cluster: str) -> dict[str, str]:
        directory = self._heartbeat_dir(cluster)
        listed = await self._list(directory)
        return {key[len(directory):]: etag for key, (etag, _) in listed.items()
                if len(key) > len(directory)}

    async def get_heartbeat(self, cluster: str, node: str) -> Heartbeat | None:
        got = await self._read(self._heartbeat_dir(cluster) + _segment("node", node))
        if got is None:
            return None
        _, data, _ = got  # (at most MAX_RECORD_BYTES + 1 bytes: one more is refused)
        return decode_heartbeat(data, cluster, node)

    async def put_heartbeat(self, heartbeat: Heartbeat) -> None:
        key = self._heartbeat_dir(heartbeat.cluster) + _segment("node", heartbeat.node)
        await self._call("put_object", key, Key=key, Body=encode(heartbeat),
                         ContentType="application/json")

    async def delete_heartbeat(self, cluster: str, node: str) -> None:
        key = self._heartbeat_dir(cluster) + _segment("node", node)
        try:
            await self._call("delete_object", key, Key=key)
        except _S3Failure as e:
            if not (e.status == 404 or e.code == "NoSuchKey"):
                raise

    # -- epochs (node-mode renewal) ------------------------------------------------------------

    async def list_epochs(self, cluster: str) -> dict[tuple[str, str], str]:
        directory = self._epoch_dir(cluster)
        # The listing holds the move marker: its ETag goes with the listing,
        # for `list_leases` to use if it is given this listing back.
        self._ticks += 1
        started = self._ticks
        listed = await self._list(directory)
        marker, _ = listed.get(self._marker_key(cluster), (_NO_MARKER, 0))
        found: dict[tuple[str, str], str] = {}
        ended: set[tuple[str, str]] = set()
        for key, (etag, _) in listed.items():
            node, sep, epoch = key[len(directory):].rpartition("@")
            if sep and node and epoch.endswith(_ENDED):
                ended.add((node, epoch.removesuffix(_ENDED)))
            elif sep and node and epoch:
                found[(node, epoch)] = etag
        return EpochListing(found, frozenset(ended & found.keys()),
                            _MarkerRead(self, cluster, started, marker))

    async def get_epoch(self, cluster: str, node: str, epoch: str) -> Stored[Epoch] | None:
        got = await self._read(self._epoch_key(cluster, node, epoch))
        if got is None:
            return None
        etag, data, _ = got
        return stored_epoch(data, etag, cluster, node, epoch)

    async def create_epoch(self, record: Epoch) -> str:
        return await self._swap_epoch(record, None)

    async def update_epoch(self, record: Epoch, version: str) -> str:
        return await self._swap_epoch(record, clean_etag(version))

    async def _swap_epoch(self, record: Epoch, expected: str | None) -> str:
        key = self._epoch_key(record.cluster, record.node, record.epoch)
        version = await self._swap(key, encode(record),
                                   f"epoch {record.node}@{record.epoch} ({self._url(key)})",
                                   expected)
        if record.ended_by is not None:
            # An object listing shows keys, not bodies: an empty object beside
            # the record tells the next listings that it is ended (a hint:
            # readers read the record before they believe it).
            try:
                await self._call("put_object", key + _ENDED, Key=key + _ENDED, Body=b"",
                                 ContentType="text/plain")
            except Exception as e:  # peers then find the end after a TTL of silence
                log.warning("could not mark the epoch %s@%s ended (%s): %s", record.node,
                            record.epoch, self._url(key + _ENDED), e)
        return version

    async def delete_epoch(self, cluster: str, node: str, epoch: str) -> None:
        key = self._epoch_key(cluster, node, epoch)
        for target in (key, key + _ENDED):
            try:
                await self._call("delete_object", target, Key=target)
            except _S3Failure as e:
                if not (e.status == 404 or e.code == "NoSuchKey"):
                    raise

    # -- the start-up probe ----------------------------------------------------------------------

    async def check(self) -> None:
        """Probe that the bucket is reachable, that this client may list, read
        and write it, and that conditional PUTs are enforced; raise
        `StoreUnsafe` if a condition is ignored, `StoreError` if the endpoint
        or bucket cannot be used. Whatever the outcome, the probe objects are
        removed (see `probe.probe`)."""
        await probe(self)
