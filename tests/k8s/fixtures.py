"""Fixtures for tests against a real Kubernetes control plane.

One etcd + kube-apiserver per test session, started on loopback by
``e2e/controlplane.py`` (binaries built from Go modules into
``${SHARDLEASE_CACHE:-~/.cache/shardlease}/bin`` if missing). A binary that
cannot be built fails the tests; nothing is skipped.
"""

from __future__ import annotations

import importlib.util
import os
import sys
import uuid
from pathlib import Path

import pytest
import pytest_asyncio

ROOT = Path(__file__).resolve().parents[2]


def _load_controlplane():
    name = "shardlease_e2e_controlplane"
    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.spec_from_file_location(name, ROOT / "e2e" / "controlplane.py")
    mod = importlib.util.module_from_spec(spec)
    sys.modules[name] = mod  # before exec: dataclasses look their module up
    spec.loader.exec_module(mod)
    return mod


cpmod = _load_controlplane()


@pytest.fixture(scope="session")
def controlplane():
    """A running ControlPlane (etcd + kube-apiserver) for the whole session."""
    error = None
    try:
        cpmod.ensure_binaries(("etcd", "kube-apiserver"))
        cp = cpmod.ControlPlane().start()
    except cpmod.BuildError as e:
        error = f"cannot build the control plane binaries:\n{e}"
    except RuntimeError as e:
        error = f"cannot start the control plane:\n{e}"
    if error:  # outside `except`: one clear message, no chained traceback
        pytest.fail(error, pytrace=False)
    try:
        yield cp
    finally:
        cp.stop()


@pytest.fixture(scope="session")
def kubeconfig(controlplane):
    """Path (str) of an admin kubeconfig (group system:masters); also exported
    as $KUBECONFIG for the session so kopf/kubectl/clients pick it up."""
    path = str(controlplane.kubeconfig)
    old = os.environ.get("KUBECONFIG")
    os.environ["KUBECONFIG"] = path
    try:
        yield path
    finally:
        if old is None:
            os.environ.pop("KUBECONFIG", None)
        else:
            os.environ["KUBECONFIG"] = old


@pytest_asyncio.fixture
async def api_client(kubeconfig):
    """An admin kubernetes_asyncio ApiClient, closed after the test."""
    from kubernetes_asyncio import client, config

    cfg = client.Configuration()
    await config.load_kube_config(config_file=kubeconfig, client_configuration=cfg)
    async with client.ApiClient(configuration=cfg) as api:
        yield api


@pytest_asyncio.fixture
async def kube(kubeconfig):
    """An admin shardlease.kubeapi client (raw JSON calls), closed after the test."""
    from shardlease.kubeapi import KubeClient

    api = KubeClient.from_config(kubeconfig)
    try:
        yield api
    finally:
        await api.close()


@pytest_asyncio.fixture
async def namespace(api_client):
    """A fresh namespace per test. It is deleted afterwards but never finishes
    terminating (no controller-manager runs); names never repeat."""
    from kubernetes_asyncio import client
    from kubernetes_asyncio.client.rest import ApiException

    core = client.CoreV1Api(api_client)
    name = f"t-{uuid.uuid4().hex[:10]}"
    await core.create_namespace(client.V1Namespace(
        metadata=client.V1ObjectMeta(name=name, labels={"shardlease.test": "true"})))
    yield name
    try:
        await core.delete_namespace(name)
    except ApiException:
        pass
