"""Telemetry: events as values, delivered to subscribers.

The seed's events (claim, release, lost, self_fence, renew_failed) plus the
runner's opened/closed, renew_slow (the warning before a fence), overrun (a
fenced close abandoned at the lease's expiry) and extend_failed (a host that
was not told a shard's new validity), as frozen dataclasses.
Subscribers are plain callables (the Python hook API); the Prometheus metrics
and the structured logs are two such subscribers. A subscriber that raises is
logged and never disturbs the loop.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from prometheus_client import CollectorRegistry

logger = logging.getLogger("shardlease")


@dataclass(frozen=True, kw_only=True)
class Event:
    cluster: str
    node: str

    @property
    def kind(self) -> str:
        return type(self).KIND  # type: ignore[attr-defined, no-any-return]


@dataclass(frozen=True, kw_only=True)
class Claim(Event):
    KIND = "claim"
    shard: int
    generation: int


@dataclass(frozen=True, kw_only=True)
class Release(Event):
    KIND = "release"
    shard: int
    #: Freed by the end of this node's epoch (a node-mode stop): the one
    #: write that freed every lease of it, so no more frees follow.
    ended: bool = False


@dataclass(frozen=True, kw_only=True)
class Lost(Event):
    KIND = "lost"
    shard: int


@dataclass(frozen=True, kw_only=True)
class SelfFence(Event):
    KIND = "self_fence"
    shards: tuple[int, ...]


@dataclass(frozen=True, kw_only=True)
class RenewFailed(Event):
    KIND = "renew_failed"
    shards: tuple[int, ...]
    error: str


@dataclass(frozen=True, kw_only=True)
class RenewSlow(Event):
    """No renewal has moved these shards' deadlines, and less than `left`
    seconds remain before they are fenced: the warning before a self-fence."""

    KIND = "renew_slow"
    shards: tuple[int, ...]
    left: float


@dataclass(frozen=True, kw_only=True)
class Overrun(Event):
    """A fenced shard's close did not end before its lease could be taken by
    another node: the runner abandoned it (`late`: seconds past the deadline)."""

    KIND = "overrun"
    shard: int
    generation: int
    late: float


@dataclass(frozen=True, kw_only=True)
class LeftToExpire(Event):
    """This node is done with a shard its host may still have open (the close
    failed, was abandoned, or was cut short as the node was stopped short):
    its lease is not freed before it expires, at most `left` seconds from now
    (the seed's rule: stop the shard, and only then free the lease)."""

    KIND = "left_to_expire"
    shard: int
    left: float


@dataclass(frozen=True, kw_only=True)
class EpochEnded(Event):
    """Node-mode renewal: the epoch `epoch` of node `owner` was ended, by this
    node (`owner` != `node`: it takes over the epoch's leases) or by a peer
    (`owner` == `node`: this node learned it and fenced `shards`)."""

    KIND = "epoch_ended"
    owner: str
    epoch: str
    shards: tuple[int, ...] = ()


@dataclass(frozen=True, kw_only=True)
class ExtendFailed(Event):
    """The host was not told these shards' new validity (a `LeasedHost`'s
    `extend` failed or took longer than an interval): it may stop acting on
    them before the runner fences them. Retried with the next pass."""

    KIND = "extend_failed"
    shards: tuple[int, ...]
    error: str


@dataclass(frozen=True, kw_only=True)
class Opened(Event):
    KIND = "opened"
    shard: int
    generation: int
    #: The runner's deadline, on the node's monotonic clock, and converted to
    #: the node's wall clock for recorders comparing nodes on one machine.
    deadline: float
    deadline_wall: float


@dataclass(frozen=True, kw_only=True)
class DeadlineMoved(Event):
    """A renewal moved a shard's deadline (for recorders of the safety rule)."""

    KIND = "deadline"
    shard: int
    generation: int
    deadline: float
    deadline_wall: float


@dataclass(frozen=True, kw_only=True)
class Closed(Event):
    KIND = "closed"
    shard: int
    reason: str


@dataclass(frozen=True, kw_only=True)
class CorruptLease(Event):
    KIND = "corrupt"
    shard: int
    error: str


@dataclass(frozen=True, kw_only=True)
class NewerRecord(Event):
    """A lease record of a format newer than this version knows: never
    claimed, held by whoever wrote it (docs/renewal.md, "Record formats")."""

    KIND = "newer_format"
    shard: int
    format: int


@dataclass(frozen=True, kw_only=True)
class Joined(Event):
    """This node's liveness record (its first epoch, or its first heartbeat)
    landed: peers may count it from their next listing (what a hint to them
    is for: `shardlease.hints`)."""

    KIND = "joined"


@dataclass(frozen=True, kw_only=True)
class Round(Event):
    KIND = "round"
    live_nodes: int
    share: int
    held: int
    duration: float
    ok: bool
    #: Whether a hint (a peer freed leases or joined) started it early.
    hinted: bool = False


Subscriber = Callable[[Event], None]


@dataclass
class Telemetry:
    subscribers: list[Subscriber] = field(default_factory=list)

    def subscribe(self, subscriber: Subscriber) -> Callable[[], None]:
        """Add a hook; returns a function that removes it."""
        self.subscribers.append(subscriber)
        return lambda: self.subscribers.remove(subscriber)

    def emit(self, event: Event) -> None:
        for subscriber in list(self.subscribers):
            try:
                subscriber(event)
            except Exception:
                logger.exception("telemetry subscriber %r failed on %s", subscriber, event.kind)


class EventLog:
    """Structured logs: one record per event, its fields in `extra`, with
    `shardset` and `pod` (the event's cluster and node) and the generation
    this node held of the shard where the event does not carry it: a
    release, a loss or a close follows the claim or the open that named it
    (an in-process table, a shard's entry dropped once its lease is freed or
    lost). The message is the event's own fields, as people read it."""

    def __init__(self) -> None:
        # (cluster, node, shard) -> generation: several nodes may share a process.
        self._claimed: dict[tuple[str, str, int], int] = {}
        self._opened: dict[tuple[str, str, int], int] = {}

    def __call__(self, event: Event) -> None:
        if isinstance(event, Round | DeadlineMoved):
            level = logging.DEBUG
        elif isinstance(event, SelfFence | Lost | RenewFailed | RenewSlow | CorruptLease
                        | NewerRecord | EpochEnded | ExtendFailed):
            level = logging.WARNING
        elif isinstance(event, Overrun | LeftToExpire):
            level = logging.ERROR
        else:
            level = logging.INFO
        fields = asdict(event)
        text = " ".join(f"{k}={v}" for k, v in fields.items())
        structured = {**fields, "shardset": event.cluster, "pod": event.node,
                      **self._generations(event)}
        logger.log(level, "%s %s", event.kind, text,
                   extra={"event": event.kind, "fields": structured})

    def _generations(self, event: Event) -> dict[str, object]:
        def key(shard: int) -> tuple[str, str, int]:
            return (event.cluster, event.node, shard)

        def held(shard: int) -> int | None:
            # The open's generation first: a close after a loss follows the
            # open it closes, the lease's entry being gone with the loss.
            return self._opened.get(key(shard), self._claimed.get(key(shard)))

        match event:
            case Claim(shard=shard, generation=generation):
                self._claimed[key(shard)] = generation
            case Opened(shard=shard, generation=generation):
                self._opened[key(shard)] = generation
            case Closed(shard=shard):
                known = held(shard)
                self._opened.pop(key(shard), None)
                return {} if known is None else {"generation": known}
            case Release(shard=shard) | Lost(shard=shard):
                known = self._claimed.pop(key(shard), None)
                return {} if known is None else {"generation": known}
            case LeftToExpire(shard=shard):
                # Still this node's lease until it expires: a release may follow.
                known = self._claimed.get(key(shard))
                return {} if known is None else {"generation": known}
            case SelfFence(shards=shards):
                return {"generations": [held(s) for s in shards]}
        return {}


#: The event log of processes with no log of their own (the bench); keyed by
#: cluster and node, so sharing it is safe.
log_events = EventLog()


class PrometheusMetrics:
    """Counters and gauges for the events, on a prometheus-client registry."""

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        from prometheus_client import REGISTRY, Counter, Gauge, Histogram

        reg = registry if registry is not None else REGISTRY
        labels = ["cluster", "node"]
        self.claims = Counter("shardlease_claims", "Leases claimed", labels, registry=reg)
        self.releases = Counter("shardlease_releases", "Leases released", labels, registry=reg)
        self.lost = Counter("shardlease_lost", "Leases found taken", labels, registry=reg)
        self.fenced = Counter("shardlease_self_fenced_shards", "Shards closed at their deadline",
                              labels, registry=reg)
        self.renew_failed = Counter("shardlease_renew_failures", "Rounds with failed renewals",
                                    labels, registry=reg)
        self.renew_slow = Counter("shardlease_renew_slow_shards",
                                  "Shards whose renewal was late enough to threaten their "
                                  "deadline", labels, registry=reg)
        self.overruns = Counter("shardlease_close_overruns",
                                "Fenced closes abandoned at the lease's expiry", labels,
                                registry=reg)
        self.left_to_expire = Counter("shardlease_left_to_expire",
                                      "Leases left to expire because their shard's close did "
                                      "not succeed", labels, registry=reg)
        self.extend_failed = Counter("shardlease_extend_failures",
                                     "Validity extensions the host was not told", labels,
                                     registry=reg)
        self.corrupt = Counter("shardlease_corrupt_records", "Corrupt lease records read",
                               labels, registry=reg)
        self.newer = Counter("shardlease_newer_records",
                             "Lease records of a format newer than this version knows (never "
                             "claimed by it)", labels, registry=reg)
        self.epochs_ended = Counter("shardlease_epochs_ended",
                                    "Epochs ended: by this node (role=peer), or this node's "
                                    "own, ended by a peer (role=own)", [*labels, "role"],
                                    registry=reg)
        self.held = Gauge("shardlease_held_shards", "Leases held by this node", labels,
                          registry=reg)
        self.live = Gauge("shardlease_live_nodes", "Nodes seen live", labels, registry=reg)
        self.share = Gauge("shardlease_fair_share", "ceil(shards / live nodes)", labels,
                           registry=reg)
        self.rounds = Histogram("shardlease_round_seconds", "Duration of a placement round",
                                labels, registry=reg)

    def __call__(self, event: Event) -> None:
        lab = (event.cluster, event.node)
        match event:
            case Claim():
                self.claims.labels(*lab).inc()
            case Release():
                self.releases.labels(*lab).inc()
            case Lost():
                self.lost.labels(*lab).inc()
            case SelfFence(shards=shards):
                self.fenced.labels(*lab).inc(len(shards))
            case RenewFailed():
                self.renew_failed.labels(*lab).inc()
            case RenewSlow(shards=shards):
                self.renew_slow.labels(*lab).inc(len(shards))
            case Overrun():
                self.overruns.labels(*lab).inc()
            case ExtendFailed():
                self.extend_failed.labels(*lab).inc()
            case LeftToExpire():
                self.left_to_expire.labels(*lab).inc()
            case CorruptLease():
                self.corrupt.labels(*lab).inc()
            case NewerRecord():
                self.newer.labels(*lab).inc()
            case EpochEnded(owner=owner):
                self.epochs_ended.labels(*lab, "own" if owner == event.node else "peer").inc()
            case Round(live_nodes=live, share=share, held=held, duration=duration):
                self.held.labels(*lab).set(held)
                self.live.labels(*lab).set(live)
                self.share.labels(*lab).set(share)
                self.rounds.labels(*lab).observe(duration)
            case _:
                pass
