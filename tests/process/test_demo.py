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

# The fixtures s3_server (MinIO over HTTP on loopback, session-wide: conftest.py).
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


def test_in_a_terminal_the_demo_draws_a_live_grid_then_a_timeline(tmp_path) -> None:
    """Run under a pseudo-terminal, as `scripts/demo` runs for a person."""
    import pty
    import re
    import select
    import time
    import xml.etree.ElementTree as ET

    svg = tmp_path / "timeline.svg"
    pid, fd = pty.fork()
    if pid == 0:  # the child: the demo on the terminal
        os.environ.update(COLUMNS="110", LINES="40", TERM="xterm-256color")
        os.execv(sys.executable, [sys.executable, "-m", "shardlease", "demo",
                                  "--svg", str(svg)])
    out = b""
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline:
        ready, _, _ = select.select([fd], [], [], 1.0)
        if not ready:
            continue
        try:
            chunk = os.read(fd, 65536)
        except OSError:  # the child closed the terminal
            break
        if not chunk:
            break
        out += chunk
    _, status = os.waitpid(pid, 0)
    text = re.sub(r"\x1b\[[0-9;?]*[A-Za-z]", "", out.decode(errors="replace"))
    assert os.waitstatus_to_exitcode(status) == 0, text[-3000:]
    # The live grid (redrawn in place: the cursor moves up between frames).
    assert "\x1b[" in out.decode(errors="replace")
    assert re.search(r"NODE\s+STATE\s+LEASES\s+SHARDS \(generation\)", text), text[:2000]
    assert "leases expire in" in text  # the countdown after the kill
    assert "node-1  killed" in text.replace("\u00a0", " ") or re.search(r"node-1\s+killed", text)
    # Then the timeline, its legend and marks, then the summary.
    assert "timeline: shards (rows) over time" in text
    for mark in ("kill -9 node-1", "restarting node-1", "SIGTERM to every node"):
        assert mark in text.split("timeline:", 1)[1]
    assert "RESULT               PASS" in text
    # The JSON lines are for pipes only.
    assert '{"t":' not in text
    root = ET.parse(svg).getroot()
    assert root.tag.endswith("svg")
    drawn = "".join(root.itertext()).replace("\u00a0", " ")
    assert "shardlease demo: 3 nodes, 12 shards" in drawn
    assert "kill -9 node-1" in drawn


def test_piped_the_demo_prints_json_lines_and_still_writes_the_picture(tmp_path) -> None:
    svg = tmp_path / "t.svg"
    result = demo("--svg", str(svg), "--shards", "6")
    check_run(result, nodes=3, shards=6)
    assert svg.read_text().startswith("<svg")
    assert f"timeline picture     {svg}" in result.stdout
