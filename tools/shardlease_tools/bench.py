"""`shardlease bench`: the figures the README quotes (a measurement, not a test).

1. Failover after kill -9, as a fraction of the lease TTL: real `shardlease
   node` processes on the file store (the demo's machinery), from the kill
   until every shard the dead node held was open on another node (recorded by
   the recording host). The same runs time a join and a graceful leave.
2. Rounds to balance after a node joins, after one leaves (graceful) and after
   one crashes: the deterministic simulation (`shardlease.sim`, the real loop
   and runner on virtual time, seed-faithful TTL of 15 s), over several seeds.
3. Store requests per node per round, in the steady state (every shard owned,
   nothing moving), for 64, 256 and 1024 shards on each store available here:
   memory, file, and S3 on moto's server when moto is installed. Requests are
   counted where the stores make them (`shardlease.stores.requests`: one per
   backend call, or per HTTP request for S3).
3b. Ordinary faults, in the simulation: self-fences with a slow store (every
   call but lease writes 3 intervals late; every call of one node 0.3 x TTL
   late; 30% of one node's calls failing like a 503), rounds until a shard
   one host refuses is open elsewhere and the store requests per interval
   meanwhile, and the opens and closes of nodes started together.
3c. A slow store on real processes: 3 `shardlease node` processes on S3
   (moto), one of them through `faultproxy` (added latency, 503 SlowDown),
   in phases of 4 TTLs; per phase, that node's self-fences, shards held,
   renew_slow and requests, and the longest any shard was open nowhere.
4. Loop CPU per round: process CPU time (time.process_time, every thread)
   over those same steady rounds, per node and round. The loops run in this
   process; moto runs in a child process so that its CPU is not counted.

`--quick` does one repetition of each on the smallest size (the smoke test).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
import itertools
import math
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from collections import Counter
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from shardlease.errors import ShardleaseError
from shardlease.loop import PlacementLoop
from shardlease.options import Options
from shardlease.stores.base import LeaseStore
from shardlease.stores.requests import count_requests
from shardlease.telemetry import (
    Claim,
    Event,
    Lost,
    Overrun,
    Release,
    RenewFailed,
    Round,
    SelfFence,
)

NODES = 4
SIZES = (64, 256, 1024)
#: Measured in node mode only (see bench_requests).
BIG_SIZES = (4096,)


def say(line: str = "") -> None:
    print(line, flush=True)


def _median(values: list[float]) -> str:
    return f"{statistics.median(values):.2f}" if values else "-"


# -- 1. failover with real processes ---------------------------------------------------


@dataclass
class ProcessRun:
    failover: float | None  # seconds from kill -9 until all the victim's shards reopened
    join: float  # seconds from the restart until balanced
    leave: float  # seconds from SIGTERM to one node until balanced
    #: Per step ("start", "join", "leave"): (shards opened in it, unowned shard-seconds).
    moves: dict[str, tuple[int, float]] = field(default_factory=dict)


def unowned(events: Sequence[Mapping[str, Any]], shards: int, since: float,
            until: float) -> tuple[int, float]:
    """Opens in [since, until] and the shard-seconds in it during which a
    shard was open nowhere (open from its `open_end` to its `close_start`)."""
    spans: dict[int, list[tuple[float, float]]] = {s: [] for s in range(shards)}
    began: dict[tuple[str, int], float] = {}
    opens = 0
    for ev in sorted(events, key=lambda e: float(e.get("wall", 0.0))):
        kind, t = ev.get("event"), float(ev.get("wall", 0.0))
        if kind not in ("open_end", "close_start") or not isinstance(ev.get("shard"), int):
            continue
        key = (str(ev.get("node")), int(ev["shard"]))
        if kind == "open_end":
            began[key] = t
            opens += since <= t <= until
        elif key in began:
            spans.setdefault(key[1], []).append((began.pop(key), t))
    for (_, shard), t in began.items():
        spans.setdefault(shard, []).append((t, math.inf))
    total = 0.0
    for shard in range(shards):
        covered, cursor = 0.0, since
        for a, b in sorted(spans.get(shard, [])):
            a, b = max(a, cursor), min(b, until)
            if b > a:
                covered += b - a
                cursor = b
        total += (until - since) - covered
    return opens, total


async def _process_run(workdir: Path, ttl: float, shards: int, nodes: int,
                       hints: bool = True, store_url: str | None = None) -> ProcessRun:
    from shardlease.checker import load_events
    from shardlease.demo import Demo, recovery_after
    from shardlease.owners import read_owners
    from shardlease.stores import open_store

    for sub in ("events", "logs"):
        (workdir / sub).mkdir(parents=True)
    url = store_url or f"file://{workdir / 'store'}"
    demo = Demo(nodes=nodes, shards=shards, store_url=url, cluster="bench",
                workdir=workdir, ttl=ttl, view="none", hints=hints)
    store = open_store(url)
    names = [f"node-{i}" for i in range(nodes)]
    settle = ttl / 3
    try:
        for name in names:
            demo.start(name)
        balanced = await demo.wait_balanced(store, "after the start")
        await asyncio.sleep(settle)
        events = load_events(demo.records)
        up = min(float(e["wall"]) for e in events if e.get("event") == "node_start")
        moves = {"start": unowned(events, shards, up, balanced)}
        rows, _ = await read_owners(store, "bench", shards)
        victim, leaver = names[1], names[0]
        lost = [r.shard for r in rows if r.owner == victim]
        killed_at = demo.kill(victim)
        await demo.wait_balanced(store, "after kill -9")
        # The store is balanced once the claims land; a host records its
        # open a moment later (a loaded machine: "not recovered" in a warm
        # fresh-clone run at b5da602), so the opens are waited for too.
        failover = recovery_after(load_events(demo.records), victim, killed_at, lost)
        give_up = time.monotonic() + 3 * ttl
        while failover is None and time.monotonic() < give_up:
            await asyncio.sleep(ttl / 20)
            failover = recovery_after(load_events(demo.records), victim, killed_at, lost)
        await asyncio.sleep(ttl / 3)
        joined_at = time.time()
        demo.start(victim)
        balanced = await demo.wait_balanced(store, "after the join")
        join = balanced - joined_at
        await asyncio.sleep(settle)
        moves["join"] = unowned(load_events(demo.records), shards, joined_at, balanced)
        member = demo.members[leaver]
        assert member.proc is not None
        left_at = time.time()
        member.proc.terminate()
        await asyncio.to_thread(member.proc.wait)
        member.state = "stopped"
        balanced = await demo.wait_balanced(store, "after the leave")
        leave = balanced - left_at
        await asyncio.sleep(settle)
        moves["leave"] = unowned(load_events(demo.records), shards, left_at, balanced)
        return ProcessRun(failover, join, leave, moves)
    finally:
        demo.stop_all(grace=3 * ttl)
        with contextlib.suppress(Exception):
            await store.aclose()


def bench_failover(quick: bool) -> None:
    ttl, shards, nodes = (2.0, 12, 3) if quick else (3.0, 24, 4)
    repetitions = 1 if quick else 3
    interval = ttl / 3
    say(f"== failover after kill -9 (real node processes, file store (and S3 on moto), "
        f"{nodes} nodes, {shards} shards, lease TTL {ttl:g}s, interval {interval:g}s) ==")
    say("  moves: shards opened in each step, and the shard-seconds a shard was open nowhere "
        "(start: from the first node's start until balanced; join and leave: from the "
        "start or the SIGTERM until balanced)")
    runs = []
    for store in ("file",) if quick else ("file", "s3"):
        with contextlib.ExitStack() as stack:
            endpoint = stack.enter_context(moto_endpoint()) if store == "s3" else None
            if store == "s3" and endpoint is None:
                say("  s3: moto is not installed; skipped")
                continue
            # (The comparison without hints in the full run only.)
            for hints in (True,) if quick else (True, False):
                for i in range(repetitions):
                    workdir = Path(tempfile.mkdtemp(prefix="shardlease-bench-"))
                    url = None
                    if endpoint is not None:
                        bucket = f"bench-{uuid.uuid4().hex[:8]}"
                        asyncio.run(_create_bucket(endpoint, bucket))
                        url = f"s3://{bucket}/p?endpoint={endpoint}&path_style=true"
                    try:
                        run = asyncio.run(_process_run(workdir, ttl, shards, nodes, hints,
                                                       url))
                    finally:
                        shutil.rmtree(workdir, ignore_errors=True)
                    if hints and store == "file":
                        runs.append(run)
                    failover = "not recovered" if run.failover is None else \
                        f"{run.failover:.2f}s = {run.failover / ttl:.2f} x TTL"
                    steps = ", ".join(f"{k} {n} opens / {u:.2f} unowned shard-s"
                                      for k, (n, u) in run.moves.items())
                    say(f"  {store}, {'hints' if hints else 'no hints'}, run {i + 1}: failover "
                        f"{failover}; balanced {run.join:.2f}s (~{run.join / interval:.1f} "
                        f"intervals) after a join, {run.leave:.2f}s "
                        f"(~{run.leave / interval:.1f} intervals) after a graceful leave; "
                        f"{steps}")
    done = [r.failover / ttl for r in runs if r.failover is not None]
    say(f"failover time / TTL after kill -9: median {_median(done)}, "
        f"min {min(done, default=math.nan):.2f}, max {max(done, default=math.nan):.2f} "
        f"over {len(done)} run(s) (the design's bound: TTL + 2 intervals = 1.67 x TTL)")
    say()


# -- 2. rounds to balance (simulation) ----------------------------------------------------


def bench_rounds(quick: bool) -> None:
    from shardlease.sim import Crash, Join, Leave, run_scenario

    seeds = range(2) if quick else range(10)
    sizes = (64,) if quick else (64, 256)
    say(f"== rounds to balance (simulation: real loop and runner on virtual time, memory "
        f"store, 3 nodes + 1 joining, lease TTL 15s, {len(seeds)} seed(s)) ==")
    for shards in sizes:
        rounds: dict[str, list[float]] = {"join": [], "leave": [], "crash": []}
        unbalanced: Counter[str] = Counter()
        recovery: list[float] = []
        problems = 0
        for seed in seeds:
            result = run_scenario(nodes=3, shards=shards, seed=seed, faults=[
                Join(at=60, node="n3"), Leave(at=120, node="n0"), Crash(at=180, node="n1")])
            problems += len(result.violations)
            for figure in result.balance:
                if figure.kind in rounds:
                    if figure.rounds is None:
                        unbalanced[figure.kind] += 1
                    else:
                        rounds[figure.kind].append(figure.rounds)
            recovery += [s / result.lease_ttl for s in result.recovery_seconds() if s is not None]
        for kind, label in (("join", "a node joins"), ("leave", "a node leaves (graceful)"),
                            ("crash", "a node crashes")):
            values = rounds[kind]
            never = f", not balanced in {unbalanced[kind]} run(s)" if unbalanced[kind] else ""
            say(f"rounds to balance after {label}, {shards} shards: median "
                f"{_median(values)}, max {max(values, default=math.nan):g}{never}")
        say(f"  simulated failover time / TTL, {shards} shards: median {_median(recovery)}, "
            f"max {max(recovery, default=math.nan):.2f}; invariant violations: {problems}")
    say()


def bench_scale(quick: bool) -> None:
    from shardlease.records import Renewal
    from shardlease.sim import Crash, Join, Leave, run_scenario

    # Shard mode makes every node write every lease it holds each round: at
    # 10,000 shards the simulation itself takes most of an hour, so it is
    # shown a size smaller.
    runs: tuple[tuple[Renewal, int, int], ...] = (
        (("shard", 10, 500), ("node", 10, 500)) if quick else
        (("shard", 100, 1000), ("node", 100, 10_000)))
    say("== rounds to balance at scale (simulation: real loops on virtual time, memory store, "
        "lease TTL 15s; the nodes start together, then one joins, one leaves, one crashes) ==")
    for renewal, nodes, shards in runs:
        result = run_scenario(nodes=nodes, shards=shards, seed=1, renewal=renewal, faults=[
            Join(at=60, node=f"n{nodes}"), Leave(at=120, node="n0"), Crash(at=180, node="n1")],
            recovery_bound=120.0)
        figures = {f.kind: f for f in result.balance}
        parts = []
        for kind in ("start", "join", "leave", "crash"):
            f = figures.get(kind)
            parts.append(f"{kind} {'never' if f is None or f.rounds is None else f.rounds}")
        say(f"rounds to balance, {renewal} renewal, {nodes} nodes x {shards} shards: "
            f"{', '.join(parts)}; invariant violations: {len(result.violations)}; "
            f"simulated {result.end:.0f}s in {result.real_seconds:.0f}s of wall time")
    say()


def bench_faults(quick: bool) -> None:
    from shardlease.loop import preference
    from shardlease.sim import LEASE_WRITES, STORE_CALLS, HostFault, StoreFault, run_scenario

    seeds = range(2) if quick else range(6)
    ttl, interval = 15.0, 5.0
    at, until = 40.0, 110.0
    say(f"== ordinary faults (simulation, lease TTL {ttl:g}s, {len(seeds)} seed(s)) ==")
    slow = {
        "every call but lease writes 3 intervals late (all nodes)":
            (None, StoreFault(at, until, latency=3 * interval,
                              calls=STORE_CALLS - LEASE_WRITES)),
        "every call of one node 0.3 x TTL late": (
            "n1", StoreFault(at, until, node="n1", latency=0.3 * ttl)),
        "30% of one node's calls failing (503)": (
            "n1", StoreFault(at, until, node="n1", error_rate=0.3)),
    }
    for label, (node, fault) in slow.items():
        fenced = moved = problems = 0
        for seed in seeds:
            r = run_scenario(nodes=3, shards=64, seed=seed, faults=[fault])
            problems += len(r.violations)
            fenced += r.counts.get("self_fence", 0)
            moved += sum(1 for ev in r.trace if ev.kind == "close_call" and at <= ev.t < until
                         and node in (None, ev.node))
        say(f"slow store, {label}: self-fences {fenced}, shards closed during the fault "
            f"{moved} (3 nodes, 64 shards); invariant violations: {problems}")
    for nodes, shards in ((2, 4), (4, 64)):
        refused = max(range(shards), key=lambda s: preference("n1", s))
        rounds: list[float] = []
        per_interval: list[float] = []
        normal: list[float] = []
        never = problems = 0
        end = 150.0
        span = (end - interval) / interval
        store = StoreFault(0, end, latency=0.01)  # 10 ms a call: time passes in a spin
        for seed in seeds:
            r = run_scenario(nodes=nodes, shards=shards, seed=seed, faults=[
                HostFault(0, end, node="n1", refuse=frozenset({refused})), store])
            clean = run_scenario(nodes=nodes, shards=shards, seed=seed, faults=[store])
            problems += len(r.violations) + len(clean.violations)
            since = r.open_for_good(refused, end, besides="n1")
            if since is None:
                never += 1
            else:
                rounds.append(math.ceil(since / interval))
            per_interval.append(r.requests_between("n1", interval, end) / span)
            normal.append(clean.requests_between("n1", interval, end) / span)
        missing = f", not open elsewhere at the end in {never} run(s)" if never else ""
        say(f"refusing host, {nodes} nodes, {shards} shards: rounds until the shard is open "
            f"elsewhere for good: median {_median(rounds)}, max "
            f"{max(rounds, default=math.nan):g}{missing}; requests per interval of the "
            f"refusing node: median {_median(per_interval)} (fault-free {_median(normal)}); "
            f"invariant violations: {problems}")
    opens = closes = 0
    for seed in seeds:
        r = run_scenario(nodes=4, shards=64, seed=seed)
        end = next(ev.t for ev in r.trace if ev.kind == "quiescent")
        opens += sum(1 for ev in r.trace if ev.kind == "open_ok" and ev.t < end)
        closes += sum(1 for ev in r.trace if ev.kind == "close_call" and ev.t < end)
    say(f"simultaneous start, 4 nodes, 64 shards: {opens / len(seeds):g} opens, "
        f"{closes / len(seeds):g} closes per start")
    say()


# -- 3c. a slow store, on real processes ----------------------------------------------------


#: The phases of the slow-store run, each 4 TTLs long, on one node's requests
#: (through `faultproxy`): added latency as a share of the TTL, or 503 answers.
SLOW_PHASES: tuple[tuple[str, float, float], ...] = (
    ("no fault", 0.0, 0.0),
    ("+0.15 x TTL latency", 0.15, 0.0),
    ("+0.3 x TTL latency", 0.3, 0.0),
    ("30% 503 SlowDown", 0.0, 0.3),
    ("+0.5 x TTL latency", 0.5, 0.0),
)
#: Phases in which the slowed node must keep its shards (the others are figures).
SLOW_KEEPS = ("no fault", "+0.15 x TTL latency", "+0.3 x TTL latency", "30% 503 SlowDown")


@dataclass
class PhaseFigures:
    """What one node went through during one phase of a slow-store run, from
    its recording host (opens, closes, self-fences, losses), its structured
    log (renew_slow, renew_failed) and the proxy in front of it (requests)."""

    label: str
    seconds: float
    self_fences: int  # self_fence events (each may fence several shards)
    fenced: int  # shards fenced
    lost: int
    held_start: int  # shards open on its host at the start of the phase
    held_min: int
    held_max: int
    held_end: int
    renew_slow: int
    renew_failed: int
    requests: dict[str, int]  # at the proxy, by kind (and slowdown, abandoned)
    errors: list[str]  # a few distinct renew_failed errors
    #: Cluster-wide, within the phase: the longest any shard was open on no
    #: node, and the shard-seconds of shards open on no node.
    closed_max: float = 0.0
    closed_area: float = 0.0

    def row(self) -> str:
        asked = sum(v for k, v in self.requests.items() if k not in ("slowdown", "abandoned"))
        extra = "".join(f", {self.requests[k]} {k}" for k in ("slowdown", "abandoned")
                        if self.requests.get(k))
        return (f"{self.label:<22} self-fences {self.self_fences:>2} ({self.fenced} shards), "
                f"lost {self.lost}, shards held {self.held_start} -> min {self.held_min} / "
                f"max {self.held_max} -> {self.held_end}, renew_slow {self.renew_slow}, "
                f"renew_failed {self.renew_failed}, requests {asked} "
                f"({asked / self.seconds:.1f}/s{extra}); shards open nowhere "
                f"{self.closed_area:.1f} shard-s, longest {self.closed_max:.1f}s")


def phase_figures(label: str, node: str, start: float, end: float,
                  recorded: list[dict[str, Any]], logged: list[dict[str, Any]],
                  requests: Counter[str]) -> PhaseFigures:
    """`node`'s figures between wall times `start` and `end`. `recorded`: the
    recording hosts' lines (any nodes); `logged`: `node`'s JSON log lines."""
    mine = sorted((e for e in recorded if e.get("node") == node),
                  key=lambda e: float(e["wall"]))
    open_now: set[int] = set()
    held_start: int | None = None
    low = high = 0
    fences = fenced = lost = 0
    for ev in mine:
        wall = float(ev["wall"])
        if wall > end:
            break
        if wall >= start and held_start is None:
            held_start = low = high = len(open_now)
        kind = ev.get("event")
        if kind == "open_end":
            open_now.add(int(ev["shard"]))
        elif kind == "close_start":
            open_now.discard(int(ev["shard"]))
        if wall >= start:
            low, high = min(low, len(open_now)), max(high, len(open_now))
            fences += kind == "self_fence"
            fenced += len(ev.get("shards", ())) if kind == "self_fence" else 0
            lost += kind == "lost"
    if held_start is None:
        held_start = low = high = len(open_now)
    in_phase = [e for e in logged if start <= float(e.get("ts", 0.0)) <= end]
    failed = [e for e in in_phase if e.get("event") == "renew_failed"]
    errors = list(dict.fromkeys(str(e.get("error", "")) for e in failed))[:3]
    return PhaseFigures(label, end - start, fences, fenced, lost, held_start, low, high,
                        len(open_now), sum(e.get("event") == "renew_slow" for e in in_phase),
                        len(failed), dict(sorted(requests.items())), errors,
                        *closed_stretches(recorded, start, end))


def open_on(recorded: list[dict[str, Any]], node: str) -> set[int]:
    """The shards open on `node`'s host at the end of the recording."""
    now: set[int] = set()
    for ev in sorted((e for e in recorded if e.get("node") == node),
                     key=lambda e: float(e["wall"])):
        if ev.get("event") == "open_end":
            now.add(int(ev["shard"]))
        elif ev.get("event") == "close_start":
            now.discard(int(ev["shard"]))
    return now


def closed_stretches(recorded: list[dict[str, Any]], start: float,
                     end: float) -> tuple[float, float]:
    """The longest stretch of [start, end] during which some shard was open
    on no node (from open_end to close_start, as the hosts saw it), and the
    sum of all such stretches over the shards (shard-seconds)."""
    by_shard: dict[int, list[tuple[float, int]]] = {}
    for ev in recorded:
        kind = ev.get("event")
        if kind in ("open_end", "close_start"):
            by_shard.setdefault(int(ev["shard"]), []).append(
                (float(ev["wall"]), 1 if kind == "open_end" else -1))
    longest = total = 0.0
    for changes in by_shard.values():
        changes.sort()
        count, closed_since = 0, start
        for wall, step in changes:
            if wall > end:
                break
            was = count
            count += step
            if was == 0 and count > 0 and wall > start:
                longest = max(longest, wall - closed_since)
                total += wall - closed_since
            elif count == 0:
                closed_since = max(wall, start)
        if count == 0:
            longest = max(longest, end - closed_since)
            total += end - closed_since
    return longest, total


async def _slow_run(endpoint: str, workdir: Path, ttl: float, shards: int, nodes: int,
                    phase: float) -> list[PhaseFigures]:
    """Node processes on S3 at `endpoint`, one of them through a `FaultProxy`,
    through `SLOW_PHASES` of `phase` seconds each, then until balanced again."""
    from shardlease.checker import check_events, load_events
    from shardlease.demo import Demo
    from shardlease.stores import open_store
    from shardlease_tools.faultproxy import NO_FAULTS, FaultProxy, Faults

    bucket = f"bench-slow-{os.urandom(3).hex()}"
    await _create_bucket(endpoint, bucket)
    proxy = FaultProxy(endpoint, seed=0)
    await proxy.start()
    names = [f"node-{i}" for i in range(nodes)]
    slowed = names[1]
    direct = f"s3://{bucket}/bench?endpoint={endpoint}&path_style=true"
    for sub in ("events", "logs"):
        (workdir / sub).mkdir(parents=True)
    demo = Demo(nodes=nodes, shards=shards, store_url=direct, cluster="bench", workdir=workdir,
                ttl=ttl, view="none", store_for={
                    slowed: f"s3://{bucket}/bench?endpoint={proxy.endpoint}&path_style=true"})
    store = open_store(direct)
    try:
        for name in names:
            demo.start(name)
        await demo.wait_balanced(store, "after the start")
        marks: list[tuple[str, float, float, Counter[str]]] = []
        for label, latency, errors in SLOW_PHASES:
            proxy.set(Faults(latency=latency * ttl, error_rate=errors))
            before, start = proxy.counts(), time.time()
            await asyncio.sleep(phase)
            marks.append((label, start, time.time(), proxy.counts() - before))
        proxy.set(NO_FAULTS)
        before, start = proxy.counts(), time.time()
        # Balanced in the store, and the slowed node's share open on its host
        # again (the store alone may still name it for leases it fenced).
        while len(open_on(load_events(demo.records), slowed)) < shards // nodes:
            if time.time() > start + demo.timeout:
                raise RuntimeError(f"{slowed} did not get its share back after the faults")
            await asyncio.sleep(0.2)
        await demo.wait_balanced(store, "after the faults")
        marks.append(("until balanced again", start, time.time(), proxy.counts() - before))
    finally:
        # In a thread: the proxy in this loop serves the slowed node's stop.
        await asyncio.to_thread(demo.stop_all, 3 * ttl)
        await proxy.aclose()
        with contextlib.suppress(Exception):
            await store.aclose()
    recorded = load_events(demo.records)
    logged = load_events([workdir / "logs" / f"{slowed}.log"])
    figures = [phase_figures(label, slowed, start, end, recorded, logged, requests)
               for label, start, end, requests in marks]
    report = check_events(recorded, conservative=True)
    if not report.ok:
        raise RuntimeError(f"two open owners of a shard: {report.violations[0]}")
    return figures


def bench_slow_store(quick: bool) -> None:
    ttl, shards, nodes = 3.0, 12, 3
    phase = (2 if quick else 4) * ttl
    with moto_endpoint() as endpoint:
        say(f"== slow store on real processes ({nodes} node processes on S3 (moto), "
            f"{shards} shards, lease TTL {ttl:g}s; node-1 alone through a fault-injecting "
            f"proxy: every request it makes, renewals included; phases of {phase:g}s) ==")
        if endpoint is None:
            say("slow store: not measured (moto is not installed: pip install 'moto[server]')")
            say()
            return
        workdir = Path(tempfile.mkdtemp(prefix="shardlease-bench-"))
        try:
            figures = asyncio.run(_slow_run(endpoint, workdir, ttl, shards, nodes, phase))
        except (RuntimeError, ShardleaseError, TimeoutError) as e:
            say(f"slow store: failed: {type(e).__name__}: {e} (files kept in {workdir})")
            say()
            return
        shutil.rmtree(workdir, ignore_errors=True)
    for f in figures:
        say(f"slow node, {f.row()}")
    say("  (no two open owners of any shard over the run: the overlap checker passed)")
    say()


# -- 3 and 4. requests and CPU per round in the steady state ----------------------------------


class NullHost:
    """Opens and closes nothing (the loop's own cost only)."""

    async def open(self, shard: int, generation: int) -> None:
        return None

    async def close(self, shard: int) -> None:
        return None


@dataclass
class Steady:
    requests: dict[str, float]  # per node per round, by kind
    cpu_ms: float  # CPU per node per round
    rounds: int  # node-rounds measured
    churn: int  # claims, releases, losses, fences or failed renewals during the window

    @property
    def total(self) -> float:
        return sum(self.requests.values())


class _Meter:
    """Watches one loop's telemetry: once `start()`ed, notes its store's
    request counts and the CPU clock at the end of each of its rounds."""

    def __init__(self, placement: PlacementLoop, rounds: int) -> None:
        self.placement = placement
        self.rounds = rounds
        self.requests = count_requests(placement.store)
        self.marks: list[tuple[Counter[str], float]] | None = None
        self.churn = 0
        self.progressed = asyncio.Event()
        placement.telemetry.subscribe(self)

    def __call__(self, event: Event) -> None:
        if isinstance(event, Claim | Release | Lost | SelfFence | RenewFailed):
            if self.marks is not None:
                self.churn += 1
        elif isinstance(event, Round) and event.node == self.placement.name:
            if self.marks is not None and not self.done():
                self.marks.append((Counter(self.requests), time.process_time()))
            self.progressed.set()

    def start(self) -> None:
        """Start measuring; call it right after one of the loop's rounds ended
        (nothing runs between rounds in the steady state)."""
        self.marks = [(Counter(self.requests), time.process_time())]

    def done(self) -> bool:
        return self.marks is not None and len(self.marks) > self.rounds

    def balanced(self, nodes: int, shards: int) -> bool:
        """As this node sees it: every node live, every shard owned by a live
        node, and this node within its fair share."""
        p = self.placement
        live = p.live_nodes()
        return (len(live) == nodes and len(p.held) <= math.ceil(shards / nodes)
                and all(o.owner in live for o in p.owners()))

    async def until(self, done: Callable[[], bool]) -> None:
        while not done():
            self.progressed.clear()
            await self.progressed.wait()

    async def settle(self, nodes: int, shards: int) -> None:
        """Wait for the end of a round after which this node sees the cluster
        balanced (returns right after that round)."""
        while True:
            before = self.placement.rounds
            await self.until(lambda b=before: self.placement.rounds > b)  # type: ignore[misc]
            if self.balanced(nodes, shards):
                return

    def steady(self) -> Steady:
        assert self.marks is not None and self.done()
        (first, cpu0), (last, cpu1) = self.marks[0], self.marks[-1]
        return Steady({k: v / self.rounds for k, v in sorted((last - first).items())},
                      1000 * (cpu1 - cpu0) / self.rounds, self.rounds, self.churn)


def _combine(parts: list[Steady]) -> Steady:
    n = len(parts)
    kinds = sorted({k for p in parts for k in p.requests})
    return Steady({k: sum(p.requests.get(k, 0.0) for p in parts) / n for k in kinds},
                  sum(p.cpu_ms for p in parts) / n, sum(p.rounds for p in parts),
                  sum(p.churn for p in parts))


def _options(name: str, shards: int, ttl: float, renewal: str = "shard") -> Options:
    return Options.make(shards=shards, lease_ttl=ttl, name=name, cluster_name="bench",
                        renewal=renewal)


async def steady_in_process(make_store: Callable[[], LeaseStore], shards: int, ttl: float,
                            rounds: int, renewal: str = "shard") -> Steady:
    """NODES loops in this process (the memory store cannot be shared across
    processes). CPU is the whole process's over the window, per node-round."""
    loops = [PlacementLoop(make_store(), NullHost(), _options(f"b{i}", shards, ttl, renewal))
             for i in range(NODES)]
    meters = [_Meter(p, rounds) for p in loops]
    tasks = [asyncio.create_task(p.run()) for p in loops]
    try:
        async with asyncio.timeout(40 * ttl):
            await asyncio.gather(*(m.settle(NODES, shards) for m in meters))
        cpu, before = time.process_time(), sum(p.rounds for p in loops)
        for m in meters:
            m.start()
        await asyncio.gather(*(m.until(m.done) for m in meters))
        cpu, done = time.process_time() - cpu, sum(p.rounds for p in loops) - before
        steady = _combine([m.steady() for m in meters])
        steady.cpu_ms = 1000 * cpu / done  # the process's CPU, shared by the loops
        return steady
    finally:
        await _wind_down(loops, tasks, ttl)


async def _wind_down(loops: list[PlacementLoop], tasks: list[asyncio.Task[None]],
                     ttl: float) -> None:
    """Stop `loops` gracefully (within 10 TTLs each), then cancel what runs."""
    for p in loops:
        with contextlib.suppress(Exception):
            await asyncio.wait_for(p.stop(), 10 * ttl)
    for t in tasks:
        t.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)


def node_worker(argv: list[str]) -> None:
    """One node in a process of its own (`steady_processes` drives it over
    stdin/stdout, one JSON line each way per step):

    1. write a heartbeat and say "ready"; wait for "go" (so that every node
       sees every other from its first round: a cold start without the churn
       of one node claiming everything first);
    2. run the loop; once settled, measure and print the figures;
    3. keep running, so the others measure a steady cluster, until killed
       (or stdin closes: then stop gracefully).
    """
    import json
    import logging
    import uuid

    from shardlease.records import Heartbeat, new_write_id
    from shardlease.stores import open_store

    # SHARDLEASE_BENCH_LOG=DIR: each node logs its rounds and events there.
    log_dir = os.environ.get("SHARDLEASE_BENCH_LOG")
    logging.basicConfig(level=logging.INFO if log_dir else logging.CRITICAL,
                        filename=f"{log_dir}/{argv[1]}.log" if log_dir else None,
                        format="%(created).3f %(name)s %(message)s")
    store_url, name = argv[0], argv[1]
    shards, ttl, rounds = int(argv[2]), float(argv[3]), int(argv[4])
    renewal = argv[5] if len(argv) > 5 else "shard"

    def tell(out: dict[str, Any]) -> None:
        print(json.dumps(out), flush=True)

    async def run() -> None:
        store = open_store(store_url)
        await store.put_heartbeat(Heartbeat(cluster="bench", node=name, seq=0,
                                            incarnation=uuid.uuid4().hex,
                                            write_id=new_write_id(), at=time.time()))
        tell({"ready": True})
        await asyncio.to_thread(sys.stdin.readline)
        placement = PlacementLoop(store, NullHost(), _options(name, shards, ttl, renewal))
        meter = _Meter(placement, rounds)
        if log_dir:
            from shardlease.telemetry import log_events

            logging.getLogger("shardlease").setLevel(logging.DEBUG)
            placement.telemetry.subscribe(log_events)
        task = asyncio.create_task(placement.run())
        try:
            async with asyncio.timeout(40 * ttl):
                await meter.settle(NODES, shards)
                meter.start()
                await meter.until(meter.done)
            tell(dataclasses.asdict(meter.steady()))
        except Exception as e:
            tell({"error": f"{type(e).__name__}: {e}" if str(e) else type(e).__name__})
        await asyncio.to_thread(sys.stdin.readline)
        with contextlib.suppress(Exception):
            await asyncio.wait_for(placement.stop(), 10 * ttl)
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        with contextlib.suppress(Exception):
            await store.aclose()

    try:
        asyncio.run(run())
    except Exception as e:
        tell({"error": f"{type(e).__name__}: {e}"})


_WORKER = "import sys; from shardlease_tools.bench import node_worker; node_worker(sys.argv[1:])"


def steady_processes(store_url: str, shards: int, ttl: float, rounds: int,
                     renewal: str = "shard", env: dict[str, str] | None = None) -> Steady:
    """NODES node processes on one store; each measures its own requests and
    CPU (time.process_time of that process) over `rounds` of its rounds."""
    import json
    import queue
    import threading

    procs = [subprocess.Popen([sys.executable, "-c", _WORKER, store_url, f"b{i}", str(shards),
                               str(ttl), str(rounds), renewal], stdin=subprocess.PIPE,
                              stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
                              env=None if env is None else {**os.environ, **env})
             for i in range(NODES)]
    lines: queue.Queue[str] = queue.Queue()

    def read(out: Any) -> None:
        for line in out:
            lines.put(line)
        lines.put("")  # the process is gone

    for proc in procs:
        threading.Thread(target=read, args=(proc.stdout,), daemon=True).start()

    def collect(timeout: float) -> list[dict[str, Any]]:
        got = []
        for _ in procs:
            try:
                line = lines.get(timeout=timeout)
            except queue.Empty:
                raise RuntimeError("a node process did not answer in time") from None
            out = json.loads(line) if line.strip() else {"error": "a node process died"}
            if "error" in out:
                raise RuntimeError(out["error"])
            got.append(out)
        return got

    def send(line: str) -> None:
        for proc in procs:
            assert proc.stdin is not None
            with contextlib.suppress(OSError):
                proc.stdin.write(line + "\n")
                proc.stdin.flush()

    try:
        collect(60.0)  # ready
        send("go")
        return _combine([Steady(**out) for out in collect(60 * ttl)])
    finally:
        # Measured: no graceful stop needed (the store is thrown away), and
        # freeing a thousand leases on a slow store takes a round.
        for proc in procs:
            proc.kill()
            proc.wait()


_MOTO = """
import sys, threading
from moto.moto_server.werkzeug_app import (DomainDispatcherApplication, MotoRequestHandler,
                                           create_backend_app)
from werkzeug.serving import make_server
app = DomainDispatcherApplication(create_backend_app)
lock = threading.Lock()
def serial(environ, start_response):  # moto's conditional PUTs are atomic only serialised
    with lock:
        return list(app(environ, start_response))
server = make_server("127.0.0.1", 0, serial, threaded=True, request_handler=MotoRequestHandler)
print(server.server_port, flush=True)
server.serve_forever()
"""


@contextlib.contextmanager
def moto_endpoint() -> Iterator[str | None]:
    """moto's S3 server in a child process on loopback (None: moto is not
    installed). Sets test credentials in this process's environment."""
    import importlib.util

    if importlib.util.find_spec("moto") is None:
        yield None
        return
    proc = subprocess.Popen([sys.executable, "-c", _MOTO], stdout=subprocess.PIPE,
                            stderr=subprocess.DEVNULL, stdin=subprocess.DEVNULL)
    try:
        assert proc.stdout is not None
        port = int(proc.stdout.readline())
        saved = dict(os.environ)
        os.environ.update({"AWS_ACCESS_KEY_ID": "bench", "AWS_SECRET_ACCESS_KEY": "bench",
                           "AWS_REGION": "us-east-1", "AWS_EC2_METADATA_DISABLED": "true",
                           "AWS_CONFIG_FILE": os.devnull,
                           "AWS_SHARED_CREDENTIALS_FILE": os.devnull})
        os.environ.pop("AWS_SESSION_TOKEN", None)
        os.environ.pop("AWS_PROFILE", None)
        try:
            yield f"http://127.0.0.1:{port}"
        finally:
            os.environ.clear()
            os.environ.update(saved)
    finally:
        proc.terminate()
        proc.wait()


async def _create_bucket(endpoint: str, bucket: str) -> None:
    from aiobotocore.session import get_session  # type: ignore[import-untyped]

    async with get_session().create_client("s3", endpoint_url=endpoint,
                                           region_name="us-east-1") as client:
        await client.create_bucket(Bucket=bucket)


def file_latency(directory: str) -> float:
    """Seconds one conditional lease write takes in `directory` (it fsyncs)."""
    from shardlease.records import Lease, new_write_id
    from shardlease.stores.file import FileStore

    async def measure() -> float:
        store = FileStore(directory)
        started = time.perf_counter()
        for shard in range(20):
            await store.create_lease(Lease(cluster="latency", shard=shard, owner="b",
                                           generation=1, write_id=new_write_id(), ttl=3.0))
        return (time.perf_counter() - started) / 20

    return asyncio.run(measure())


#: Published S3 request prices, dollars per 1,000 requests (GET and HEAD are
#: cheaper; DELETE is free).
S3_PRICE = {"put": 0.005, "list": 0.005, "get": 0.0004, "head": 0.0004, "delete": 0.0}
#: Rounds per month at the default interval (lease TTL 15 s / 3).
ROUNDS_PER_MONTH = 30 * 24 * 3600 / 5.0


def s3_monthly_cost(steady: Steady, nodes: int = NODES) -> float:
    """Dollars a month of S3 requests for `nodes` nodes at the default interval."""
    per_round = sum(S3_PRICE.get(kind, 0.005) * n / 1000 for kind, n in steady.requests.items())
    return per_round * nodes * ROUNDS_PER_MONTH


# -- graceful stops of every node at once ---------------------------------------------------

#: Nodes stopped at once (and started in their place) by `bench_stop`.
STOP_NODES = 4


class TimedHost:
    """Opens at once, closes after `close_latency` seconds; notes when."""

    def __init__(self, close_latency: float) -> None:
        self.close_latency = close_latency
        self.opened: dict[int, float] = {}
        self.closed: dict[int, float] = {}

    async def open(self, shard: int, generation: int) -> None:
        self.opened.setdefault(shard, time.monotonic())

    async def close(self, shard: int) -> None:
        await asyncio.sleep(self.close_latency)
        self.closed[shard] = time.monotonic()


@dataclass
class StopRun:
    writes: list[int]  # store writes (PUTs and deletes) of each stopping node during its stop
    fences: int  # self-fences of the stopping nodes during their stops
    abandoned: int  # closes they abandoned (overruns)
    stop_s: list[float]  # how long each stop took
    reopened_s: float | None  # from the stops to every shard open on the new nodes
    unowned: float  # shard-seconds between a shard's close and its open elsewhere


async def _stop_run(make_store: Callable[[], LeaseStore], shards: int, ttl: float,
                    renewal: str, close_latency: float) -> StopRun:
    """STOP_NODES loops share `shards`; once balanced, all stop at once while
    as many new loops start (a rollout of every pod at once)."""
    old_hosts = [TimedHost(close_latency) for _ in range(STOP_NODES)]
    old = [PlacementLoop(make_store(), h, _options(f"old{i}", shards, ttl, renewal))
           for i, h in enumerate(old_hosts)]
    counts = Counter[str]()
    stopping = False

    def count(event: Event) -> None:
        if stopping and isinstance(event, SelfFence | Overrun):
            counts[type(event).__name__] += 1

    for p in old:
        p.telemetry.subscribe(count)
    meters = [_Meter(p, 1) for p in old]
    tasks = [asyncio.create_task(p.run()) for p in old]
    new: list[PlacementLoop] = []
    try:
        async with asyncio.timeout(40 * ttl):
            await asyncio.gather(*(m.settle(STOP_NODES, shards) for m in meters))
        new_hosts = [TimedHost(close_latency) for _ in range(STOP_NODES)]
        new = [PlacementLoop(make_store(), h, _options(f"new{i}", shards, ttl, renewal))
               for i, h in enumerate(new_hosts)]
        counted = [count_requests(p.store) for p in old]
        stopping, started = True, time.monotonic()
        tasks += [asyncio.create_task(p.run()) for p in new]

        async def stop(p: PlacementLoop) -> float:
            await p.stop()
            return time.monotonic() - started

        stop_s = await asyncio.wait_for(asyncio.gather(*(stop(p) for p in old)), 40 * ttl)
        writes = [sum(c[k] for k in ("put", "delete")) for c in counted]
        reopened_s = None
        deadline = time.monotonic() + 20 * ttl
        while time.monotonic() < deadline:
            opened = {s: t for h in new_hosts for s, t in h.opened.items()}
            if len(opened) == shards:
                reopened_s = max(opened.values()) - started
                break
            await asyncio.sleep(0.05)
        closed = {s: t for h in old_hosts for s, t in h.closed.items()}
        opened = {s: t for h in new_hosts for s, t in h.opened.items()}
        end = time.monotonic()
        unowned = sum(opened.get(s, end) - t for s, t in closed.items())
        return StopRun(writes, counts["SelfFence"], counts["Overrun"], list(stop_s),
                       reopened_s, unowned)
    finally:
        await _wind_down(new, tasks, ttl)
        for p in (*old, *new):
            with contextlib.suppress(Exception):
                await p.store.aclose()


def bench_stop(quick: bool) -> None:
    """Issue 17, item 0: what a graceful stop of every node at once costs."""
    from shardlease.stores import open_store
    from shardlease.stores.file import FileStore
    from shardlease.stores.memory import MemoryBackend, MemoryStore

    per_node, ttl = (8, 3.0) if quick else (128, 6.0)
    shards, close_latency = STOP_NODES * per_node, 0.05
    say(f"== graceful stop of every node at once: {STOP_NODES} nodes x {per_node} shards "
        f"stopped together while {STOP_NODES} new ones start (a rollout of every pod), "
        f"lease TTL {ttl:g}s, closes of {1000 * close_latency:g} ms ==")
    say("  writes: store writes of each stopping node during its stop (PUTs, deletes); fences "
        "and abandoned closes on the stopping nodes; reopened: every shard open on a new node")

    def row(kind: str, make: Callable[[], Callable[[], LeaseStore]],
            modes: tuple[str, ...] = ("node", "shard")) -> None:
        for renewal in modes:
            begun = time.monotonic()
            try:
                r = asyncio.run(_stop_run(make(), shards, ttl, renewal, close_latency))
            except (RuntimeError, ShardleaseError, TimeoutError) as e:
                say(f"graceful stop, {kind}, {renewal} renewal: failed: {type(e).__name__}: {e}")
                continue
            reopened = "not all reopened" if r.reopened_s is None else \
                f"every shard reopened after {r.reopened_s:.2f}s"
            say(f"graceful stop, {kind}, {renewal} renewal, {STOP_NODES} x {per_node} shards: "
                f"store writes per stopping node {min(r.writes)}-{max(r.writes)} "
                f"({sum(r.writes) / shards:.2f} per shard), self-fences {r.fences}, abandoned "
                f"closes {r.abandoned}, stops {min(r.stop_s):.2f}-{max(r.stop_s):.2f}s, "
                f"{reopened} ({r.unowned:.1f} unowned shard-seconds) "
                f"[{time.monotonic() - begun:.0f}s]")

    def memory() -> Callable[[], LeaseStore]:
        backend = MemoryBackend()
        return lambda: MemoryStore(backend, name="bench")

    row("memory", memory)
    shm = "/dev/shm" if os.access("/dev/shm", os.W_OK) else None
    directory = tempfile.mkdtemp(prefix="shardlease-bench-", dir=shm)
    try:
        count = itertools.count()

        def file() -> Callable[[], LeaseStore]:
            where = Path(directory) / str(next(count))  # one store per run, shared by its nodes
            return lambda: FileStore(where)

        row("file", file)
    finally:
        shutil.rmtree(directory, ignore_errors=True)
    with moto_endpoint() as endpoint:
        if endpoint is None:
            say("  s3: moto is not installed (pip install './tools[s3]')")
        else:
            def s3() -> Callable[[], LeaseStore]:
                bucket = f"stop-{uuid.uuid4().hex[:8]}"
                asyncio.run(_create_bucket(endpoint, bucket))
                url = f"s3://{bucket}/stop?endpoint={endpoint}&path_style=true"
                return lambda: open_store(url)
            # Shard renewal of 512 shards is 256 PUTs a second at this TTL,
            # more than moto serves on this machine: node renewal only.
            row("s3", s3, modes=("node", "shard") if quick else ("node",))
    say()


def bench_requests(quick: bool, kubeconfig: str | None = None) -> None:
    from shardlease.stores.memory import MemoryBackend, MemoryStore
    from shardlease.stores.s3 import FULL_LIST_EVERY

    sizes = SIZES[:1] if quick else SIZES
    big = () if quick else BIG_SIZES
    rounds = 2
    # A quiet node-mode round on S3 lists no lease unless it is one of every
    # FULL_LIST_EVERY (stores/s3.py): a window of that many rounds holds one
    # such listing, where one of 2 rounds would hold none or a whole one.
    s3_node_rounds = max(rounds, FULL_LIST_EVERY)
    say(f"== store requests per node per round and loop CPU per round (steady state: "
        f"{NODES} nodes, every shard owned, nothing moving; {rounds} rounds of each node, "
        f"{s3_node_rounds} on S3 in node mode), for both renewal modes (docs/renewal.md) ==")
    say("  memory: 4 loops in one process; file, s3 and kubernetes: 4 node processes, each "
        "measuring its own requests and CPU")
    say("  requests: one per store call (memory, file), one per HTTP request (s3, kubernetes)")

    def measure(kind: str, run: Callable[[int, str], Steady], cost: bool = False,
                extra: tuple[int, ...] = ()) -> None:
        for renewal in ("shard", "node"):
            # Shard mode at 4096 shards is thousands of writes per round: the
            # big sizes are measured in node mode only.
            for shards in (*sizes, *(extra if renewal == "node" else ())):
                started = time.monotonic()
                try:
                    row: Steady | str = run(shards, renewal)
                except (RuntimeError, ShardleaseError, TimeoutError) as e:
                    row = f"failed: {type(e).__name__}: {e}"
                _print_row(f"{kind}, {renewal} renewal", shards, row,
                           time.monotonic() - started, cost)

    def memory(shards: int, renewal: str) -> Steady:
        backend = MemoryBackend()
        return asyncio.run(steady_in_process(lambda: MemoryStore(backend, name="bench"),
                                             shards, max(1.5, shards / 400), rounds, renewal))

    measure("memory", memory, extra=big)

    # tmpfs when there is one: the figures are requests and CPU, and a disk's
    # fsync latency would only stretch the rounds (reported separately below).
    shm = "/dev/shm" if os.access("/dev/shm", os.W_OK) else None

    def file(shards: int, renewal: str) -> Steady:
        directory = tempfile.mkdtemp(prefix="shardlease-bench-", dir=shm)
        try:
            return steady_processes(f"file://{directory}", shards, max(1.5, shards / 200),
                                    rounds, renewal)
        finally:
            shutil.rmtree(directory, ignore_errors=True)

    measure("file" + (" (tmpfs)" if shm else ""), file, extra=big)

    with moto_endpoint() as endpoint:
        if endpoint is None:
            say("s3: not measured (moto is not installed: pip install 'moto[server]')")
        else:
            def s3(shards: int, renewal: str) -> Steady:
                bucket = f"bench-{shards}-{os.urandom(3).hex()}"
                asyncio.run(_create_bucket(endpoint, bucket))
                url = f"s3://{bucket}/bench?endpoint={endpoint}&path_style=true"
                # moto serves each request in turn: a round of 1024 shards took ~13 s
                # here (4 nodes, 2 CPUs), so the interval (TTL/3) must exceed it.
                # The smoke test (--quick) runs beside the rest of the suite, whose
                # load once stretched shard mode's 64-shard rounds past a 3.8 s TTL.
                floor = 8.0 if quick and renewal == "shard" else 3.0
                ttl = min(45.0, max(floor, shards / (17 if renewal == "shard" else 120)))
                return steady_processes(url, shards, ttl,
                                        s3_node_rounds if renewal == "node" else rounds, renewal)

            measure("s3 (moto)", s3, cost=True, extra=big)

    if kubeconfig is None:
        say("kubernetes: not measured (give --kubeconfig of a cluster to write Leases to)")
    else:
        def kubernetes(shards: int, renewal: str) -> Steady:
            namespace = asyncio.run(_k8s_namespace(kubeconfig))
            try:
                ttl = min(45.0, max(3.0, shards / (40 if renewal == "shard" else 200)))
                return steady_processes(f"kubernetes://{namespace}", shards, ttl, rounds,
                                        renewal, env={"KUBECONFIG": kubeconfig})
            finally:
                asyncio.run(_k8s_namespace(kubeconfig, delete=namespace))

        measure("kubernetes", kubernetes, extra=big[:0] if quick else (4096,))
        say("  (kubernetes writes per second per node = put per round / interval; the "
            "interval is lease TTL / 3)")

    directory = tempfile.mkdtemp(prefix="shardlease-bench-")
    try:
        latency = file_latency(directory)
    finally:
        shutil.rmtree(directory, ignore_errors=True)
    say(f"file store write latency in {tempfile.gettempdir()} (fsync): {1000 * latency:.1f} ms; "
        f"each renewal is one such write (a node renews up to 32 leases at once), so keep "
        f"(leases per node / 32) x {1000 * latency:.1f} ms well under the interval")
    say()


async def _k8s_namespace(kubeconfig: str, delete: str | None = None) -> str:
    """Make a namespace for one measurement (or delete it)."""
    from shardlease.kubeapi import KubeClient

    api = KubeClient.from_config(kubeconfig)
    try:
        if delete is not None:
            await api.call("DELETE", f"/api/v1/namespaces/{delete}")
            return delete
        name = f"bench-{os.urandom(3).hex()}"
        status, payload = await api.call("POST", "/api/v1/namespaces",
                                         {"metadata": {"name": name}})
        if status not in (200, 201):
            raise RuntimeError(f"cannot create namespace {name}: {status} {payload}")
        return name
    finally:
        await api.close()


def _print_row(kind: str, shards: int, steady: Steady | str, took: float,
               cost: bool = False) -> None:
    if isinstance(steady, str):
        say(f"store requests per node per round, {kind}, {shards} shards: {steady}")
        return
    parts = ", ".join(f"{k} {v:.1f}" for k, v in steady.requests.items())
    quiet = "" if steady.churn == 0 else f" (not quiet: {steady.churn} claims/releases/fences)"
    say(f"store requests per node per round, {kind}, {shards} shards: {steady.total:.1f} "
        f"({parts}){quiet}")
    if cost:
        say(f"S3 requests a month, {kind}, {shards} shards, {NODES} nodes, interval 5 s: "
            f"${s3_monthly_cost(steady):,.0f}")
    say(f"loop CPU per round, {kind}, {shards} shards: {steady.cpu_ms:.2f} ms per node "
        f"(over {steady.rounds} node-rounds; measured in {took:.0f}s)")


# -- the command ----------------------------------------------------------------------------


def cmd_bench(args: argparse.Namespace) -> int:
    import logging

    logging.basicConfig(level=logging.ERROR, stream=sys.stderr)
    started = time.monotonic()
    say(f"shardlease bench{' --quick' if args.quick else ''} ({os.cpu_count()} CPUs, "
        f"Python {sys.version.split()[0]})")
    say()
    only = set(args.only or ())

    def wanted(section: str) -> bool:
        return not only or section in only

    if wanted("failover"):
        bench_failover(args.quick)
    if wanted("rounds"):
        bench_rounds(args.quick)
    if wanted("faults"):
        bench_faults(args.quick)
    if wanted("slow-store"):
        bench_slow_store(args.quick)
    if wanted("requests"):
        bench_requests(args.quick, args.kubeconfig)
    if wanted("stop"):
        bench_stop(args.quick)
    if wanted("scale"):
        bench_scale(args.quick)
    say(f"bench done in {time.monotonic() - started:.0f}s")
    return 0
