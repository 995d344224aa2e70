"""`run_scenario`: one seeded simulation from start to graceful end, checked,
with the figures the benchmark reports (see the package docstring)."""

from __future__ import annotations

import asyncio
import logging
import math
import random
import time
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from pydantic import ValidationError

from shardlease.errors import ConfigError
from shardlease.options import Options, describe_validation_error
from shardlease.records import Renewal
from shardlease.sim.check import (
    Recovery,
    check_counted,
    check_fenced_closes,
    check_fences_caused,
    check_open_somewhere,
    check_quiescence,
    check_trace,
    liveness_bound,
    recoveries,
)
from shardlease.sim.faults import (
    Abort,
    Corrupt,
    Crash,
    Fault,
    Hints,
    HostFault,
    Join,
    Leave,
    Pause,
    Reconfigure,
    StoreFault,
    fault_end,
)
from shardlease.sim.vloop import VirtualTimeLoop, run_virtual
from shardlease.sim.world import Snapshot, TraceEvent, World


@dataclass
class BalanceFigure:
    """How long after a membership change the placement was balanced for good
    (every shard open on exactly one live node, none above ceil(S/N)) -- until
    the next fault or the end. `kind` is start (from t=0), join, leave, crash."""

    kind: str
    node: str
    at: float
    seconds: float | None  # None: not balanced before the next fault / the end
    rounds: int | None  # ceil(seconds / interval)


@dataclass
class ScenarioResult:
    seed: int
    nodes: int
    shards: int
    lease_ttl: float
    interval: float
    margin: float
    trace: list[TraceEvent]
    violations: list[str]
    quiescence: Snapshot | None
    recovery: list[Recovery]
    balance: list[BalanceFigure]
    requests: dict[str, dict[str, int]]  # node label -> kind (list/get/put/delete) -> count
    rounds: dict[str, int]  # node label -> placement rounds run
    requests_per_round: dict[str, float]  # node label -> store requests per round
    request_times: dict[str, list[float]]  # node label -> virtual time of each request
    counts: dict[str, int]  # claim, release, lost, self_fence, abandoned, ... (see the package)
    end: float  # virtual seconds simulated
    real_seconds: float = field(compare=False)

    @property
    def ok(self) -> bool:
        return not self.violations

    @property
    def claims(self) -> int:
        return self.counts.get("claim", 0)

    @property
    def releases(self) -> int:
        return self.counts.get("release", 0)

    def requests_between(self, node: str, t0: float, t1: float) -> int:
        """Store requests `node` (a label) made in [t0, t1)."""
        return sum(1 for t in self.request_times.get(node, ()) if t0 <= t < t1)

    def open_for_good(self, shard: int, until: float, besides: str = "") -> float | None:
        """When `shard` last became open on a node (other than the label
        `besides`) to stay open there until `until`; None if it is not open
        anywhere (else) then."""
        since: dict[str, float] = {}
        for ev in self.trace:
            if ev.t >= until:
                break
            if (ev.shard != shard and ev.kind != "crash") or ev.node == besides:
                continue
            if ev.kind == "open_ok":
                since[ev.node] = ev.t
            elif ev.kind in ("close_call", "crash"):
                since.pop(ev.node, None)
        return min(since.values(), default=None)

    def recovery_seconds(self) -> list[float | None]:
        return [r.seconds for r in self.recovery]

    def figures(self) -> dict[str, Any]:
        """JSON-friendly figures (no trace)."""
        return {
            "seed": self.seed, "nodes": self.nodes, "shards": self.shards,
            "lease_ttl": self.lease_ttl, "interval": self.interval, "margin": self.margin,
            "ok": self.ok, "violations": list(self.violations),
            "recovery_seconds": self.recovery_seconds(),
            "balance": [{"kind": b.kind, "node": b.node, "at": b.at, "seconds": b.seconds,
                         "rounds": b.rounds} for b in self.balance],
            "requests_per_round": dict(self.requests_per_round),
            "counts": dict(self.counts),
            "virtual_seconds": self.end, "real_seconds": self.real_seconds,
        }

    def format_trace(self, kinds: set[str] | None = None) -> str:
        lines = []
        for ev in self.trace:
            if kinds is not None and ev.kind not in kinds:
                continue
            parts = [f"{ev.t:10.3f}", f"{ev.node:6}", f"{ev.kind:13}"]
            if ev.shard >= 0:
                parts.append(f"shard={ev.shard}")
            if ev.generation >= 0:
                parts.append(f"gen={ev.generation}")
            if ev.value:
                parts.append(f"value={ev.value:.3f}")
            if ev.detail:
                parts.append(ev.detail)
            lines.append(" ".join(parts))
        return "\n".join(lines)


def run_scenario(
    *,
    nodes: int = 3,
    shards: int = 16,
    seed: int = 0,
    lease_ttl: float = 15.0,
    interval: float | None = None,
    margin: float | None = None,
    max_concurrency: int = 16,
    open_timeout: float = 60.0,
    close_timeout: float = 60.0,
    renewal: Renewal = "shard",
    faults: Sequence[Fault] = (),
    wall_skews: Mapping[str, float] | None = None,
    settle: float | None = None,
    recovery_bound: float | None = None,
    quiet: bool = True,
    hints: Hints | None = None,
    sticky_reservations: bool = False,
) -> ScenarioResult:
    """Simulate, check, and measure one scenario (see the package docstring)."""
    started = time.perf_counter()
    log = logging.getLogger("shardlease")
    level = log.level
    if quiet:  # the injected faults make the loop log a lot; the trace has it all
        log.setLevel(logging.CRITICAL)
    try:
        result = run_virtual(_scenario(
            nodes=nodes, shards=shards, seed=seed, lease_ttl=lease_ttl, interval=interval,
            margin=margin, max_concurrency=max_concurrency, open_timeout=open_timeout,
            close_timeout=close_timeout, renewal=renewal, faults=list(faults),
            wall_skews=dict(wall_skews or {}), settle=settle, recovery_bound=recovery_bound,
            hints=hints, sticky_reservations=sticky_reservations))
    finally:
        log.setLevel(level)
    result.real_seconds = time.perf_counter() - started
    return result


async def _scenario(
    *, nodes: int, shards: int, seed: int, lease_ttl: float, interval: float | None,
    margin: float | None, max_concurrency: int, open_timeout: float, close_timeout: float,
    renewal: Renewal, faults: list[Fault], wall_skews: dict[str, float], settle: float | None,
    recovery_bound: float | None, hints: Hints | None, sticky_reservations: bool,
) -> ScenarioResult:
    loop = asyncio.get_running_loop()
    assert isinstance(loop, VirtualTimeLoop)
    opts = Options(shards=shards, lease_ttl=lease_ttl, interval=interval, margin=margin,
                   name="check")  # validates the combination up front
    interval_s, ttl = opts.interval_s, opts.lease_ttl
    world = World(shards=shards, seed=seed, lease_ttl=ttl, interval=interval, margin=margin,
                  max_concurrency=max_concurrency, open_timeout=open_timeout,
                  close_timeout=close_timeout, renewal=renewal, hints=hints,
                  sticky_reservations=sticky_reservations)
    world.install(loop)
    world.store_faults = [f for f in faults if isinstance(f, StoreFault)]
    world.host_faults = [f for f in faults if isinstance(f, HostFault)]
    t0 = loop.time()
    rng = random.Random(f"{seed}/scenario")

    actions: list[tuple[float, int, Fault]] = []
    world.pending = {f"n{k}" for k in range(nodes)}
    for k in range(nodes):
        name = f"n{k}"
        actions.append((rng.uniform(0, interval_s), len(actions),
                        Join(0.0, name, wall_skews.get(name, 0.0))))
    for f in faults:
        actions.append((f.at, len(actions), f))
    actions.sort(key=lambda a: (a[0], a[1]))
    leaving: list[asyncio.Task[None]] = []
    margins = [opts.margin_s]  # every margin in force at some time (Reconfigure)
    ttls, intervals = [ttl], [interval_s]  # likewise every TTL and interval

    async def until(at: float) -> None:
        delay = t0 + at - loop.time()
        if delay > 0:
            await asyncio.sleep(delay)

    for at, _, f in actions:
        await until(at)
        match f:
            case Join(node=name, wall_skew=skew):
                current = world.node(name)
                if current is None or current.status not in ("running", "leaving"):
                    started_opts = world.start(name, skew).loop.options
                    ttls.append(started_opts.lease_ttl)
                    intervals.append(started_opts.interval_s)
                    margins.append(started_opts.margin_s)
            case Leave(node=name, hold=hold):
                if (n := world.node(name)) is not None and (task := world.leave(n, hold)):
                    leaving.append(task)
            case Crash(node=name):
                if (n := world.node(name)) is not None:
                    await world.crash(n)
            case Abort(node=name, what=what):
                if (n := world.node(name)) is not None:
                    world.abort(n, what)
            case Pause(node=name, duration=d):
                if (n := world.node(name)) is not None and n.status in ("running", "leaving"):
                    world.pause(n, d)
            case Corrupt(shard=shard, how=how):
                if shard < shards:
                    world.corrupt(shard, how)
            case StoreFault() | HostFault():
                world.record("*", "fault", value=fault_end(f), detail=repr(f))
            case Reconfigure(node=only, changes=changes):
                targets = [n for n in world.live_nodes() if only in (None, n.name)]
                applied = True
                for n in targets:
                    try:
                        new = Options.model_validate({**n.loop.options.model_dump(),
                                                      **dict(changes)})
                    except ValidationError as e:  # (a combination invalid with its options)
                        world.record(n.label, "reconfigure_invalid",
                                     detail=describe_validation_error(e, "option"))
                        applied = False
                        continue
                    try:
                        n.loop.reconfigure(new)
                    except ConfigError as e:  # (node mode: a margin its epoch cannot hold)
                        world.record(n.label, "reconfigure_refused", detail=str(e))
                        applied = False
                        continue
                    margins.append(new.margin_s)
                    ttls.append(new.lease_ttl)
                    intervals.append(new.interval_s)
                    world.record(n.label, "reconfigure", detail=repr(dict(changes)))
                if only is None and applied:
                    # The cluster's spec changed: nodes that start later get it.
                    # (Not a change some node refused: the nodes would then
                    # differ for good, and (c)'s balance assumes they judge
                    # liveness alike.)
                    try:
                        Options.model_validate({**world.options("check").model_dump(),
                                                **dict(changes)})
                    except ValidationError:
                        pass
                    else:
                        world.changes.update(changes)

    last = max([a[0] for a in actions] + [fault_end(f) for f in faults] + [0.0])
    # The longest TTL and interval any node had (a Reconfigure may have raised
    # them): what a crashed node's leases may take to expire.
    ttl_max, interval_max = max(ttls), max(intervals)
    # A reservation (a Leave with a hold) keeps its shards unowned for its
    # hold from when each node first sees it: from the last start at worst.
    hold_max = max([f.hold for f in faults if isinstance(f, Leave)] + [0.0])
    # A cap on moves per round spreads a rebalance over up to shards / cap rounds.
    caps = [int(v) for f in faults if isinstance(f, Reconfigure)
            for k, v in f.changes if k == "max_moves_per_round" and v]
    spread = math.ceil(shards / min(caps)) * interval_max if caps else 0.0
    await until(last + (settle if settle is not None
                        else 2 * ttl_max + 4 * interval_max + hold_max + spread))
    # Every node's view (what `lookup` routes by) is one round old at most:
    # a move just before this instant is checked once each node has had a
    # round after it, and a placement still moving after two more rounds
    # is checked as it is (and fails).
    quiet = 1.25 * interval_max
    latest = world.now() + 2 * quiet
    while (due := world.changed_at + quiet) > world.now() and world.now() < latest:
        await until(min(due, latest) - t0)
    world.record("*", "quiescent")
    snapshot = world.snapshot()
    quiet_problems = check_quiescence(snapshot, shards)

    # The end: every node stops gracefully (and is checked when it has).
    for n in world.live_nodes():
        if (task := world.leave(n)) is not None:
            leaving.append(task)
    if leaving:
        stop_bound = 4 * ttl_max + 10 * interval_max
        _, pending = await asyncio.wait(leaving, timeout=stop_bound)
        if pending:
            world.violations.append(f"{loop.time() - t0:.3f}: graceful stops did not finish "
                                    f"within {stop_bound:g}s")
    for n in world.nodes:
        if n.status in ("running", "leaving", "died", "aborting"):
            await world.crash(n)  # clean up whatever is left, without a trace of politeness
    end = loop.time() - t0

    trace = world.trace
    recs = recoveries(trace)
    bound = recovery_bound if recovery_bound is not None else ttl_max + 2 * interval_max
    problems = list(world.violations) + quiet_problems + check_trace(trace)
    # Each deadline against the margin it was given with (Reconfigure).
    problems += check_fenced_closes(
        trace, margins[0] if len(set(margins)) == 1 else world.margin_at)
    problems += _check_recoveries(recs, faults, actions, world, bound, ttl_max)
    problems += check_open_somewhere(trace, shards, faults, snapshot.t,
                                     liveness_bound(ttl_max, interval_max))
    problems += check_counted(trace, faults, snapshot.t, ttl_max, interval_max)
    problems += check_fences_caused(trace, faults, ttl_max, interval_max)

    counts = Counter(ev.kind for ev in trace if ev.kind in {
        "claim", "release", "lost", "self_fence", "renew_failed", "renew_slow", "abandoned",
        "overrun", "corrupt",
        "open_err", "close_err", "crash", "pause", "leave", "start", "left_behind"})
    requests = {n.label: dict(n.requests) for n in world.nodes}
    per_round = {n.label: sum(n.requests.values()) / world.rounds[n.label]
                 for n in world.nodes if world.rounds.get(n.label)}
    return ScenarioResult(
        seed=seed, nodes=nodes, shards=shards, lease_ttl=ttl, interval=interval_s,
        margin=opts.margin_s, trace=trace, violations=problems, quiescence=snapshot,
        recovery=recs, balance=_balance(trace, interval_s), requests=requests,
        rounds=dict(world.rounds), requests_per_round=per_round,
        request_times={n.label: list(n.store.times) for n in world.nodes}, counts=dict(counts),
        end=end, real_seconds=0.0)


def _check_recoveries(recs: list[Recovery], faults: list[Fault],
                      actions: list[tuple[float, int, Fault]], world: World, bound: float,
                      ttl: float) -> list[str]:
    """(d), for crashes with no other fault in [crash - ttl, crash + bound] and a
    live node left to take over."""
    problems = []
    for r in recs:
        window = (r.at - ttl, r.at + bound)
        others = [f for f in faults if not (isinstance(f, Crash) and f.node == r.node
                                            and abs(f.at - r.at) < 1e-9)
                  and not isinstance(f, Join | Leave)
                  and f.at <= window[1] and fault_end(f) >= window[0]]
        membership = [f for _, _, f in actions if isinstance(f, Join | Leave)
                      and window[0] <= f.at <= window[1]]
        survivors = [n for n in world.nodes if n.label != r.node and n.started_at <= r.at
                     and (n.ended_at is None or n.ended_at >= window[1])]
        if others or membership or not survivors or not r.shards:
            continue
        if r.seconds is None or r.seconds > bound:
            problems.append(f"(d) the shards {list(r.shards)} of {r.node}, crashed at "
                            f"{r.at:.3f}, were not all open elsewhere within {bound:g}s "
                            f"(took {r.seconds})")
    return problems


def _balance(trace: list[TraceEvent], interval: float) -> list[BalanceFigure]:
    marks = {"start", "leave", "crash", "pause", "fault", "quiescent"}
    events = [(i, ev) for i, ev in enumerate(trace) if ev.kind in marks]
    states = [(i, ev.t, ev.kind == "balanced") for i, ev in enumerate(trace)
              if ev.kind in ("balanced", "unbalanced")]
    out: list[BalanceFigure] = []
    first_start = True
    for k, (i, ev) in enumerate(events):
        if ev.kind == "quiescent":
            break  # the graceful end of the scenario is not measured
        if ev.kind not in ("start", "leave", "crash"):
            continue
        if ev.kind == "start" and first_start and ev.t < interval:
            # The initial nodes start within the first interval: measure from 0
            # to the end of their group.
            if k + 1 < len(events) and events[k + 1][1].kind == "start" \
                    and events[k + 1][1].t < interval:
                continue
            kind, at = "start", 0.0
        else:
            kind = "join" if ev.kind == "start" else ev.kind
            at = ev.t
        first_start = False
        end_i = events[k + 1][0] if k + 1 < len(events) else len(trace)
        before_end = [s for s in states if s[0] < end_i]
        if not before_end or not before_end[-1][2]:
            out.append(BalanceFigure(kind, ev.node, at, None, None))
            continue
        flips = [s for s in before_end if s[0] > i]
        became = flips[-1][1] if flips else at
        seconds = max(0.0, became - at)
        out.append(BalanceFigure(kind, ev.node, at, seconds,
                                 math.ceil(seconds / interval - 1e-9)))
    return out
