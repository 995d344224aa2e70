"""Real `shardlease node` processes for the process tests.

A `LocalCluster` starts node processes (`python -m shardlease node`) on one
store URL with a recording host (one JSON-lines file per node name), reads
the owners the way a user does (`shardlease owners -o json`), sends signals,
and stops everything it started. Every wait polls with a generous timeout and
checks orderings and invariants, never how long something took.
"""

from __future__ import annotations

import math
import os
import signal
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from shardlease.checker import Report, check_events, load_events
from tests.support.owners_watch import OwnersWatch

#: Seconds any one wait may take before the test fails (CI machines are slow).
WAIT = 90.0

Owners = list[dict[str, Any]]


@dataclass
class Node:
    name: str
    proc: subprocess.Popen[bytes]
    log: Path

    @property
    def pid(self) -> int:
        return self.proc.pid

    def alive(self) -> bool:
        return self.proc.poll() is None


@dataclass
class LocalCluster:
    store_url: str
    workdir: Path
    shards: int = 16
    ttl: float = 2.0
    name: str = "proc"
    env: Mapping[str, str] | None = None
    renewal: str = "shard"
    nodes: dict[str, Node] = field(default_factory=dict)
    #: Nodes stopped with SIGSTOP: alive, but not running.
    paused: set[str] = field(default_factory=set)
    #: Nodes this test killed or terminated (their exit is expected).
    stopped: set[str] = field(default_factory=set)
    #: The `shardlease owners --watch` process `owners()` reads (started on first use).
    watch: OwnersWatch | None = None

    def __post_init__(self) -> None:
        (self.workdir / "events").mkdir(parents=True, exist_ok=True)
        (self.workdir / "logs").mkdir(parents=True, exist_ok=True)

    # -- processes ---------------------------------------------------------------

    def _env(self) -> dict[str, str]:
        env = dict(os.environ)
        env.update(self.env or {})
        return env

    def start(self, name: str, *extra: str, store_url: str | None = None,
              version: Path | None = None) -> Node:
        """Start node `name`; on `store_url` if given (the same store reached
        another way, say through a fault-injecting proxy), else the cluster's.
        `version`: the directory holding another version's `shardlease`
        package (imported first), for a node of that version; it gets only
        the options every version has."""
        assert name not in self.nodes or not self.nodes[name].alive(), f"{name} is running"
        log = self.workdir / "logs" / f"{name}.log"
        events = self.workdir / "events" / f"{name}.jsonl"
        command = [sys.executable, "-m", "shardlease", "node",
                   "--store", store_url or self.store_url, "--cluster", self.name,
                   "--name", name, "--shards", str(self.shards),
                   "--lease-ttl", f"{self.ttl:g}", "--host", f"record:{events}",
                   "--log-format", "json", "--parent-pid", str(os.getpid()),
                   *(() if version is not None else ("--renewal", self.renewal)), *extra]
        env = self._env()
        if version is not None:
            env["PYTHONPATH"] = os.pathsep.join(
                p for p in (str(version), env.get("PYTHONPATH", "")) if p)
        with open(log, "ab") as out:
            proc = subprocess.Popen(command, stdin=subprocess.DEVNULL, stdout=out, stderr=out,
                                    env=env, start_new_session=True)
        node = self.nodes[name] = Node(name, proc, log)
        self.stopped.discard(name)
        return node

    def signal(self, name: str, sig: signal.Signals) -> None:
        self.nodes[name].proc.send_signal(sig)
        if sig in (signal.SIGKILL, signal.SIGTERM, signal.SIGINT):
            self.stopped.add(name)
        if sig is signal.SIGSTOP:
            self.paused.add(name)
            # A signal is delivered asynchronously: wait until the kernel
            # shows it stopped, so that what it recorded so far is final.
            stat = Path(f"/proc/{self.nodes[name].proc.pid}/stat")
            end = time.monotonic() + WAIT
            while stat.read_text().rsplit(")", 1)[1].split()[0] not in ("T", "t"):
                if time.monotonic() > end:
                    raise AssertionError(f"{name} did not stop on SIGSTOP")
                time.sleep(0.01)
        elif sig is signal.SIGCONT:
            self.paused.discard(name)

    def kill(self, name: str) -> None:
        """kill -9, and reap it."""
        self.signal(name, signal.SIGKILL)
        self.nodes[name].proc.wait(WAIT)

    def terminate(self, name: str) -> int:
        """SIGTERM (graceful stop); its exit status."""
        self.signal(name, signal.SIGTERM)
        return self.nodes[name].proc.wait(WAIT)

    def running(self) -> set[str]:
        """Nodes alive and not paused."""
        return {n for n, node in self.nodes.items() if node.alive() and n not in self.paused}

    def stop_all(self) -> dict[str, int]:
        """SIGCONT what is paused, SIGTERM everything alive; the exit statuses."""
        for name in list(self.paused):
            self.signal(name, signal.SIGCONT)
        alive = {n: node for n, node in self.nodes.items() if node.alive()}
        for name in alive:
            self.signal(name, signal.SIGTERM)
        codes = {}
        for name, node in alive.items():
            try:
                codes[name] = node.proc.wait(WAIT)
            except subprocess.TimeoutExpired:
                node.proc.kill()
                codes[name] = node.proc.wait()
        return codes

    def cleanup(self) -> None:
        """Whatever happened, leave no process behind."""
        for node in self.nodes.values():
            if node.alive():
                node.proc.kill()
                node.proc.wait()
        if self.watch is not None:
            self.watch.close()

    # -- what the store says -------------------------------------------------------

    def shardlease(self, *args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-m", "shardlease", *args], capture_output=True,
                              text=True, timeout=WAIT, env=self._env(),
                              stdin=subprocess.DEVNULL)

    def owners(self) -> Owners:
        """`shardlease owners -o json`, as a user watching them (`--watch`):
        a read that began after this call."""
        if self.watch is None:
            self.watch = OwnersWatch(self.store_url, self.name, self.shards, env=self._env(),
                                     timeout=WAIT)
        return self.watch.read()

    def wait_owners(self, what: str, ok: Callable[[Owners], bool],
                    timeout: float = WAIT) -> Owners:
        """Poll `shardlease owners` until `ok`; fail with the last view."""
        end = time.monotonic() + timeout
        while True:
            owners = self.owners()
            if ok(owners):
                return owners
            for name, node in self.nodes.items():
                if name not in self.stopped and not node.alive():
                    raise AssertionError(f"node {name} exited with {node.proc.returncode} "
                                         f"while waiting for {what}:\n{self.log_tail(name)}")
            if time.monotonic() > end:
                raise AssertionError(f"not {what} after {timeout:g}s: {counts(owners)}; "
                                     f"running {sorted(self.running())}; logs in {self.workdir}")
            time.sleep(0.3)

    def balanced(self, owners: Owners, nodes: set[str] | None = None) -> bool:
        """Every shard owned by one of `nodes` (default: the running ones),
        none holding more than its fair share."""
        live = self.running() if nodes is None else nodes
        if not live or any(s["owner"] not in live for s in owners):
            return False
        return max(counts(owners).values()) <= math.ceil(self.shards / len(live))

    def wait_balanced(self, what: str, nodes: set[str] | None = None) -> Owners:
        return self.wait_owners(f"balanced {what}", lambda o: self.balanced(o, nodes))

    # -- what the nodes recorded -------------------------------------------------------

    def events(self) -> list[dict[str, Any]]:
        return load_events(sorted((self.workdir / "events").glob("*.jsonl")))

    def check(self) -> Report:
        """The overlap checker over everything recorded, in its stricter
        (conservative) window: opening and closing count as open."""
        return check_events(self.events(), conservative=True)

    def log_tail(self, name: str, lines: int = 30) -> str:
        return "\n".join(self.nodes[name].log.read_text().splitlines()[-lines:])


def counts(owners: Owners) -> Counter[str | None]:
    return Counter(s["owner"] for s in owners)


def held_by(owners: Owners, node: str) -> dict[int, int]:
    """shard -> generation of the leases `node` owns."""
    return {s["shard"]: s["generation"] for s in owners if s["owner"] == node}
