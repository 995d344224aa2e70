"""`shardlease verify` without --history: run the SlateDB application under
faults on this machine, record the history, judge it (docs/verify.md).

    shardlease verify [--store file|s3] [--nodes N] [--shards S]
                      [--faults kill,pause,latency,leave,join] [--seconds T] [--seed X]

What runs, all on loopback:

- MinIO (the binary e2e/controlplane builds and caches, or --minio PATH),
  started here with a data directory of its own. slatekv's shards are
  SlateDB databases, and slatekv needs S3 for them (its generation guard is
  a conditional S3 write): with ``--store file`` only the leases are in a
  file store, the databases are on MinIO all the same;
- N pairs: a `shardlease node` process driving a slatekv process over the
  host protocol (`--host http://...`). Each pair reaches MinIO through a
  fault proxy of its own (tools/shardlease_tools/faultproxy.py): its app's
  databases, and in ``--store s3`` its node's leases;
- clients (8 by default), one operation at a time each: writes, reads and
  compare-and-sets of unique values to random keys, sent to the app beside
  the node the lease store names as the key's shard's owner (then to the
  others: a 421 sends a client on), recorded as the history.

The faults, a schedule drawn from the seed (each kind asked for at least
once, in an order and with targets and lengths drawn from it, then more
until the seconds are up):

- ``kill``: kill -9 of a pair's node and app, restarted after a while;
- ``pause``: SIGSTOP of a pair's node past the lease TTL, then SIGCONT (its
  app keeps running: its shards' validity runs out, another node claims
  them, the paused node finds its leases gone when it resumes);
- ``latency``: every request of a pair's proxy delayed (its app's SlateDB
  and guard requests; in s3 mode its node's lease requests too);
- ``leave``: a graceful stop (SIGTERM) of a pair's node, then of its app;
- ``join``: a pair that left (or a new one) starts.

Then the clients stop, every key is read back, the nodes and apps stop
gracefully, and the history (history.jsonl), the apps' open/close records
(opens.jsonl) go to the judge of `shardlease verify --history`. The files
and the processes' logs are kept in the directory it names (--dir, else a
new one under the temporary directory).

A process killed with -9 closes nothing: when it has been reaped, this
runner appends a close record, at that time, for every shard its records
leave open (a process that is gone holds no SlateDB writer).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import random
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import BinaryIO, TextIO

import aiohttp
from aiobotocore.session import get_session  # type: ignore[import-untyped]

from shardlease.owners import read_owners
from shardlease.stores import open_store
from shardlease_tools.faultproxy import FaultProxy, Faults
from shardlease_tools.verify import (
    EXIT_CANNOT_JUDGE,
    EXIT_FAILED,
    EXIT_OK,
    CheckerError,
    HistoryError,
    dump_history,
    find_checker,
    judge,
)
from shardlease_tools.workload import Workload

FAULTS = ("kill", "pause", "latency", "leave", "join")
ACCESS_KEY = "shardlease-verify"
SECRET_KEY = "shardlease-verify-secret"
BUCKET = "verify"
CLUSTER = "verify"
MINIO_ENV = "SHARDLEASE_MINIO"
#: Seconds a process may take to start, stop or settle before the run gives up.
WAIT = 60.0


class RunError(Exception):
    """The run could not be made (a server did not start, a process died)."""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def find_minio(explicit: str | None) -> Path:
    """--minio, else $SHARDLEASE_MINIO, else the one e2e/controlplane builds
    and caches from this checkout."""
    given = explicit or os.environ.get(MINIO_ENV)
    if given:
        return Path(given)
    script = Path(__file__).resolve().parents[2] / "e2e" / "controlplane.py"
    if not script.is_file():
        raise RunError(f"no MinIO: pass --minio PATH or ${MINIO_ENV}")
    proc = subprocess.run([sys.executable, str(script), "path", "minio"],
                          stdout=subprocess.PIPE, text=True, stdin=subprocess.DEVNULL)
    if proc.returncode != 0 or not proc.stdout.strip():
        raise RunError("could not build minio (e2e/controlplane build minio says why)")
    return Path(proc.stdout.strip())


def aws_env() -> dict[str, str]:
    """The credentials of the MinIO started here, for this process and its children."""
    return {"AWS_ACCESS_KEY_ID": ACCESS_KEY, "AWS_SECRET_ACCESS_KEY": SECRET_KEY,
            "AWS_REGION": "us-east-1", "AWS_DEFAULT_REGION": "us-east-1",
            "AWS_EC2_METADATA_DISABLED": "true", "AWS_CONFIG_FILE": os.devnull,
            "AWS_SHARED_CREDENTIALS_FILE": os.devnull}


@dataclass
class Settings:
    store: str
    nodes: int
    shards: int
    faults: tuple[str, ...]
    seconds: float
    seed: int
    clients: int
    ttl: float
    workdir: Path
    minio: str | None


@dataclass
class Pair:
    """A `shardlease node` and the slatekv process it drives."""

    name: str
    proxy: FaultProxy
    incarnation: int = 0
    app: subprocess.Popen[bytes] | None = None
    node: subprocess.Popen[bytes] | None = None
    url: str = ""

    @property
    def instance(self) -> str:
        return f"{self.name}.{self.incarnation}"

    def up(self) -> bool:
        return self.app is not None and self.node is not None


@dataclass
class Run:
    settings: Settings
    out: TextIO
    minio_endpoint: str = ""
    pairs: dict[str, Pair] = field(default_factory=dict)
    #: app name -> URL of the apps up (the workload reads it).
    apps: dict[str, str] = field(default_factory=dict)
    #: shard -> the name of the node owning its lease (the workload's hint).
    owners: dict[int, str] = field(default_factory=dict)
    owners_seen: dict[int, tuple[str | None, int]] = field(default_factory=dict)
    paused: set[str] = field(default_factory=set)
    env: dict[str, str] = field(default_factory=dict)
    started: float = field(default_factory=time.monotonic)

    def say(self, message: str) -> None:
        print(f"[{time.monotonic() - self.started:6.1f}s] {message}", file=self.out, flush=True)

    # -- processes ---------------------------------------------------------------------

    def _spawn(self, log: Path, command: list[str]) -> subprocess.Popen[bytes]:
        with open(log, "ab") as out:
            return subprocess.Popen(command, stdin=subprocess.DEVNULL, stdout=out, stderr=out,
                                    env=self.env, start_new_session=True)

    def store_url(self, pair: Pair, path: str) -> str:
        return f"s3://{BUCKET}/{path}?endpoint={pair.proxy.endpoint}&path_style=true"

    def lease_store(self, pair: Pair | None) -> str:
        if self.settings.store == "file":
            return f"file://{self.settings.workdir / 'leases'}"
        endpoint = pair.proxy.endpoint if pair is not None else self.minio_endpoint
        return f"s3://{BUCKET}/leases?endpoint={endpoint}&path_style=true"

    async def start_pair(self, http: aiohttp.ClientSession, name: str) -> Pair:
        pair = self.pairs.get(name)
        if pair is None:
            proxy = FaultProxy(self.minio_endpoint, seed=self.settings.seed)
            await proxy.start()
            pair = self.pairs[name] = Pair(name, proxy)
        pair.incarnation += 1
        port = free_port()
        s, wd = self.settings, self.settings.workdir
        pair.app = self._spawn(wd / f"app-{name}.log", [
            sys.executable, "-m", "shardlease_examples.slatekv", "--port", str(port),
            "--bind", "127.0.0.1", "--store", self.store_url(pair, "kv"),
            "--shards", str(s.shards), "--opens", str(wd / f"opens-{name}.jsonl"),
            "--instance", pair.instance, "--manifest-poll-ms", "200",
            "--parent-pid", str(os.getpid())])
        pair.url = f"http://127.0.0.1:{port}"
        end = time.monotonic() + WAIT
        while True:
            if pair.app.poll() is not None:
                raise RunError(f"app {name} exited with {pair.app.returncode} "
                               f"(see {wd / f'app-{name}.log'})")
            try:
                async with http.get(f"{pair.url}/healthz") as resp:
                    if resp.status == 200:
                        break
            except (aiohttp.ClientError, TimeoutError):
                pass
            if time.monotonic() > end:
                raise RunError(f"app {name} did not serve within {WAIT:g}s")
            await asyncio.sleep(0.1)
        pair.node = self._spawn(wd / f"node-{name}.log", [
            sys.executable, "-m", "shardlease", "node", "--store", self.lease_store(pair),
            "--cluster", CLUSTER, "--name", name, "--shards", str(s.shards),
            "--lease-ttl", f"{s.ttl:g}", "--host", pair.url, "--log-format", "json",
            "--parent-pid", str(os.getpid())])
        self.apps[name] = pair.url
        return pair

    def _closed_by_death(self, pair: Pair) -> None:
        """The app of `pair` is gone (killed): close what its records leave open."""
        path = self.settings.workdir / f"opens-{pair.name}.jsonl"
        if not path.exists():
            return
        open_now: dict[int, int | None] = {}
        for line in path.read_text().splitlines():
            if not line.strip():
                continue
            rec = json.loads(line)
            if rec.get("instance") != pair.instance:
                continue
            if rec["event"] == "open":
                open_now.setdefault(rec["shard"], rec.get("generation"))
            else:
                open_now.pop(rec["shard"], None)
        now = time.monotonic_ns()
        with path.open("a") as f:
            for shard, generation in sorted(open_now.items()):
                f.write(json.dumps({"shard": shard, "instance": pair.instance,
                                    "event": "close", "time": now,
                                    "generation": generation}) + "\n")

    async def _wait(self, proc: subprocess.Popen[bytes], what: str) -> int:
        end = time.monotonic() + WAIT
        while proc.poll() is None:
            if time.monotonic() > end:
                proc.kill()
                await asyncio.to_thread(proc.wait)
                raise RunError(f"{what} did not exit within {WAIT:g}s (killed)")
            await asyncio.sleep(0.05)
        return proc.returncode

    async def kill(self, pair: Pair) -> None:
        self.apps.pop(pair.name, None)
        for proc in (pair.node, pair.app):
            if proc is not None:
                proc.send_signal(signal.SIGKILL)
        for proc in (pair.node, pair.app):
            if proc is not None:
                await asyncio.to_thread(proc.wait)
        self.paused.discard(pair.name)
        self._closed_by_death(pair)
        pair.node = pair.app = None

    async def stop(self, pair: Pair) -> tuple[int | None, int | None]:
        """SIGTERM the node (it closes its shards and frees its leases), then the app."""
        codes: list[int | None] = [None, None]
        if pair.node is not None:
            if pair.name in self.paused:
                pair.node.send_signal(signal.SIGCONT)
                self.paused.discard(pair.name)
            pair.node.send_signal(signal.SIGTERM)
            codes[0] = await self._wait(pair.node, f"node {pair.name}")
        self.apps.pop(pair.name, None)
        if pair.app is not None:
            pair.app.send_signal(signal.SIGTERM)
            codes[1] = await self._wait(pair.app, f"app {pair.name}")
            self._closed_by_death(pair)  # (nothing, when it closed everything)
        pair.node = pair.app = None
        return codes[0], codes[1]

    def check_alive(self) -> None:
        for pair in self.pairs.values():
            for kind, proc in (("node", pair.node), ("app", pair.app)):
                if proc is not None and proc.poll() is not None:
                    raise RunError(f"{kind} {pair.name} exited with {proc.returncode} (see "
                                   f"{self.settings.workdir / f'{kind}-{pair.name}.log'})")

    def cleanup(self) -> None:
        for pair in self.pairs.values():
            for proc in (pair.node, pair.app):
                if proc is not None and proc.poll() is None:
                    proc.send_signal(signal.SIGCONT)
                    proc.kill()
                    proc.wait()

    # -- the owners ------------------------------------------------------------------------

    async def watch_owners(self, stop: asyncio.Event) -> None:
        store = open_store(self.lease_store(None))
        try:
            while not stop.is_set():
                with contextlib.suppress(Exception):
                    rows, _ = await read_owners(store, CLUSTER, self.settings.shards)
                    self.owners_seen = {r.shard: (r.owner, r.generation) for r in rows}
                    for r in rows:
                        if r.owner:
                            self.owners[r.shard] = r.owner
                        else:
                            self.owners.pop(r.shard, None)
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(stop.wait(), 0.3)
        finally:
            with contextlib.suppress(Exception):
                await store.aclose()

    def settled(self) -> bool:
        """Every shard's lease held by a pair that is up and running."""
        live = {n for n, p in self.pairs.items() if p.up() and n not in self.paused}
        return len(self.owners_seen) == self.settings.shards and all(
            owner in live for owner, _ in self.owners_seen.values())

    async def wait_settled(self, what: str) -> None:
        end = time.monotonic() + WAIT
        while not self.settled():
            self.check_alive()
            if time.monotonic() > end:
                raise RunError(f"not {what} after {WAIT:g}s: {self.owners_seen}")
            await asyncio.sleep(0.2)

    # -- the faults -----------------------------------------------------------------------

    def schedule(self, rng: random.Random) -> list[str]:
        """Every kind asked for once, in an order drawn from the seed."""
        kinds = list(self.settings.faults)
        rng.shuffle(kinds)
        return kinds

    async def fault(self, http: aiohttp.ClientSession, kind: str, rng: random.Random) -> None:
        ttl = self.settings.ttl
        up = sorted(n for n, p in self.pairs.items() if p.up() and n not in self.paused)
        down = sorted(n for n, p in self.pairs.items() if not p.up())
        if kind == "join":
            name = down[0] if down else f"n{len(self.pairs) + 1}"
            self.say(f"fault join: {name} starts")
            await self.start_pair(http, name)
            return
        if kind == "leave" and len(up) < 2:
            self.say("fault leave: skipped (one node left)")
            return
        if not up:
            self.say(f"fault {kind}: skipped (no node up)")
            return
        pair = self.pairs[rng.choice(up)]
        if kind == "kill":
            downtime = rng.uniform(0.5, 1.0) * ttl
            self.say(f"fault kill: kill -9 {pair.name} (node and app), restart after "
                     f"{downtime:.1f}s")
            await self.kill(pair)
            await asyncio.sleep(downtime)
            await self.start_pair(http, pair.name)
            self.say(f"  {pair.name} restarted")
        elif kind == "pause":
            length = rng.uniform(1.3, 1.8) * ttl
            assert pair.node is not None
            self.say(f"fault pause: SIGSTOP node {pair.name} for {length:.1f}s "
                     f"(lease TTL {ttl:g}s)")
            pair.node.send_signal(signal.SIGSTOP)
            self.paused.add(pair.name)
            await asyncio.sleep(length)
            if pair.node is not None:
                pair.node.send_signal(signal.SIGCONT)
            self.paused.discard(pair.name)
            self.say(f"  {pair.name} continued")
        elif kind == "latency":
            delay, length = rng.uniform(0.2, 0.8), rng.uniform(1.5, 3.0)
            what = "its app's S3 requests" + (
                " and its node's lease requests" if self.settings.store == "s3" else "")
            self.say(f"fault latency: +{delay:.2f}s on {what} of {pair.name} for "
                     f"{length:.1f}s")
            pair.proxy.set(Faults(latency=delay))
            await asyncio.sleep(length)
            pair.proxy.set(Faults())
            self.say(f"  {pair.name}'s store latency back to none")
        elif kind == "leave":
            self.say(f"fault leave: {pair.name} stops gracefully (SIGTERM)")
            codes = await self.stop(pair)
            self.say(f"  {pair.name} stopped (node exit {codes[0]}, app exit {codes[1]})")
        else:
            raise ValueError(f"unknown fault {kind!r}")

    async def faults(self, http: aiohttp.ClientSession, rng: random.Random,
                     until: float) -> list[str]:
        done: list[str] = []
        for kind in self.schedule(rng):
            await self.fault(http, kind, rng)
            done.append(kind)
            self.check_alive()
            await asyncio.sleep(rng.uniform(0.5, 1.5))
        while time.monotonic() < until - 3 * self.settings.ttl:
            kind = rng.choice(self.settings.faults)
            await self.fault(http, kind, rng)
            done.append(kind)
            self.check_alive()
            await asyncio.sleep(rng.uniform(0.5, 1.5))
        return done

    # -- the whole run --------------------------------------------------------------------

    async def main(self) -> int:
        s = self.settings
        self.env = {**os.environ, **aws_env()}
        os.environ.update(aws_env())  # this process reads the leases (the owners) too
        rng = random.Random(s.seed)
        port = free_port()
        minio, minio_log = self._start_minio(port)
        self.minio_endpoint = f"http://127.0.0.1:{port}"
        timeout = aiohttp.ClientTimeout(total=10)
        stop_owners, stop_clients = asyncio.Event(), asyncio.Event()
        tasks: list[asyncio.Task[None]] = []
        try:
            async with aiohttp.ClientSession(timeout=timeout) as http:
                await self._minio_ready(http, minio)
                async with get_session().create_client(
                        "s3", endpoint_url=self.minio_endpoint, region_name="us-east-1",
                        aws_access_key_id=ACCESS_KEY,
                        aws_secret_access_key=SECRET_KEY) as s3:
                    await s3.create_bucket(Bucket=BUCKET)
                self.say(f"MinIO on {self.minio_endpoint}; leases in a {s.store} store; "
                         f"{s.nodes} nodes, {s.shards} shards, lease TTL {s.ttl:g}s, "
                         f"{s.clients} clients, faults {','.join(s.faults)}")
                for i in range(1, s.nodes + 1):
                    await self.start_pair(http, f"n{i}")
                tasks.append(asyncio.create_task(self.watch_owners(stop_owners)))
                await self.wait_settled("every shard owned")
                self.say("every shard owned; clients start")
                workload = Workload(http, self.apps, s.shards, keys=2 * s.shards, seed=s.seed,
                                    cas=0.3, writes=0.4, owners=self.owners)
                tasks += [asyncio.create_task(workload.client(c, stop_clients))
                          for c in range(s.clients)]
                until = time.monotonic() + s.seconds
                await asyncio.sleep(min(2.0, s.seconds / 10))
                done = await self.faults(http, rng, until)
                while time.monotonic() < until:
                    self.check_alive()
                    await asyncio.sleep(0.2)
                stop_clients.set()
                await asyncio.gather(*tasks[1:])
                self.say(f"clients stopped after {len(workload.ops)} operations; faults: "
                         + ", ".join(f"{k} x{n}" for k, n in Counter(done).items()))
                await self.wait_settled("every shard owned again for the read-back")
                missing = await workload.read_back()
                if missing:
                    self.say(f"could not read back {len(missing)} keys: {missing[:5]}")
                for pair in list(self.pairs.values()):
                    codes = await self.stop(pair)
                    if codes != (None, None) and codes != (0, 0):
                        self.say(f"{pair.name} stopped with exit statuses {codes}")
                stop_owners.set()
                await asyncio.gather(*tasks[:1])
        finally:
            stop_owners.set()
            stop_clients.set()
            for task in tasks:
                task.cancel()
            self.cleanup()
            for pair in self.pairs.values():
                await pair.proxy.aclose()
            minio.terminate()
            try:
                minio.wait(15)
            except subprocess.TimeoutExpired:
                minio.kill()
                minio.wait()
            minio_log.close()
        return self.judge(workload)

    def _start_minio(self, port: int) -> tuple[subprocess.Popen[bytes], BinaryIO]:
        s = self.settings
        binary = find_minio(s.minio)
        data = s.workdir / "minio"
        data.mkdir(exist_ok=True)
        log = open(s.workdir / "minio.log", "ab")
        proc = subprocess.Popen(
            [str(binary), "server", str(data / "d"), "--address", f"127.0.0.1:{port}",
             "--quiet"], stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
            env={**os.environ, "MINIO_ROOT_USER": ACCESS_KEY, "MINIO_ROOT_PASSWORD": SECRET_KEY,
                 "MINIO_BROWSER": "off", "MINIO_UPDATE": "off", "HOME": str(data)},
            start_new_session=True)
        return proc, log

    async def _minio_ready(self, http: aiohttp.ClientSession,
                           minio: subprocess.Popen[bytes]) -> None:
        end = time.monotonic() + WAIT
        while True:
            try:
                async with http.get(f"{self.minio_endpoint}/minio/health/ready") as resp:
                    if resp.status == 200:
                        return
            except (aiohttp.ClientError, TimeoutError):
                pass
            if minio.poll() is not None or time.monotonic() > end:
                raise RunError(f"MinIO did not become ready (see "
                               f"{self.settings.workdir / 'minio.log'})")
            await asyncio.sleep(0.2)

    def judge(self, workload: Workload) -> int:
        s = self.settings
        history = s.workdir / "history.jsonl"
        history.write_text(dump_history(workload.ops))
        opens = s.workdir / "opens.jsonl"
        opens.write_text("".join(p.read_text() for p in sorted(s.workdir.glob("opens-*.jsonl"))))
        outcomes = Counter(op.outcome for op in workload.ops)
        kinds = Counter(op.op for op in workload.ops)
        self.say(f"history: {len(workload.ops)} operations ("
                 + ", ".join(f"{n} {k}" for k, n in sorted(kinds.items())) + "; "
                 + ", ".join(f"{n} {k}" for k, n in sorted(outcomes.items())) + f"), "
                 f"{sum(workload.acknowledged().values())} acknowledged writes")
        print(f"verify: files in {s.workdir}: history.jsonl, opens.jsonl, node-*.log, app-*.log",
              file=self.out, flush=True)
        try:
            verdict = judge(history, opens=opens, checker=find_checker(None))
        except (HistoryError, CheckerError) as e:
            print(f"shardlease verify: cannot judge: {e}", file=sys.stderr)
            print(f"verify: seed {s.seed}, {len(workload.ops)} ops, linearizable: unknown, "
                  "lost acknowledged writes: ?, stale-generation writes: ?, double opens: ?",
                  file=self.out, flush=True)
            return EXIT_CANNOT_JUDGE
        for line in verdict.lines(str(s.seed)):
            print(line, file=self.out, flush=True)
        return EXIT_OK if verdict.passed else EXIT_FAILED


def settings_from(args: argparse.Namespace) -> Settings:
    faults = tuple(f for f in (args.faults or "").split(",") if f)
    unknown = [f for f in faults if f not in FAULTS]
    if unknown:
        raise ValueError(f"unknown fault {', '.join(unknown)} (known: {', '.join(FAULTS)})")
    if args.nodes < 1 or args.shards < 1 or args.seconds <= 0 or args.clients < 1:
        raise ValueError("--nodes, --shards, --clients and --seconds must be positive")
    if "leave" in faults and args.nodes < 2:
        raise ValueError("a leave needs --nodes 2 or more")
    seed = args.seed if args.seed is not None else random.SystemRandom().randrange(1, 2**31)
    workdir = Path(args.dir) if args.dir else Path(tempfile.mkdtemp(prefix="shardlease-verify-"))
    workdir.mkdir(parents=True, exist_ok=True)
    return Settings(args.store, args.nodes, args.shards, faults, args.seconds, seed,
                    args.clients, args.lease_ttl, workdir.resolve(), args.minio)


def cmd_verify_run(args: argparse.Namespace) -> int:
    """`shardlease verify` without --history: run, record, judge."""
    try:
        settings = settings_from(args)
    except ValueError as e:
        print(f"shardlease verify: {e}", file=sys.stderr)
        return EXIT_CANNOT_JUDGE
    run = Run(settings, sys.stdout)
    try:
        return asyncio.run(run.main())
    except RunError as e:
        print(f"shardlease verify: the run failed: {e}", file=sys.stderr)
        print(f"verify: seed {settings.seed}, 0 ops, linearizable: unknown, lost acknowledged "
              "writes: ?, stale-generation writes: ?, double opens: ?", flush=True)
        return EXIT_CANNOT_JUDGE
