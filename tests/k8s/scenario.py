"""Helpers for the operator scenario on the real control plane.

There is no kubelet and no controller-manager: the tests create the
StatefulSet's pods themselves (with the owner reference the StatefulSet
controller would set), mark them Running and Ready through the status
subresource, and run the agents as local processes, one per pod, each with
its own application (a recording HTTP host) on loopback.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Awaitable, Callable, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import yaml
from aiohttp import web
from kubernetes_asyncio import client

ROOT = Path(__file__).resolve().parents[2]
CRD = ROOT / "crds" / "shardlease.io_shardsets.yaml"
T = TypeVar("T")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


async def eventually(check: Callable[[], Awaitable[T]], what: str, timeout: float = 60.0,
                     every: float = 0.5) -> T:
    """Poll until `check` returns a truthy value; fail with the last value seen."""
    deadline = time.monotonic() + timeout
    last: Any = None
    while True:
        try:
            last = await check()
        except Exception as e:  # a poll may race with a restart; keep polling
            last = e
        if last and not isinstance(last, Exception):
            return last  # type: ignore[no-any-return]
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout:.0f}s waiting for {what}; "
                                 f"last: {last!r}")
        await asyncio.sleep(every)


async def event_reasons(api: client.ApiClient, namespace: str, field_selector: str,
                        want: set[str], timeout: float = 60.0) -> set[str]:
    """Wait until the Events matching `field_selector` include every reason in `want`.

    One read is not enough: kopf posts the events an operator emits from a
    queue of its own, after (and apart from) the status patch a test waits
    for, so an event can be listed a moment later than its condition.
    """
    core = client.CoreV1Api(api)
    seen: set[str] = set()

    async def has() -> set[str] | None:
        nonlocal seen
        events = await core.list_namespaced_event(namespace, field_selector=field_selector)
        seen = {ev.reason for ev in events.items}
        return seen if want <= seen else None
    try:
        return await eventually(has, f"events {sorted(want)} on {field_selector}", timeout)
    except AssertionError as e:
        raise AssertionError(f"{e}; reasons seen: {sorted(seen)}") from None


async def apply_crd(api: client.ApiClient) -> None:
    ext = client.ApiextensionsV1Api(api)
    body = yaml.safe_load(CRD.read_text())
    try:
        await ext.create_custom_resource_definition(body)
    except client.ApiException as e:
        if e.status != 409:
            raise

    async def established() -> bool:
        crd = await ext.read_custom_resource_definition(body["metadata"]["name"])
        return any(c.type == "Established" and c.status == "True"
                   for c in crd.status.conditions or [])
    await eventually(established, "the ShardSet CRD to be established", 30)


def statefulset(name: str, namespace: str, annotations: dict[str, str],
                replicas: int = 3) -> dict[str, Any]:
    labels = {"app": name}
    return {
        "apiVersion": "apps/v1", "kind": "StatefulSet",
        "metadata": {"name": name, "namespace": namespace, "annotations": annotations},
        "spec": {
            "serviceName": name, "replicas": replicas,
            "selector": {"matchLabels": labels},
            "template": {"metadata": {"labels": labels},
                         "spec": {"containers": [{"name": "app", "image": "example/app:1"}]}},
        },
    }


async def shardset_for(api: client.ApiClient, namespace: str, name: str, *, shards: int,
                       replicas: int, **spec: Any) -> None:
    """The CRD, a StatefulSet `name` (only read by the agents: no controller
    runs here) and its ShardSet on the namespace's lease store, as the
    operator makes them; `spec` adds ShardSet fields (leaseTTL=3.0, ...)."""
    await apply_crd(api)
    await client.AppsV1Api(api).create_namespaced_stateful_set(
        namespace, statefulset(name, namespace, {}, replicas=replicas))
    await client.CustomObjectsApi(api).create_namespaced_custom_object(
        "shardlease.io", "v1alpha1", namespace, "shardsets", {
            "apiVersion": "shardlease.io/v1alpha1", "kind": "ShardSet",
            "metadata": {"name": name},
            "spec": {"statefulSet": name, "selector": {"app": name}, "shards": shards,
                     "store": f"kubernetes://{namespace}", **spec}})


def pod_for(sts: dict[str, Any], ordinal: int) -> dict[str, Any]:
    meta = sts["metadata"]
    template = sts["spec"]["template"]
    return {
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {
            "name": f"{meta['name']}-{ordinal}", "namespace": meta["namespace"],
            "labels": dict(template["metadata"]["labels"]),
            "ownerReferences": [{"apiVersion": "apps/v1", "kind": "StatefulSet",
                                 "name": meta["name"], "uid": meta["uid"],
                                 "controller": True, "blockOwnerDeletion": True}],
        },
        "spec": json.loads(json.dumps(template["spec"])),
    }


async def mark_ready(api: client.ApiClient, namespace: str, name: str, ready: bool = True) -> None:
    core = client.CoreV1Api(api)
    now = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    status = {"status": {
        "phase": "Running", "podIP": "127.0.0.1",
        "conditions": [{"type": "Ready", "status": "True" if ready else "False",
                        "lastTransitionTime": now}]}}
    await core.patch_namespaced_pod_status(name, namespace, status)


async def ready_pods(api: client.ApiClient, namespace: str, names: Iterable[str],
                     labels: dict[str, str],
                     specs: Mapping[str, Mapping[str, Any]] | None = None) -> None:
    """Bare pods marked Ready (no kubelet here): what peer discovery sees.
    `specs`: fields added to a pod's spec, by its name."""
    core = client.CoreV1Api(api)
    for name in names:
        await core.create_namespaced_pod(namespace, {
            "apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name, "labels": dict(labels)},
            "spec": {"containers": [{"name": "app", "image": "example/app:1"}],
                     **(specs or {}).get(name, {})}})
        await mark_ready(api, namespace, name)


@dataclass
class RecordingApp:
    """One pod's application: records open/close calls (the HTTP host protocol)."""

    pod: str
    log: list[dict[str, Any]]
    port: int = field(default_factory=free_port)
    open: dict[int, int] = field(default_factory=dict)
    runner: web.AppRunner | None = None

    async def start(self) -> None:
        app = web.Application()
        app.add_routes([web.post("/shards/{shard}/{action}", self.handle)])
        self.runner = web.AppRunner(app, access_log=None)
        await self.runner.setup()
        await web.TCPSite(self.runner, "127.0.0.1", self.port).start()

    async def handle(self, request: web.Request) -> web.Response:
        shard = int(request.match_info["shard"])
        action = request.match_info["action"]
        body = await request.json()
        if action == "open":
            self.open[shard] = int(body["generation"])
        elif action == "close":
            self.open.pop(shard, None)
        else:
            return web.Response(status=404)
        self.log.append({"pod": self.pod, "action": action, "shard": shard,
                         "generation": body.get("generation"), "t": time.monotonic()})
        return web.json_response({"ok": True})

    async def stop(self) -> None:
        if self.runner is not None:
            await self.runner.cleanup()


@dataclass
class Proc:
    name: str
    popen: subprocess.Popen[bytes]
    log: Path

    def signal(self, sig: int) -> None:
        if self.popen.poll() is None:
            os.kill(self.popen.pid, sig)

    async def wait(self, within: float = 30.0) -> int:
        """Wait for the exit without blocking the event loop (the apps live on it)."""
        deadline = time.monotonic() + within
        while (code := self.popen.poll()) is None:
            if time.monotonic() > deadline:
                raise AssertionError(f"{self.name} did not exit within {within:.0f}s")
            await asyncio.sleep(0.1)
        return code

    def stop(self) -> None:
        if self.popen.poll() is None:
            self.popen.send_signal(signal.SIGKILL)
            self.popen.wait(10)

    def tail(self, n: int = 40) -> str:
        try:
            return "\n".join(self.log.read_text(errors="replace").splitlines()[-n:])
        except OSError:
            return ""


def spawn(name: str, args: list[str], logdir: Path, env: dict[str, str] | None = None) -> Proc:
    log = logdir / f"{name}.log"
    full_env = {**os.environ, **(env or {}), "PYTHONUNBUFFERED": "1"}
    popen = subprocess.Popen(
        [sys.executable, "-m", "shardlease", *args],
        stdout=log.open("wb"), stderr=subprocess.STDOUT, env=full_env)
    return Proc(name, popen, log)


def make_webhook_cert(directory: Path) -> bytes:
    directory.mkdir(parents=True, exist_ok=True)
    subprocess.run(
        ["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "2",
         "-keyout", str(directory / "tls.key"), "-out", str(directory / "tls.crt"),
         "-subj", "/CN=127.0.0.1", "-addext", "subjectAltName=IP:127.0.0.1"],
        check=True, capture_output=True)
    return (directory / "tls.crt").read_bytes()


CHART = ROOT / "charts" / "shardlease"


def chart_documents(helm: str, home: Path, *kinds: str,
                    args: tuple[str, ...] = ()) -> list[dict[str, Any]]:
    """The objects of these kinds the Helm chart ships, rendered by the real
    helm (`args`: more of its flags, --set or --api-versions)."""
    env = {"PATH": "/usr/bin:/bin", "HOME": str(home), "HELM_CONFIG_HOME": str(home / "c"),
           "HELM_CACHE_HOME": str(home / "k"), "HELM_DATA_HOME": str(home / "d")}
    out = subprocess.run([helm, "template", "shardlease", str(CHART), "--namespace",
                          "shardlease-system", *args], env=env, check=True,
                         capture_output=True, text=True, timeout=120).stdout
    return [d for d in yaml.safe_load_all(out) if d and d.get("kind") in kinds]


def chart_cluster_roles(helm: str, home: Path) -> list[dict[str, Any]]:
    """The ClusterRoles the Helm chart ships."""
    return chart_documents(helm, home, "ClusterRole")


async def apply_cluster_roles(api: client.ApiClient, roles: list[dict[str, Any]]) -> list[str]:
    """Create the chart's ClusterRoles where missing; return the names created.

    Roles that exist are left alone: they belong to a Helm release of the
    chart (tests/chart installs one), and rewriting them would take them away
    from it. The caller deletes what it created.
    """
    rbac = client.RbacAuthorizationV1Api(api)
    created = []
    for role in roles:
        try:
            await rbac.create_cluster_role(role)
            created.append(role["metadata"]["name"])
        except client.ApiException as e:
            if e.status != 409:
                raise
    return created


async def delete_cluster_roles(api: client.ApiClient, names: list[str]) -> None:
    rbac = client.RbacAuthorizationV1Api(api)
    for name in names:
        try:
            await rbac.delete_cluster_role(name)
        except client.ApiException as e:
            if e.status != 404:
                raise


async def service_account_kubeconfig(api: client.ApiClient, admin_kubeconfig: str,
                                     namespace: str, account: str, path: Path) -> str:
    """A kubeconfig that authenticates as a ServiceAccount with a token from
    the TokenRequest API: what a pod's mounted token gives it."""
    core = client.CoreV1Api(api)
    try:
        await core.create_namespaced_service_account(
            namespace, {"metadata": {"name": account}})
    except client.ApiException as e:
        if e.status != 409:
            raise
    token = await core.create_namespaced_service_account_token(
        account, namespace, {"spec": {"expirationSeconds": 3600}})
    admin = yaml.safe_load(Path(admin_kubeconfig).read_text())
    cluster = admin["clusters"][0]
    path.write_text(yaml.safe_dump({
        "apiVersion": "v1", "kind": "Config",
        "clusters": [cluster],
        "users": [{"name": account, "user": {"token": token.status.token}}],
        "contexts": [{"name": account, "context": {"cluster": cluster["name"],
                                                   "user": account,
                                                   "namespace": namespace}}],
        "current-context": account,
    }))
    return str(path)


async def bind_cluster_role(api: client.ApiClient, namespace: str, role: str,
                            account: str) -> None:
    await client.RbacAuthorizationV1Api(api).create_namespaced_role_binding(namespace, {
        "metadata": {"name": f"{role}-{account}"},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole",
                    "name": role},
        "subjects": [{"kind": "ServiceAccount", "name": account, "namespace": namespace}],
    })
