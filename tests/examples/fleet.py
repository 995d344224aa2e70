"""Real processes for the end-to-end test of the example app: `shardlease node`
processes, each driving its own `shardlease_examples.shardapp` process over
the HTTP host protocol, and a client that writes through whichever app owns a
key (asking the apps, following 421s) and records every answer.

Waits poll with generous timeouts; the checks are invariants over what the
client was told and what S3 holds, never durations.
"""

from __future__ import annotations

import asyncio
import math
import os
import signal
import socket
import subprocess
import sys
from collections import Counter, defaultdict
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import aiohttp

from shardlease.routing import shard_for_key
from tests.support.owners_watch import OwnersWatch

#: Seconds any one wait may take before the test fails (CI machines are slow).
WAIT = 120.0

T = TypeVar("T")
Owners = list[dict[str, Any]]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


async def wait_for(what: str, check: Callable[[], Awaitable[T | None]],
                   timeout: float = WAIT, describe: Callable[[], str] | None = None) -> T:
    """Poll `check` until it returns something truthy; fail with `describe()`."""
    loop = asyncio.get_running_loop()
    end = loop.time() + timeout
    while True:
        got = await check()
        if got:
            return got
        if loop.time() > end:
            more = f"\n{describe()}" if describe else ""
            raise AssertionError(f"not {what} after {timeout:g}s{more}")
        await asyncio.sleep(0.2)


@dataclass
class Proc:
    name: str
    popen: subprocess.Popen[bytes]
    log: Path

    def alive(self) -> bool:
        return self.popen.poll() is None

    def tail(self, lines: int = 25) -> str:
        try:
            text = self.log.read_text(errors="replace").splitlines()[-lines:]
        except OSError:
            return "(no log)"
        return "\n".join(text)


@dataclass
class Fleet:
    """Pairs of (node, app) processes: node NAME drives app NAME."""

    workdir: Path
    app_store: str
    lease_store: str
    shards: int
    ttl: float = 2.0
    cluster: str = "shardapp"
    #: The application's module: the toy (shardapp) or the SlateDB one (slatekv),
    #: which take the same options.
    app: str = "shardlease_examples.shardapp"
    apps: dict[str, Proc] = field(default_factory=dict)
    app_urls: dict[str, str] = field(default_factory=dict)
    nodes: dict[str, Proc] = field(default_factory=dict)
    paused: set[str] = field(default_factory=set)
    #: The `shardlease owners --watch` process `owners()` reads.
    watch: OwnersWatch | None = None

    def _spawn(self, kind: str, name: str, command: list[str]) -> Proc:
        log = self.workdir / f"{kind}-{name}.log"
        with open(log, "ab") as out:
            popen = subprocess.Popen(command, stdin=subprocess.DEVNULL, stdout=out, stderr=out,
                                     env=dict(os.environ), start_new_session=True)
        return Proc(name, popen, log)

    def start_app(self, name: str, *extra: str) -> str:
        port = free_port()
        self.apps[name] = self._spawn("app", name, [
            sys.executable, "-m", self.app, "--port", str(port),
            "--bind", "127.0.0.1", "--store", self.app_store, "--shards", str(self.shards),
            "--parent-pid", str(os.getpid()), *extra])
        url = self.app_urls[name] = f"http://127.0.0.1:{port}"
        return url

    def start_node(self, name: str) -> Proc:
        node = self.nodes[name] = self._spawn("node", name, [
            sys.executable, "-m", "shardlease", "node", "--store", self.lease_store,
            "--cluster", self.cluster, "--name", name, "--shards", str(self.shards),
            "--lease-ttl", f"{self.ttl:g}", "--host", self.app_urls[name],
            "--log-format", "json", "--parent-pid", str(os.getpid())])
        return node

    def pause(self, name: str) -> None:
        self.nodes[name].popen.send_signal(signal.SIGSTOP)
        self.paused.add(name)

    def resume(self, name: str) -> None:
        self.nodes[name].popen.send_signal(signal.SIGCONT)
        self.paused.discard(name)

    def running_nodes(self) -> set[str]:
        return {n for n, p in self.nodes.items() if p.alive() and n not in self.paused}

    def terminate_nodes(self) -> dict[str, int]:
        """SIGTERM every node (each closes its shards and frees its leases)."""
        for name in list(self.paused):
            self.resume(name)
        for proc in self.nodes.values():
            if proc.alive():
                proc.popen.send_signal(signal.SIGTERM)
        return {name: proc.popen.wait(WAIT) for name, proc in self.nodes.items()}

    def cleanup(self) -> None:
        if self.watch is not None:
            self.watch.close()
        for proc in [*self.nodes.values(), *self.apps.values()]:
            if proc.alive():
                if proc.name in self.paused:
                    proc.popen.send_signal(signal.SIGCONT)
                proc.popen.kill()
                proc.popen.wait()

    async def apps_serving(self, http: aiohttp.ClientSession) -> None:
        """Until every app started answers /healthz."""
        for name, url in self.app_urls.items():
            async def healthy(url: str = url) -> bool:
                self.check_alive()
                try:
                    async with http.get(f"{url}/healthz") as resp:
                        return resp.status == 200
                except aiohttp.ClientError:
                    return False
            await wait_for(f"app {name} serving", healthy, describe=self.describe)

    def check_alive(self) -> None:
        for kind, procs in (("node", self.nodes), ("app", self.apps)):
            for name, proc in procs.items():
                if not proc.alive():
                    raise AssertionError(f"{kind} {name} exited with {proc.popen.returncode}:"
                                         f"\n{proc.tail()}")

    def describe(self) -> str:
        return "\n".join(f"--- {p.log.name}\n{p.tail(8)}"
                         for p in [*self.nodes.values(), *self.apps.values()])

    # -- views ---------------------------------------------------------------------

    async def owners(self) -> Owners:
        """`shardlease owners -o json`: the leases, as a user watching them
        reads them (`--watch`; a read that began after this call)."""
        if self.watch is None or self.watch.store != self.lease_store:
            if self.watch is not None:
                self.watch.close()
            self.watch = OwnersWatch(self.lease_store, self.cluster, self.shards, timeout=WAIT)
        return await asyncio.to_thread(self.watch.read)

    async def app_views(self, http: aiohttp.ClientSession) -> dict[str, dict[str, Any]]:
        """GET /shards of every app: what each has open, at which generation."""
        views = {}
        for name, url in self.app_urls.items():
            async with http.get(f"{url}/shards") as resp:
                assert resp.status == 200
                views[name] = await resp.json()
        return views

    def balanced(self, owners: Owners, live: set[str]) -> bool:
        if not live or any(o["owner"] not in live for o in owners):
            return False
        counts = Counter(o["owner"] for o in owners)
        return max(counts.values()) <= math.ceil(self.shards / len(live))

    async def settled(self, http: aiohttp.ClientSession) -> Owners | None:
        """The owners, once balanced over the running nodes and each shard open
        on exactly its owner's app, at the lease's generation; else None."""
        self.check_alive()
        owners = await self.owners()
        if not self.balanced(owners, self.running_nodes()):
            return None
        views = await self.app_views(http)
        for o in owners:
            opened = {name for name, view in views.items() if str(o["shard"]) in view["open"]}
            if opened != {o["owner"]}:
                return None
            if views[o["owner"]]["open"][str(o["shard"])]["generation"] != o["generation"]:
                return None
        return owners


# -- the client --------------------------------------------------------------------------


@dataclass
class Attempt:
    app: str
    status: int  # 0: no answer (connection failed)
    body: dict[str, Any]


@dataclass
class Op:
    """One logical write, tried on the apps until one accepts it."""

    seq: int
    key: str
    value: str
    shard: int
    attempts: list[Attempt] = field(default_factory=list)
    #: accepted, refused (no app accepted it; none may have applied it), unknown.
    outcome: str = "refused"
    app: str | None = None
    generation: int | None = None


@dataclass
class Client:
    """Writes through whichever app has the key's shard open: it tries the app
    that last accepted the shard, then the others (a 421 or a 409 sends it on)."""

    http: aiohttp.ClientSession
    apps: Mapping[str, str]
    shards: int
    route: dict[int, str] = field(default_factory=dict)
    ops: list[Op] = field(default_factory=list)

    async def write(self, key: str, value: str) -> Op:
        shard = shard_for_key(key, self.shards)
        op = Op(len(self.ops), key, value, shard)
        self.ops.append(op)
        maybe = False
        for _ in range(3):
            first = self.route.get(shard)
            order = ([first] if first else []) + sorted(n for n in self.apps if n != first)
            for name in order:
                attempt = await self._put(name, key, value)
                op.attempts.append(attempt)
                if attempt.status == 200:
                    op.outcome, op.app = "accepted", name
                    op.generation = int(attempt.body["generation"])
                    self.route[shard] = name
                    return op
                if attempt.status == 0 or attempt.body.get("applied") == "unknown":
                    maybe = True
            await asyncio.sleep(0.05)
        op.outcome = "unknown" if maybe else "refused"
        return op

    async def _put(self, name: str, key: str, value: str) -> Attempt:
        try:
            async with self.http.put(f"{self.apps[name]}/kv/{key}", data=value.encode()) as resp:
                try:
                    body = await resp.json()
                except (aiohttp.ContentTypeError, ValueError):
                    body = {"text": await resp.text()}
                return Attempt(name, resp.status, body)
        except (aiohttp.ClientError, TimeoutError) as e:
            return Attempt(name, 0, {"error": repr(e)})

    async def run(self, stop: asyncio.Event, hot_keys: int = 12) -> None:
        """Write until `stop`: fresh keys and overwritten hot keys, alternately;
        every value is unique."""
        seq = 0
        while not stop.is_set():
            key = f"u{seq}" if seq % 2 == 0 else f"h{seq % hot_keys}"
            await self.write(key, f"v{seq}")
            seq += 1

    def accepted_since(self, start: int) -> Counter[int]:
        """Accepted writes per shard among ops from index `start` on."""
        return Counter(op.shard for op in self.ops[start:] if op.outcome == "accepted")


def expected_values(ops: list[Op]) -> dict[str, set[str | None]]:
    """key -> the values it may hold in the end: its last accepted value (None if
    none was accepted), or a value written after it whose outcome is unknown."""
    allowed: dict[str, set[str | None]] = defaultdict(lambda: {None})
    for op in ops:
        if op.outcome == "accepted":
            allowed[op.key] = {op.value}
        elif op.outcome == "unknown" or any(a.status == 0 or a.body.get("applied") == "unknown"
                                            for a in op.attempts):
            allowed[op.key] = allowed[op.key] | {op.value}
    return dict(allowed)


def generation_regressions(ops: list[Op]) -> list[str]:
    """Per shard, in the client's order (it writes one op at a time), an accepted
    write at a generation below one accepted earlier: a stale writer effective
    after a newer one. Must be empty."""
    highest: dict[int, tuple[int, Op]] = {}
    bad = []
    for op in ops:
        if op.outcome != "accepted" or op.generation is None:
            continue
        seen = highest.get(op.shard)
        if seen is not None and op.generation < seen[0]:
            bad.append(f"op {op.seq} ({op.key}) accepted by {op.app} at generation "
                       f"{op.generation} after op {seen[1].seq} at {seen[0]}")
        if seen is None or op.generation > seen[0]:
            highest[op.shard] = (op.generation, op)
    return bad
