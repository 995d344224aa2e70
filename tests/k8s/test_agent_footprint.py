"""What an agent sidecar costs (#19): its resident memory and its time from
start to ready, at 64 and at 1,024 shards, for one `shardlease agent`
process on the real API server (the Kubernetes lease store) with a
recording application. Printed, never asserted as a timing; what is
asserted is that it becomes ready and opens every shard."""

from __future__ import annotations

import asyncio
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest
from kubernetes_asyncio import client

from .scenario import RecordingApp, eventually, free_port, ready_pods, shardset_for, spawn

pytestmark = pytest.mark.slow


def rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise AssertionError(f"no VmRSS for {pid}")


def import_seconds() -> float:
    """What importing the agent's modules alone takes, in a fresh process."""
    t0 = time.monotonic()
    subprocess.run([sys.executable, "-c", "import shardlease.k8s.commands, shardlease.k8s.agent"],
                   check=True, timeout=60)
    return time.monotonic() - t0


@pytest.mark.parametrize("shards", [64, 1024])
async def test_an_agents_memory_and_time_to_ready(
        namespace: str, kubeconfig: str, api_client: client.ApiClient, tmp_path: Path,
        shards: int) -> None:
    ns = namespace
    await shardset_for(api_client, ns, "db", shards=shards, replicas=1, leaseTTL=15.0)
    await ready_pods(api_client, ns, ["db-0"], {"app": "db"})
    calls: list[dict[str, object]] = []
    app = RecordingApp("db-0", calls)
    await app.start()
    port = free_port()
    started = time.monotonic()
    proc = spawn("agent", ["agent", "--shardset", "db", "--namespace", ns, "--name", "db-0",
                           "--port", str(port), "--host-url", f"http://127.0.0.1:{app.port}"],
                 tmp_path, env={"KUBECONFIG": kubeconfig})
    try:
        def ready() -> bool:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/readyz", timeout=1) as r:
                    return r.status == 200
            except OSError:
                return False

        while not await asyncio.to_thread(ready):
            assert proc.popen.poll() is None, proc.tail()
            assert time.monotonic() - started < 120, proc.tail()
            await asyncio.sleep(0.05)
        to_ready = time.monotonic() - started
        at_ready = rss_mb(proc.popen.pid)

        async def all_open() -> bool:
            return len(app.open) == shards
        await eventually(all_open, f"every one of {shards} shards open", timeout=300)
        to_open = time.monotonic() - started
        at_open = rss_mb(proc.popen.pid)
        importing = await asyncio.to_thread(import_seconds)
        # The agent's own account of it, which the pods' scenario prints too.
        said = [ln for ln in proc.log.read_text().splitlines() if "ready: " in ln]
        assert len(said) == 1, proc.tail()
        print(f"\n[footprint] agent, {shards} shards: ready {to_ready:.2f}s after start "
              f"(importing its modules alone: {importing:.2f}s), every shard open after "
              f"{to_open:.1f}s; resident memory {at_ready:.1f} MB when ready, "
              f"{at_open:.1f} MB with every shard open; it logged "
              f"{said[0][said[0].index('ready: '):][:200]}")
    finally:
        proc.stop()
        await app.stop()
