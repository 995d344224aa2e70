"""The `shardlease` command: run a node, show the owners, run the demo, bench.

    shardlease node   --store URL --cluster NAME --name NAME --shards N [...]
    shardlease owners --store URL --cluster NAME [--shards N] [-o table|json]
    shardlease demo   [--nodes 3] [--shards 12] [--store file:///path]
    shardlease bench  [--quick]

Exit status: 0 on success (a node stopped by SIGTERM/SIGINT after releasing
its shards), 2 for a bad option or store URL, 1 when the store cannot be used
or the node failed. Errors are one line on stderr, never a traceback.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import logging
import math
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, NoReturn

from shardlease.errors import ConfigError, ShardleaseError
from shardlease.hosts.base import Host
from shardlease.hosts.record import RecordHost
from shardlease.options import Options
from shardlease.stores import open_store
from shardlease.stores.base import LeaseStore

if TYPE_CHECKING:
    from shardlease.loop import PlacementLoop

logger = logging.getLogger("shardlease.cli")

EXIT_OK, EXIT_FAILED, EXIT_CONFIG = 0, 1, 2


def _fail(message: str, code: int) -> int:
    print(f"shardlease: error: {message}", file=sys.stderr)
    return code


class _Parser(argparse.ArgumentParser):
    """argparse, with a usage error as one line (and exit status 2)."""

    def error(self, message: str) -> NoReturn:
        self.exit(EXIT_CONFIG, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


# -- logging -------------------------------------------------------------------


class JsonFormatter(logging.Formatter):
    """One JSON object per record; telemetry events bring their fields."""

    def __init__(self, node: str | None = None) -> None:
        super().__init__()
        self.node = node

    def format(self, record: logging.LogRecord) -> str:
        out: dict[str, Any] = {"ts": round(record.created, 6), "level": record.levelname.lower(),
                               "logger": record.name, "msg": record.getMessage()}
        if self.node:
            out["node"] = self.node
        event = getattr(record, "event", None)
        if event is not None:
            out["event"] = event
            for key, value in (getattr(record, "fields", None) or {}).items():
                out.setdefault(key, value)
        if record.exc_info:
            out["exc"] = self.formatException(record.exc_info)
        return json.dumps(out, default=str)


def setup_logging(fmt: str, level: str, node: str | None = None) -> None:
    handler = logging.StreamHandler(sys.stderr)
    if fmt == "json":
        handler.setFormatter(JsonFormatter(node))
    else:
        who = f" [{node}]" if node else ""
        handler.setFormatter(logging.Formatter(
            f"%(asctime)s %(levelname)s %(name)s{who} %(message)s"))
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level.upper())
    for noisy in ("botocore", "aiobotocore", "urllib3", "asyncio"):
        logging.getLogger(noisy).setLevel(logging.WARNING)


# -- node ------------------------------------------------------------------------


def parse_peers(specs: Sequence[str]) -> dict[str, str]:
    peers: dict[str, str] = {}
    for spec in specs:
        name, sep, address = spec.partition("=")
        if not sep or not name or not address:
            raise ConfigError(f"--peer {spec!r} must look like NAME=ADDRESS")
        peers[name] = address
    return peers


def make_host(spec: str, node: str) -> Host:
    """`log`, `http(s)://...` (the sidecar protocol) or `record:PATH`."""
    if spec == "log":
        from shardlease.hosts.log import LogHost

        return LogHost(node)
    if spec.startswith(("http://", "https://")):
        from shardlease.hosts.http import HttpHost

        return HttpHost(spec)
    if spec.startswith("record:") and len(spec) > len("record:"):
        path = spec[len("record:"):]
        try:
            return RecordHost(path, node)
        except OSError as e:
            raise ConfigError(f"--host {spec}: cannot open {path}: {e.strerror or e}") from None
    raise ConfigError(f"--host {spec!r}: use log, http://HOST:PORT or record:PATH")


def record_deadlines(placement: PlacementLoop, host: RecordHost) -> None:
    """Let a recording host see the runner's deadlines, in wall time: at each
    open, and whenever a renewal moves one (the runner's DeadlineMoved events)."""
    from shardlease.telemetry import DeadlineMoved, Event

    runner = placement.runner
    clock = placement.clock

    def deadline_of(shard: int) -> float | None:
        deadline = runner.deadline(shard)
        return None if deadline is None else time.time() + (deadline - clock.monotonic())

    def moved(event: Event) -> None:
        if isinstance(event, DeadlineMoved):
            host.deadline_moved(event.shard, event.generation,
                                time.time() + (event.deadline - clock.monotonic()))

    host.deadline_of = deadline_of
    placement.telemetry.subscribe(moved)


async def run_node(args: argparse.Namespace, options: Options, store: LeaseStore, host: Host,
                   peers: dict[str, str]) -> int:
    from shardlease.loop import PlacementLoop
    from shardlease.telemetry import PrometheusMetrics, Telemetry, log_events

    telemetry = Telemetry()
    telemetry.subscribe(log_events)
    if args.metrics_port is not None:
        from prometheus_client import start_http_server

        try:
            start_http_server(args.metrics_port, addr="127.0.0.1")
        except OSError as e:
            return _fail(f"cannot serve metrics on 127.0.0.1:{args.metrics_port}: "
                         f"{e.strerror or e}", EXIT_FAILED)
        telemetry.subscribe(PrometheusMetrics())
    try:
        await store.check()
    except Exception as e:  # an unexpected client failure is still a store failure
        with contextlib.suppress(Exception):
            await store.aclose()
        what = str(e) if isinstance(e, ShardleaseError) else f"{type(e).__name__}: {e}"
        return _fail(f"store {args.store}: {what}", EXIT_FAILED)

    placement = PlacementLoop(store, host, options, peers=peers.keys, telemetry=telemetry)
    recorder = host if isinstance(host, RecordHost) else None
    if recorder is not None:
        telemetry.subscribe(recorder.on_event)
        record_deadlines(placement, recorder)
        recorder.record("node_start", cluster=options.cluster_name, shards=options.shards,
                        lease_ttl=options.lease_ttl)

    loop = asyncio.get_running_loop()
    running = asyncio.create_task(placement.run(), name="shardlease-loop")
    stopping: list[asyncio.Task[None]] = []
    forced = False

    def on_signal(why: str) -> None:
        nonlocal forced
        if not stopping:
            logger.info("%s: stopping gracefully (closing shards, freeing leases)", why)
            stopping.append(asyncio.create_task(placement.stop()))
        elif not forced:
            logger.warning("%s again: stopping now", why)
            forced = True
            running.cancel()

    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, on_signal, sig.name)

    async def watch_parent(pid: int) -> None:
        # Polling: there is no event for a parent's exit (the demo and the tests
        # pass their pid so that nodes never outlive them).
        while os.getppid() == pid:  # noqa: ASYNC110
            await asyncio.sleep(0.5)
        on_signal("parent process exited")

    watcher = asyncio.create_task(watch_parent(args.parent_pid)) if args.parent_pid else None
    logger.info("node %s of cluster %s on %s: %d shards, lease_ttl %gs, interval %gs, "
                "margin %gs", options.name, options.cluster_name, store.describe(),
                options.shards, options.lease_ttl, options.interval_s, options.margin_s)
    code = EXIT_OK
    try:
        await running
    except asyncio.CancelledError:
        code = EXIT_FAILED
    except Exception as e:
        logger.exception("the placement loop failed")
        code = _fail(f"the placement loop failed: {e}", EXIT_FAILED)
    finally:
        if watcher is not None:
            watcher.cancel()
        for task in stopping:
            with contextlib.suppress(BaseException):
                await task
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.remove_signal_handler(sig)
        if recorder is not None:
            recorder.record("node_stop", code=code)
            recorder.close_file()
        with contextlib.suppress(Exception):
            await store.aclose()
        if hasattr(host, "aclose"):
            with contextlib.suppress(Exception):
                await host.aclose()
    logger.info("node %s stopped", options.name)
    return code


def cmd_node(args: argparse.Namespace) -> int:
    setup_logging(args.log_format, args.log_level, args.name)
    try:
        options = Options.make(shards=args.shards, lease_ttl=args.lease_ttl,
                               interval=args.interval, margin=args.margin, name=args.name,
                               cluster_name=args.cluster, max_concurrency=args.max_concurrency)
        peers = parse_peers(args.peer)
        store = open_store(args.store)
        host = make_host(args.host, options.name)
    except ConfigError as e:
        return _fail(str(e), EXIT_CONFIG)
    return asyncio.run(run_node(args, options, store, host, peers))


# -- owners ------------------------------------------------------------------------


@dataclass(frozen=True)
class OwnerRow:
    shard: int
    owner: str | None
    generation: int


async def read_owners(store: LeaseStore, cluster: str, shards: int | None) -> tuple[
        list[OwnerRow], list[str]]:
    """One listing of the leases: a row per shard (0..N-1, N from `shards` or
    the highest shard seen + 1) and a line per corrupt record."""
    # An empty listing of a store that is not there would read as "no owners".
    await store.check_readable()
    leases = await store.list_leases(cluster)
    count = shards if shards is not None else (max(leases) + 1 if leases else 0)
    rows, problems = [], []
    for shard in range(count):
        stored = leases.get(shard)
        if stored is None:
            rows.append(OwnerRow(shard, None, 0))
        elif stored.record is None:
            problems.append(f"shard {shard}: corrupt lease record: {stored.error}")
            rows.append(OwnerRow(shard, None, stored.generation or 0))
        else:
            rows.append(OwnerRow(shard, stored.record.owner, stored.record.generation))
    return rows, problems


def owners_table(rows: Sequence[OwnerRow]) -> str:
    header = ("SHARD", "OWNER", "GENERATION")
    cells = [(str(r.shard), r.owner or "-", str(r.generation)) for r in rows]
    widths = [max(len(c[i]) for c in [header, *cells]) for i in range(3)]
    lines = ["  ".join(c[i].ljust(widths[i]) for i in range(3)).rstrip()
             for c in [header, *cells]]
    by_owner: dict[str | None, list[int]] = {}
    for r in rows:
        by_owner.setdefault(r.owner, []).append(r.shard)
    lines.append("")
    for owner in sorted(by_owner, key=lambda o: (o is None, o or "")):
        shards = by_owner[owner]
        lines.append(f"{owner or '(unowned)'}: {len(shards)} shard(s): "
                     + " ".join(map(str, shards)))
    return "\n".join(lines)


async def _owners(args: argparse.Namespace, store: LeaseStore) -> int:
    try:
        rows, problems = await read_owners(store, args.cluster, args.shards)
    except ShardleaseError as e:
        return _fail(f"store {args.store}: {e}", EXIT_FAILED)
    except Exception as e:
        return _fail(f"store {args.store}: {type(e).__name__}: {e}", EXIT_FAILED)
    finally:
        with contextlib.suppress(Exception):
            await store.aclose()
    for problem in problems:
        print(f"shardlease: warning: {problem}", file=sys.stderr)
    if args.output == "json":
        print(json.dumps({"cluster": args.cluster,
                          "shards": [{"shard": r.shard, "owner": r.owner,
                                      "generation": r.generation} for r in rows]}))
    else:
        print(owners_table(rows))
    return EXIT_OK


def cmd_owners(args: argparse.Namespace) -> int:
    setup_logging("text", "warning")
    if args.shards is not None and args.shards < 1:
        return _fail(f"--shards must be at least 1, not {args.shards}", EXIT_CONFIG)
    try:
        store = open_store(args.store)
    except ConfigError as e:
        return _fail(str(e), EXIT_CONFIG)
    return asyncio.run(_owners(args, store))


# -- demo --------------------------------------------------------------------------


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
    #: "table" (redrawn on a terminal), "json" (lines) or "none" (the bench).
    view: str
    keep: bool = False
    timeout: float = 60.0
    started: float = field(default_factory=time.time)
    members: dict[str, DemoNode] = field(default_factory=dict)
    marks: list[tuple[str, float]] = field(default_factory=list)
    phase: str = ""
    _last_view: str = ""

    @property
    def records(self) -> list[Path]:
        return sorted((self.workdir / "events").glob("*.jsonl"))

    def command(self, name: str) -> list[str]:
        return [sys.executable, "-m", "shardlease", "node", "--store", self.store_url,
                "--cluster", self.cluster, "--name", name, "--shards", str(self.shards),
                "--lease-ttl", f"{self.ttl:g}",
                "--host", f"record:{self.workdir / 'events' / (name + '.jsonl')}",
                "--log-format", "json", "--parent-pid", str(os.getpid())]

    def start(self, name: str) -> None:
        member = self.members.setdefault(name, DemoNode(name))
        with open(self.workdir / "logs" / f"{name}.log", "ab") as log:
            member.proc = subprocess.Popen(self.command(name), stdin=subprocess.DEVNULL,
                                           stdout=log, stderr=log, start_new_session=True)
        member.state = "running"

    def running(self) -> list[str]:
        return [m.name for m in self.members.values()
                if m.state == "running" and m.proc is not None and m.proc.poll() is None]

    def mark(self, what: str) -> float:
        now = time.time()
        self.marks.append((what, now))
        self.say(what)
        return now

    def say(self, what: str) -> None:
        self.phase = what
        if self.view == "json":
            print(json.dumps({"t": round(time.time() - self.started, 3), "phase": what}),
                  flush=True)

    def show(self, rows: Sequence[OwnerRow]) -> None:
        owners = [r.owner for r in rows]
        if self.view == "none":
            return
        if self.view == "table":
            view = self._table(rows)
            if view != self._last_view:
                sys.stdout.write("\x1b[H\x1b[2J" + view + "\n")
                sys.stdout.flush()
                self._last_view = view
            return
        key = json.dumps(owners)
        if key != self._last_view:
            self._last_view = key
            print(json.dumps({"t": round(time.time() - self.started, 3), "owners": owners,
                              "generations": [r.generation for r in rows],
                              "running": self.running()}), flush=True)

    def _table(self, rows: Sequence[OwnerRow]) -> str:
        t = time.time() - self.started
        lines = [f"shardlease demo: {len(self.members)} nodes, {self.shards} shards, "
                 f"lease TTL {self.ttl:g}s   t={t:5.1f}s", ""]
        lines += [f"  {at - self.started:5.1f}s  {what}" for what, at in self.marks]
        lines += ["", f"{'NODE':<10} {'STATE':<8} {'LEASES':>6}  SHARDS (generation)"]
        for m in self.members.values():
            held = [r for r in rows if r.owner == m.name]
            state = m.state if m.state != "running" or m.name in self.running() else "exited"
            shards = " ".join(f"{r.shard}({r.generation})" for r in held)
            lines.append(f"{m.name:<10} {state:<8} {len(held):>6}  {shards}")
        free = [r.shard for r in rows if r.owner is None]
        lines.append(f"{'(free)':<10} {'':<8} {len(free):>6}  {' '.join(map(str, free))}")
        return "\n".join(lines)

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
        return time.time()

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


class DemoError(Exception):
    """The demo could not go on (a node died, no balance in time)."""


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


async def _demo(demo: Demo, store: LeaseStore) -> int:
    from shardlease.checker import check_events, load_events

    try:
        await store.check()
    except ShardleaseError as e:
        return _fail(f"store {demo.store_url}: {e}", EXIT_FAILED)
    names = [f"node-{i}" for i in range(demo.nodes)]
    victim = names[len(names) // 2]
    demo.mark(f"starting {demo.nodes} nodes: {', '.join(names)}")
    for name in names:
        demo.start(name)
    t0 = time.time()
    balanced_at = await demo.wait_balanced(store, "after the start")
    demo.mark(f"balanced after {balanced_at - t0:.1f}s")
    rows = await demo.owners(store)
    lost = [r.shard for r in rows if r.owner == victim]
    await asyncio.sleep(1.0)

    demo.mark(f"kill -9 {victim} (it held shards {' '.join(map(str, lost))}); its leases "
              f"must expire ({demo.ttl:g}s) before others take them")
    killed_at = demo.kill(victim)
    failover_at = await demo.wait_balanced(store, f"after killing {victim}")
    demo.mark(f"failover done: {victim}'s shards owned by "
              f"{', '.join(demo.running())} after {failover_at - killed_at:.1f}s")
    await asyncio.sleep(1.0)

    demo.mark(f"restarting {victim} (a join): the others release shards above their share")
    joined_at = time.time()
    demo.start(victim)
    rejoined_at = await demo.wait_balanced(store, f"after {victim} joined")
    demo.mark(f"rebalanced after the join in {rejoined_at - joined_at:.1f}s")
    await asyncio.sleep(1.0)

    demo.mark("SIGTERM to every node: each closes its shards and frees its leases")
    codes = demo.stop_all(grace=3 * demo.ttl)
    final = await demo.owners(store)
    still_owned = [r.shard for r in final if r.owner is not None]

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
    ok = report.ok and recovered is not None and graceful
    print("RESULT               " + ("PASS" if ok else "FAIL"))
    return EXIT_OK if ok else EXIT_FAILED


def cmd_demo(args: argparse.Namespace) -> int:
    if args.nodes < 2:
        return _fail("--nodes must be at least 2 (one is killed and restarted)", EXIT_CONFIG)
    if args.shards < 1:
        return _fail("--shards must be at least 1", EXIT_CONFIG)
    try:
        Options.make(shards=args.shards, lease_ttl=args.lease_ttl, name="demo")
    except ConfigError as e:
        return _fail(str(e), EXIT_CONFIG)
    if args.store is not None and args.store.startswith("memory:"):
        return _fail("--store memory:// lives in one process; the demo runs several "
                     "(use file:///path or s3://bucket/prefix)", EXIT_CONFIG)
    try:
        given = None if args.store is None else open_store(args.store)
    except ConfigError as e:
        return _fail(str(e), EXIT_CONFIG)
    workdir = Path(tempfile.mkdtemp(prefix="shardlease-demo-"))
    for sub in ("events", "logs"):
        (workdir / sub).mkdir()
    if given is None:
        store_url, cluster = f"file://{workdir / 'store'}", "demo"
        store = open_store(store_url)
    else:
        store_url, cluster, store = args.store, f"demo-{os.urandom(3).hex()}", given
    setup_logging("text", "warning")
    view = "table" if sys.stdout.isatty() else "json"
    demo = Demo(nodes=args.nodes, shards=args.shards, store_url=store_url, cluster=cluster,
                workdir=workdir, ttl=args.lease_ttl, view=view, keep=args.keep)

    def interrupted(signum: int, frame: object) -> None:
        raise KeyboardInterrupt

    # Explicitly, so that a demo started with SIGINT ignored still cleans up.
    previous = {sig: signal.signal(sig, interrupted) for sig in (signal.SIGTERM, signal.SIGINT)}
    code = EXIT_FAILED
    try:
        code = asyncio.run(_demo(demo, store))
    except DemoError as e:
        code = _fail(f"demo failed: {e} (files kept in {workdir})", EXIT_FAILED)
    except KeyboardInterrupt:
        print("\ninterrupted: stopping the nodes", file=sys.stderr)
        code = 130
    finally:
        demo.stop_all(grace=2 * args.lease_ttl)
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        if code == EXIT_OK and not args.keep:
            shutil.rmtree(workdir, ignore_errors=True)
        else:
            print(f"files kept in {workdir}", file=sys.stderr)
    return code


# -- the parser --------------------------------------------------------------------


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="shardlease", description="Place shards across nodes with leases.")
    sub = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)

    node = sub.add_parser("node", help="run one node until SIGTERM/SIGINT",
                          description="Run one node of a cluster outside Kubernetes until "
                          "SIGTERM or SIGINT, then close its shards and free its leases.")
    node.add_argument("--store", required=True,
                      help="memory://NAME, file:///path or s3://bucket/prefix")
    node.add_argument("--cluster", required=True, help="cluster name")
    node.add_argument("--name", required=True, help="this node's name")
    node.add_argument("--shards", required=True, type=int, help="number of shards")
    node.add_argument("--lease-ttl", type=float, help="lease lifetime in seconds (15)")
    node.add_argument("--interval", type=float, help="seconds between rounds (lease-ttl/3)")
    node.add_argument("--margin", type=float,
                      help="seconds before expiry at which shards are fenced (lease-ttl/6)")
    node.add_argument("--max-concurrency", type=int, help="opens at once (16)")
    node.add_argument("--host", default="log",
                      help="log, http://127.0.0.1:PORT (sidecar) or record:PATH (tests)")
    node.add_argument("--peer", action="append", default=[], metavar="NAME=ADDRESS",
                      help="a peer lookup may route to (repeat); stands in for the pod list")
    node.add_argument("--metrics-port", type=int, help="serve Prometheus metrics on 127.0.0.1")
    node.add_argument("--log-format", choices=("text", "json"), default="text")
    node.add_argument("--log-level", choices=("debug", "info", "warning", "error"),
                      default="info")
    node.add_argument("--parent-pid", type=int, help=argparse.SUPPRESS)
    node.set_defaults(func=cmd_node)

    owners = sub.add_parser("owners", help="show the current owner of every shard",
                            description="Read every lease once and show its owner.")
    owners.add_argument("--store", required=True)
    owners.add_argument("--cluster", required=True)
    owners.add_argument("--shards", type=int, help="shards 0..N-1 (default: highest seen + 1)")
    owners.add_argument("-o", "--output", choices=("table", "json"), default="table")
    owners.set_defaults(func=cmd_owners)

    demo = sub.add_parser("demo", help="run several nodes locally through a kill and a join",
                          description="Start node processes on a file store, kill one, "
                          "restart it, stop all, and check that no shard was open twice.")
    demo.add_argument("--nodes", type=int, default=3)
    demo.add_argument("--shards", type=int, default=12)
    demo.add_argument("--store", help="default: a file store in a fresh temporary directory")
    demo.add_argument("--lease-ttl", type=float, default=3.0)
    demo.add_argument("--keep", action="store_true", help="keep the temporary files")
    demo.set_defaults(func=cmd_demo)

    bench = sub.add_parser("bench", help="print failover, balance, request and CPU figures",
                           description="Measure shardlease (figures, not a test).")
    bench.add_argument("--quick", action="store_true", help="fewer repetitions, smaller sizes")
    bench.set_defaults(func=_cmd_bench)

    from shardlease.k8s.commands import add_parsers

    add_parsers(sub)  # agent, operator
    return parser


def _cmd_bench(args: argparse.Namespace) -> int:
    from shardlease.bench import cmd_bench

    return cmd_bench(args)


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    code: int = args.func(args)
    return code
