"""`shardlease bench --quick` runs and prints every figure (a smoke test: the
figures themselves are measurements, never asserted), one section at a time
(`--only SECTION`): each is a test of its own, so scripts/test can put the
slow ones (the real processes of slow-store, requests and stop) in whichever
group has room, and a failure names its section."""

from __future__ import annotations

import argparse
import re
import subprocess
import sys

import pytest

from shardlease.cli import build_parser

pytestmark = pytest.mark.slow

MODES = ("shard", "node")

FIGURES: dict[str, list[str]] = {
    "failover": [
        r"failover time / TTL after kill -9: median \d+\.\d+",
        r"run 1: failover \d+\.\d+s = \d+\.\d+ x TTL",
        r"file, hints, run 1: .* start \d+ opens / \d+\.\d+ unowned shard-s, join \d+ opens / "
        r"\d+\.\d+ unowned shard-s, leave \d+ opens / \d+\.\d+ unowned shard-s",
    ],
    "rounds": [
        r"rounds to balance after a node joins, 64 shards: median \d",
        r"rounds to balance after a node leaves \(graceful\), 64 shards: median \d",
        r"rounds to balance after a node crashes, 64 shards: median \d",
    ],
    "faults": [
        r"slow store, every call but lease writes 3 intervals late \(all nodes\): self-fences 0,",
        r"slow store, every call of one node 0.3 x TTL late: self-fences 0,",
        r"slow store, 30% of one node's calls failing \(503\): self-fences 0,",
        r"refusing host, 2 nodes, 4 shards: rounds until the shard is open elsewhere for good: "
        r"median \d",
        r"refusing host, 4 nodes, 64 shards: rounds until the shard is open elsewhere for good: "
        r"median \d",
        r"simultaneous start, 4 nodes, 64 shards: \d+ opens, \d+ closes per start",
    ],
    "slow-store": [
        r"slow node, no fault +self-fences +\d+ \(\d+ shards\)",
        r"slow node, \+0.15 x TTL latency +self-fences +\d+ .* requests \d+ \(",
        r"slow node, \+0.3 x TTL latency +self-fences +\d+ .* shards open nowhere \d",
        r"slow node, 30% 503 SlowDown +self-fences +\d+ .*\d+ slowdown",
        r"slow node, \+0.5 x TTL latency +self-fences +\d+ .* renew_slow \d+",
        r"slow node, until balanced again +self-fences",
    ],
    "requests": [
        *(line.format(mode=mode) for mode in MODES for line in (
            r"store requests per node per round, memory, {mode} renewal, 64 shards: \d+\.\d+ \(",
            r"loop CPU per round, memory, {mode} renewal, 64 shards: \d+\.\d+ ms per node",
            r"store requests per node per round, file[^,]*, {mode} renewal, 64 shards: "
            r"\d+\.\d+ \(",
            r"loop CPU per round, file[^,]*, {mode} renewal, 64 shards: \d+\.\d+ ms per node",
            r"store requests per node per round, s3 \(moto\), {mode} renewal, 64 shards: "
            r"\d+\.\d+ \(",
            r"S3 requests a month, s3 \(moto\), {mode} renewal, 64 shards, 4 nodes, "
            r"interval 5 s: \$\d",
            r"loop CPU per round, s3 \(moto\), {mode} renewal, 64 shards: \d+\.\d+ ms per node",
        )),
        r"file store write latency in .* \d+\.\d+ ms",
    ],
    "stop": [
        rf"graceful stop, {kind}, {mode} renewal, 4 x 8 shards: store writes per stopping "
        rf"node \d+-\d+ \(\d+\.\d+ per shard\), self-fences \d+, abandoned closes \d+, "
        rf"stops .* every shard reopened after \d+\.\d+s"
        for mode in MODES for kind in ("memory", "file", "s3")
    ],
    "scale": [
        rf"rounds to balance, {mode} renewal, 10 nodes x 500 shards: start \d+, join \d+, "
        rf"leave \d+, crash \d+; invariant violations: 0" for mode in MODES
    ],
}


def test_every_section_of_the_bench_is_smoke_tested() -> None:
    commands = next(a for a in build_parser()._actions
                    if isinstance(a, argparse._SubParsersAction))
    only = next(a for a in commands.choices["bench"]._actions if a.dest == "only")
    assert set(only.choices) == set(FIGURES)


@pytest.mark.parametrize("section", list(FIGURES))
def test_bench_quick_prints_every_figure(section: str) -> None:
    result = subprocess.run([sys.executable, "-m", "shardlease", "bench", "--quick",
                             "--only", section],
                            capture_output=True, text=True, timeout=900,
                            stdin=subprocess.DEVNULL)
    assert result.returncode == 0, result.stdout + result.stderr
    missing = [f for f in FIGURES[section] if not re.search(f, result.stdout)]
    assert not missing, f"missing {missing} in:\n{result.stdout}"
    assert "failed:" not in result.stdout
    assert "not recovered" not in result.stdout
    assert "Traceback" not in result.stderr
