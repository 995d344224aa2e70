"""`shardlease demo`, the project's main job, end to end: with no arguments
(the embedded file store in a fresh temporary directory) and on S3."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from tests.support.s3server import S3Server

pytestmark = pytest.mark.slow

# The fixtures s3_server (moto's S3 server over HTTP on loopback, session-wide).
pytest_plugins = ["tests.support.s3server"]


def demo(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "shardlease", "demo", *args],
                          capture_output=True, text=True, timeout=300,
                          stdin=subprocess.DEVNULL, env={**os.environ, **(env or {})})


def check_run(result: subprocess.CompletedProcess[str], nodes: int, shards: int) -> None:
    assert result.returncode == 0, result.stdout + result.stderr
    head, _, summary = result.stdout.partition("== shardlease demo summary ==")
    # Not a terminal: the live view is JSON lines, each a phase or the owners.
    lines = [json.loads(line) for line in head.splitlines() if line.strip()]
    phases = [line["phase"] for line in lines if "phase" in line]
    assert [p.split()[0] for p in phases] == [
        "starting", "balanced", "kill", "failover", "restarting", "rebalanced", "SIGTERM"]
    views = [line for line in lines if "owners" in line]
    assert views and all(len(v["owners"]) == shards for v in views)
    assert all(owner is None for owner in views[-1]["owners"])  # freed by the graceful stop
    assert any(len(set(v["owners"])) == nodes and None not in v["owners"] for v in views)
    for line in ("overlap check        PASS", "RESULT               PASS",
                 "graceful stop        ok", "x TTL (all"):
        assert line in summary, summary
    assert "Traceback" not in result.stderr


def test_the_demo_runs_with_no_arguments() -> None:
    check_run(demo(), nodes=3, shards=12)


def test_the_demo_runs_on_s3(s3_server: S3Server) -> None:
    url = s3_server.url(s3_server.create_bucket(), "demo")
    result = demo("--store", url, "--nodes", "4", "--shards", "8", env=s3_server.env())
    check_run(result, nodes=4, shards=8)
