"""The SlateDB application (shardlease_examples.slatekv) as real processes on
MinIO: `shardlease conformance` against it, its key-value API, and two
`shardlease node` processes moving shards between two of its instances
under a client workload, the history judged by `shardlease verify`'s judge
(porcupine, lost writes, stale generations, double opens).
"""

from __future__ import annotations

import asyncio
import json
from collections import Counter
from collections.abc import Awaitable, Callable
from pathlib import Path

import aiohttp
import pytest

from shardlease.conformance import RULES
from shardlease.routing import shard_for_key
from shardlease_tools.verify import CheckerError, dump_history, find_checker, judge
from shardlease_tools.workload import Workload, call
from tests.support.s3server import S3Server

from .fleet import Fleet, wait_for
from .test_conformance import conformance

pytest_plugins = ["tests.support.s3server"]

APP = "shardlease_examples.slatekv"


def key_of(shard: int, shards: int, stem: str) -> str:
    return next(k for k in (f"{stem}{i}" for i in range(10_000))
                if shard_for_key(k, shards) == shard)


async def test_slatekv_keeps_every_rule_and_serves_its_api(
        minio: S3Server, tmp_path: Path) -> None:
    fleet = Fleet(tmp_path, minio.url(minio.create_bucket(), "kv"), "memory://unused", 4,
                  app=APP)
    try:
        url = fleet.start_app("a", "--agent", "http://127.0.0.1:8470")
        async with aiohttp.ClientSession() as http:
            await fleet.apps_serving(http)
            code, out, err = await conformance(url, "--shard", "2")
            assert code == 0, out + err
            assert f"conformance: {len(RULES)} rules kept, 0 broken (MUST), 0 warned" in out, out

            key, elsewhere = key_of(1, 4, "k"), key_of(3, 4, "k")
            assert await call(http, "POST", f"{url}/shards/1/open",
                              json={"shard": 1, "generation": 7, "validity_ms": 60_000}) \
                == (200, {"shard": 1, "generation": 7})
            status, body = await call(http, "PUT", f"{url}/kv/{key}", data=b"one")
            assert (status, body["generation"]) == (200, 7), body
            status, body = await call(http, "GET", f"{url}/kv/{key}")
            assert status == 200 and (body["value"], body["generation"]) == ("one", 7), body
            status, body = await call(http, "POST", f"{url}/cas/{key}",
                                      json={"expected": "two", "value": "three"})
            assert status == 200 and not body["swapped"] and body["value"] == "one", body
            status, body = await call(http, "POST", f"{url}/cas/{key}",
                                      json={"expected": "one", "value": "three"})
            assert status == 200 and body["swapped"] and body["value"] == "three", body
            status, body = await call(http, "GET", f"{url}/kv/{key_of(1, 4, 'none')}")
            assert status == 404 and body["value"] is None, body
            # A shard not open here: 421, and where to ask.
            status, body = await call(http, "PUT", f"{url}/kv/{elsewhere}", data=b"x")
            assert status == 421 and body["lookup"].startswith(
                "http://127.0.0.1:8470/lookup?key="), body
            # The host protocol's close shuts the database down; another
            # instance (generation 8) then reads what generation 7 stored.
            assert (await call(http, "POST", f"{url}/shards/1/close",
                               json={"shard": 1, "generation": 7}))[0] == 200
            other = fleet.start_app("b")
            await fleet.apps_serving(http)
            assert (await call(http, "POST", f"{other}/shards/1/open",
                               json={"shard": 1, "generation": 8}))[0] == 200
            status, body = await call(http, "GET", f"{other}/kv/{key}")
            assert status == 200 and (body["value"], body["generation"]) == ("three", 7), body
            assert body["served_by"] == 8
    finally:
        fleet.cleanup()


async def test_shards_move_between_two_nodes_and_no_acknowledged_write_is_lost(
        minio: S3Server, tmp_path: Path) -> None:
    """Two `shardlease node` processes, each driving its own slatekv process,
    one bucket of MinIO for the databases and a file store for the leases.
    Eight clients write and read all along; node a owns the four shards,
    then node b joins and two of them move (close on a's app, lease freed,
    claimed and opened on b's). The history, the read-back of every key at
    the end and the apps' open/close records go to the judge of `shardlease
    verify`: linearizable, no acknowledged write lost, no write under a
    superseded generation, no shard open on both apps at once."""
    try:
        checker = find_checker()
    except CheckerError as e:
        pytest.fail(f"cannot build the checker: {e}", pytrace=False)
    shards = 4
    fleet = Fleet(tmp_path, minio.url(minio.create_bucket(), "kv"),
                  f"file://{tmp_path / 'leases'}", shards, app=APP, cluster="slatekv")
    http = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=20))
    stop = asyncio.Event()
    workload = Workload(http, fleet.app_urls, shards)
    clients: list[asyncio.Task[None]] = []

    def acknowledged_on_every_shard(since: int) -> Callable[[], Awaitable[bool]]:
        async def check() -> bool:
            fleet.check_alive()
            for task in clients:
                if task.done():
                    task.result()  # a client failed: say how
            seen = {shard for shard, _ in workload.acknowledged(since)}
            return seen == set(range(shards))
        return check

    try:
        for name in ("a", "b"):
            fleet.start_app(name, "--opens", str(tmp_path / f"opens-{name}.jsonl"),
                            "--instance", name, "--manifest-poll-ms", "200")
        await fleet.apps_serving(http)
        fleet.start_node("a")
        before = await wait_for("node a owning every shard, each open on its app",
                                lambda: fleet.settled(http), describe=fleet.describe)
        clients = [asyncio.create_task(workload.client(c, stop)) for c in range(8)]
        await wait_for("writes acknowledged on every shard", acknowledged_on_every_shard(0),
                       describe=fleet.describe)

        fleet.start_node("b")
        after = await wait_for("nodes a and b balanced, each shard open on its owner's app",
                               lambda: fleet.settled(http), describe=fleet.describe)
        moved = {o["shard"]: o["generation"] for o in after if o["owner"] == "b"}
        assert len(moved) == 2, after
        await wait_for("writes acknowledged on every shard after the move",
                       acknowledged_on_every_shard(len(workload.ops)), describe=fleet.describe)
        stop.set()
        await asyncio.gather(*clients)
        for key in workload.keys:
            await workload.read(99, key, final=True)
        codes = fleet.terminate_nodes()
        assert set(codes.values()) == {0}, (codes, fleet.describe())
    finally:
        stop.set()
        for task in clients:
            task.cancel()
        await http.close()
        fleet.cleanup()

    finals = [op for op in workload.ops if op.final]
    assert len(finals) == len(workload.keys), "a key could not be read back"
    acknowledged = workload.acknowledged()
    old = {o["shard"]: o["generation"] for o in before}
    for shard, generation in moved.items():
        # The move happened under load: writes acknowledged by both owners.
        assert acknowledged[(shard, old[shard])] and acknowledged[(shard, generation)], \
            (shard, acknowledged)
    history = tmp_path / "history.jsonl"
    history.write_text(dump_history(workload.ops))
    opens = tmp_path / "opens.jsonl"
    opens.write_text("".join((tmp_path / f"opens-{n}.jsonl").read_text() for n in "ab"))
    verdict = judge(history, opens=opens, checker=checker)
    outcomes = Counter(op.outcome for op in workload.ops)
    print("slatekv:", json.dumps({"ops": len(workload.ops), "outcomes": outcomes, "moved": moved,
                                  "acknowledged writes": sum(acknowledged.values())}))
    print(verdict.summary_line())
    assert verdict.passed, "\n".join(verdict.lines())
    assert [event for line in opens.read_text().splitlines()
            if (event := json.loads(line))["instance"] == "b" and event["event"] == "open"], \
        "b's app never opened a shard"
