"""One error hierarchy for shardlease.

Every error the package raises on purpose derives from `ShardleaseError`, so a
caller can catch the domain with one clause and still tell the leaves apart.
"""

from __future__ import annotations


class ShardleaseError(Exception):
    """Base of every error shardlease raises on purpose."""


class ConfigError(ShardleaseError, ValueError):
    """Options or a store URL that cannot work; the message says what to change."""


class StoreError(ShardleaseError):
    """A lease store call failed (unreachable, refused, timed out).

    The loop treats it as transient: a failed renewal is retried after half an
    interval, a failed read skips the claims of that round.
    """


class Conflict(StoreError):
    """A compare-and-swap lost: the record changed (or exists) since it was read.

    Never retried blindly: the caller re-reads and decides again.
    """


class CorruptRecord(StoreError):
    """A record in the store is not a valid lease or heartbeat (too big, not JSON,
    wrong fields). Reported, and the shard is treated as held until it expires."""


class StoreUnsafe(StoreError):
    """The store does not enforce conditional writes; running on it could let two
    nodes own one shard, so shardlease refuses to start."""


class HostError(ShardleaseError):
    """The application host failed to open or close a shard."""
