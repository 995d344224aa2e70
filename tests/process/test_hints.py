"""`shardlease node --hints` as typed: real processes on the file store and
on S3 (MinIO), a long interval (10 s), and a graceful stop. The survivor must
take the stopped node's shards in a round its hint woke, not at its next
round of its time; the overlap checker runs over everything recorded.

Assertions are orderings (which round claimed what), never durations."""

from __future__ import annotations

import json
import socket
from pathlib import Path
from typing import Any

import pytest

from .cluster import LocalCluster, held_by
from .conftest import MakeCluster, cluster_on

pytestmark = pytest.mark.slow
pytest_plugins = ["tests.support.s3server"]

SHARDS = 8
TTL = 30.0  # interval 10 s: a claim at a round of its time would come seconds later


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def log_records(cluster: LocalCluster, name: str) -> list[dict[str, Any]]:
    out = []
    for line in cluster.nodes[name].log.read_text().splitlines():
        try:
            out.append(json.loads(line))
        except json.JSONDecodeError:
            continue
    return out


@pytest.fixture(params=["file-shard", "file-node", "s3-node"])
def cluster(request: pytest.FixtureRequest, make_cluster: MakeCluster,
            tmp_path: Path) -> LocalCluster:
    return cluster_on(request.param, request, make_cluster, tmp_path, shards=SHARDS, ttl=TTL)


def test_a_stopped_nodes_shards_are_claimed_in_a_round_its_hint_woke(
        cluster: LocalCluster) -> None:
    ports = {"a": free_port(), "b": free_port()}
    peers = [arg for name, port in ports.items()
             for arg in ("--peer", f"{name}=127.0.0.1:{port}")]
    for name, port in ports.items():
        cluster.start(name, "--hints", f"127.0.0.1:{port}", *peers, "--log-level", "debug")
    owners = cluster.wait_balanced("after the start")
    theirs = set(held_by(owners, "b"))
    assert theirs and set(held_by(owners, "a")) | theirs == set(range(SHARDS))
    assert cluster.terminate("b") == 0
    cluster.wait_owners("a holds every shard",
                        lambda o: set(held_by(o, "a")) == set(range(SHARDS)))
    records = log_records(cluster, "a")
    hinted = [i for i, r in enumerate(records) if r["msg"].startswith("hint from b: freed")]
    assert hinted, cluster.log_tail("a")
    # Each of b's shards was claimed in the round that followed the hint,
    # one the hint woke (its Round event says hinted=True).
    claims = {r["shard"]: i for i, r in enumerate(records)  # (the last of each)
              if r.get("event") == "claim" and r["shard"] in theirs}
    assert set(claims) == theirs, cluster.log_tail("a")
    for shard, i in claims.items():
        assert i > hinted[0], f"shard {shard} claimed before the hint"
        after = next(r for r in records[i:] if r.get("event") == "round")
        assert after["hinted"] is True, (shard, after)
    assert cluster.terminate("a") == 0
    report = cluster.check()
    assert report.ok, "\n".join(report.violations[:20])
