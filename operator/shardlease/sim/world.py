"""The simulated world: nodes running the real `PlacementLoop` and `Runner`
against one shared `MemoryBackend`, each through a fault-injecting store and a
recording host, all in one virtual-time event loop.

Crash model. `PlacementLoop.run()` answers cancellation with a best-effort
shutdown (close every shard, free every lease, delete the heartbeat): a crash
must not get that courtesy. A crash therefore first turns the node's store and
host into black holes (every call in flight or to come hangs forever: nothing
the dying node does can reach the store or the application any more, the way
nothing reaches them from a killed process), then cancels every task the node
ever created (the world knows them: tasks inherit a context variable naming
their node), again and again until none is left. What the node's CancelledError
handlers try is swallowed by the black holes. Its telemetry after the crash is
dropped, and the recording host counts its open shards as closed at the crash
(the process and its files are gone).

Pause model. A pause makes every store and host call that starts, or whose
answer comes back, during the pause wait until it ends: SIGSTOP as seen at the
node's next I/O. The node's timers keep running, so the runner fences on time
while the loop is stuck in a store call (what the design promises for a slow
store). A real SIGSTOP also stops the timers; what protects the shard then is
the generation, which the invariant checks account for (an overlap is allowed
once the older owner's deadline has passed).

Determinism. The only randomness is `random.Random` seeded from the scenario
seed and the node's name and incarnation; wall clocks are virtual (epoch +
loop time + skew). uuid4 write ids and incarnations are random but only ever
compared for equality, so the trace is a function of the seed.
"""

from __future__ import annotations

import asyncio
import bisect
import contextvars
import json
import math
import random
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any, TypeVar, cast

from shardlease.clock import LoopClock
from shardlease.errors import HostError, OutdatedGeneration, StoreError
from shardlease.loop import PlacementLoop
from shardlease.options import Options
from shardlease.records import (
    Epoch,
    Heartbeat,
    Lease,
    Renewal,
    Stored,
    decode_heartbeat,
    recover_generation,
    stored_epoch,
    stored_lease,
)
from shardlease.sim.faults import ABORT_TASKS, Hints, HostFault, StoreFault
from shardlease.sim.vloop import SimulationStuck, VirtualTimeLoop
from shardlease.stores.base import LeaseStore, Listed
from shardlease.stores.memory import MemoryBackend, MemoryStore
from shardlease.stores.requests import RequestObservers, count_requests
from shardlease.telemetry import (
    Claim,
    Closed,
    CorruptLease,
    Event,
    Joined,
    Lost,
    Opened,
    Overrun,
    Release,
    RenewFailed,
    RenewSlow,
    Round,
    SelfFence,
    Telemetry,
)

T = TypeVar("T")

CLUSTER = "sim"
#: Virtual wall-clock epoch (2027-01-15): wall = EPOCH + loop time + skew.
EPOCH = 1_800_000_000.0

NODE_VAR: contextvars.ContextVar[SimNode | None] = contextvars.ContextVar(
    "shardlease_sim_node", default=None)


@dataclass(frozen=True, slots=True)
class TraceEvent:
    """One line of the trace. `node` is the node's label (its name, plus
    `#k` for its k-th restart). Kinds:

    host side (recording host): open_call, open_ok, open_err (`detail`
    "outdated": refused for a generation at or below `value`, the highest
    the application's storage holds, that another host opened), open_cancel,
    close_call, close_ok, close_err, close_cancel, abandoned (the runner
    reported the shard closed while the host still has it open);
    runner deadlines: deadline (`value` = the runner's new deadline);
    telemetry: claim, release, lost, self_fence, renew_failed, renew_slow
    (per shard, `value` = seconds left before its fence), overrun (a fenced
    close abandoned at the lease's expiry, `value` = seconds past the
    deadline), opened
    (`value` = deadline), closed (`detail` = reason), corrupt, round
    (`value` = duration, `detail` = live/share/held/ok);
    the world: start, crash (`detail` = shards it held), pause (`value` =
    until), leave, left, balanced, unbalanced.
    """

    t: float
    node: str
    kind: str
    shard: int = -1
    generation: int = -1
    value: float = 0.0
    detail: str = ""


class SimClock(LoopClock):
    """Monotonic time from the (virtual) loop; a virtual, skewed wall clock."""

    def wall(self) -> float:
        return EPOCH + self.monotonic() + self.wall_skew


class SimNode:
    """One incarnation of a node."""

    def __init__(self, world: World, name: str, incarnation: int, wall_skew: float) -> None:
        self.world = world
        self.name = name
        self.label = name if incarnation == 0 else f"{name}#{incarnation}"
        self.wall_skew = wall_skew
        # running, leaving, left, crashed, died; aborting, aborted (`World.abort`)
        self.status = "running"
        self.paused_until = -math.inf
        self.blackholed = False
        # Insertion-ordered (a dict, not a set of tasks hashed by address), so
        # that a crash cancels them in the same order in every run.
        self.tasks: dict[asyncio.Task[Any], None] = {}
        self.had_pause = False
        #: Per shard, when its lease expires in the runner's eyes: the deadline
        #: it was given last + the margin it was given with (inf: unbounded).
        self.expiry: dict[int, float] = {}
        self.store_rng = random.Random(f"{world.seed}/{self.label}/store")
        self.host_rng = random.Random(f"{world.seed}/{self.label}/host")
        self.hint_rng = random.Random(f"{world.seed}/{self.label}/hints")
        self.store = SimStore(world, self)
        #: The store's requests by kind (the report's `requests`).
        self.requests = count_requests(self.store)
        self.host = RecordingHost(world, self)
        self.telemetry = Telemetry()
        self.telemetry.subscribe(self._on_event)
        self.loop = PlacementLoop(self.store, self.host, world.options(name),
                                  peers=world.peer_names, clock=SimClock(wall_skew),
                                  telemetry=self.telemetry,
                                  rng=random.Random(f"{world.seed}/{self.label}/loop"))
        self._wrap_runner()
        self.task: asyncio.Task[None] | None = None
        self.started_at = world.now()
        self.leave_at: float | None = None
        self.ended_at: float | None = None  # crashed, departed or died

    @property
    def live(self) -> bool:
        return self.status == "running"

    async def gate(self) -> None:
        """Where a pause or a crash catches the node's I/O."""
        loop = asyncio.get_running_loop()
        while True:
            if self.blackholed:
                await loop.create_future()  # never resolves: a dead process
            now = loop.time()
            if now >= self.paused_until:
                return
            await asyncio.sleep(self.paused_until - now)

    def _record(self, kind: str, shard: int = -1, generation: int = -1, value: float = 0.0,
                detail: str = "") -> None:
        self.world.record(self.label, kind, shard, generation, value, detail)

    def _wrap_runner(self) -> None:
        """Record every deadline the runner is given (claims and renewals),
        without changing the runner: instance attributes over its methods."""
        runner = self.loop.runner
        start, extend, fence = runner.start, runner.extend, runner.fence

        def start_recorded(shard: int, generation: int, deadline: float) -> None:
            start(shard, generation, deadline)
            self._record("deadline", shard, generation, deadline, "claim")
            self._record_margin(shard)

        def extend_recorded(shard: int, deadline: float) -> None:
            before = runner.deadline(shard)
            extend(shard, deadline)
            after = runner.deadline(shard)
            if after is not None and after != before:
                self._record("deadline", shard, -1, after, "renew")
                self._record_margin(shard)

        def fence_recorded(shards: list[int]) -> None:
            fence(shards)  # (may bring deadlines forward: an ended epoch)
            for shard in shards:
                self._note_expiry(shard)

        setattr(runner, "start", start_recorded)  # noqa: B010 - instance override
        setattr(runner, "extend", extend_recorded)  # noqa: B010
        setattr(runner, "fence", fence_recorded)  # noqa: B010

    def _note_expiry(self, shard: int) -> None:
        deadline, margin = self.loop.runner.deadline(shard), self.loop.runner.margin
        if deadline is not None:
            self.expiry[shard] = deadline + (math.inf if margin is None else margin)

    def _record_margin(self, shard: int) -> None:
        """The margin the deadline just recorded was given with (the runner's
        now): the lease's expiry in this node's eyes is that deadline plus it."""
        self._note_expiry(shard)
        margin = self.loop.runner.margin
        if margin is not None:
            idx, vals = self.world.margins.setdefault((self.label, shard), ([], []))
            idx.append(len(self.world.trace) - 1)
            vals.append(margin)

    def _on_event(self, ev: Event) -> None:
        if self.status in ("crashed", "died"):
            return
        match ev:
            case Claim(shard=s, generation=g):
                self._record("claim", s, g)
            case Release(shard=s, ended=ended):
                self._record("release", s)
                # As shardlease.hints sends them: an epoch's end is complete.
                self.world.send_hints(self, settle=not ended)
            case Joined():
                self.world.send_hints(self, settle=False)
            case Lost(shard=s):
                self._record("lost", s)
            case SelfFence(shards=shards):
                for s in shards:
                    self._record("self_fence", s)
            case RenewFailed(shards=shards, error=error):
                self._record("renew_failed", -1, -1, len(shards), error)
            case RenewSlow(shards=shards, left=left):
                for s in shards:
                    self._record("renew_slow", s, -1, left)
            case Opened(shard=s, generation=g, deadline=d):
                self._record("opened", s, g, d)
            case Closed(shard=s, reason=reason):
                self._record("closed", s, -1, 0.0, reason)
                if s in self.host.open_now:
                    # The runner is done with a shard the host still has open
                    # (a fenced close that kept failing, a close cut short by
                    # an abort): its deadline bounds it (the generation fences
                    # it past that), and its lease must not be freed before it
                    # expires (`value`); it no longer counts as placed.
                    self.abandon(s, "aborted" if self.status == "aborting" else reason)
            case Overrun(shard=s, generation=g, late=late):
                self._record("overrun", s, g, late)
            case CorruptLease(shard=s, error=error):
                self._record("corrupt", s, -1, 0.0, error)
            case Round(live_nodes=live, share=share, held=held, duration=d, ok=ok,
                       hinted=hinted):
                self.world.rounds[self.label] = self.world.rounds.get(self.label, 0) + 1
                self._record("round", -1, -1, d, f"live={live} share={share} held={held} ok={ok}"
                             + (" hinted" if hinted else ""))
            case _:
                pass


    def abandon(self, shard: int, why: str) -> None:
        """The host keeps `shard` open with nobody to close it: recorded
        `abandoned` (`value`: when its lease expires in its node's eyes)."""
        self._record("abandoned", shard, self.host.open_now.pop(shard),
                     self.expiry.get(shard, math.inf), why)
        self.world.host_changed()


class SimStore(LeaseStore):
    """A node's view of the shared backend, with its faults. Reports its
    requests to `backend_requests` like a real store (`stores.requests`)."""

    def __init__(self, world: World, node: SimNode) -> None:
        super().__init__()
        self.backend_requests = RequestObservers()
        self.world = world
        self.node = node
        self.inner = MemoryStore(world.backend, name="sim")
        #: When each request was made (virtual time): requests per interval
        #: of a window, whatever the number of rounds in it.
        self.times: list[float] = []
        #: Listings frozen by a stale-reads fault: (method, window) -> result.
        self._frozen: dict[tuple[str, float], Any] = {}

    def describe(self) -> str:
        return f"sim://{self.node.label}"

    async def _call(self, kind: str, method: str, op: Callable[[], Awaitable[T]],
                    shard: int | None = None) -> T:
        self.backend_requests.report(kind)
        self.times.append(self.world.now())
        node, rng = self.node, self.node.store_rng
        await node.gate()
        latency, jitter, error_rate, lost_rate, reply_share = \
            self.world.store_conditions(node.name, method, shard)
        delay = latency + (rng.uniform(0, jitter) if jitter > 0 else 0.0)
        if delay * (1 - reply_share) > 0:
            await asyncio.sleep(delay * (1 - reply_share))
        if error_rate > 0 and rng.random() < error_rate:
            await node.gate()
            raise StoreError(f"injected {kind} failure")
        result = await op()
        if delay * reply_share > 0:
            # Applied: a caller that gives up from now on has written unheard.
            await asyncio.sleep(delay * reply_share)
        if lost_rate > 0 and rng.random() < lost_rate:
            await node.gate()
            raise StoreError(f"injected {kind} failure: the reply was lost")
        await node.gate()
        return result

    async def _listing(self, method: str, op: Callable[[], Awaitable[T]]) -> T:
        """A listing, or the one taken earlier in a stale-reads window."""
        window = self.world.stale_window(self.node.name)
        if window is None:
            return await self._call("list", method, op)
        key = (method, window)
        if key not in self._frozen:
            self._frozen[key] = await self._call("list", method, op)
        else:
            await self._call("list", method, _noop)
        return cast(T, self._frozen[key])

    async def list_leases(self, cluster: str, *,
                          seen: Listed | None = None) -> dict[int, Stored[Lease]]:
        return await self._listing("list_leases",
                                   lambda: self.inner.list_leases(cluster, seen=seen))

    async def get_lease(self, cluster: str, shard: int) -> Stored[Lease] | None:
        return await self._call(
            "get", "get_lease", lambda: self.inner.get_lease(cluster, shard), shard)

    async def create_lease(self, lease: Lease) -> str:
        return await self._call(
            "put", "create_lease", lambda: self.inner.create_lease(lease), lease.shard)

    async def update_lease(self, lease: Lease, version: str) -> str:
        if self.world.sticky_reservations and lease.reserved_for is None and not lease.hold:
            # A store whose update keeps what the write does not name (a merge
            # patch): an earlier free's reservation stays on the record.
            before = self.world.read_leases().get(lease.shard)
            if before is not None and before.reserved_for is not None:
                lease = lease.model_copy(update={"reserved_for": before.reserved_for,
                                                 "hold": before.hold})
        return await self._call(
            "put", "update_lease", lambda: self.inner.update_lease(lease, version),
            lease.shard)

    async def list_heartbeats(self, cluster: str) -> dict[str, str]:
        return await self._listing("list_heartbeats",
                                   lambda: self.inner.list_heartbeats(cluster))

    async def get_heartbeat(self, cluster: str, node: str) -> Heartbeat | None:
        return await self._call(
            "get", "get_heartbeat", lambda: self.inner.get_heartbeat(cluster, node))

    async def put_heartbeat(self, heartbeat: Heartbeat) -> None:
        await self._call(
            "put", "put_heartbeat", lambda: self.inner.put_heartbeat(heartbeat))

    async def delete_heartbeat(self, cluster: str, node: str) -> None:
        await self._call(
            "delete", "delete_heartbeat", lambda: self.inner.delete_heartbeat(cluster, node))

    async def list_epochs(self, cluster: str) -> dict[tuple[str, str], str]:
        return await self._listing("list_epochs", lambda: self.inner.list_epochs(cluster))

    async def get_epoch(self, cluster: str, node: str, epoch: str) -> Stored[Epoch] | None:
        return await self._call(
            "get", "get_epoch", lambda: self.inner.get_epoch(cluster, node, epoch))

    async def create_epoch(self, record: Epoch) -> str:
        return await self._call("put", "create_epoch", lambda: self.inner.create_epoch(record))

    async def update_epoch(self, record: Epoch, version: str) -> str:
        return await self._call(
            "put", "update_epoch", lambda: self.inner.update_epoch(record, version))

    async def delete_epoch(self, cluster: str, node: str, epoch: str) -> None:
        await self._call(
            "delete", "delete_epoch", lambda: self.inner.delete_epoch(cluster, node, epoch))


async def _noop() -> None:
    return None


class RecordingHost:
    """The application of one node: records every call with virtual time,
    node and generation; `open_now` is what the application has open."""

    def __init__(self, world: World, node: SimNode) -> None:
        self.world = world
        self.node = node
        self.open_now: dict[int, int] = {}  # shard -> generation

    async def open(self, shard: int, generation: int) -> None:
        node, rng = self.node, self.node.host_rng
        await node.gate()
        node._record("open_call", shard, generation)
        latency, _, error_rate, _ = self.world.host_conditions(node.name)
        try:
            if latency > 0:
                await asyncio.sleep(latency)
        except asyncio.CancelledError:
            node._record("open_cancel", shard, generation)
            raise
        if error_rate > 0 and rng.random() < error_rate:
            node._record("open_err", shard, generation)
            raise HostError(f"injected open failure of shard {shard}")
        if self.world.refuses(node.name, shard):
            node._record("open_err", shard, generation)
            raise HostError(f"this host refuses shard {shard}")
        seen, by = self.world.app_generation.get(shard, (-1, ""))
        if generation < seen or (generation == seen and by != node.label):
            node._record("open_err", shard, generation, seen, "outdated")
            raise OutdatedGeneration(f"shard {shard}: generation {seen} was opened by {by}",
                                     shard=shard, generation=generation, highest=seen)
        self.world.app_generation[shard] = (generation, node.label)
        node._record("open_ok", shard, generation)
        self.open_now[shard] = generation
        self.world.host_changed()
        await node.gate()

    async def close(self, shard: int) -> None:
        node, rng = self.node, self.node.host_rng
        await node.gate()
        node._record("close_call", shard)
        _, latency, _, error_rate = self.world.host_conditions(node.name)
        try:
            if latency > 0:
                await asyncio.sleep(latency)
        except asyncio.CancelledError:
            node._record("close_cancel", shard)
            raise
        if error_rate > 0 and rng.random() < error_rate:
            node._record("close_err", shard)
            raise HostError(f"injected close failure of shard {shard}")
        node._record("close_ok", shard)
        if self.open_now.pop(shard, None) is not None:
            self.world.host_changed()
        await node.gate()


@dataclass
class Snapshot:
    """The state at quiescence, for the invariant (c)."""

    t: float
    live: dict[str, str]  # label -> name of the live nodes
    incarnations: dict[str, str]  # label -> loop incarnation
    open: dict[str, dict[int, int]]  # label -> shard -> generation open at its host
    held: dict[str, set[int]]  # label -> leases the loop holds
    leases: dict[int, Lease | None]  # the backend's records
    lookups: dict[str, dict[int, str | None]]  # label -> shard -> lookup()


@dataclass
class World:
    shards: int
    seed: int
    lease_ttl: float
    interval: float | None
    margin: float | None
    max_concurrency: int
    open_timeout: float
    close_timeout: float
    renewal: Renewal = "shard"
    backend: MemoryBackend = field(default_factory=MemoryBackend)
    trace: list[TraceEvent] = field(default_factory=list)
    nodes: list[SimNode] = field(default_factory=list)
    store_faults: list[StoreFault] = field(default_factory=list)
    host_faults: list[HostFault] = field(default_factory=list)
    violations: list[str] = field(default_factory=list)
    rounds: dict[str, int] = field(default_factory=dict)
    balanced: bool = False
    #: When a host last opened or closed a shard (virtual seconds).
    changed_at: float = 0.0
    #: Option changes made to every node (a Reconfigure of node None): the
    #: cluster's spec, which nodes that start later get too.
    changes: dict[str, Any] = field(default_factory=dict)
    #: Per (label, shard), the trace index of each deadline recorded and the
    #: margin the runner gave it (`margin_at`).
    margins: dict[tuple[str, int], tuple[list[int], list[float]]] = field(
        default_factory=dict)
    #: Pods created together whose nodes have not started yet (a StatefulSet
    #: of parallel pods: the pod list shows them all before any agent runs).
    pending: set[str] = field(default_factory=set)
    #: How hints travel between nodes (None: no node sends any).
    hints: Hints | None = None
    #: The store keeps a free's reservation through later writes that do not
    #: name one (the Kubernetes store's merge patches did, before c22221f).
    sticky_reservations: bool = False
    #: The application's fenced storage, shared by every node's host: per
    #: shard, the highest generation opened and the host (label) that opened
    #: it. A host refuses an open at or below it that it did not open itself
    #: (`OutdatedGeneration`), as the example application does.
    app_generation: dict[int, tuple[int, str]] = field(default_factory=dict)

    # -- plumbing ------------------------------------------------------------------

    def now(self) -> float:
        return asyncio.get_running_loop().time()

    def options(self, name: str) -> Options:
        base = Options(shards=self.shards, lease_ttl=self.lease_ttl, interval=self.interval,
                       margin=self.margin, name=name, cluster_name=CLUSTER,
                       max_concurrency=self.max_concurrency, open_timeout=self.open_timeout,
                       close_timeout=self.close_timeout, renewal=self.renewal)
        if not self.changes:
            return base
        return Options.model_validate({**base.model_dump(), **self.changes})

    def margin_at(self, node: str, shard: int, index: int) -> float | None:
        """The margin of the deadline last recorded for (node, shard) before
        trace index `index` (None: none recorded, or an unbounded runner)."""
        found = self.margins.get((node, shard))
        if found is None:
            return None
        pos = bisect.bisect_left(found[0], index)
        return found[1][pos - 1] if pos else None

    def record(self, node: str, kind: str, shard: int = -1, generation: int = -1,
               value: float = 0.0, detail: str = "") -> None:
        self.trace.append(TraceEvent(self.now(), node, kind, shard, generation, value, detail))

    def install(self, loop: VirtualTimeLoop) -> None:
        loop.task_hook = self._on_task

    def _on_task(self, task: asyncio.Task[Any], context: contextvars.Context | None) -> None:
        node = context.get(NODE_VAR) if context is not None else NODE_VAR.get()
        if node is not None:
            node.tasks[task] = None
            task.add_done_callback(lambda t: node.tasks.pop(t, None))

    def send_hints(self, sender: SimNode, settle: bool = True) -> None:
        """`sender` freed a lease or joined: hint every other node, each hint
        lost or late as `hints` says (a burst of frees sends one per free:
        what the loop must coalesce). `settle`: the woken round waits for
        more frees (a lone free) or not (an epoch's end, a join)."""
        if self.hints is None or sender.blackholed:
            return
        loop = asyncio.get_running_loop()
        for node in self.nodes:
            if node is sender or node.status not in ("running", "leaving"):
                continue
            if sender.hint_rng.random() < self.hints.drop:
                continue
            delay = sender.hint_rng.uniform(0, self.hints.delay) if self.hints.delay else 0.0
            self.record(node.label, "hinted", detail=sender.label)
            loop.call_later(delay, node.loop.hint, settle)

    def peer_names(self) -> list[str]:
        """Peer discovery: the pods that exist (not crashed, not departed),
        and those created whose node has not started yet (`pending`)."""
        names = [n.name for n in self.nodes if n.status in ("running", "leaving")]
        return names + sorted(self.pending - set(names))

    def live_nodes(self) -> list[SimNode]:
        return [n for n in self.nodes if n.live]

    def node(self, name: str) -> SimNode | None:
        """The current incarnation of `name`."""
        for n in reversed(self.nodes):
            if n.name == name:
                return n
        return None

    def _active(self, fault: StoreFault | HostFault, name: str) -> bool:
        return fault.at <= self.now() < fault.until and fault.node in (None, name)

    def stale_window(self, name: str) -> float | None:
        """The start of the stale-reads window `name` is in now, if any."""
        for f in self.store_faults:
            if f.stale and self._active(f, name):
                return f.at
        return None

    def store_conditions(self, name: str, method: str,
                         shard: int | None = None) -> tuple[float, float, float, float, float]:
        """latency, jitter, error rate, lost-reply rate and reply share for a
        call of `method` (about `shard`'s lease, if any) starting now."""
        latency = jitter = reply_share = 0.0
        ok = lost_ok = 1.0
        for f in self.store_faults:
            if self._active(f, name) and (f.calls is None or method in f.calls) \
                    and (f.shards is None or shard in f.shards):
                latency, jitter = max(latency, f.latency), max(jitter, f.jitter)
                reply_share = max(reply_share, f.reply_share)
                ok *= 1 - f.error_rate
                lost_ok *= 1 - f.lost_reply_rate
        return latency, jitter, 1 - ok, 1 - lost_ok, reply_share

    def host_conditions(self, name: str) -> tuple[float, float, float, float]:
        """open latency, close latency, open error rate, close error rate."""
        ol = cl = 0.0
        ook = cok = 1.0
        for f in self.host_faults:
            if self._active(f, name):
                ol, cl = max(ol, f.open_latency), max(cl, f.close_latency)
                ook *= 1 - f.open_error_rate
                cok *= 1 - f.close_error_rate
        return ol, cl, 1 - ook, 1 - cok

    def refuses(self, name: str, shard: int) -> bool:
        """Whether `name`'s host refuses to open `shard` now."""
        return any(self._active(f, name) and shard in f.refuse for f in self.host_faults)

    # -- balance -------------------------------------------------------------------

    def is_balanced(self) -> bool:
        """Every shard open at exactly one live node's host, none above ceil(S/N)."""
        live = self.live_nodes()
        if not live:
            return False
        share = math.ceil(self.shards / len(live))
        count = [0] * self.shards
        for n in self.nodes:
            if n.status == "crashed":
                continue
            for s in n.host.open_now:
                if not n.live:
                    return False
                count[s] += 1
        if any(c != 1 for c in count):
            return False
        return all(len(n.host.open_now) <= share for n in live)

    def host_changed(self) -> None:
        self.changed_at = self.now()
        balanced = self.is_balanced()
        if balanced != self.balanced:
            self.balanced = balanced
            self.record("*", "balanced" if balanced else "unbalanced")

    # -- lifecycle -----------------------------------------------------------------

    def start(self, name: str, wall_skew: float = 0.0) -> SimNode:
        previous = self.node(name)
        if previous is not None and previous.status in ("running", "leaving"):
            raise ValueError(f"node {name} is already running")
        incarnation = sum(1 for n in self.nodes if n.name == name)
        self.pending.discard(name)
        node = SimNode(self, name, incarnation, wall_skew)
        self.nodes.append(node)
        self.record(node.label, "start", value=wall_skew)
        ctx = contextvars.copy_context()
        ctx.run(NODE_VAR.set, node)
        node.task = asyncio.get_running_loop().create_task(
            node.loop.run(), name=f"sim-{node.label}", context=ctx)
        node.task.add_done_callback(lambda t: self._ended(node, t))
        self.host_changed()
        return node

    def _ended(self, node: SimNode, task: asyncio.Task[None]) -> None:
        if node.status in ("crashed",):
            return
        if node.status == "aborting":
            # Stopped short on purpose (`abort`): the process exits, and what
            # its host still has open nobody closes any more.
            node.status = "aborted"
            self.record(node.label, "aborted", detail=repr(
                None if task.cancelled() else task.exception()))
            for shard in sorted(node.host.open_now):
                node.abandon(shard, "aborted")
            self.host_changed()
            return
        if task.cancelled():
            exc: BaseException | None = asyncio.CancelledError()
        else:
            exc = task.exception()
        if exc is not None or node.status != "leaving":
            self.violations.append(
                f"{self.now():.3f} {node.label}: the placement loop ended on its own "
                f"({type(exc).__name__ if exc else 'returned'}: {exc})")
            node.status = "died"
            node.ended_at = self.now()
            self.record(node.label, "died", detail=repr(exc))
            self.host_changed()

    def pause(self, node: SimNode, duration: float) -> None:
        node.had_pause = True
        node.paused_until = max(node.paused_until, self.now() + duration)
        self.record(node.label, "pause", value=node.paused_until)

    def abort(self, node: SimNode, what: str) -> None:
        """Stop `node` short (`faults.Abort`): cancel its loop, or the task of
        its loop that `what` names. Its store and host still answer; what it
        does on its way out is recorded and checked like anything else."""
        if node.status not in ("running", "leaving"):
            return
        node.status = "aborting"
        node.ended_at = self.now()
        self.record(node.label, "abort", detail=what)
        self.host_changed()
        name = ABORT_TASKS[what]
        target = node.task if name is None else next(
            (t for t in node.tasks if t.get_name() == name and not t.done()), node.task)
        assert target is not None
        target.cancel()

    async def crash(self, node: SimNode) -> None:
        if node.status in ("crashed", "left", "died", "aborted"):
            return
        held = sorted(
            s for s, lease in self.read_leases().items()
            if lease is not None and lease.owner == node.name
            and lease.incarnation == node.loop.lease_incarnation)
        node.blackholed = True
        node.status = "crashed"
        node.ended_at = node.ended_at if node.ended_at is not None else self.now()
        self.record(node.label, "crash", detail=",".join(map(str, held)))
        node.host.open_now.clear()
        self.host_changed()
        for _ in range(10_000):
            alive = [t for t in node.tasks if not t.done()]
            if not alive:
                return
            for t in alive:
                t.cancel()
            await asyncio.sleep(0)
        raise SimulationStuck(f"could not kill the tasks of {node.label}")

    def leave(self, node: SimNode, hold: float = 0.0) -> asyncio.Task[None] | None:
        if node.status != "running":
            return None
        node.status = "leaving"
        node.leave_at = self.now()
        self.record(node.label, "leave", value=hold)
        self.host_changed()
        # As a watching store (Kubernetes) tells the peers of the heartbeat's
        # deletion: their round wakes while the leaver still holds its leases,
        # and its frees, after it, wake another.
        self.send_hints(node, settle=False)

        async def stop() -> None:
            await node.loop.stop(hold)
            assert node.task is not None
            await asyncio.gather(node.task, return_exceptions=True)
            if node.status != "leaving":
                return  # crashed while leaving
            node.status = "left"
            node.ended_at = self.now()
            self.record(node.label, "left")
            self._check_departed(node)

        ctx = contextvars.copy_context()
        ctx.run(NODE_VAR.set, node)
        return asyncio.get_running_loop().create_task(stop(), name=f"sim-leave-{node.label}",
                                                      context=ctx)

    def _check_departed(self, node: SimNode) -> None:
        """(g) After a graceful stop: nothing open at its host, and -- unless
        its store calls were failing (or paused) during the stop, when a lease or the
        heartbeat may be left to expire (recorded as `left_behind`) -- no
        lease and no heartbeat of this incarnation."""
        t = f"{self.now():.3f} {node.label}"
        if node.host.open_now:
            self.violations.append(f"{t}: stopped with shards still open at its host: "
                                   f"{sorted(node.host.open_now)}")
        # Node mode: its epoch record is its heartbeat, and a lease that names
        # an epoch it ended is free (its end freed every lease of it at once).
        # Only the epoch current at the stop is the stop's to end: one given
        # up earlier (`OwnEpoch.give_up`: a closed shard it could not free)
        # is left silent for peers to end after a TTL, by design (the swarm's
        # seed 248, node mode: n3 gave an epoch up, stopped before its peers
        # had ended it, and they ended it after that, "silent and holding
        # nothing").
        live_epochs = {e for (c, n, e), (v, data) in self.backend.epochs.items()
                       if c == CLUSTER and n == node.name and e == node.loop.epoch
                       and not _ended(data, n, e)}
        kept = [s for s, lease in self.read_leases().items()
                if lease is not None and lease.owner == node.name
                and lease.incarnation in node.loop.own_epochs
                and (lease.renewal == "shard" or lease.incarnation in live_epochs)]
        found = self.backend.heartbeats.get((CLUSTER, node.name))
        beat = found is not None and decode_heartbeat(
            found[1], CLUSTER, node.name).incarnation == node.loop.incarnation
        beat = beat or bool(live_epochs)
        start = node.leave_at if node.leave_at is not None else self.now()
        # (Calls too slow are failing too. A stop's writes -- the frees, the
        # end of its epoch, the deletions -- are useful until peers would take
        # the leases anyway, and get a TTL, not a round's budget: the end may
        # take a beat in flight (a budget at most), then three calls in a row
        # (the end, a read after a conflict with a beat that landed unheard,
        # the end again; only if a beat may land unheard: `reply_share`).
        # Slower calls than fit in that may leave the leases to a TTL of
        # silence; faster ones must not.)
        loop = node.loop

        def too_slow(f: StoreFault) -> bool:
            return f.latency + f.jitter >= (loop.ttl - loop.budget) / (
                3 if f.reply_share > 0 else 1)

        failing = any(f.node in (None, node.name) and f.at <= self.now() and f.until > start
                      and (f.error_rate > 0 or f.lost_reply_rate > 0 or too_slow(f))
                      for f in self.store_faults)
        # A pause leaves the stop's store calls unanswered until it ends; if
        # that leaves no time for a round (one abandoned call's budget, then
        # the stopping pace) within the stop's window (a TTL from the stop),
        # the stop gives up and the leases expire.
        failing = failing or node.paused_until + loop.budget + loop.options.interval_s \
            > start + loop.ttl
        if failing:
            if kept or beat:
                self.record(node.label, "left_behind",
                            detail=f"leases={kept} heartbeat={beat}")
            return
        if kept:
            self.violations.append(f"{t}: stopped but its leases were not freed: {kept}")
        if beat:
            self.violations.append(f"{t}: stopped but its heartbeat is still there")

    def corrupt(self, shard: int, how: str = "garbage") -> None:
        """Overwrite the lease record of `shard` with bytes that are no lease
        (a new version; `how` as in `faults.Corrupt`)."""
        found = self.backend.leases.get((CLUSTER, shard))
        data = b"\x00 not a lease \xff"
        if found is not None and how == "truncated":
            data = found[1][:len(found[1]) // 2]
        elif found is not None and how == "invalid":
            try:
                fields = json.loads(found[1])
            except ValueError:
                fields = None
            if isinstance(fields, dict):
                data = json.dumps({**fields, "ttl": "not a number"}).encode()
        if how == "deleted":
            self.backend.leases.pop((CLUSTER, shard), None)
            self.record("*", "corrupted", shard, detail=how)
            return
        self.backend.leases[(CLUSTER, shard)] = (self.backend.next_version(), data)
        # The generation a reader can still recover (-1: none): check (b).
        recovered = recover_generation(data)
        self.record("*", "corrupted", shard, -1 if recovered is None else recovered,
                    detail=how)

    def read_leases(self) -> dict[int, Lease | None]:
        out: dict[int, Lease | None] = {}
        for (c, shard), (version, data) in sorted(self.backend.leases.items()):
            if c == CLUSTER:
                out[shard] = stored_lease(data, version, c, shard).record
        return out

    def snapshot(self) -> Snapshot:
        live = self.live_nodes()
        return Snapshot(
            t=self.now(),
            live={n.label: n.name for n in live},
            incarnations={n.label: n.loop.lease_incarnation for n in live},
            open={n.label: dict(n.host.open_now) for n in live},
            held={n.label: set(n.loop.held) for n in live},
            leases=self.read_leases(),
            lookups={n.label: {s: n.loop.lookup(s) for s in range(self.shards)} for n in live},
        )


def _ended(data: bytes, node: str, epoch: str) -> bool:
    """Whether an epoch record (as stored) is ended; an unreadable one is not."""
    record = stored_epoch(data, "", CLUSTER, node, epoch).record
    return record is not None and record.ended_by is not None
