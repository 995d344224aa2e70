"""e2e/kind.sh, the scenario a user runs on a laptop, run as typed on the
kind cluster made here: the same steps (build the image and `kind load` it,
MinIO and its bucket Job, `helm install`, the example StatefulSet, a
failover, 3 -> 5 -> 2, every key read back); only the images' source
differs (MinIO and its client built here; the Python base made here)."""

from __future__ import annotations

import subprocess
import time

import pytest

from .conftest import ROOT, Kind, kindmod

pytestmark = pytest.mark.slow


def test_kind_sh_runs_the_users_scenario(kind: Kind) -> None:
    node = kindmod.node
    base, runtime_base = node.base_image(), node.runtime_base_image()
    env = dict(kind.env(), **kindmod.workload_images(), TIMEOUT="300",
               # Builds reach the package index through the host's network
               # (the engine has no bridge here), from the bases made here.
               BUILD_ARGS=f"--network host --build-arg PYTHON_IMAGE={base} "
                          f"--build-arg RUNTIME_BASE={runtime_base}")
    t0 = time.monotonic()
    p = subprocess.run([str(ROOT / "e2e" / "kind.sh"), "--keep"], capture_output=True,
                       text=True, timeout=1800, env=env, stdin=subprocess.DEVNULL)
    took = time.monotonic() - t0
    # What failed is kind.sh's last step (stdout) and its first words on
    # stderr; the diagnostics follow them there.
    out = p.stdout[-5000:] + "\n--- stderr ---\n" + p.stderr[:6000]
    summary = [ln.strip() for ln in p.stdout.splitlines() if "✓" in ln]
    print(f"\n[kind] e2e/kind.sh --keep: exit {p.returncode} in {took:.0f}s")
    for line in summary[-8:]:
        print(f"[kind]   {line}")
    assert p.returncode == 0, out
    assert "shardlease e2e passed" in p.stdout, out
    # What it claims, checked on the cluster it leaves.
    shardset = kind.get("shardset", "shardapp", "-n", "shardapp")
    status = shardset["status"]
    assert status["ownedShards"] == 16 and len(status["nodes"]) == 2, status
    pods = kind.get("pods", "-n", "shardapp", "-l", "app.kubernetes.io/name=shardapp")["items"]
    # The agent is a native sidecar (an init container that keeps running).
    names = {c["name"] for p in pods
             for c in [*p["spec"]["containers"], *p["spec"].get("initContainers", [])]}
    assert names >= {"app", "shardlease-agent"}, names
    # The pods of the StatefulSet ran on both workers.
    assert {p["spec"]["nodeName"] for p in pods} <= set(kind.workers)
