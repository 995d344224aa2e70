"""Stop, then free, on real node processes (issue 38, items 1 and 2): a node
whose application refuses to close its shards gets two SIGTERMs. It exits
(the second signal stops it short) without freeing those leases, and no peer
opens one of those shards before the validity the application was given for
it has run out.

The applications are small HTTP servers in this process speaking the host
protocol (shardlease.hosts.http): they record every open, validity and close
on this process's one monotonic clock, so that the orderings between the
nodes' applications are exact; one of them answers every close with a 500.
Assertions are orderings (an open after a validity's end), never durations.
"""

from __future__ import annotations

import json
import signal
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from .cluster import WAIT, LocalCluster, held_by
from .conftest import MakeCluster, cluster_on

pytestmark = pytest.mark.slow
pytest_plugins = ["tests.support.s3server"]

SHARDS = 4
TTL = 3.0


@dataclass
class App:
    """One node's application: what it has open, until when it may act on
    each shard (monotonic, this process), and whether it refuses closes."""

    name: str
    refuse_closes: bool = False
    #: shard -> (generation, valid until) while open here.
    open: dict[int, tuple[int, float]] = field(default_factory=dict)
    #: (monotonic, shard, generation) of every open that succeeded.
    opens: list[tuple[float, int, int]] = field(default_factory=list)
    closes_refused: int = 0
    lock: threading.Lock = field(default_factory=threading.Lock)

    def handle(self, path: str, body: dict[str, Any]) -> int:
        now = time.monotonic()
        with self.lock:
            if path == "/lease":
                for entry in body.get("leases", []):
                    held = self.open.get(entry["shard"])
                    if held is not None and held[0] == entry["generation"]:
                        until = now + entry["validity_ms"] / 1000
                        self.open[entry["shard"]] = (held[0], max(held[1], until))
                return 200
            _, _, shard_s, action = path.split("/")
            shard = int(shard_s)
            if action == "open":
                until = now + body.get("validity_ms", 0) / 1000
                self.open[shard] = (body["generation"], until)
                self.opens.append((now, shard, body["generation"]))
                return 200
            if action == "close":
                if self.refuse_closes:
                    self.closes_refused += 1
                    return 500
                self.open.pop(shard, None)
            return 200  # close, abort

    def valid_until(self, shard: int) -> float:
        with self.lock:
            return self.open[shard][1]


class Server:
    def __init__(self, app: App) -> None:
        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                body = json.loads(self.rfile.read(length) or b"{}")
                code = app.handle(self.path, body)
                self.send_response(code)
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, *args: Any) -> None:
                pass

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)
        self.thread.start()

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


@pytest.fixture
def apps() -> Iterator[dict[str, tuple[App, Server]]]:
    made = {name: App(name) for name in ("a", "b")}
    servers = {name: (app, Server(app)) for name, app in made.items()}
    yield servers
    for _, server in servers.values():
        server.close()


@pytest.fixture(params=["file-shard", "file-node", "s3-shard", "s3-node"])
def cluster(request: pytest.FixtureRequest, make_cluster: MakeCluster,
            tmp_path: Path) -> LocalCluster:
    return cluster_on(request.param, request, make_cluster, tmp_path, shards=SHARDS, ttl=TTL)


def test_a_node_stopped_short_leaves_what_its_application_did_not_close_to_expire(
        cluster: LocalCluster, apps: dict[str, tuple[App, Server]]) -> None:
    (a, a_server), (b, b_server) = apps["a"], apps["b"]
    cluster.start("a", "--host", a_server.url)
    cluster.start("b", "--host", b_server.url)
    owners = cluster.wait_balanced("after the start")
    held = held_by(owners, "a")
    assert held
    # a's application will not close anything: a graceful stop keeps its
    # leases (renewed) while the closes are retried, and the second signal
    # stops it short.
    a.refuse_closes = True
    cluster.signal("a", signal.SIGTERM)
    end = time.monotonic() + WAIT
    while a.closes_refused < len(held):
        assert time.monotonic() < end, f"a never tried to close {sorted(held)}"
        time.sleep(0.05)
    cluster.signal("a", signal.SIGTERM)
    code = cluster.nodes["a"].proc.wait(WAIT)
    assert code != 0, "a second signal is an abnormal end"
    # What a's application still has open, and until when it may act on it.
    with a.lock:
        still_open = {s: until for s, (_, until) in a.open.items()}
    assert set(held) <= set(still_open)
    # b takes every shard, each only once a's validity for it has run out.
    after = cluster.wait_owners("every shard with b",
                                lambda o: all(s["owner"] == "b" for s in o))
    generations = {s["shard"]: s["generation"] for s in after}
    assert all(generations[s] > g for s, g in held.items())
    for shard, until in still_open.items():
        a_opened = max(t for t, s, _ in a.opens if s == shard)

        def opened_on_b(shard: int = shard, after: float = a_opened) -> list[float]:
            with b.lock:
                return [t for t, s, _ in b.opens if s == shard and t > after]
        # (The store names b once its claim landed; b's application opens
        # the shard after that: on a loaded machine, not yet. CI-like run at
        # 60a3a61, the Kubernetes store: "b never opened shard 2".)
        end = time.monotonic() + WAIT
        while not (opened := opened_on_b()) and time.monotonic() < end:
            time.sleep(0.05)
        assert opened, f"b never opened shard {shard}"
        assert min(opened) >= until, \
            f"b opened shard {shard} {until - min(opened):.3f}s before a's validity ended"
    # And a said so, per shard.
    said = [json.loads(line) for line in cluster.nodes["a"].log.read_text().splitlines()
            if '"left_to_expire"' in line]
    assert {e["shard"] for e in said} == set(still_open), cluster.log_tail("a")
