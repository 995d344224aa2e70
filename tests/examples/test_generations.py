"""Generations never restart (issue 18, item 4), on real processes: two
`shardlease node` processes, each driving its own example app, on a file
lease store; the apps' data in S3 (moto), fenced by the generation.

A lease store can lose what it knew: the cluster is moved to a new store (or
its Leases deleted), or every record is overwritten with garbage while every
node is down. A claim then starts again at generation 1, below what the
application's storage holds, or at the very generation another app already
opened. The app refuses such an open, naming its highest generation, and the
agent claims above it. A client writes all along; in the end every write it
was told was accepted is in S3, no write was accepted below a newer
generation, and no generation was ever written by two apps.

Waits poll with generous timeouts; the checks are orderings and invariants.
"""

from __future__ import annotations

import asyncio
import json
from collections import defaultdict
from pathlib import Path

import aiohttp
import pytest

from shardlease.stores.file import FileStore
from tests.support.s3server import S3Server

from .fleet import Client, Fleet, Op, Owners, expected_values, generation_regressions, wait_for

pytestmark = pytest.mark.slow
pytest_plugins = ["tests.support.s3server"]

SHARDS = 4
NAMES = ["n1", "n2"]
GARBAGE = b"\x00 not a lease \xff"


def shared_generations(ops: list[Op]) -> list[str]:
    """(shard, generation) pairs at which more than one app accepted writes:
    two writers of one fencing token, which storage cannot tell apart."""
    writers: dict[tuple[int, int], set[str]] = defaultdict(set)
    for op in ops:
        if op.outcome == "accepted" and op.generation is not None and op.app is not None:
            writers[(op.shard, op.generation)].add(op.app)
    return [f"shard {s} generation {g}: written by {sorted(apps)}"
            for (s, g), apps in sorted(writers.items()) if len(apps) > 1]


async def test_a_store_change_and_garbage_records_never_hand_out_a_generation_twice(
        s3_server: S3Server, s3_bucket: str, tmp_path: Path) -> None:
    fleet = Fleet(tmp_path, s3_server.url(s3_bucket, "gen"), f"file://{tmp_path / 'leases-a'}",
                  SHARDS, ttl=3.0)
    http = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=30))
    stop = asyncio.Event()
    client = Client(http, fleet.app_urls, SHARDS)
    writer: asyncio.Task[None] | None = None

    async def phase(what: str, *, above: dict[int, int]) -> Owners:
        """Start both nodes; wait until settled with every shard above `above`
        and writes accepted on every shard since; then stop them (SIGTERM)."""
        for name in NAMES:
            fleet.start_node(name)

        async def settled_above() -> Owners | None:
            if writer is not None and writer.done():
                writer.result()  # the client failed: say how
            owners = await fleet.settled(http)
            if owners is None or any(o["generation"] <= above.get(o["shard"], 0)
                                     for o in owners):
                return None
            return owners

        owners = await wait_for(f"{what}: settled above {above}", settled_above,
                                describe=fleet.describe)
        mark = len(client.ops)

        async def written() -> bool:
            counts = client.accepted_since(mark)
            return all(counts[s] >= 3 for s in range(SHARDS))

        await wait_for(f"{what}: writes on every shard", written, describe=fleet.describe)
        codes = fleet.terminate_nodes()
        assert set(codes.values()) == {0}, (codes, fleet.describe())
        return owners

    try:
        for name in NAMES:
            fleet.start_app(name)
        await fleet.apps_serving(http)
        writer = asyncio.create_task(client.run(stop))

        first = await phase("store A", above={})
        again = await phase("store A, nodes restarted",
                            above={o["shard"]: o["generation"] for o in first})
        # The cluster moves to an empty store: its claims start at 1 again.
        fleet.lease_store = f"file://{tmp_path / 'leases-b'}"
        moved = await phase("store B (empty)",
                            above={o["shard"]: o["generation"] for o in again})
        # Every record of store B made garbage while every node is down.
        files = FileStore(tmp_path / "leases-b")
        for shard in range(SHARDS):
            files.put_raw_lease(fleet.cluster, shard, GARBAGE)
        mended = await phase("store B, every record garbage",
                             above={o["shard"]: o["generation"] for o in moved})
        views = await fleet.app_views(http)
        stop.set()
        await writer
        writer = None
    finally:
        stop.set()
        if writer is not None:
            writer.cancel()
        await http.close()
        fleet.cleanup()

    refused = sum(view["stats"].get("opens_refused", 0) for view in views.values())
    assert refused >= SHARDS, views  # the claims at 1 (or at a generation seen elsewhere)
    s3 = s3_server.client()
    final: dict[str, str] = {}
    for o in mended:
        doc = json.loads(s3.get_object(Bucket=s3_bucket, Key=f"gen/data/{o['shard']}.json")
                         ["Body"].read())
        assert doc["generation"] == o["generation"], (o, doc["generation"])
        final.update(doc["data"])
    ops = client.ops
    allowed = expected_values(ops)
    wrong = {k: (final.get(k), sorted(map(str, v))) for k, v in allowed.items()
             if final.get(k) not in v}
    assert not wrong, f"{len(wrong)} key(s) hold a value the client was not left with: " \
        f"{dict(list(wrong.items())[:10])}"
    assert generation_regressions(ops) == []
    assert shared_generations(ops) == []
    print("generations:", json.dumps({
        "store A": {o["shard"]: o["generation"] for o in first},
        "store A again": {o["shard"]: o["generation"] for o in again},
        "store B": {o["shard"]: o["generation"] for o in moved},
        "store B after garbage": {o["shard"]: o["generation"] for o in mended},
        "opens refused as outdated": refused, "writes": len(ops)}, sort_keys=True))
