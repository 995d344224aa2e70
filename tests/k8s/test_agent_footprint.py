"""What an agent sidecar costs (#19): its resident memory and its time from
start to ready, at 64 and at 1,024 shards, for one `shardlease agent` on the
real API server (the Kubernetes lease store) with a recording application:
as a process of the test venv, and in the runtime image (`docker run
--network host`, the image the chart deploys, which lacks what the test venv
adds, kubernetes_asyncio among it). Printed, never asserted as a timing;
what is asserted is that it becomes ready and opens every shard."""

from __future__ import annotations

import asyncio
import importlib.util
import os
import subprocess
import sys
import time
import urllib.request
import uuid
from pathlib import Path

import pytest
from kubernetes_asyncio import client

from .scenario import RecordingApp, eventually, free_port, ready_pods, shardset_for, spawn

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]


def _load_cluster():  # e2e/cluster.py, as tests/pods loads it
    name = "shardlease_e2e_cluster"
    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.spec_from_file_location(name, ROOT / "e2e" / "cluster.py")
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    sys.modules[name] = mod
    spec.loader.exec_module(mod)
    return mod


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


async def recording_db(api_client: client.ApiClient, ns: str, shards: int) -> RecordingApp:
    """ShardSet `db` of `shards` shards with its one pod `db-0` Ready, and the
    recording application its agent opens them on (started)."""
    await shardset_for(api_client, ns, "db", shards=shards, replicas=1, leaseTTL=15.0)
    await ready_pods(api_client, ns, ["db-0"], {"app": "db"})
    app = RecordingApp("db-0", [])
    await app.start()
    return app


def _ready(port: int) -> bool:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/readyz", timeout=1) as r:
            return r.status == 200
    except OSError:
        return False


@pytest.mark.parametrize("shards", [64, 1024])
async def test_an_agents_memory_and_time_to_ready(
        namespace: str, kubeconfig: str, api_client: client.ApiClient, tmp_path: Path,
        shards: int) -> None:
    ns = namespace
    app = await recording_db(api_client, ns, shards)
    port = free_port()
    started = time.monotonic()
    proc = spawn("agent", ["agent", "--shardset", "db", "--namespace", ns, "--name", "db-0",
                           "--port", str(port), "--host-url", f"http://127.0.0.1:{app.port}"],
                 tmp_path, env={"KUBECONFIG": kubeconfig})
    try:
        while not await asyncio.to_thread(_ready, port):
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


@pytest.mark.parametrize("shards", [64, 1024])
async def test_an_agents_memory_and_time_to_ready_in_the_runtime_image(
        namespace: str, kubeconfig: str, api_client: client.ApiClient, tmp_path: Path,
        shards: int) -> None:
    if os.geteuid() != 0:
        pytest.fail("the runtime image is built and run with Docker's engine: needs root",
                    pytrace=False)
    clmod = _load_cluster()
    ns = namespace
    app = await recording_db(api_client, ns, shards)
    # The image runs as uid 65532: a readable copy of the admin kubeconfig.
    config = tmp_path / "kubeconfig"
    config.write_bytes(Path(kubeconfig).read_bytes())
    config.chmod(0o644)
    port = free_port()
    name = f"shardlease-footprint-{uuid.uuid4().hex[:8]}"
    with clmod.docker_engine():
        await asyncio.to_thread(clmod.image)  # this revision's, cached layers
        started = time.monotonic()
        clmod._docker("run", "-d", "--name", name, "--network", "host",
                      "-v", f"{config}:/kubeconfig:ro", "-e", "KUBECONFIG=/kubeconfig",
                      clmod.RUNTIME_IMAGE, "agent", "--shardset", "db", "--namespace", ns,
                      "--name", "db-0", "--port", str(port),
                      "--host-url", f"http://127.0.0.1:{app.port}", timeout=120)
        try:
            def logs() -> str:
                p = clmod._docker("logs", name, check=False, timeout=60)
                return (p.stdout + p.stderr).decode(errors="replace")

            def running() -> bool:
                p = clmod._docker("inspect", "-f", "{{.State.Running}}", name, check=False,
                                  timeout=60)
                return p.stdout.decode().strip() == "true"

            while not await asyncio.to_thread(_ready, port):
                assert await asyncio.to_thread(running), logs()[-3000:]
                assert time.monotonic() - started < 120, logs()[-3000:]
                await asyncio.sleep(0.05)
            to_ready = time.monotonic() - started
            pid = int(clmod._docker("inspect", "-f", "{{.State.Pid}}", name,
                                    timeout=60).stdout.decode())
            at_ready = rss_mb(pid)

            async def all_open() -> bool:
                return len(app.open) == shards
            await eventually(all_open, f"every one of {shards} shards open", timeout=300)
            to_open = time.monotonic() - started
            at_open = rss_mb(pid)
            said = [ln for ln in logs().splitlines() if "ready: " in ln]
            assert len(said) == 1, logs()[-3000:]
            print(f"\n[footprint] agent in {clmod.RUNTIME_IMAGE}, {shards} shards: ready "
                  f"{to_ready:.2f}s after docker run, every shard open after {to_open:.1f}s; "
                  f"resident memory {at_ready:.1f} MB when ready, {at_open:.1f} MB with every "
                  f"shard open; it logged {said[0][said[0].index('ready: '):][:200]}")
        finally:
            clmod._docker("stop", "-t", "20", name, check=False, timeout=120)
            clmod._docker("rm", "-f", name, check=False, timeout=120)
            await app.stop()
