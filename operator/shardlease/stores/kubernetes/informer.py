"""The Kubernetes store's watch-fed cache of one cluster's Leases (the
state an informer keeps): what it holds, when it may answer a read, and how
a watch event or a write of ours changes it (see the package's doc)."""

from __future__ import annotations

import asyncio
import dataclasses
from dataclasses import dataclass
from typing import Any

from shardlease.stores.kubernetes.codec import _decode, _Entry

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
