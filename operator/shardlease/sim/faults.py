"""The faults a scenario injects, as plain values (times are virtual seconds
from the start of the simulation; node names are the simulation's, n0, n1...)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Crash:
    """The node dies at `at`: no graceful step at all (see `world.World.crash`
    and the world module's docstring)."""

    at: float
    node: str


@dataclass(frozen=True)
class Abort:
    """The node is stopped short at `at`, its store and host still there (what
    it does on its way out reaches them, unlike a crash). `what` ends:
    "loop", the placement loop cancelled (a second SIGTERM during a graceful
    stop: `shardlease node` cancels it then); "runner", the runner's task
    (it died); "task", one of the loop's own tasks (the renewals: a bug).
    The process then exits: what its host still has open is recorded
    abandoned, bounded by the deadline it was last given (the application's
    validity), and its lease must not be freed before it expires."""

    at: float
    node: str
    what: str = "loop"

    def __post_init__(self) -> None:
        if self.what not in ABORTS:
            raise ValueError(f"unknown abort {self.what!r}; use one of {ABORTS}")


#: What an `Abort` ends, and the task of the node's loop it cancels (None:
#: the loop itself).
ABORTS = ("loop", "runner", "task")
ABORT_TASKS = {"loop": None, "runner": "shardlease-runner", "task": "shardlease-renewals"}


@dataclass(frozen=True)
class Pause:
    """Every store and host call of the node that starts, or whose answer
    arrives, during [at, at + duration) waits until the pause ends: SIGSTOP as
    seen at the node's next I/O. Its timers keep running (see world.py)."""

    at: float
    node: str
    duration: float


@dataclass(frozen=True)
class StoreFault:
    """Store calls started in [at, until) by `node` (every node if None) take
    `latency` + uniform(0, `jitter`) seconds and fail with `error_rate`
    (before reaching the store, like a 503 answer) or `lost_reply_rate`
    (after the store applied the call: the answer is lost). Draws come from a
    seeded RNG per node. `calls` limits the fault to those store methods
    (`STORE_CALLS`); None means every call. `stale`: the node's listings
    in the window all return what its first listing in it returned (a view
    stale by up to the window: a lagging cache or watch). `reply_share`: the
    share of each call's delay that comes after the store applied it (the
    answer on its way back; 0: the whole delay is before): a call its caller
    stops waiting for in that part (cancelled, or past its budget) has
    landed unheard, as an HTTP request whose client gave up may have.
    `shards`: only the calls about those shards' leases (a GET, a claim, a
    renewal or a free of one of them; a hot key of the store); None means
    every call."""

    at: float
    until: float
    node: str | None = None
    latency: float = 0.0
    jitter: float = 0.0
    error_rate: float = 0.0
    lost_reply_rate: float = 0.0
    calls: frozenset[str] | None = None
    shards: frozenset[int] | None = None
    stale: bool = False
    reply_share: float = 0.0

    def __post_init__(self) -> None:
        if not 0.0 <= self.reply_share <= 1.0:
            raise ValueError(f"reply_share must be within [0, 1]: {self.reply_share}")
        if self.calls is not None and not self.calls <= STORE_CALLS:
            raise ValueError(f"unknown store calls {sorted(self.calls - STORE_CALLS)}; "
                             f"use some of {sorted(STORE_CALLS)}")


#: The store methods a `StoreFault` may be limited to. Lease writes are
#: create_lease (claims) and update_lease (renewals, frees).
STORE_CALLS = frozenset({"list_leases", "get_lease", "create_lease", "update_lease",
                         "list_heartbeats", "put_heartbeat", "delete_heartbeat",
                         "list_epochs", "get_epoch", "create_epoch", "update_epoch",
                         "delete_epoch"})
LEASE_WRITES = frozenset({"create_lease", "update_lease"})


@dataclass(frozen=True)
class HostFault:
    """Host calls started in [at, until) by `node` (every node if None) take
    the given latency and fail (HostError) with the given rates. Opens of the
    shards in `refuse` always fail: a host that cannot serve those shards."""

    at: float
    until: float
    node: str | None = None
    open_latency: float = 0.0
    close_latency: float = 0.0
    open_error_rate: float = 0.0
    close_error_rate: float = 0.0
    refuse: frozenset[int] = frozenset()


@dataclass(frozen=True)
class Join:
    """A node starts at `at` (a new name, or the name of a crashed or departed
    node: a new incarnation), its wall clock skewed by `wall_skew` seconds."""

    at: float
    node: str
    wall_skew: float = 0.0


@dataclass(frozen=True)
class Leave:
    """The node stops gracefully (`PlacementLoop.stop()`) at `at`; with
    `hold` > 0 its leases are kept for its name that long (`handoff: hold`:
    a pod being replaced)."""

    at: float
    node: str
    hold: float = 0.0


@dataclass(frozen=True)
class Reconfigure:
    """At `at`, `node`'s loop (every running node's if None) gets its options
    with `changes` ((option, value) pairs, e.g. (("lease_ttl", 30.0),)) applied
    in place (`PlacementLoop.reconfigure`). A change that is invalid with a
    node's options of the moment is recorded (reconfigure_invalid) and skipped.
    Nodes that join later start with the scenario's options and every change
    made with `node` None (the cluster's spec). The shard count is not for
    this (the checks of quiescence count the scenario's)."""

    at: float
    node: str | None
    changes: tuple[tuple[str, float | int | None], ...]

    def __post_init__(self) -> None:
        if any(k == "shards" for k, _ in self.changes):
            raise ValueError("a Reconfigure of the shard count is not simulated")


@dataclass(frozen=True)
class Corrupt:
    """At `at`, the lease record of `shard` is overwritten with bytes that are
    no lease (a new version): a hand edit, a bad tool, a disk error. `how`:
    "garbage" (nothing of the record left, its generation neither), "truncated"
    (its first half: JSON cut short, the generation often still in it),
    "invalid" (the same JSON with its ttl made a string: every field but one
    still readable), or "deleted" (the record removed: a deleted Lease, a store
    changed under the cluster). A shard without a record gets garbage."""

    at: float
    shard: int
    how: str = "garbage"

    def __post_init__(self) -> None:
        if self.how not in CORRUPTIONS:
            raise ValueError(f"unknown corruption {self.how!r}; use one of {CORRUPTIONS}")


CORRUPTIONS = ("garbage", "truncated", "invalid", "deleted")


@dataclass(frozen=True)
class Hints:
    """Not a fault: how the peers' hints travel (`PlacementLoop.hint`, what
    `shardlease.hints` sends when a node frees leases or joins). Each hint
    to each peer is lost with probability `drop`, else delivered after
    uniform(0, `delay`) seconds. A hint only wakes a round; the checks are
    the same with or without them."""

    drop: float = 0.0
    delay: float = 0.0


Fault = Crash | Abort | Pause | StoreFault | HostFault | Join | Leave | Reconfigure | Corrupt


def fault_end(fault: Fault) -> float:
    """When a fault stops acting (for the settling time after the last one):
    a slow call started just before its end fails or answers that much later."""
    match fault:
        case Pause(at=at, duration=d):
            return at + d
        case StoreFault(until=until, latency=latency, jitter=jitter):
            return until + latency + jitter  # a call started just before `until` ends then
        case HostFault(until=until, open_latency=ol, close_latency=cl):
            return until + max(ol, cl)
        case _:
            return fault.at
