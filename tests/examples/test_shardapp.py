"""The example app (`shardlease_examples.shardapp`) on a real S3 server over HTTP.

Every test talks to moto's S3 server on loopback (tests/support/s3server.py)
and to the apps over HTTP. The fencing tests run two app instances on one
bucket and let a stale owner, never told to close, try to write after a newer
generation opened the shard: S3's conditional writes must refuse it.
"""

from __future__ import annotations

import asyncio
import json
import math
import subprocess
import sys
import time
from collections import Counter
from collections.abc import AsyncIterator, Awaitable, Callable, Coroutine
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from aiohttp import web

from shardlease.routing import shard_for_key
from shardlease_examples.shardapp import (
    MAX_VALUE_BYTES,
    PreconditionFailed,
    ShardApp,
    ShardObjects,
    StorageError,
    is_loopback,
)
from tests.support.s3server import S3Server

from .fleet import Client, Fleet, Op, Owners, expected_values, generation_regressions, wait_for

pytest_plugins = ["tests.support.s3server"]

SHARDS = 8
PREFIX = "app"


def keys_of(shard: int, count: int, shards: int = SHARDS, stem: str = "k") -> list[str]:
    """`count` distinct keys that hash to `shard`."""
    out: list[str] = []
    i = 0
    while len(out) < count:
        key = f"{stem}{i}"
        if shard_for_key(key, shards) == shard:
            out.append(key)
        i += 1
    return out


@dataclass
class Answer:
    status: int
    body: dict[str, Any]


@dataclass
class AppHandle:
    app: ShardApp
    url: str
    http: aiohttp.ClientSession

    async def call(self, method: str, path: str, **kwargs: Any) -> Answer:
        async with self.http.request(method, self.url + path, **kwargs) as resp:
            text = await resp.text()
            try:
                body = json.loads(text)
            except ValueError:
                body = {"text": text}
            return Answer(resp.status, body)

    async def open(self, shard: int, generation: int) -> Answer:
        return await self.call("POST", f"/shards/{shard}/open",
                               json={"shard": shard, "generation": generation})

    async def close(self, shard: int, generation: int | None = None) -> Answer:
        body = {"shard": shard} if generation is None else {"shard": shard,
                                                             "generation": generation}
        return await self.call("POST", f"/shards/{shard}/close", json=body)

    async def put(self, key: str, value: str) -> Answer:
        return await self.call("PUT", f"/kv/{key}", data=value.encode())

    async def get(self, key: str) -> Answer:
        return await self.call("GET", f"/kv/{key}")


MakeApp = Callable[..., Coroutine[Any, Any, AppHandle]]


@pytest.fixture
async def make_app(s3_server: S3Server, s3_bucket: str) -> AsyncIterator[MakeApp]:
    """Start app instances on loopback, all on this test's bucket."""
    runners: list[web.AppRunner] = []
    http = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=60))

    async def make(*, objects: ShardObjects | None = None, shards: int = SHARDS,
                   **options: Any) -> AppHandle:
        app = ShardApp(objects or ShardObjects.from_url(s3_server.url(s3_bucket, PREFIX)),
                       shards, **options)
        runner = web.AppRunner(app.web_app(), access_log=None)
        await runner.setup()
        runners.append(runner)
        await web.TCPSite(runner, "127.0.0.1", 0).start()
        port = runner.addresses[0][1]
        return AppHandle(app, f"http://127.0.0.1:{port}", http)

    yield make
    await http.close()
    for runner in runners:
        await runner.cleanup()


def stored(server: S3Server, bucket: str, shard: int) -> dict[str, Any]:
    """The shard's object, read with a plain S3 client."""
    got = server.client().get_object(Bucket=bucket, Key=f"{PREFIX}/data/{shard}.json")
    doc: dict[str, Any] = json.loads(got["Body"].read())
    return doc


# -- two owners, one stale --------------------------------------------------------------------


async def test_a_stale_owner_is_fenced_by_the_newer_generation(
        make_app: MakeApp, s3_server: S3Server, s3_bucket: str) -> None:
    a, b = await make_app(), await make_app()
    before, after, mine = keys_of(3, 3), keys_of(3, 3, stem="late"), keys_of(3, 2, stem="b")

    assert (await a.open(3, 1)).status == 200
    for i, key in enumerate(before):
        assert (await a.put(key, f"a{i}")).status == 200
    assert (await a.get(before[0])).body["value"] == "a0"
    # B does not own shard 3 yet: misdirected, with a hint where to ask.
    refused = await b.put(mine[0], "too early")
    assert refused.status == 421, refused
    assert "lookup" in refused.body["message"]

    # B opens at generation 2; A is never told to close (a paused, stale owner).
    opened = await b.open(3, 2)
    assert opened.status == 200, opened
    assert opened.body["keys"] == len(before)

    # A's next write is refused by S3 and A closes the shard.
    fenced = await a.put(after[0], "stale")
    assert fenced.status == 409, fenced
    assert fenced.body["error"] == "fenced"
    assert fenced.body["fenced_by"] == 2
    assert "fenced by generation 2" in fenced.body["message"]
    # From then on A has the shard closed, and says who fenced it.
    again = await a.put(after[1], "stale again")
    assert again.status == 421 and again.body["fenced_by"] == 2
    assert (await a.get(before[0])).status == 421

    # B's writes succeed; B's data has A's writes from before its open, none after.
    for i, key in enumerate(mine):
        assert (await b.put(key, f"b{i}")).status == 200
    for i, key in enumerate(before):
        assert (await b.get(key)).body["value"] == f"a{i}"
    for key in after:
        assert (await b.get(key)).status == 404
    doc = stored(s3_server, s3_bucket, 3)
    assert doc == {"generation": 2,
                   "data": {**{k: f"a{i}" for i, k in enumerate(before)},
                            **{k: f"b{i}" for i, k in enumerate(mine)}}}

    # An open below the stored generation is refused, here and on a fresh instance.
    for app in (a, await make_app()):
        lower = await app.open(3, 1)
        assert lower.status == 409, lower
        assert lower.body["error"] == "outdated_generation"
        assert lower.body["highest_generation"] == 2
    assert stored(s3_server, s3_bucket, 3)["generation"] == 2
    assert (await b.put(mine[0], "still mine")).status == 200
    assert a.app.describe()["stats"]["fences"] == 1


async def test_a_generation_opened_by_another_owner_is_refused_with_the_generation(
        make_app: MakeApp, s3_server: S3Server, s3_bucket: str) -> None:
    """The lease store lost shard 3's record (a store change, a deleted or
    garbage record, every agent restarted), so a claim starts over at a
    generation the storage already holds: the storage cannot tell the two
    owners of one generation apart, so the open is refused, naming the
    highest one (issue 18, item 4); an open above it works. The same
    instance re-opening the generation it holds is an idempotent retry."""
    a, b = await make_app(), await make_app()
    key = keys_of(3, 1)[0]
    assert (await a.open(3, 4)).status == 200
    assert (await a.put(key, "a")).status == 200
    assert (await a.open(3, 4)).status == 200  # a retry by the same instance
    for generation in (1, 4):  # below it, and the very same one from elsewhere
        refused = await b.open(3, generation)
        assert refused.status == 409, refused
        assert refused.body["error"] == "outdated_generation"
        assert refused.body["highest_generation"] == 4
    assert (await a.put(key, "still a")).status == 200  # refused opens fence nobody
    assert (await b.open(3, 5)).status == 200
    assert (await a.put(key, "late")).status == 409  # fenced by 5
    assert (await b.get(key)).body["value"] == "still a"
    assert stored(s3_server, s3_bucket, 3)["generation"] == 5


async def test_writes_racing_a_takeover_are_either_kept_or_refused(
        make_app: MakeApp, s3_server: S3Server, s3_bucket: str) -> None:
    """Many writes to the old owner while the new one opens: every write the
    old owner acknowledged is in the new owner's data; every refused one is not."""
    a, b = await make_app(), await make_app()
    assert (await a.open(5, 7)).status == 200
    first = keys_of(5, 3, stem="first")
    for key in first:
        assert (await a.put(key, key)).status == 200
    keys = keys_of(5, 60, stem="race")

    async def write(i: int, key: str) -> tuple[str, Answer]:
        await asyncio.sleep(0.005 * (i % 12))
        return key, await a.put(key, f"v{i}")

    async def takeover() -> Answer:
        await asyncio.sleep(0.03)
        return await b.open(5, 8)

    opening = asyncio.create_task(takeover())
    results = await asyncio.gather(*(write(i, k) for i, k in enumerate(keys)))
    opened = await opening
    assert opened.status == 200, opened
    outcomes = dict(results)
    statuses = sorted({answer.status for answer in outcomes.values()})
    assert set(statuses) <= {200, 409, 421}, statuses
    accepted = {k for k, ans in outcomes.items() if ans.status == 200}
    refused = set(keys) - accepted
    assert all(ans.body.get("fenced_by") == 8 for k, ans in outcomes.items() if k in refused
               and ans.status == 409)

    doc = stored(s3_server, s3_bucket, 5)
    assert doc["generation"] == 8
    assert set(doc["data"]) == accepted | set(first)
    assert all(doc["data"][k] == f"v{keys.index(k)}" for k in accepted)
    # A write after the takeover is certainly refused.
    late = await a.put(keys_of(5, 1, stem="after")[0], "late")
    assert late.status in (409, 421) and late.body["fenced_by"] == 8


async def test_concurrent_first_opens_leave_the_higher_generation(
        make_app: MakeApp, s3_server: S3Server, s3_bucket: str) -> None:
    a, b = await make_app(), await make_app()
    got_a, got_b = await asyncio.gather(a.open(1, 1), b.open(1, 2))
    assert got_b.status == 200, got_b
    assert got_a.status in (200, 409), got_a
    assert stored(s3_server, s3_bucket, 1)["generation"] == 2
    key = keys_of(1, 1)[0]
    assert (await a.put(key, "a")).status in (409, 421)
    assert (await b.put(key, "b")).status == 200
    assert stored(s3_server, s3_bucket, 1)["data"] == {key: "b"}


async def test_reopen_at_the_same_generation_and_close(
        make_app: MakeApp, s3_server: S3Server, s3_bucket: str) -> None:
    a = await make_app()
    key = keys_of(2, 1)[0]
    assert (await a.open(2, 5)).status == 200
    assert (await a.put(key, "x")).status == 200
    # The host may retry an open whose answer it lost: same generation, same data.
    again = await a.open(2, 5)
    assert again.status == 200 and again.body["keys"] == 1
    assert (await a.put(key, "y")).status == 200
    closed = await a.close(2)
    assert closed.status == 200 and closed.body["was_open"] is True
    assert (await a.put(key, "z")).status == 421
    assert (await a.close(2)).body["was_open"] is False
    # Nothing is buffered: what was acknowledged is in S3 once closed.
    assert stored(s3_server, s3_bucket, 2) == {"generation": 5, "data": {key: "y"}}
    # The next owner continues from there.
    assert (await a.open(2, 6)).status == 200
    assert (await a.get(key)).body == {"key": key, "value": "y", "shard": 2, "generation": 6}
    # A late open of an older generation is refused and leaves the shard open.
    late = await a.open(2, 5)
    assert late.status == 409 and late.body["highest_generation"] == 6
    assert (await a.put(key, "w")).status == 200


async def test_every_call_names_its_generation_and_older_calls_lose(
        make_app: MakeApp) -> None:
    """A slow open that arrives after its close, or a close that arrives
    after the next open, must not leave the app holding a shard with no lease."""
    a = await make_app()
    key = keys_of(3, 1)[0]
    assert (await a.open(3, 4)).status == 200
    # The close of generation 4 overtook by the open of 5 (it was retried late):
    assert (await a.open(3, 5)).status == 200
    stale_close = await a.close(3, 4)
    assert stale_close.status == 200 and stale_close.body["was_open"] is False
    assert (await a.put(key, "still open")).status == 200
    assert (await a.close(3, 5)).body["was_open"] is True
    # The open of 5, slow on its way, arrives after its close: refused.
    late = await a.open(3, 5)
    assert late.status == 409 and "already closed" in late.body["message"]
    assert (await a.put(key, "x")).status == 421
    assert (await a.open(3, 6)).status == 200
    assert (await a.close(3, -1)).status == 400


async def test_the_http_host_sends_the_generation_and_its_own_timeouts(
        make_app: MakeApp) -> None:
    from shardlease.errors import HostError, OutdatedGeneration
    from shardlease.hosts.http import HttpHost

    a = await make_app()
    host = HttpHost(a.url, open_timeout=30, close_timeout=30)
    try:
        await host.open(1, 9)
        assert a.app.open_shards[1].generation == 9
        await host.close(1)
        assert a.app.closed_at[1] == 9  # the close named generation 9
        with pytest.raises(OutdatedGeneration) as late:
            await host.open(1, 9)  # the same generation again, after its close
        assert late.value.highest == 9
    finally:
        await host.aclose()
    # A timeout is the caller's: tiny here, so the open fails as a HostError.
    slow = HttpHost(a.url, open_timeout=1e-6)
    try:
        with pytest.raises(HostError, match="open shard 2"):
            await slow.open(2, 1)
    finally:
        await slow.aclose()


# -- answers lost in flight ---------------------------------------------------------------------


class LostAnswers(ShardObjects):
    """Real S3, but the next `lose` updates land and then fail as a client
    would see them: a 412 from an SDK retry, or a timeout."""

    lose: list[StorageError]

    async def replace(self, shard: int, generation: int, data: Any, etag: str) -> str:
        new = await super().replace(shard, generation, data, etag)
        if getattr(self, "lose", None):
            raise self.lose.pop(0)
        return new


async def test_a_write_whose_answer_was_lost_is_recognised(
        make_app: MakeApp, s3_server: S3Server, s3_bucket: str) -> None:
    objects = LostAnswers.from_url(s3_server.url(s3_bucket, PREFIX))
    assert isinstance(objects, LostAnswers)
    a = await make_app(objects=objects)
    k1, k2, k3 = keys_of(4, 3)
    assert (await a.open(4, 3)).status == 200

    # Landed, then "412" (a retried PUT): the object holds our generation and
    # exactly what we wrote, so the write was ours and is acknowledged.
    objects.lose = [PreconditionFailed("412 on retry")]
    assert (await a.put(k1, "one")).status == 200
    # Landed, then a timeout: the outcome is unknown (503); the next request
    # reads the object, finds our generation, and goes on from there.
    objects.lose = [StorageError("read timeout", applied="unknown")]
    unknown = await a.put(k2, "two")
    assert unknown.status == 503 and unknown.body["applied"] == "unknown"
    assert 4 in a.app.open_shards
    assert (await a.put(k3, "three")).status == 200
    assert stored(s3_server, s3_bucket, 4)["data"] == {k1: "one", k2: "two", k3: "three"}
    # A newer owner still fences it after all that.
    b = await make_app()
    assert (await b.open(4, 4)).status == 200
    assert (await a.put(k1, "stale")).status == 409
    assert stored(s3_server, s3_bucket, 4)["data"][k1] == "one"


# -- input and failures ---------------------------------------------------------------------------


async def test_bad_requests_get_clear_answers(make_app: MakeApp) -> None:
    a = await make_app(agent_url="http://127.0.0.1:8470")
    key = keys_of(0, 1)[0]
    misdirected = await a.put(key, "v")
    assert misdirected.status == 421
    assert misdirected.body["lookup"] == f"http://127.0.0.1:8470/lookup?key={key}"
    assert misdirected.body["shard"] == 0

    for body in ({"shard": 0}, {"shard": 0, "generation": "1"}, {"shard": 0, "generation": -1},
                 {"shard": 0, "generation": True}, {"shard": 1, "generation": 1}, [1]):
        answer = await a.call("POST", "/shards/0/open", json=body)
        assert answer.status == 400, (body, answer)
    assert (await a.call("POST", "/shards/0/open", data=b"{not json")).status == 400
    assert (await a.open(SHARDS, 1)).status == 400
    assert (await a.call("POST", "/shards/x/open", json={"generation": 1})).status == 400
    huge = await a.call("POST", "/shards/0/open", data=b" " * 10_000)
    assert huge.status == 413

    assert (await a.open(0, 1)).status == 200
    too_big = await a.put(key, "x" * (MAX_VALUE_BYTES + 1))
    assert too_big.status == 413, too_big

    async def chunks() -> AsyncIterator[bytes]:  # no Content-Length: chunked
        for _ in range(2):
            yield b"x" * (MAX_VALUE_BYTES // 2 + 1)

    chunked = await a.call("PUT", f"/kv/{key}", data=chunks())
    assert chunked.status == 413, chunked
    not_text = await a.call("PUT", f"/kv/{key}", data=b"\xff\xfe")
    assert not_text.status == 400
    assert (await a.get(key)).status == 404
    assert (await a.put(key, "x" * MAX_VALUE_BYTES)).status == 200
    assert (await a.call("GET", "/healthz")).status == 200
    shards = await a.call("GET", "/shards")
    assert shards.body["open"] == {"0": {"generation": 1, "keys": 1}}


async def test_a_corrupt_object_refuses_the_open(
        make_app: MakeApp, s3_server: S3Server, s3_bucket: str) -> None:
    client = s3_server.client()
    a = await make_app()
    for shard, raw in ((6, b"not json"), (7, b'{"generation": 1, "data": {"k": 1}}')):
        client.put_object(Bucket=s3_bucket, Key=f"{PREFIX}/data/{shard}.json", Body=raw)
        answer = await a.open(shard, 2)
        assert answer.status == 502, answer
        assert answer.body["error"] == "corrupt_object"
        assert f"{PREFIX}/data/{shard}.json" in answer.body["message"]
        assert (await a.put(keys_of(shard, 1)[0], "v")).status == 421
    # Untouched: a person decides what to do with it.
    got = client.get_object(Bucket=s3_bucket, Key=f"{PREFIX}/data/6.json")["Body"].read()
    assert got == b"not json"


async def test_an_unreachable_store_is_a_clear_503(make_app: MakeApp) -> None:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    objects = ShardObjects.from_url(f"s3://nowhere/x?endpoint=http://127.0.0.1:{port}"
                                    "&path_style=true")
    a = await make_app(objects=objects)
    answer = await a.open(0, 1)
    assert answer.status == 503, answer
    assert "cannot reach S3" in answer.body["message"]
    assert a.app.open_shards == {}


def test_loopback_addresses() -> None:
    assert is_loopback("127.0.0.1") and is_loopback("::1") and is_loopback("127.9.9.9")
    assert is_loopback("::ffff:127.0.0.1")
    assert not is_loopback("10.0.0.5") and not is_loopback("::ffff:10.0.0.5")
    assert not is_loopback(None) and not is_loopback("") and not is_loopback("nonsense")


@pytest.mark.parametrize(("args", "message"), [
    ([], "--store"),
    (["--store", "http://bucket/x", "--shards", "4"], "s3://"),
    (["--store", "s3://bucket/x", "--shards", "0"], "--shards"),
    (["--store", "s3://bucket/x?endpoint=ftp://h", "--shards", "4"], "endpoint"),
])
def test_command_line_errors(args: list[str], message: str) -> None:
    result = subprocess.run([sys.executable, "-m", "shardlease_examples.shardapp", *args],
                            capture_output=True, text=True, timeout=60,
                            stdin=subprocess.DEVNULL)
    assert result.returncode == 2, result
    assert message in result.stderr and "Traceback" not in result.stderr, result.stderr


# -- end to end: shardlease nodes driving app processes --------------------------------------------


@pytest.mark.slow
async def test_nodes_fence_a_paused_owner_through_the_app(
        s3_server: S3Server, s3_bucket: str, tmp_path: Path) -> None:
    """Three `shardlease node` processes, each driving its own app process, on
    one bucket. A client writes all along. One node is paused (SIGSTOP) beyond
    the lease TTL while its app keeps serving: another node claims its shards
    and opens them at a higher generation on another app; the stale app's next
    writes are refused by S3. Then the node resumes (SIGCONT). In the end every
    write the client was told was accepted is in S3 with its last accepted
    value, and no write was accepted at a lower generation after a higher one.

    The apps ignore the agent's validity (--ignore-validity) here: what this
    shows is the storage's fence, the last line of defence, which an app
    keeping its deadline would rarely reach (see
    test_a_paused_agents_app_stops_at_its_deadline)."""
    shards = 6
    fleet = Fleet(tmp_path, s3_server.url(s3_bucket, "e2e"), f"file://{tmp_path / 'leases'}",
                  shards)
    http = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=30))
    stop = asyncio.Event()
    client = Client(http, fleet.app_urls, shards)
    writer: asyncio.Task[None] | None = None

    def written_since(mark: int) -> Callable[[], Awaitable[bool]]:
        """A check: the client had writes accepted on every shard since op `mark`."""
        async def check() -> bool:
            fleet.check_alive()
            if writer is not None and writer.done():
                writer.result()  # the client failed: say how
            counts = client.accepted_since(mark)
            return all(counts[s] >= 3 for s in range(shards))
        return check

    try:
        names = ["n1", "n2", "n3"]
        for name in names:
            fleet.start_app(name, "--ignore-validity")
        await fleet.apps_serving(http)
        for name in names:
            fleet.start_node(name)

        before = await wait_for("3 nodes balanced, each shard open on its owner's app",
                                lambda: fleet.settled(http), describe=fleet.describe)
        writer = asyncio.create_task(client.run(stop))
        await wait_for("writes accepted on every shard", written_since(0),
                       describe=fleet.describe)

        # Pause the node (not its app) that owns shards; wait for the takeover.
        victim = next(o["owner"] for o in before)
        taken = {o["shard"]: o["generation"] for o in before if o["owner"] == victim}
        paused_at = len(client.ops)
        fleet.pause(victim)

        async def taken_over() -> Owners | None:
            fleet.check_alive()
            owners = await fleet.owners()
            views = await fleet.app_views(http)
            for o in owners:
                if o["shard"] in taken:
                    if o["owner"] in (None, victim) or o["generation"] <= taken[o["shard"]]:
                        return None
                    view = views[o["owner"]]["open"].get(str(o["shard"]))
                    if view is None or view["generation"] != o["generation"]:
                        return None
            return owners

        after = await wait_for(f"{victim}'s shards {sorted(taken)} opened elsewhere at a "
                               "higher generation", taken_over, describe=fleet.describe)
        new_generation = {o["shard"]: o["generation"] for o in after if o["shard"] in taken}

        # The stale app (its node is paused, so nobody told it to close) refuses
        # any write to those shards now: 409 fenced, or 421 once it has closed it.
        probes = []
        for shard in sorted(taken):
            key = keys_of(shard, 1, shards, stem=f"stale-probe-{shard}-")[0]
            op = Op(-1, key, "stale", shard)
            answer = await client._put(victim, key, "stale")
            op.attempts.append(answer)
            probes.append(op)
            assert answer.status in (409, 421), answer
            assert answer.body["fenced_by"] >= new_generation[shard], answer
        stale_view = (await fleet.app_views(http))[victim]
        assert not set(stale_view["open"]) & {str(s) for s in taken}, stale_view
        assert stale_view["stats"].get("fences", 0) >= 1, stale_view

        await wait_for("writes accepted on every shard after the takeover",
                       written_since(len(client.ops)), describe=fleet.describe)

        # Resume the node: it finds its leases lost, closes the shards on its app,
        # and rejoins; the shards rebalance over three nodes again.
        resumed_at = len(client.ops)
        fleet.resume(victim)
        await wait_for("3 nodes balanced again after SIGCONT", lambda: fleet.settled(http),
                       describe=fleet.describe)
        await wait_for("writes accepted on every shard after the rebalance",
                       written_since(len(client.ops)), describe=fleet.describe)
        stop.set()
        await writer
        writer = None

        codes = fleet.terminate_nodes()
        assert set(codes.values()) == {0}, (codes, fleet.describe())
        last = await fleet.owners()
    finally:
        stop.set()
        if writer is not None:
            writer.cancel()
        await http.close()
        fleet.cleanup()

    # What S3 holds, against what the client was told.
    s3 = s3_server.client()
    final: dict[str, str] = {}
    for o in last:
        doc = json.loads(s3.get_object(Bucket=s3_bucket, Key=f"e2e/data/{o['shard']}.json")
                         ["Body"].read())
        assert o["owner"] is None  # freed on SIGTERM, the generation kept
        assert doc["generation"] == o["generation"], (o, doc["generation"])
        assert all(shard_for_key(k, shards) == o["shard"] for k in doc["data"])
        final.update(doc["data"])

    ops = client.ops
    allowed = expected_values(ops + probes)
    wrong = {k: (final.get(k), sorted(map(str, v))) for k, v in allowed.items()
             if final.get(k) not in v}
    assert not wrong, f"{len(wrong)} key(s) hold a value the client was not left with: " \
        f"{dict(list(wrong.items())[:10])}"
    assert not set(final) - set(allowed), "keys in S3 that no client wrote"
    assert generation_regressions(ops) == []

    outcomes = Counter(op.outcome for op in ops)
    attempts = [a for op in [*ops, *probes] for a in op.attempts]
    fenced = [a for a in attempts if a.status == 409 and a.body.get("error") == "fenced"]
    # Writes the paused node's app accepted while the node was paused, at the
    # old generation: before the new owner's open, so they must all be in S3
    # (checked above with every other accepted write).
    stale_accepted = [op for op in ops[paused_at:resumed_at] if op.outcome == "accepted"
                      and op.app == victim and op.shard in taken]
    assert all(op.generation == taken[op.shard] for op in stale_accepted)
    summary = {
        "writes": len(ops), "outcomes": dict(outcomes),
        "accepted_by_paused_nodes_app": len(stale_accepted),
        "refused_as_fenced_409": len(fenced),
        "misdirected_421": sum(a.status == 421 for a in attempts),
        "keys_checked": len(allowed), "victim": victim, "taken": taken,
        "new_generations": new_generation,
    }
    print("shardapp e2e:", json.dumps(summary, sort_keys=True))
    (tmp_path / "summary.json").write_text(json.dumps(summary))
    assert fenced, "the stale app never refused a write as fenced"
    assert outcomes["accepted"] > 0




async def test_the_example_client_follows_the_owners(make_app: MakeApp) -> None:
    """`shardclient write` then `verify`, with the shards moved in between."""
    a, b = await make_app(), await make_app()
    for shard in range(SHARDS):
        assert (await (a if shard < SHARDS // 2 else b).open(shard, 1)).status == 200

    async def client(command: str) -> dict[str, Any]:
        proc = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "shardlease_examples.shardclient", command,
            "--apps", f"{a.url},{b.url}", "--shards", str(SHARDS), "--count", "40",
            "--prefix", "c", "--run", "r1", "--timeout", "10",
            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        out, err = await proc.communicate()
        assert proc.returncode == 0, (out, err)
        result: dict[str, Any] = json.loads(out)
        return result

    written = await client("write")
    assert written["ok"] == 40 and written["failed"] == 0
    assert written["redirects"].get("http_421", 0) > 0
    # Move half of A's shards to B (close, then open at a higher generation).
    for shard in range(SHARDS // 4):
        assert (await a.close(shard)).status == 200
        assert (await b.open(shard, 2)).status == 200
    verified = await client("verify")
    assert verified["ok"] == 40 and verified["failed"] == 0


# -- the agent's validity, and abort --------------------------------------------------------------


async def test_a_shard_past_its_validity_is_served_as_closed_until_a_lease_extends_it(
        make_app: MakeApp) -> None:
    a = await make_app()
    key = keys_of(2, 1)[0]
    before = time.monotonic()
    opened = await a.call("POST", "/shards/2/open",
                          json={"shard": 2, "generation": 5, "validity_ms": 300})
    after = time.monotonic()
    assert opened.status == 200
    # The deadline counts from the open's arrival (no write is timed against
    # it here: on a loaded machine the next request may come after 300 ms).
    generation, until = a.app.valid_until[2]
    assert generation == 5 and before + 0.3 <= until <= after + 0.3
    # The agent says nothing more: past the deadline.
    await asyncio.sleep(until - time.monotonic() + 0.05)
    late = await a.put(key, "too late")
    assert late.status == 421 and late.body["expired"] is True, late
    assert (await a.get(key)).status == 421
    # A lease of an older generation is ignored; of this one, it acts again.
    lease = await a.call("POST", "/lease", json={"leases": [
        {"shard": 2, "generation": 4, "validity_ms": 60_000}]})
    assert lease.status == 200 and lease.body == {"extended": [], "ignored": [2]}
    assert (await a.put(key, "still late")).status == 421
    lease = await a.call("POST", "/lease", json={"leases": [
        {"shard": 2, "generation": 5, "validity_ms": 60_000}]})
    assert lease.body == {"extended": [2], "ignored": []}
    assert (await a.put(key, "renewed")).status == 200
    assert (await a.get(key)).body["value"] == "renewed"
    # An open without validity_ms (an agent that keeps no deadlines): unbounded.
    assert (await a.open(3, 1)).status == 200
    assert a.app.valid_until[3] == (1, math.inf)


async def test_a_lease_that_overtakes_its_open_counts_for_it(make_app: MakeApp) -> None:
    a = await make_app()
    lease = await a.call("POST", "/lease", json={"leases": [
        {"shard": 1, "generation": 3, "validity_ms": 60_000}]})
    assert lease.body["extended"] == [1]
    opened = await a.call("POST", "/shards/1/open",
                          json={"shard": 1, "generation": 3, "validity_ms": 1})
    assert opened.status == 200
    await asyncio.sleep(0.01)
    assert (await a.put(keys_of(1, 1)[0], "v")).status == 200  # the lease's deadline holds


async def test_lease_bodies_are_checked(make_app: MakeApp) -> None:
    a = await make_app()
    for body in ({}, {"leases": {}}, {"leases": [{"shard": "1"}]},
                 {"leases": [{"shard": 1, "generation": 1}]},
                 {"leases": [{"shard": 1, "generation": 1, "validity_ms": -5}]},
                 {"leases": [{"shard": 99, "generation": 1, "validity_ms": 5}]}):
        answer = await a.call("POST", "/lease", json=body)
        assert answer.status == 400, (body, answer)


async def test_an_abort_drops_the_shard_at_once_and_an_older_one_is_ignored(
        make_app: MakeApp) -> None:
    a = await make_app()
    key = keys_of(4, 1)[0]
    assert (await a.open(4, 6)).status == 200
    ignored = await a.call("POST", "/shards/4/abort", json={"shard": 4, "generation": 5})
    assert ignored.status == 200 and ignored.body["was_open"] is False
    assert (await a.put(key, "v")).status == 200
    aborted = await a.call("POST", "/shards/4/abort", json={"shard": 4, "generation": 6})
    assert aborted.status == 200 and aborted.body["was_open"] is True
    assert (await a.put(key, "after")).status == 421
    assert (await a.open(4, 6)).status == 409  # an open of the aborted generation is late
    assert [e["event"] for e in a.app.history if e["shard"] == 4] == ["open", "abort"]
