"""The kind cluster made on this machine (e2e/kindcluster.py): one control
plane and two workers, each a podman container running systemd, containerd
and a kubelet. The real-pod tests (tests/pods, tests/kind) all run on it, in
one pytest process, so it comes up once.

`kind` brings it up (or reuses one that runs), with a Docker engine for the
session (kind.sh and the image build use it); `kind_with_image` adds the
project's image (shardlease:dev, the example target) loaded into every
node. A cluster this session made is deleted at the end; one that ran
before is left. If it cannot come up the tests fail with the reason:
nothing here is skipped.
"""

from __future__ import annotations

import contextlib
import importlib.util
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from tests.support.cluster import Cluster

ROOT = Path(__file__).resolve().parents[2]


def _load(name: str, path: Path) -> Any:
    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    sys.modules[name] = mod
    spec.loader.exec_module(mod)
    return mod


#: e2e/kindcluster.py (its own `cluster` and `controlplane` siblings come with
#: it: `kindmod.node`, `kindmod.cp`).
kindmod = _load("shardlease_e2e_kindcluster", ROOT / "e2e" / "kindcluster.py")


@dataclass
class Kind(Cluster):
    """A Cluster (the pods' helpers work on it) that knows its kind nodes."""

    workers: tuple[str, ...] = ()

    def env(self) -> dict[str, str]:
        return kindmod.env()

    def podman(self, *args: str, check: bool = True,
               timeout: float = 120) -> subprocess.CompletedProcess:
        p = subprocess.run(["podman", *args], capture_output=True, text=True, timeout=timeout,
                           env=self.env())
        if check and p.returncode != 0:
            raise AssertionError(f"podman {' '.join(args)} failed ({p.returncode}):\n"
                                 f"{p.stdout}\n{p.stderr}")
        return p

    def address(self) -> str:
        """Where pods reach a server the tests run on this machine: its
        address on the kind network (no worker's fault takes it down)."""
        return str(kindmod.gateway())


@pytest.fixture(scope="session")
def kind() -> Iterator[Kind]:
    error = None
    was_running = False
    stack = contextlib.ExitStack()
    try:
        if os.geteuid() != 0:
            raise kindmod.KindError("kind's nodes need root (podman, privileged containers)")
        stack.enter_context(kindmod.node.docker_engine())
        was_running = kindmod.healthy()
        t0 = time.monotonic()
        kubeconfig = kindmod.up()
        t_up = time.monotonic() - t0
        images = kindmod.workload_images()
        bins = kindmod.cp.ensure_binaries(("kubectl", "helm"))
        workers = tuple(n for n in kindmod.nodes() if "worker" in n)
    except Exception as e:  # every failure is the tests' failure, with its reason
        error = f"the kind cluster could not come up: {type(e).__name__}: {e}"
    if error:
        if not was_running:
            with contextlib.suppress(Exception):
                kindmod.down()
        stack.close()
        pytest.fail(error, pytrace=False)
    print(f"\n[kind] cluster {kindmod.NAME} {'reused' if was_running else 'made'} in "
          f"{t_up:.1f}s; nodes: {', '.join(kindmod.nodes())}; images: {images}")
    try:
        yield Kind(kubeconfig=str(kubeconfig), kubectl_path=str(bins["kubectl"]),
                   helm_path=str(bins["helm"]), image=kindmod.node.IMAGE, image_id="",
                   node_name=kindmod.NAME + "-control-plane", workers=workers)
    finally:
        try:
            if not was_running:
                kindmod.down()
        finally:
            stack.close()


@pytest.fixture(scope="session")
def kind_with_image(kind: Kind) -> Kind:
    """The kind cluster with this revision's shardlease:dev in every node."""
    t0 = time.monotonic()
    image_id = kindmod.node.image()
    kindmod.kind("load", "docker-image", kindmod.node.IMAGE, "--name", kindmod.NAME,
                 timeout=900)
    print(f"\n[kind] {kindmod.node.IMAGE} built and loaded in {time.monotonic() - t0:.1f}s")
    kind.image_id = image_id
    return kind
