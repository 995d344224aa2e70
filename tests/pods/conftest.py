"""A real single-node cluster (e2e/cluster.py) for tests that run real pods.

The `cluster` fixture brings the node up (or reuses one that already runs),
builds the project's image and loads it into the node. A node this session
started is torn down at the end; one that ran before is left running, so a
developer's `e2e/cluster up` survives the tests. If the node cannot come up
the tests fail with the reason: nothing here is skipped.
"""

from __future__ import annotations

import contextlib
import importlib.util
import json
import os
import subprocess
import sys
import time
import uuid
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def _load_cluster():
    name = "shardlease_e2e_cluster"
    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.spec_from_file_location(name, ROOT / "e2e" / "cluster.py")
    mod = importlib.util.module_from_spec(spec)
    sys.modules[name] = mod
    spec.loader.exec_module(mod)
    return mod


clmod = _load_cluster()


@dataclass
class Cluster:
    """What tests get: the admin kubeconfig, the kubectl and helm binaries
    (same versions as the node), and the project's image loaded in the node
    (use it with `imagePullPolicy: Never`)."""

    kubeconfig: str
    kubectl_path: str
    helm_path: str
    image: str
    image_id: str
    node_name: str

    def env(self) -> dict[str, str]:
        return dict(os.environ, KUBECONFIG=self.kubeconfig)

    def kubectl(self, *args: str, check: bool = True, input: str | None = None,
                timeout: float = 180) -> subprocess.CompletedProcess:
        p = subprocess.run([self.kubectl_path, *args], input=input, capture_output=True,
                           text=True, timeout=timeout, env=self.env())
        if check and p.returncode != 0:
            raise AssertionError(f"kubectl {' '.join(args)} failed ({p.returncode}):\n"
                                 f"{p.stdout}\n{p.stderr}")
        return p

    def get(self, *args: str) -> dict:
        return json.loads(self.kubectl("get", "-o", "json", *args).stdout)

    def helm(self, *args: str, check: bool = True,
             timeout: float = 300) -> subprocess.CompletedProcess:
        p = subprocess.run([self.helm_path, *args], capture_output=True, text=True,
                           timeout=timeout, env=self.env())
        if check and p.returncode != 0:
            raise AssertionError(f"helm {' '.join(args)} failed ({p.returncode}):\n"
                                 f"{p.stdout}\n{p.stderr}")
        return p


@pytest.fixture(scope="session")
def cluster():
    """A Ready node with shardlease:dev loaded; yields a Cluster."""
    error = None
    was_running = False
    try:
        if os.geteuid() != 0:
            raise clmod.ClusterError("the node needs root (kubelet, containerd, iptables)")
        was_running = clmod.healthy()
        t0 = time.monotonic()
        kubeconfig = clmod.up()
        t_up = time.monotonic() - t0
        t0 = time.monotonic()
        image_id = clmod.image()
        t_image = time.monotonic() - t0
        bins = clmod.cp.ensure_binaries(("kubectl", "helm"))
    except Exception as e:  # every failure is the tests' failure, with its reason
        error = f"the node could not come up: {type(e).__name__}: {e}"
    if error:
        if not was_running:  # leave the machine as it was, even when failing
            with contextlib.suppress(Exception):
                clmod.down()
        pytest.fail(error, pytrace=False)
    print(f"\n[cluster] node {'reused' if was_running else 'started'} in {t_up:.1f}s; "
          f"image {clmod.IMAGE} built/loaded in {t_image:.1f}s")
    try:
        yield Cluster(kubeconfig=str(kubeconfig), kubectl_path=str(bins["kubectl"]),
                      helm_path=str(bins["helm"]), image=clmod.IMAGE, image_id=image_id,
                      node_name=clmod.NODE_NAME)
    finally:
        if not was_running:
            clmod.down()


@contextlib.contextmanager
def fresh_namespace(cluster: Cluster):
    """A new namespace on the node whose `default` ServiceAccount exists
    (pods are refused before it does); deleted afterwards."""
    name = f"p-{uuid.uuid4().hex[:10]}"
    cluster.kubectl("create", "namespace", name)
    deadline = time.monotonic() + 60
    while cluster.kubectl("-n", name, "get", "serviceaccount", "default",
                          check=False).returncode != 0:
        assert time.monotonic() < deadline, f"no default ServiceAccount in {name} after 60s"
        time.sleep(0.3)
    try:
        yield name
    finally:
        cluster.kubectl("delete", "namespace", name, "--wait=false", check=False)


@pytest.fixture
def node_namespace(cluster):
    """A fresh namespace on the node (see fresh_namespace)."""
    with fresh_namespace(cluster) as name:
        yield name
