"""`shardlease demo`: node processes on one store, driven through a kill, a
failover, a join and a graceful stop, then checked for overlapping owners.

On a terminal it draws a live grid (demo_view.py) and, at the end, a
timeline of the whole run, also saved as an SVG picture; piped, it prints
the JSON lines it always printed (one per change of owners, one per phase).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import math
import os
import signal
import socket
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.live import Live

from shardlease.demo_view import DemoView, save_svg
from shardlease.errors import DemoError as DemoError  # (re-exported: its old home)
from shardlease.errors import ShardleaseError
from shardlease.owners import OwnerRow, read_owners
from shardlease.stores.base import LeaseStore


def _free_udp_port() -> int:
    """A UDP port free on loopback now (the kernel's pick)."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@dataclass
class DemoNode:
    name: str
    proc: subprocess.Popen[bytes] | None = None
    state: str = "new"  # running, killed, stopped


@dataclass
class Demo:
    """Several `shardlease node` processes on one store, driven through a kill,
    a failover, a join and a graceful stop, with a recording host."""

    nodes: int
    shards: int
    store_url: str
    cluster: str
    workdir: Path
    ttl: float
    #: "table" (a live grid on a terminal), "json" (lines) or "none" (the bench).
    view: str
    keep: bool = False
    timeout: float = 60.0
    #: Nodes that reach the store another way (the bench: through a fault proxy).
    store_for: dict[str, str] = field(default_factory=dict)
    #: Whether the nodes hint each other (`--hints`, `--peer`): a freed shard
    #: reopens at once (the bench measures both).
    hints: bool = True
    started: float = field(default_factory=time.time)
    members: dict[str, DemoNode] = field(default_factory=dict)
    marks: list[tuple[str, float]] = field(default_factory=list)
    phase: str = ""
    _last_view: str = ""
    #: What is drawn: the live grid and, at the end, the timeline.
    picture: DemoView | None = None
    _live: Live | None = None

    def __post_init__(self) -> None:
        self.picture = DemoView(shards=self.shards, ttl=self.ttl)
        #: Each node's hint address: the demo's nodes know every other.
        self.hint_ports = {f"node-{i}": _free_udp_port() for i in range(self.nodes)}

    @property
    def records(self) -> list[Path]:
        return sorted((self.workdir / "events").glob("*.jsonl"))

    def command(self, name: str) -> list[str]:
        return [sys.executable, "-m", "shardlease", "node",
                "--store", self.store_for.get(name, self.store_url),
                "--cluster", self.cluster, "--name", name, "--shards", str(self.shards),
                "--lease-ttl", f"{self.ttl:g}",
                "--host", f"record:{self.workdir / 'events' / (name + '.jsonl')}",
                "--log-format", "json", "--parent-pid", str(os.getpid()),
                *self.hint_args(name)]

    def hint_args(self, name: str) -> list[str]:
        if not self.hints:
            return []
        port = self.hint_ports.setdefault(name, _free_udp_port())
        args = ["--hints", f"127.0.0.1:{port}"]
        for peer, peer_port in sorted(self.hint_ports.items()):
            args += ["--peer", f"{peer}=127.0.0.1:{peer_port}"]
        return args

    def start(self, name: str) -> None:
        assert self.picture is not None
        self.picture.colour(name)  # colours in the order the nodes start
        member = self.members.setdefault(name, DemoNode(name))
        with open(self.workdir / "logs" / f"{name}.log", "ab") as log:
            member.proc = subprocess.Popen(self.command(name), stdin=subprocess.DEVNULL,
                                           stdout=log, stderr=log, start_new_session=True)
        member.state = "running"

    def running(self) -> list[str]:
        return [m.name for m in self.members.values()
                if m.state == "running" and m.proc is not None and m.proc.poll() is None]

    def mark(self, what: str, symbol: str = "|") -> float:
        now = time.time()
        self.marks.append((what, now))
        assert self.picture is not None
        self.picture.mark(now - self.started, what, symbol)
        self.say(what)
        return now

    # -- the terminal view ------------------------------------------------------------------

    def states(self) -> dict[str, str]:
        running = self.running()
        return {m.name: m.state if m.state != "running" or m.name in running else "exited"
                for m in self.members.values()}

    def _grid(self) -> Any:
        assert self.picture is not None
        return self.picture.grid(time.time() - self.started, self.states())

    def __enter__(self) -> Demo:
        if self.view == "table":
            # Redrawn four times a second, so the countdown moves between reads.
            self._live = Live(get_renderable=self._grid, refresh_per_second=4,
                              console=Console(), transient=False)
            self._live.start()
        return self

    def __exit__(self, *_: object) -> None:
        if self._live is not None:
            self._live.stop()
            self._live = None

    def say(self, what: str) -> None:
        self.phase = what
        if self.view == "json":
            print(json.dumps({"t": round(time.time() - self.started, 3), "phase": what}),
                  flush=True)

    def show(self, rows: Sequence[OwnerRow]) -> None:
        owners = [r.owner for r in rows]
        assert self.picture is not None
        self.picture.record(time.time() - self.started, owners, [r.generation for r in rows])
        if self.view in ("none", "table"):
            return  # the live grid redraws itself
        key = json.dumps(owners)
        if key != self._last_view:
            self._last_view = key
            print(json.dumps({"t": round(time.time() - self.started, 3), "owners": owners,
                              "generations": [r.generation for r in rows],
                              "running": self.running()}), flush=True)

    async def owners(self, store: LeaseStore) -> list[OwnerRow]:
        try:
            rows, _ = await read_owners(store, self.cluster, self.shards)
        except ShardleaseError:
            return []
        self.show(rows)
        return rows

    def balanced(self, rows: Sequence[OwnerRow]) -> bool:
        live = self.running()
        if not rows or not live or any(r.owner not in live for r in rows):
            return False
        counts = Counter(r.owner for r in rows)
        return max(counts.values()) <= math.ceil(self.shards / len(live))

    async def wait_balanced(self, store: LeaseStore, what: str) -> float:
        deadline = time.time() + self.timeout
        while time.time() < deadline:
            if self.balanced(await self.owners(store)):
                return time.time()
            for m in self.members.values():
                if m.state == "running" and m.proc is not None and m.proc.poll() is not None:
                    raise DemoError(f"node {m.name} exited with status {m.proc.returncode}; "
                                    f"see {self.workdir / 'logs' / (m.name + '.log')}")
            await asyncio.sleep(0.2)
        raise DemoError(f"no balance {what} within {self.timeout:g}s")

    def kill(self, name: str) -> float:
        member = self.members[name]
        assert member.proc is not None
        member.proc.send_signal(signal.SIGKILL)
        member.proc.wait()
        member.state = "killed"
        now = time.time()
        assert self.picture is not None
        self.picture.countdown_from = now - self.started
        return now

    def stop_all(self, grace: float) -> dict[str, int | None]:
        """SIGTERM every live node, wait for them, SIGKILL what is left."""
        procs = {m.name: m.proc for m in self.members.values()
                 if m.proc is not None and m.proc.poll() is None}
        for proc in procs.values():
            with contextlib.suppress(ProcessLookupError):
                proc.send_signal(signal.SIGTERM)
        end = time.time() + grace
        codes: dict[str, int | None] = {}
        for name, proc in procs.items():
            try:
                codes[name] = proc.wait(max(0.1, end - time.time()))
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
                codes[name] = None
            self.members[name].state = "stopped"
        return codes


def recovery_after(events: Sequence[dict[str, Any]], victim: str, killed_at: float,
                   lost: Sequence[int]) -> float | None:
    """Seconds from the kill until every shard the victim held was open on
    another node again (from the recorded `open_end` lines)."""
    reopened: dict[int, float] = {}
    for ev in events:
        if ev.get("event") == "open_end" and ev.get("node") != victim \
                and ev.get("shard") in lost and float(ev["wall"]) >= killed_at:
            shard = int(ev["shard"])
            reopened[shard] = min(reopened.get(shard, math.inf), float(ev["wall"]))
    if set(reopened) != set(lost):
        return None
    return max(reopened.values(), default=killed_at) - killed_at


async def run_demo(demo: Demo, store: LeaseStore, svg: Path | None = None) -> bool:
    """The whole demo; prints the summary and returns whether it passed.
    Raises ShardleaseError if the store cannot be used, DemoError if a step
    did not finish."""
    await store.check()
    with demo:
        outcome = await _steps(demo, store)
    return _summary(demo, store, svg, *outcome)


async def _steps(demo: Demo, store: LeaseStore) -> tuple[Any, ...]:
    names = [f"node-{i}" for i in range(demo.nodes)]
    victim = names[len(names) // 2]
    demo.mark(f"starting {demo.nodes} nodes: {', '.join(names)}", "S")
    for name in names:
        demo.start(name)
    t0 = time.time()
    balanced_at = await demo.wait_balanced(store, "after the start")
    demo.mark(f"balanced after {balanced_at - t0:.1f}s")
    rows = await demo.owners(store)
    lost = [r.shard for r in rows if r.owner == victim]
    await asyncio.sleep(1.0)

    demo.mark(f"kill -9 {victim} (it held shards {' '.join(map(str, lost))}); its leases "
              f"must expire ({demo.ttl:g}s) before others take them", "K")
    killed_at = demo.kill(victim)
    failover_at = await demo.wait_balanced(store, f"after killing {victim}")
    assert demo.picture is not None
    demo.picture.countdown_from = None
    demo.mark(f"failover done: {victim}'s shards owned by "
              f"{', '.join(demo.running())} after {failover_at - killed_at:.1f}s")
    await asyncio.sleep(1.0)

    demo.mark(f"restarting {victim} (a join): the others release shards above their share",
              "J")
    joined_at = time.time()
    demo.start(victim)
    rejoined_at = await demo.wait_balanced(store, f"after {victim} joined")
    demo.mark(f"rebalanced after the join in {rejoined_at - joined_at:.1f}s")
    await asyncio.sleep(1.0)

    demo.mark("SIGTERM to every node: each closes its shards and frees its leases", "T")
    codes = demo.stop_all(grace=3 * demo.ttl)
    final = await demo.owners(store)
    return (names, victim, lost, t0, balanced_at, killed_at, failover_at, joined_at,
            rejoined_at, codes, final)


def _summary(demo: Demo, store: LeaseStore, svg: Path | None, names: list[str], victim: str,
             lost: list[int], t0: float, balanced_at: float, killed_at: float,
             failover_at: float, joined_at: float, rejoined_at: float,
             codes: dict[str, int | None], final: list[OwnerRow]) -> bool:
    from shardlease.checker import check_events, load_events

    still_owned = [r.shard for r in final if r.owner is not None]
    assert demo.picture is not None
    timeline = demo.picture.timeline()
    if demo.view == "table":
        console = Console()
        console.print()
        console.rule("timeline: shards (rows) over time, coloured by owner, "
                     "generation at each claim")
        console.print(timeline)
    if svg is not None:
        save_svg(timeline, svg, title=f"shardlease demo: {demo.nodes} nodes, "
                 f"{demo.shards} shards, lease TTL {demo.ttl:g}s")

    events = load_events(demo.records)
    report = check_events(events)
    kinds = Counter(str(ev.get("event")) for ev in events)
    recovered = recovery_after(events, victim, killed_at, lost)
    print()
    print("== shardlease demo summary ==")
    print(f"store                {demo.store_url} (cluster {demo.cluster})")
    print(f"nodes, shards, TTL   {demo.nodes} nodes, {demo.shards} shards, "
          f"lease TTL {demo.ttl:g}s")
    print(f"claims               {kinds['claim']}")
    print(f"releases             {kinds['release']}")
    print(f"opens / closes       {kinds['open_end']} / {kinds['close_end']}")
    print(f"lost / self-fenced   {kinds['lost']} / {kinds['self_fence']}")
    print(f"first balance        {balanced_at - t0:.2f}s after the start")
    if recovered is None:
        print(f"recovery after kill  NOT RECOVERED ({victim}'s shards were not all reopened)")
    else:
        print(f"recovery after kill  {recovered:.2f}s = {recovered / demo.ttl:.2f} x TTL "
              f"(all {len(lost)} shards of {victim} reopened elsewhere)")
    print(f"balance after kill   {failover_at - killed_at:.2f}s")
    print(f"balance after join   {rejoined_at - joined_at:.2f}s")
    graceful = all(c == 0 for c in codes.values()) and not still_owned
    print(f"graceful stop        {'ok' if graceful else 'NOT CLEAN'}: exit statuses "
          f"{codes}, leases still owned after the stop: {still_owned or 'none'}")
    print(f"overlap check        {report.summary()}")
    for violation in report.violations[:20]:
        print(f"  - {violation}")
    kept = "" if demo.keep else " (removed on PASS; --keep keeps them)"
    print(f"recorded events      {demo.workdir / 'events'}{kept}")
    if svg is not None:
        print(f"timeline picture     {svg}")
    ok = report.ok and recovered is not None and graceful
    print("RESULT               " + ("PASS" if ok else "FAIL"))
    return ok
