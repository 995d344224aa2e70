"""One error hierarchy for shardlease.

Every error the package raises on purpose derives from `ShardleaseError`, so a
caller can catch the domain with one clause and still tell the leaves apart.
The branches say what a caller must do, not where the error came from:

    ShardleaseError
    ├── ConfigError       options or a URL that cannot work: fix and restart
    ├── StoreError        a store call failed (unreachable, refused, timed out): transient
    │   └── StoreUnsafe   the store ignores conditional writes: never run on it
    ├── KubeAPIError      the Kubernetes API server gave no answer (refused, timed out, TLS)
    ├── Conflict          an outcome, not a failure: a compare-and-swap lost
    ├── CorruptRecord     bad data in the store: reported, never trusted
    ├── HostError         the application failed to open or close a shard
    │   └── OutdatedGeneration  it holds that generation or a newer one: claim above it
    ├── EngineError       the placement engine itself cannot go on
    │   └── RunnerDied    the runner stopped; the loop stopped with it
    ├── LoopDied          the agent's placement loop ended with an error while it ran
    ├── PluginError       `kubectl shardlease`: one line for the user, then exit 1
    └── DemoError         `shardlease demo` could not go on

`Conflict` and `CorruptRecord` sit outside `StoreError` on purpose: a retry
loop written as `except StoreError` must neither retry a lost race (re-read
and decide again instead) nor a record that will stay corrupt.

The last three belong to one front end each (the agent, the kubectl plugin,
the demo) and are re-exported from their modules; they live here so that the
whole hierarchy is in one place.
"""

from __future__ import annotations


class ShardleaseError(Exception):
    """Base of every error shardlease raises on purpose."""


class ConfigError(ShardleaseError, ValueError):
    """Options or a store URL that cannot work; the message says what to change."""


class StoreError(ShardleaseError):
    """A lease store call failed (unreachable, refused, timed out).

    Transient: the loop retries renewals within their budget and skips the
    claims of a round whose reads failed.
    """


class StoreUnsafe(StoreError):
    """The store does not enforce conditional writes; running on it could let two
    nodes own one shard, so shardlease refuses to start."""


class KubeAPIError(ShardleaseError):
    """A call to the Kubernetes API server got no answer at all: refused, reset,
    timed out, a TLS failure, or credentials that could not be fetched.

    An answer with an error status is not this: `kubeapi` returns every status
    to its caller, whose decision it is (a 409 is a lost race, a 404 an absent
    object). Transient, like StoreError; the Kubernetes store turns it into one.
    """


class Conflict(ShardleaseError):
    """A compare-and-swap lost: the record changed (or exists) since it was read.

    An answer, not a failure: never retried blindly; the caller re-reads and
    decides again.
    """


class CorruptRecord(ShardleaseError, ValueError):
    """A record in the store is not a valid lease or heartbeat (too big, not JSON,
    wrong fields). Reported, and the shard is treated as held until it expires."""


class HostError(ShardleaseError):
    """The application host failed to open or close a shard."""


class OutdatedGeneration(HostError):
    """The application refused an open because it has seen `highest` (at or
    above the generation asked) for the shard: another owner held that one.
    The one party that always knows the last generation is the application
    (its storage is fenced by it); a store that lost its lease record (a
    store change, a deleted or garbage record) does not. The lease is freed
    with its generation raised to `highest`, so the next claim, by any node,
    is above it."""

    def __init__(self, message: str, *, shard: int, generation: int, highest: int) -> None:
        super().__init__(message)
        self.shard, self.generation, self.highest = shard, generation, highest


class EngineError(ShardleaseError, RuntimeError):
    """The placement engine (loop and runner) cannot go on, or was asked for
    something it must refuse (a shard handed to the runner twice). A
    `RuntimeError` too, for callers written before the hierarchy had it."""


class RunnerDied(EngineError):
    """The runner stopped (cancelled, or a shard worker failed): the loop stops
    with it, after closing every shard it could. The agent should report
    itself unhealthy and restart the loop or the pod."""


class LoopDied(ShardleaseError):
    """The placement loop ended with an error while it ran (not at start)."""


class PluginError(ShardleaseError):
    """What the user is told, in one line, before exiting 1."""


class DemoError(ShardleaseError):
    """The demo could not go on (a node died, no balance in time)."""
