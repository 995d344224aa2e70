"""The `shardlease` command: run a node, show the owners, run the demo, bench, verify.

    shardlease node   --store URL --cluster NAME --name NAME --shards N [...]
    shardlease owners --store URL --cluster NAME [--shards N] [-o table|json] [--watch S]
    shardlease conformance URL [--shard S] [--generation G] [-o table|json]
    shardlease demo   [--nodes 3] [--shards 12] [--store file:///path]
    shardlease bench  [--quick]
    shardlease verify --history FILE [--opens FILE]
    shardlease verify [--store file|s3] [--nodes N] [--shards S] [--faults LIST] [--seconds T]
                      [--seed X]

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
import os
import shutil
import signal
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, NoReturn

from shardlease.errors import ConfigError, DemoError, ShardleaseError
from shardlease.hosts.base import Host
from shardlease.hosts.record import RecordHost
from shardlease.logs import add_log_options, setup_logging
from shardlease.options import Options
from shardlease.owners import owners_table, read_owners
from shardlease.stores import open_store
from shardlease.stores.base import LeaseStore

if TYPE_CHECKING:
    from prometheus_client import CollectorRegistry

    from shardlease.loop import PlacementLoop
    from shardlease.telemetry import Telemetry

logger = logging.getLogger("shardlease.cli")

EXIT_OK, EXIT_FAILED, EXIT_CONFIG = 0, 1, 2


def _fail(message: str, code: int) -> int:
    print(f"shardlease: error: {message}", file=sys.stderr)
    return code


class _Parser(argparse.ArgumentParser):
    """argparse, with a usage error as one line (and exit status 2)."""

    def error(self, message: str) -> NoReturn:
        self.exit(EXIT_CONFIG, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


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


def node_metrics(telemetry: Telemetry) -> CollectorRegistry:
    """The registry `shardlease node --metrics-port` serves: the events' metrics
    and the process's, as prometheus-client's default registry has them (a
    registry of its own, so that docs/metrics.md is made from this one)."""
    from prometheus_client import (
        CollectorRegistry,
        GCCollector,
        PlatformCollector,
        ProcessCollector,
    )

    from shardlease.telemetry import PrometheusMetrics

    registry = CollectorRegistry()
    ProcessCollector(registry=registry)
    PlatformCollector(registry=registry)
    GCCollector(registry=registry)
    telemetry.subscribe(PrometheusMetrics(registry))
    return registry


async def run_node(args: argparse.Namespace, options: Options, store: LeaseStore, host: Host,
                   peers: dict[str, str]) -> int:
    from shardlease.loop import PlacementLoop
    from shardlease.telemetry import EventLog, Telemetry

    telemetry = Telemetry()
    telemetry.subscribe(EventLog())
    if args.metrics_port is not None:
        from prometheus_client import start_http_server

        try:
            start_http_server(args.metrics_port, addr="127.0.0.1",
                              registry=node_metrics(telemetry))
        except OSError as e:
            return _fail(f"cannot serve metrics on 127.0.0.1:{args.metrics_port}: "
                         f"{e.strerror or e}", EXIT_FAILED)
    try:
        await store.check()
    except Exception as e:  # an unexpected client failure is still a store failure
        with contextlib.suppress(Exception):
            await store.aclose()
        what = str(e) if isinstance(e, ShardleaseError) else f"{type(e).__name__}: {e}"
        return _fail(f"store {args.store}: {what}", EXIT_FAILED)

    placement = PlacementLoop(store, host, options, peers=peers.keys, telemetry=telemetry)
    hints = None
    if args.hints is not None:
        from shardlease.hints import HintChannel

        hints = HintChannel(cluster=options.cluster_name, name=options.name, listen=args.hints,
                            peers=lambda: peers, on_hint=placement.hint)
        try:
            bound = await hints.start()
        except ConfigError as e:
            with contextlib.suppress(Exception):
                await store.aclose()
            return _fail(str(e), EXIT_CONFIG)
        telemetry.subscribe(hints.on_event)
        logger.info("hints: listening on %s:%d, sending to %d peer(s)", *bound,
                    len(set(peers) - {options.name}))
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
        if hints is not None:
            await hints.aclose()
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
    # `shardset` and `pod` beside `cluster` and `node`: one query finds a
    # shard's records from nodes and agents alike (shardlease.logs).
    setup_logging(args.log_format, args.log_level, tag=args.name,
                  context={"node": args.name, "shardset": args.cluster, "pod": args.name})
    try:
        options = Options.make(shards=args.shards, lease_ttl=args.lease_ttl,
                               interval=args.interval, margin=args.margin, name=args.name,
                               cluster_name=args.cluster, max_concurrency=args.max_concurrency,
                               renewal=args.renewal,
                               max_moves_per_round=args.max_moves_per_round)
        peers = parse_peers(args.peer)
        if args.hints is not None:
            from shardlease.hints import parse_address

            args.hints = parse_address(args.hints, "--hints")
            for name, address in peers.items():
                parse_address(address, f"--peer {name}=")
        store = open_store(args.store)
        host = make_host(args.host, options.name)
    except ConfigError as e:
        return _fail(str(e), EXIT_CONFIG)
    return asyncio.run(run_node(args, options, store, host, peers))


# -- owners ------------------------------------------------------------------------


async def _owners(args: argparse.Namespace, store: LeaseStore) -> int:
    if args.watch is None:
        return await _show_owners(args, store)
    while True:  # until SIGINT or SIGTERM (or the parent's exit)
        if args.parent_pid and os.getppid() != args.parent_pid:
            return EXIT_OK
        started = time.monotonic()
        code = await _show_owners(args, store, watching=True)
        if code != EXIT_OK:
            print(f"shardlease: warning: read again in {args.watch:g}s", file=sys.stderr,
                  flush=True)
        await asyncio.sleep(max(0.0, args.watch - (time.monotonic() - started)))
        # A store of its own for every read: a store object may answer a
        # listing from its last one when no writer announced a move, and a
        # hand edit announces nothing (stores/s3.py, FULL_LIST_EVERY); a
        # watch shows what is there.
        store = open_store(args.store)


async def _show_owners(args: argparse.Namespace, store: LeaseStore,
                       watching: bool = False) -> int:
    """One read, printed: a JSON document on one line, or the table (under
    --watch, each read's table after a line saying when it was read)."""
    try:
        rows, problems = await read_owners(store, args.cluster, args.shards, heartbeats=True)
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
                                      "generation": r.generation, "since": r.since or None,
                                      "heartbeat": r.heartbeat, "renewal": r.renewal}
                                     for r in rows]}), flush=True)
    else:
        if watching:
            print(f"-- {time.strftime('%H:%M:%S')}")
        print(owners_table(rows), flush=True)
    return EXIT_OK


def cmd_owners(args: argparse.Namespace) -> int:
    setup_logging("text", "warning")
    if args.shards is not None and args.shards < 1:
        return _fail(f"--shards must be at least 1, not {args.shards}", EXIT_CONFIG)
    if args.watch is not None and not 0.05 <= args.watch <= 3600:
        return _fail(f"--watch must be between 0.05 and 3600 seconds, not {args.watch:g}",
                     EXIT_CONFIG)
    try:
        store = open_store(args.store)
    except ConfigError as e:
        return _fail(str(e), EXIT_CONFIG)
    try:
        return asyncio.run(_owners(args, store))
    except KeyboardInterrupt:
        return EXIT_OK  # (--watch ends with ^C)


# -- demo --------------------------------------------------------------------------


def cmd_demo(args: argparse.Namespace) -> int:
    try:
        import rich  # noqa: F401  (the demo's extra: only asked whether it is there)
    except ModuleNotFoundError:
        return _fail("the demo draws with rich, which is not installed: "
                     "pip install 'shardlease[demo]'", EXIT_CONFIG)
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
    # Here, not at the top: the agent and the operator run this module too,
    # and the demo brings `rich` and its grid (tests/test_imports.py).
    from shardlease.demo import Demo, run_demo

    setup_logging("text", "warning")
    view = args.output or ("table" if sys.stdout.isatty() else "json")
    demo = Demo(nodes=args.nodes, shards=args.shards, store_url=store_url, cluster=cluster,
                workdir=workdir, ttl=args.lease_ttl, view=view, keep=args.keep)
    svg = Path(tempfile.gettempdir()) / "shardlease-demo-timeline.svg" if args.svg is None \
        else Path(args.svg) if args.svg else None

    def interrupted(signum: int, frame: object) -> None:
        raise KeyboardInterrupt

    # Explicitly, so that a demo started with SIGINT ignored still cleans up.
    previous = {sig: signal.signal(sig, interrupted) for sig in (signal.SIGTERM, signal.SIGINT)}
    code = EXIT_FAILED
    try:
        ok = asyncio.run(run_demo(demo, store, svg))
        code = EXIT_OK if ok else EXIT_FAILED
    except DemoError as e:  # (a ShardleaseError too: first)
        code = _fail(f"demo failed: {e} (files kept in {workdir})", EXIT_FAILED)
    except ShardleaseError as e:
        code = _fail(f"store {store_url}: {e}", EXIT_FAILED)
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


# -- conformance -------------------------------------------------------------------


def cmd_conformance(args: argparse.Namespace) -> int:
    # Imported here: the agent and the operator never load the kit.
    from shardlease import conformance

    setup_logging("text", "warning")
    if not args.url.startswith(("http://", "https://")):
        return _fail(f"URL must be http:// or https://, not {args.url!r}", EXIT_CONFIG)
    if args.shard < 0:
        return _fail(f"--shard must be at least 0, not {args.shard}", EXIT_CONFIG)
    if args.generation is not None and not 1 <= args.generation < 2**62:
        return _fail(f"--generation must be between 1 and 2**62, not {args.generation}",
                     EXIT_CONFIG)
    findings = asyncio.run(conformance.run(args.url, shard=args.shard,
                                           generation=args.generation))
    if args.output == "json":
        print(json.dumps({"url": args.url, "findings": [
            {"rule": f.rule, "level": f.level, "passed": f.passed, "message": f.message}
            for f in findings]}))
    else:
        print(conformance.report(findings))
    broken = any(not f.passed and f.level == "MUST" for f in findings)
    return EXIT_FAILED if broken else EXIT_OK


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
    node.add_argument("--max-moves-per-round", type=int,
                      help="shards released above the share per round, at most (no cap)")
    node.add_argument("--renewal", choices=("shard", "node"),
                      help="how held leases are kept: 'node' writes one epoch record per "
                      "node (default); 'shard' rewrites each lease every interval "
                      "(docs/renewal.md)")
    node.add_argument("--host", default="log",
                      help="log, http://127.0.0.1:PORT (sidecar) or record:PATH (tests)")
    node.add_argument("--peer", action="append", default=[], metavar="NAME=ADDRESS",
                      help="a peer (repeat): stands in for the pod list; lookup routes only to "
                           "peers, a first round claims at once once every peer is live, and "
                           "with --hints ADDRESS is its HOST:PORT for hints")
    node.add_argument("--hints", metavar="HOST:PORT",
                      help="listen for peers' hints (UDP) here, and hint the --peer addresses "
                           "when this node frees leases or joins: freed shards reopen at once")
    node.add_argument("--metrics-port", type=int, help="serve Prometheus metrics on 127.0.0.1")
    add_log_options(node)
    node.add_argument("--parent-pid", type=int, help=argparse.SUPPRESS)
    node.set_defaults(func=cmd_node)

    owners = sub.add_parser("owners", help="show the current owner of every shard",
                            description="Read every lease once and show its owner.")
    owners.add_argument("--store", required=True)
    owners.add_argument("--cluster", required=True)
    owners.add_argument("--shards", type=int, help="shards 0..N-1 (default: highest seen + 1)")
    owners.add_argument("-o", "--output", choices=("table", "json"), default="table")
    owners.add_argument("--watch", type=float, metavar="SECONDS",
                        help="read again every SECONDS until interrupted (with -o json: one "
                             "document per line); a failed read is reported and retried")
    owners.add_argument("--parent-pid", type=int, help=argparse.SUPPRESS)
    owners.set_defaults(func=cmd_owners)

    conf = sub.add_parser(
        "conformance", help="check a running application against the host protocol",
        description="Drive the application at URL through the host protocol's rules "
        "(docs/host-api.yaml) on one shard and print which it keeps and which it breaks; "
        "exit 1 if a MUST rule is broken. It opens and closes that shard: use a test "
        "instance.")
    conf.add_argument("url", help="the application's base URL, e.g. http://127.0.0.1:8080")
    conf.add_argument("--shard", type=int, default=0, help="the shard to use (0)")
    conf.add_argument("--generation", type=int,
                      help="generations used are above this (default: seconds since 1970)")
    conf.add_argument("-o", "--output", choices=("table", "json"), default="table")
    conf.set_defaults(func=cmd_conformance)

    demo = sub.add_parser("demo", help="run several nodes locally through a kill and a join",
                          description="Start node processes on a file store, kill one, "
                          "restart it, stop all, and check that no shard was open twice.")
    demo.add_argument("--nodes", type=int, default=3)
    demo.add_argument("--shards", type=int, default=12)
    demo.add_argument("--store", help="default: a file store in a fresh temporary directory")
    demo.add_argument("--lease-ttl", type=float, default=3.0)
    demo.add_argument("--keep", action="store_true", help="keep the temporary files")
    demo.add_argument("-o", "--output", choices=("table", "json"),
                      help="table: a live grid and a timeline (default on a terminal); "
                           "json: one line per change (default when piped)")
    # The default is resolved when the demo runs, never here: the agent's
    # container has a read-only root filesystem and no temporary directory.
    demo.add_argument("--svg", help="write the timeline as an SVG picture here ('' for none; "
                                    "default: shardlease-demo-timeline.svg in the temporary "
                                    "directory)")
    demo.set_defaults(func=cmd_demo)

    bench = sub.add_parser("bench", help="print failover, balance, request and CPU figures",
                           description="Measure shardlease (figures, not a test).")
    bench.add_argument("--quick", action="store_true", help="fewer repetitions, smaller sizes")
    bench.add_argument("--kubeconfig", help="also measure the Kubernetes Lease store on this "
                       "cluster (it creates and deletes a namespace per measurement)")
    bench.add_argument("--only", action="append", choices=("failover", "rounds", "faults",
                       "slow-store", "requests", "stop", "scale"),
                       help="run only these sections (repeat)")
    bench.set_defaults(func=_cmd_bench)

    verify = sub.add_parser(
        "verify", help="judge a client history: linearizability (porcupine), lost and "
                       "stale-generation writes, double opens",
        description="Judge a client history of a sharded key-value service (docs/verify.md). "
                    "With --history, the history of a file; without it, run shardlease nodes "
                    "beside the SlateDB application on this machine under a fault schedule "
                    "drawn from --seed, record the clients' history and judge it. "
                    "The last line is the verdict; exit status 0 only when it passes, 1 when "
                    "it does not, 2 when the files cannot be judged.")
    verify.add_argument("--history", metavar="FILE",
                        help="the clients' history, JSON lines (docs/verify.md)")
    run = verify.add_argument_group(
        "run mode (without --history)",
        "nodes and slatekv apps on this machine, SlateDB on a MinIO started here")
    run.add_argument("--store", choices=("file", "s3"), default="file",
                     help="the lease store: a file store, or the MinIO of the databases "
                          "(default file; the databases are on MinIO either way)")
    run.add_argument("--nodes", type=int, default=3, help="node and app pairs (3)")
    run.add_argument("--shards", type=int, default=8, help="shards (8)")
    run.add_argument("--faults", default="kill,pause,latency,leave,join", metavar="LIST",
                     help="fault kinds, comma-separated (default: all: kill,pause,latency,"
                          "leave,join)")
    run.add_argument("--seconds", type=float, default=30.0, help="how long the clients run (30)")
    run.add_argument("--seed", type=int, help="the fault schedule's seed (default: random)")
    run.add_argument("--clients", type=int, default=8, help="concurrent clients (8)")
    run.add_argument("--lease-ttl", type=float, default=6.0,
                     help="the nodes' lease TTL (6: SlateDB's open and close take seconds "
                          "on a busy machine, and a close that outlasts the lease is the "
                          "agent's overrun)")
    run.add_argument("--dir", metavar="DIR",
                     help="where the history, the open records and the logs go (default: a "
                          "new directory under the temporary directory)")
    run.add_argument("--minio", metavar="PATH",
                     help="the MinIO binary (default: $SHARDLEASE_MINIO, else the one "
                          "e2e/controlplane builds from this checkout)")
    verify.add_argument("--opens", metavar="FILE",
                        help="the applications' open and close records, JSON lines, for the "
                             "double-open check")
    verify.add_argument("--time-limit-per-key", type=float, default=10.0, metavar="SECONDS",
                        help="how long porcupine may search one key before its verdict is "
                             "unknown (default 10)")
    verify.add_argument("--max-ops", type=int, default=100_000, metavar="N",
                        help="a longer history is not checked for linearizability: its verdict "
                             "is unknown (default 100000)")
    verify.add_argument("--html-dir", metavar="DIR",
                        help="where porcupine's visualization of a failing key is written "
                             "(default: the history's directory)")
    verify.add_argument("--checker", metavar="PATH",
                        help="the porcupine-check binary (default: $SHARDLEASE_PORCUPINE_CHECK, "
                             "else the one e2e/controlplane builds from this checkout)")
    verify.set_defaults(func=_cmd_verify)

    from shardlease.k8s.commands import add_parsers

    add_parsers(sub)  # agent, operator
    return parser


def _not_installed(command: str, e: ModuleNotFoundError) -> int:
    # The bench and verify are development tools, a distribution of their own
    # (tools/): the wheel, the image and the sidecars carry none of it. Their
    # imports stay plain `from` imports so that the import contracts see them.
    if not (e.name or "").startswith("shardlease_tools"):
        raise e
    return _fail(f"`shardlease {command}` is a development tool, not part of this "
                 "install: pip install ./tools from a checkout of shardlease "
                 "(scripts/setup test does)", EXIT_CONFIG)


def _cmd_bench(args: argparse.Namespace) -> int:
    try:
        from shardlease_tools.bench import cmd_bench
    except ModuleNotFoundError as e:
        return _not_installed("bench", e)
    return cmd_bench(args)


def _cmd_verify(args: argparse.Namespace) -> int:
    try:
        from shardlease_tools.verify import cmd_verify
        from shardlease_tools.verifyrun import cmd_verify_run
    except ModuleNotFoundError as e:
        return _not_installed("verify", e)
    return cmd_verify(args) if args.history else cmd_verify_run(args)


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    code: int = args.func(args)
    return code
