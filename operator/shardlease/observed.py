"""What this node saw of each record, and since when: client-go's
observedRecord / observedTime, for every record a node watches.

A node decides that another node is gone when that node's record (a lease,
an epoch, the leader Lease) has stayed the same version for a TTL. "For a
TTL" is measured on the observer's own monotonic clock only: from the moment
this node first saw that version to now. The times written inside a record
(its `at`, its renewTime) are another machine's wall clock; comparing them
with ours would let clock skew, or a clock stepped by NTP, make a live owner
look expired and give one shard (or the leadership) to two nodes. So a
record's wall-clock times are never compared here: only its version, and our
own monotonic readings of when it changed.
"""

from __future__ import annotations

from collections.abc import Collection, Hashable, ItemsView, KeysView
from dataclasses import dataclass
from typing import Generic, TypeVar

#: The version recorded for something with no record at all (missing or
#: deleted): being missing is a state that can stay unchanged for a TTL too.
MISSING = "\0missing"

K = TypeVar("K", bound=Hashable)
R = TypeVar("R")


@dataclass(frozen=True, slots=True)
class Seen(Generic[R]):
    """A record as this node saw it: its version, the monotonic time that
    version was first seen, and the record itself if the caller keeps it."""

    version: str
    since: float
    record: R | None = None


class Observed(Generic[K, R]):
    """What this node saw of each record, keyed by K: its version and since
    when (on the observer's monotonic clock)."""

    __slots__ = ("_seen",)

    def __init__(self) -> None:
        self._seen: dict[K, Seen[R]] = {}  # insertion-ordered: simulations replay

    def see(self, key: K, version: str, now: float, record: R | None = None) -> bool:
        """Record `version` of `key` seen at `now`. True if it is new or changed
        (its `since` is now `now`); False if unchanged (nothing is updated,
        so the time it has been seen unchanged keeps growing)."""
        seen = self._seen.get(key)
        if seen is not None and seen.version == version:
            return False
        self._seen[key] = Seen(version, now, record)
        return True

    def missing(self, key: K, now: float) -> bool:
        """Record that `key` has no record at `now` (`see` with MISSING)."""
        return self.see(key, MISSING, now)

    def get(self, key: K) -> Seen[R] | None:
        return self._seen.get(key)

    def unchanged_for(self, key: K, now: float) -> float | None:
        """Seconds since the current version of `key` was first seen, None if
        `key` was never seen (or forgotten)."""
        seen = self._seen.get(key)
        return None if seen is None else now - seen.since

    def forget(self, key: K) -> None:
        """Drop `key` (no error if it was not seen)."""
        self._seen.pop(key, None)

    def forget_except(self, keys: Collection[K]) -> None:
        """Drop every key not in `keys`."""
        for key in [k for k in self._seen if k not in keys]:
            del self._seen[key]

    def keys(self) -> KeysView[K]:
        return self._seen.keys()

    def items(self) -> ItemsView[K, Seen[R]]:
        return self._seen.items()

    def __contains__(self, key: object) -> bool:
        return key in self._seen

    def __len__(self) -> int:
        return len(self._seen)

    def __repr__(self) -> str:
        return f"Observed({self._seen!r})"
