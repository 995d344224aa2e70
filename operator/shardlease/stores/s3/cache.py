"""The S3 store's caches: the records by ETag (a listing GETs only the
leases that moved), and the move marker with what a listing may skip (see
the package's doc)."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Container, Mapping
from dataclasses import dataclass, field
from typing import Literal

from shardlease.records import (
    Lease,
    Stored,
)

#: The move marker's name, in the epochs prefix: every version's
#: `list_epochs` skips a name without "@", and a node-mode node lists that
#: prefix every round, so the marker's ETag usually comes with no request of
#: its own (a heartbeat-prefix name would read as a node to older versions).
MOVED = "moved"
#: Every FULL_LIST_EVERY-th `list_leases` of a cluster lists, whatever the
#: marker says: the safety net for what no marker announces (a hand edit or
#: deletion, a writer that died between its write and its mark, a node of a
#: version without marks in node mode). A listing is a page per 1,000
#: shards: 5 pages at 4,096 shards cost 0.6 requests a round, 9 at 8,192
#: (the most a cluster may have) 1.1; a missed move is seen within 8 rounds.
FULL_LIST_EVERY = 8
#: A heartbeat seen at one ETag in this many listings in a row (of those
#: `list_leases` was told of) is nobody's beat any more (a crashed or
#: stopped peer's leftover); one that changed within them may be a peer of a
#: version that writes no marks.
QUIET_LISTINGS = 3
#: Pauses between attempts at a marker PUT that failed (seconds, doubling).
MARK_RETRY_FIRST, MARK_RETRY_MAX = 0.2, 5.0
#: The marker's ETag when there is no marker object (ETags are never empty).
_NO_MARKER = ""

log = logging.getLogger("shardlease.stores.s3")


class _Records:
    """The lease last read or written at each object key, by its ETag: a
    listing that shows a key at that ETag needs no GET. An entry is served
    as the very same object, which is how `list_leases` tells an unchanged
    lease from a change."""

    def __init__(self) -> None:
        self._by_key: dict[str, Stored[Lease]] = {}
        self._reported: set[str] = set()

    def at(self, key: str, etag: str) -> Stored[Lease] | None:
        """The lease at `key` if it is still at `etag`."""
        seen = self._by_key.get(key)
        return seen if seen is not None and seen.version == etag else None

    def remember(self, key: str, stored: Stored[Lease]) -> Stored[Lease]:
        self._by_key[key] = stored
        return stored

    def forget(self, key: str) -> None:
        self._by_key.pop(key, None)

    def keep_listed(self, directory: str, listed: Container[str]) -> None:
        """Forget the keys under `directory` that a listing of it no longer
        shows: deleted leases would otherwise be kept for good."""
        for key in [k for k in self._by_key if k.startswith(directory) and k not in listed]:
            del self._by_key[key]

    def not_a_lease(self, key: str, url: str) -> None:
        """Warn of a stray object under leases/, once: it is listed every round."""
        if key not in self._reported:
            self._reported.add(key)
            log.warning("ignoring %s: not a lease (the name after leases/ must be "
                        "a shard number)", url)


@dataclass(frozen=True)
class _MarkerRead:
    """The marker as an epoch listing found it (`EpochListing.mark`): which
    store object listed, which cluster, the store's `_ticks` when the
    listing started, and the marker's ETag. `list_leases` uses it only if it
    is its own, of that cluster, from a listing that started after its
    previous call returned."""

    store: object
    cluster: str
    started: int
    etag: str


@dataclass
class _Moves:
    """What one store object knows of one cluster's moves (`list_leases`)."""

    #: The answer of the last full listing, and what it depended on: the
    #: marker ETag read before it (None: not read), `local` when it started.
    view: dict[int, Stored[Lease]] | None = None
    view_marker: str | None = None
    view_local: int = -1
    #: The view holds a lease that changes without a mark (kept by shard
    #: renewal, or unreadable): it is listed every time.
    view_moving: bool = True
    #: The view found a change since the listing before: listed again.
    view_changed: bool = True
    #: Answers from the view since that listing.
    served: int = 0
    #: Bumped when a lease write of this object starts and when it ends (and
    #: by `get_lease`): a view listed across one of them is not served.
    local: int = 0
    #: `_ticks` when the last `list_leases` returned: a marker read by an
    #: epoch listing that started before then is no read for the next call.
    returned: int = -1
    #: Heartbeat ETags by node, with the listings in a row that showed each,
    #: of those `list_leases` was told of (`Listed.heartbeats`); the last one.
    beats: dict[str, tuple[str, int]] = field(default_factory=dict)
    beats_told: Mapping[str, str] | None = None
    #: A mark to PUT, and the task putting marks.
    dirty: bool = False
    flusher: asyncio.Task[None] | None = None

    def marking(self) -> bool:
        return self.dirty or (self.flusher is not None and not self.flusher.done())

    def quiet(self, listing: Mapping[str, str] | None) -> bool:
        """Whether nobody heartbeats by the caller's last heartbeat listing
        (`Listed.heartbeats`), counted in: every heartbeat in it seen at one
        ETag in QUIET_LISTINGS listings in a row. None (no listing, or the
        last one failed): not quiet, and the counts stand. The listing told
        last time, told again, is not counted again."""
        if listing is None:
            return False
        if listing is not self.beats_told:
            seen = self.beats
            self.beats = {node: (etag, seen[node][1] + 1
                                 if seen.get(node, ("",))[0] == etag else 1)
                          for node, etag in listing.items()}
            self.beats_told = listing
        return all(times >= QUIET_LISTINGS for _, times in self.beats.values())


@dataclass(frozen=True)
class ViewFacts:
    """What `list_leases` knows of its last listing's answer (the view) when
    it decides, as plain data: `serve_view` and `head_worth_it` decide from
    it alone, so the rule is a table (tests/stores/test_s3_cache.py)."""

    #: There is a view at all.
    has_view: bool
    #: It holds a lease that changes without a mark (kept by shard renewal
    #: with an owner, or unreadable).
    moving: bool = False
    #: Its listing found a change since the listing before it.
    changed: bool = False
    #: Nobody heartbeats, by the caller's last heartbeat listing (`_Moves.quiet`).
    quiet: bool = True
    #: This object has a mark still to put, or is putting one.
    marking: bool = False
    #: A lease write (or `get_lease`) of this object started or ended since
    #: the view's listing started, or during this call.
    wrote: bool = False
    #: Answers served from the view since its listing.
    served: int = 0


def head_worth_it(facts: ViewFacts) -> bool:
    """Whether a HEAD of the move marker can matter, when the caller's epoch
    listing did not read it: not when the call lists anyway (somebody
    beats, or the view moves). Without a view it can: the marker read
    before this listing is what the next call compares with."""
    return facts.quiet and not (facts.has_view and facts.moving)


def serve_view(facts: ViewFacts, marker: str | None,
               view_marker: str | None) -> Literal["serve", "list"]:
    """Serve the view again, or list: serve only if the marker read since
    the last call (`marker`; None: not read) is the one read before the
    view's listing, and nothing else can have moved a lease unannounced
    (see `S3Store.list_leases`)."""
    if not facts.has_view or marker is None or marker != view_marker:
        return "list"
    if facts.moving or facts.changed or not facts.quiet or facts.marking or facts.wrote:
        return "list"
    return "serve" if facts.served < FULL_LIST_EVERY - 1 else "list"
