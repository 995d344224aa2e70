"""The Kubernetes store's informer: one cluster's watch-fed cache of Leases,
kept up to date (LISTed, watched from there, LISTed again on a 410 or once
stale), with our own writes' echoes tracked and each change told to its
subscribers (see the package's doc). The requests themselves are the
store's: an informer is handed a LIST and a watch to call."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import logging
import random
import time
from collections.abc import Awaitable, Callable
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal

from shardlease.errors import KubeAPIError, StoreError
from shardlease.stores.base import Change
from shardlease.stores.kubernetes.codec import _decode, _Entry, _status_error

if TYPE_CHECKING:
    import aiohttp

logger = logging.getLogger("shardlease.store.kubernetes")

#: Server-side timeout of one watch request (`timeoutSeconds`), by default.
WATCH_TIMEOUT = 10.0
#: A cache is stale once no sign of life came for watch_timeout + this long.
STALE_MARGIN = 5.0
#: A cache is stale once a write of ours answered this long ago has not come
#: back as a watch event (the API server sends events within milliseconds).
ECHO_LIMIT = 5.0
#: Longest line (one watch event) accepted from a watch, in bytes (etcd's
#: own limit on an object is 1.5 MiB).
WATCH_LINE_LIMIT = 4 * 1024 * 1024
#: Pause before re-opening a watch that failed: doubling up to the second.
WATCH_RETRY_FIRST, WATCH_RETRY_MAX = 0.2, 2.0


def _retrieve(future: asyncio.Future[Any]) -> None:
    """Done callback: a failure nobody waited for is not logged as unretrieved."""
    if not future.cancelled():
        future.exception()


class _Expired(Exception):
    """The server no longer has the history a watch asked for (410 Gone)."""


@dataclass
class _View:
    """The watch-fed cache of one cluster's Leases (see the module doc)."""

    cluster: str
    #: The last resourceVersion the cache is complete up to (a LIST's, then
    #: each event's and bookmark's): the next watch starts there.
    version: str
    entries: dict[str, _Entry]
    #: monotonic time of the last sign of life (watch answered, event, bookmark).
    sign: float
    #: Why the cache is no longer in sync (410, a watch that gave up), or None.
    broken: str | None = None
    #: name -> (the version our write made, None for a deletion; monotonic time
    #: its answer arrived): our writes whose watch event has not come yet.
    pending: dict[str, tuple[str | None, float]] = dataclasses.field(default_factory=dict)
    task: asyncio.Task[None] | None = None
    #: Watch events applied and skipped, watches opened (for tests and figures).
    events: int = 0
    bookmarks: int = 0

    def stale(self, now: float, stale_after: float) -> str | None:
        """Why this cache may not answer a read now, or None if it may."""
        if self.broken is not None:
            return self.broken
        if self.task is None or self.task.done():
            return "its watch is not running"
        if now - self.sign > stale_after:
            return (f"no event, bookmark or watch answer for {now - self.sign:.1f}s "
                    f"(more than {stale_after:g}s)")
        if self.pending:
            name, (_, when) = min(self.pending.items(), key=lambda item: item[1][1])
            if now - when > ECHO_LIMIT:
                return (f"our write of {name} did not come back on the watch within "
                        f"{ECHO_LIMIT:g}s")
        return None

    def apply(self, kind: str, obj: dict[str, Any], namespace: str) -> _Entry | None:
        """One watch event (ADDED, MODIFIED or DELETED): the entry it shows
        (for a deletion, the object as it was), None if it was skipped."""
        meta = obj.get("metadata") or {}
        name = str(meta.get("name", ""))
        version = str(meta.get("resourceVersion", ""))
        if (mine := self.pending.get(name)) is not None:
            if (mine[0] is None) != (kind == "DELETED") or (mine[0] is not None
                                                           and mine[0] != version):
                return None  # from before our write (events of one object come in order)
            del self.pending[name]
        if kind == "DELETED":
            gone = self.entries.pop(name, None)
            return gone if gone is not None else _decode(obj, self.cluster, namespace)[1]
        name, entry = _decode(obj, self.cluster, namespace, self.entries)
        self.entries[name] = entry
        return entry

    def wrote(self, name: str, obj: dict[str, Any] | None, namespace: str, now: float) -> None:
        """A write of ours to `name` was answered: `obj` is the object it
        returned (None: we deleted it)."""
        if obj is None:
            self.entries.pop(name, None)
            self.pending[name] = (None, now)
            return
        known = self.entries.get(str((obj.get("metadata") or {}).get("name", "")))
        name, entry = _decode(obj, self.cluster, namespace, self.entries)
        self.entries[name] = entry
        if known is None or known.version != entry.version:  # (a no-op write has no event)
            self.pending[name] = (entry.version, now)


#: Every Lease of the cluster the store keeps (one LIST, however many pages),
#: and the listing's resourceVersion.
Lister = Callable[[], Awaitable[tuple[list[dict[str, Any]], str]]]
#: A watch of the same Leases from a resourceVersion, its body still unread.
Watcher = Callable[[str], AbstractAsyncContextManager["aiohttp.ClientResponse"]]


class Informer:
    """The watch-fed cache of one cluster (see the module doc)."""

    def __init__(self, cluster: str, namespace: str, stale_after: float, *,
                 list_leases: Lister, watch_leases: Watcher,
                 loaded: Callable[[str], None]) -> None:
        self.cluster = cluster
        self.namespace = namespace
        self.stale_after = stale_after
        self._list = list_leases
        self._open = watch_leases
        #: Told the cluster each time a LIST loads the cache (the store's
        #: `resyncs`, one list for every cluster, in order).
        self._loaded = loaded
        #: The cache: None until the first read, and again once stopped.
        self.view: _View | None = None
        #: The (re)LIST in progress, so concurrent reads share one.
        self._syncing: asyncio.Future[_View] | None = None
        #: Who is told of each change the watch sees (`subscribe`); `stop`
        #: ends the watch, not the subscriptions.
        self._watchers: list[Callable[[Change], None]] = []

    async def stop(self) -> None:
        tasks: list[asyncio.Future[Any]] = [self.view.task] \
            if self.view is not None and self.view.task is not None else []
        if self._syncing is not None:
            tasks.append(self._syncing)
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        self.view = None
        self._syncing = None

    async def read(self) -> _View:
        """The cache, LISTed again first unless in sync and fresh."""
        view = self.view
        if view is not None and view.stale(time.monotonic(), self.stale_after) is None:
            return view
        syncing = self._syncing
        if syncing is None or syncing.done():
            # One LIST for every read that finds the cache unusable meanwhile
            # (the leases and the heartbeats of a round); it goes on if they
            # stop waiting, like any request the loop abandons.
            syncing = asyncio.ensure_future(self._resync())
            syncing.add_done_callback(_retrieve)
            self._syncing = syncing
        return await asyncio.shield(syncing)

    async def _resync(self) -> _View:
        """LIST the cluster's Leases into a new cache and watch from there."""
        cluster = self.cluster
        old = self.view
        if old is not None:
            why = old.stale(time.monotonic(), self.stale_after)
            if why is None:
                return old  # (a LIST finished just before this one started)
            logger.warning("kubernetes store: the cache of cluster %s is out of date (%s); "
                           "listing its leases again", cluster, why)
            if old.task is not None:
                old.task.cancel()
        started = time.monotonic()
        items, version = await self._list()
        known = old.entries if old is not None else None
        entries = dict(_decode(obj, cluster, self.namespace, known) for obj in items)
        view = _View(cluster, version, entries, time.monotonic())
        if old is not None:
            for name, (written, when) in old.pending.items():
                if when < started:
                    continue  # answered before the LIST was sent: the LIST shows it or later
                # Answered while the LIST ran: the LIST may predate it.
                view.pending[name] = (written, when)
                if written is None:
                    entries.pop(name, None)
                elif name in old.entries:
                    entries[name] = old.entries[name]
        self.view = view
        self._loaded(cluster)
        view.task = asyncio.create_task(self._watch(view), name=f"watch leases of {cluster}")
        return view

    def wrote(self, name: str, obj: dict[str, Any] | None, now: float) -> None:
        """A write of ours to `name` was answered (`obj` None: we deleted it)."""
        view = self.view
        # (A deletion's answer does not say whose the object was.)
        if view is not None and (obj is not None or name in view.entries):
            view.wrote(name, obj, self.namespace, now)

    async def _watch(self, view: _View) -> None:
        """Keep `view` up to date: watch after watch from its last version,
        until the server says that version is gone or the cache is stale."""
        delay = WATCH_RETRY_FIRST
        while True:
            try:
                await self._watch_once(view)
                delay = WATCH_RETRY_FIRST
                continue
            except _Expired as e:
                view.broken = f"the server no longer has version {view.version} ({e})"
                logger.info("kubernetes store: watch of cluster %s: %s", view.cluster,
                            view.broken)
                return
            except Exception as e:  # the connection, the server, a malformed event
                failure = e
            if (silent := time.monotonic() - view.sign) > self.stale_after:
                view.broken = (f"no event, bookmark or watch answer for {silent:.1f}s (more than "
                               f"{self.stale_after:g}s); the watch: {failure}")
                logger.warning("kubernetes store: watch of cluster %s: %s", view.cluster,
                               view.broken)
                return
            logger.info("kubernetes store: watch of cluster %s failed, watching again from "
                        "version %s: %s", view.cluster, view.version, failure)
            await asyncio.sleep(delay * (0.5 + random.random()))
            delay = min(2 * delay, WATCH_RETRY_MAX)

    async def _watch_once(self, view: _View) -> None:
        """One watch request, read to its end (the server's timeoutSeconds)."""
        try:
            async with self._open(view.version) as resp:
                if resp.status != 200:
                    data = await resp.read()
                    try:
                        payload = json.loads(data) if data else {}
                    except ValueError:
                        payload = {"message": data[:300].decode(errors="replace")}
                    if resp.status == 410:
                        raise _Expired(str(payload.get("message", "410 Gone")))
                    raise _status_error(f"watching leases of {view.cluster}", int(resp.status),
                                        payload)
                view.sign = time.monotonic()
                buffer = bytearray()
                async for chunk in resp.content.iter_any():
                    buffer += chunk
                    while (end := buffer.find(b"\n")) >= 0:
                        line = bytes(buffer[:end])
                        del buffer[:end + 1]
                        if line.strip():
                            self._event(view, line)
                    if len(buffer) > WATCH_LINE_LIMIT:
                        raise StoreError(f"kubernetes store: a watch event of cluster "
                                         f"{view.cluster} is over {WATCH_LINE_LIMIT} bytes")
        except KubeAPIError as e:
            raise StoreError(f"kubernetes store: watching leases of {view.cluster} failed: "
                             f"{e}") from None

    def _event(self, view: _View, line: bytes) -> None:
        event = json.loads(line)
        kind = event.get("type")
        obj = event.get("object") or {}
        if kind == "ERROR":
            if obj.get("code") == 410:
                raise _Expired(str(obj.get("message", "410 Gone")))
            raise _status_error(f"watching leases of {view.cluster}", int(obj.get("code") or 0),
                                obj)
        if kind == "BOOKMARK":
            view.bookmarks += 1
        elif kind in ("ADDED", "MODIFIED", "DELETED"):
            entry = view.apply(kind, obj, self.namespace)
            view.events += 1
            if entry is not None and self._watchers:
                self._notify(kind, entry)
        else:
            raise StoreError(f"kubernetes store: unknown watch event type {kind!r}")
        version = (obj.get("metadata") or {}).get("resourceVersion")
        if version:
            view.version = str(version)
        view.sign = time.monotonic()

    def subscribe(self, callback: Callable[[Change], None]) -> Callable[[], None]:
        """Tell `callback` of each change the watch sees, until the call it returns."""
        self._watchers.append(callback)

        def unsubscribe() -> None:
            with contextlib.suppress(ValueError):
                self._watchers.remove(callback)

        return unsubscribe

    def _notify(self, kind: str, entry: _Entry) -> None:
        what: Literal["added", "modified", "deleted"] = \
            "added" if kind == "ADDED" else "deleted" if kind == "DELETED" else "modified"
        if entry.kind == "shard":
            rec = entry.stored.record if entry.stored is not None else None
            change = Change("lease", what, free=rec is not None and rec.owner is None)
        elif entry.kind == "heartbeat" and entry.node is not None:
            change = Change("heartbeat", what, node=entry.node)
        elif entry.kind == "epoch" and entry.node is not None:
            change = Change("epoch", what, node=entry.node, ended=entry.ended)
        else:
            return
        for callback in list(self._watchers):
            try:
                callback(change)
            except Exception:  # a watcher's bug must not end the watch
                logger.exception("kubernetes store: a change watcher of cluster %s failed",
                                 self.cluster)
