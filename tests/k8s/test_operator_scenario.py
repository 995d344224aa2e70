"""The whole Kubernetes scenario on a real kube-apiserver: opt in by annotation,
sidecar injection by the webhook, agents converging to fair shares, status on
the ShardSet, failover after kill -9, a graceful move on SIGTERM, a bad
annotation reported, opting out.

The operator and the agents run as local processes (no kubelet here).
"""

from __future__ import annotations

import asyncio
import base64
import math
import signal
import subprocess
from collections import Counter
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from kubernetes_asyncio import client

from shardlease.routing import shard_for_key
from shardlease.stores.kubernetes import epoch_object_name, lease_name

from .conftest import cpmod
from .scenario import (
    Proc,
    RecordingApp,
    apply_cluster_roles,
    apply_crd,
    bind_cluster_role,
    chart_cluster_roles,
    delete_cluster_roles,
    event_reasons,
    eventually,
    free_port,
    make_webhook_cert,
    mark_ready,
    pod_for,
    service_account_kubeconfig,
    spawn,
    statefulset,
)

SHARDS = 8
TTL = 3.0
GROUP, VERSION, PLURAL = "shardlease.io", "v1alpha1", "shardsets"

pytestmark = pytest.mark.slow


async def get_shardset(api: client.ApiClient, ns: str, name: str) -> dict[str, Any]:
    obj: dict[str, Any] = await client.CustomObjectsApi(api).get_namespaced_custom_object(
        GROUP, VERSION, ns, PLURAL, name)
    return obj


def condition(shardset: dict[str, Any], type_: str) -> dict[str, Any] | None:
    for c in (shardset.get("status") or {}).get("conditions") or []:
        if c.get("type") == type_:
            return dict(c)
    return None


def kubectl(kubeconfig: str, *args: str) -> str:
    out = subprocess.run([str(cpmod.binary_path("kubectl")), "--kubeconfig", kubeconfig, *args],
                         check=True, capture_output=True, text=True, timeout=60)
    return out.stdout


async def test_an_annotated_statefulset_gets_placed_shards_and_survives_failures(
        namespace: str, kubeconfig: str, api_client: client.ApiClient, tmp_path: Path) -> None:
    api = api_client
    apps, core = client.AppsV1Api(api), client.CoreV1Api(api)
    await apply_crd(api)
    procs: list[Proc] = []
    created_roles: list[str] = []
    apps_by_pod: dict[str, RecordingApp] = {}
    calls: list[dict[str, Any]] = []
    try:
        # -- RBAC exactly as the Helm chart ships it: the operator and the agents
        # authenticate as ServiceAccounts, so a missing permission fails here.
        helm = str(cpmod.ensure_binaries(("helm",))["helm"])
        created_roles = await apply_cluster_roles(
            api, chart_cluster_roles(helm, tmp_path / "helm"))
        await bind_cluster_role(api, namespace, "shardlease-operator", "shardlease-operator")
        operator_kc = await service_account_kubeconfig(
            api, kubeconfig, namespace, "shardlease-operator", tmp_path / "operator.kubeconfig")
        # The operator binds shardlease-agent to this account itself.
        agent_kc = await service_account_kubeconfig(
            api, kubeconfig, namespace, "db-app", tmp_path / "agent.kubeconfig")

        # -- the operator, with its webhook registered on loopback ------------
        cert = make_webhook_cert(tmp_path / "certs")
        port = free_port()
        procs.append(spawn("operator", [
            "operator", "--namespace", namespace, "--agent-image", "shardlease:test",
            "--webhook-cert-dir", str(tmp_path / "certs"), "--webhook-addr", "127.0.0.1",
            "--webhook-port", str(port), "--liveness", ""], tmp_path,
            env={"KUBECONFIG": operator_kc}))
        await client.AdmissionregistrationV1Api(api).create_mutating_webhook_configuration({
            "metadata": {"name": f"shardlease-{namespace}"},
            "webhooks": [{
                "name": "inject-agent.shardlease.io",
                "clientConfig": {"url": f"https://127.0.0.1:{port}/inject-agent",
                                 "caBundle": base64.b64encode(cert).decode()},
                "rules": [{"operations": ["CREATE"], "apiGroups": [""], "apiVersions": ["v1"],
                           "resources": ["pods"]}],
                "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name":
                                                      namespace}},
                "failurePolicy": "Ignore", "sideEffects": "None",
                "admissionReviewVersions": ["v1"], "timeoutSeconds": 5,
            }]})

        # -- opt in -----------------------------------------------------------
        body = statefulset("db", namespace, {
            "shardlease.io/shards": str(SHARDS), "shardlease.io/lease-ttl": str(TTL)})
        body["spec"]["template"]["spec"]["serviceAccountName"] = "db-app"
        sts = await apps.create_namespaced_stateful_set(namespace, body)
        sts_body = api.sanitize_for_serialization(sts)

        async def shardset_created() -> dict[str, Any] | None:
            try:
                return await get_shardset(api, namespace, "db")
            except client.ApiException:
                return None
        shardset = await eventually(shardset_created, "the operator to create the ShardSet")
        assert shardset["spec"]["shards"] == SHARDS
        # Its agents' account, named for the isolation policy (tests/k8s/test_isolation.py).
        assert shardset["metadata"]["labels"]["shardlease.io/service-account"] == "db-app"
        assert shardset["spec"]["store"] == f"kubernetes://{namespace}"
        assert shardset["spec"]["selector"] == {"app": "db"}
        refs = shardset["metadata"]["ownerReferences"]
        assert [(r["kind"], r["name"], r["uid"]) for r in refs] == [
            ("StatefulSet", "db", sts.metadata.uid)]
        # The RoleBinding comes in the operator's next request after the
        # ShardSet (two objects, not one write): waited for, not assumed.
        async def role_binding() -> Any:
            try:
                return await client.RbacAuthorizationV1Api(api).read_namespaced_role_binding(
                    "shardlease-agent-db", namespace)
            except client.ApiException:
                return None
        rb = await eventually(role_binding, "the operator to bind the agent's role")
        assert rb.role_ref.name == "shardlease-agent"
        assert [(s.kind, s.name) for s in rb.subjects] == [("ServiceAccount", "db-app")]

        # -- pods: injected by the webhook, then made Running and Ready ----------
        async def pod_created_with_agent() -> Any:
            # The webhook may need a moment to start serving after the operator.
            name = "db-0"
            try:
                await core.delete_namespaced_pod(name, namespace, grace_period_seconds=0)
            except client.ApiException:
                pass
            await eventually(lambda: _gone(core, namespace, name), "pod db-0 to go", 20)
            pod = await core.create_namespaced_pod(namespace, pod_for(sts_body, 0))
            names = [c.name for c in pod.spec.init_containers or []]
            return pod if "shardlease-agent" in names else None
        pod0 = await eventually(pod_created_with_agent, "the webhook to inject the agent",
                                timeout=60, every=2)
        # A native sidecar on this server (>= 1.29): it starts before the app.
        agent = next(c for c in pod0.spec.init_containers if c.name == "shardlease-agent")
        assert agent.restart_policy == "Always"
        assert agent.image == "shardlease:test"
        assert agent.args[:3] == ["agent", "--shardset", "db"]
        app_container = next(c for c in pod0.spec.containers if c.name == "app")
        assert app_container.lifecycle.pre_stop.http_get.path == "/drain"
        # No secret rides on the hook: the agent asks the API server (k8s/drain.py).
        assert not app_container.lifecycle.pre_stop.http_get.http_headers
        assert not [e for e in agent.env if "TOKEN" in e.name]
        for i in (1, 2):
            await core.create_namespaced_pod(namespace, pod_for(sts_body, i))
        # A pod of a StatefulSet that did not opt in is never touched.
        other = await apps.create_namespaced_stateful_set(
            namespace, statefulset("web", namespace, {}))
        plain = await core.create_namespaced_pod(
            namespace, pod_for(api.sanitize_for_serialization(other), 0))
        assert [c.name for c in plain.spec.containers] == ["app"]

        pods = ["db-0", "db-1", "db-2"]
        for name in pods:
            await mark_ready(api, namespace, name)

        # -- one agent per pod, each with its application -----------------------
        agents: dict[str, Proc] = {}
        agent_ports: dict[str, int] = {}
        for name in pods:
            app = RecordingApp(name, calls)
            await app.start()
            apps_by_pod[name] = app
            agent_ports[name] = free_port()
            agents[name] = spawn(f"agent-{name}", [
                "agent", "--shardset", "db", "--namespace", namespace, "--name", name,
                "--port", str(agent_ports[name]), "--host-url",
                f"http://127.0.0.1:{app.port}"], tmp_path, env={"KUBECONFIG": agent_kc})
            procs.append(agents[name])

        async def balanced(live: list[str]) -> dict[str, Any] | None:
            ss = await get_shardset(api, namespace, "db")
            st = ss.get("status") or {}
            owners = st.get("owners") or {}
            cond = condition(ss, "Balanced")
            share = math.ceil(SHARDS / len(live))
            counts = Counter(owners.values())
            ok = (len(owners) == SHARDS and set(owners.values()) <= set(live)
                  and max(counts.values(), default=0) <= share
                  and cond is not None and cond["status"] == "True"
                  and st.get("liveNodes") == len(live))
            return ss if ok else None

        ss = await eventually(lambda: balanced(pods), "fair shares across 3 pods", 90)
        assert ss["status"]["publishedBy"] in pods
        assert set(ss["status"]["generations"]) == {str(s) for s in range(SHARDS)}
        # What the applications were told agrees with the status.
        opened = {s: p for p, a in apps_by_pod.items() for s in a.open}
        assert opened == {int(s): p for s, p in ss["status"]["owners"].items()}

        # Every agent answers lookups the same way, from its own last read.
        owners = ss["status"]["owners"]
        async with aiohttp.ClientSession() as http:
            for name, port in agent_ports.items():
                base = f"http://127.0.0.1:{port}"
                async with http.get(f"{base}/readyz") as r:
                    assert r.status == 200
                async with http.get(f"{base}/healthz") as r:
                    assert r.status == 200

                async def agreed(base: str = base) -> bool:
                    async with http.get(f"{base}/lookup", params={"shard": "5"}) as r:
                        got = await r.json()
                    return got["owner"] == owners["5"]
                await eventually(agreed, f"{name}'s lookup to agree with the status", 20)
                async with http.get(f"{base}/lookup", params={"shard": "5"}) as r:
                    got = await r.json()
                assert got == {"shard": 5, "owner": owners["5"], "address": "127.0.0.1",
                               "generation": ss["status"]["generations"]["5"]}
                key_shard = shard_for_key("user-42", SHARDS)
                async with http.get(f"{base}/lookup", params={"key": "user-42"}) as r:
                    assert (await r.json())["shard"] == key_shard
                async with http.get(f"{base}/lookup", params={"shard": "99"}) as r:
                    assert r.status == 400
                async with http.get(f"{base}/metrics") as r:
                    text = await r.text()
                assert f'shardlease_held_shards{{cluster="db",node="{name}"}}' in text

        # What a user or a pipeline types to wait for it: Ready needs the
        # operator's Configured, the agents' Balanced and no pod without agent.
        await asyncio.to_thread(kubectl, kubeconfig, "wait", "-n", namespace,
                                "--for=condition=Ready", "shardset/db", "--timeout=60s")
        table = kubectl(kubeconfig, "get", "shardsets", "-n", namespace)
        header, row = table.splitlines()[:2]
        assert header.split() == ["NAME", "SHARDS", "OWNED", "LIVE", "READY", "BALANCED",
                                  "CONFIGURED", "AGE"]
        assert row.split()[:7] == ["db", str(SHARDS), str(SHARDS), "3", "True", "True", "True"]
        wide = kubectl(kubeconfig, "get", "shardsets", "-n", namespace, "-o", "wide")
        assert wide.splitlines()[0].split()[-2:] == ["AGE", "MESSAGE"]
        assert "at most" in wide.splitlines()[1], wide  # the Balanced message
        leases = kubectl(kubeconfig, "get", "leases", "-n", namespace,
                         "-l", "shardlease.io/cluster=db,shardlease.io/kind=shard", "-o", "name")
        assert len(leases.split()) == SHARDS

        # -- kill -9 one agent (its pod is gone too): its shards reopen elsewhere --
        victim = "db-1"
        agents[victim].signal(signal.SIGKILL)
        await agents[victim].wait()
        await core.delete_namespaced_pod(victim, namespace, grace_period_seconds=0)
        live = ["db-0", "db-2"]
        await eventually(lambda: balanced(live), "failover to db-0 and db-2", 90)
        assert not _open_twice(apps_by_pod, exclude=victim)

        # -- SIGTERM one: it frees its leases, the other takes them ----------------
        leaving = "db-2"
        before = {s for s, p in (await get_shardset(api, namespace, "db"))["status"]
                  ["owners"].items() if p == leaving}
        assert before
        agents[leaving].signal(signal.SIGTERM)
        assert await agents[leaving].wait(60) == 0, agents[leaving].tail()
        assert apps_by_pod[leaving].open == {}  # every shard closed before exit
        coord = client.CoordinationV1Api(api)
        for s in before:
            lease = await coord.read_namespaced_lease(lease_name("db", s), namespace)
            # Freed or already taken by db-0, never left to expire. In node
            # renewal a stop frees every lease at once by ending its epoch
            # (docs/renewal.md, rule 7): the lease may still name db-2's
            # epoch until db-0's next round, but that epoch is ended.
            if lease.spec.holder_identity == leaving:
                ann = lease.metadata.annotations or {}
                assert ann.get("shardlease.io/renewal") == "node", ann
                epoch = await coord.read_namespaced_lease(epoch_object_name(
                    "db", leaving, ann["shardlease.io/incarnation"]), namespace)
                assert (epoch.metadata.labels or {}).get("shardlease.io/ended") == "true"
            else:
                assert lease.spec.holder_identity in (None, "db-0")
        await core.delete_namespaced_pod(leaving, namespace, grace_period_seconds=0)
        await eventually(lambda: balanced(["db-0"]), "db-0 to own every shard", 60)

        # Kubernetes Events tell the story on the ShardSet.
        await event_reasons(api, namespace, "involvedObject.kind=ShardSet,involvedObject.name=db",
                            {"Claimed", "Released"})

        # -- a malformed annotation: Warning Event and a False condition ----------
        await apps.patch_namespaced_stateful_set(
            "db", namespace, {"metadata": {"annotations": {"shardlease.io/shards": "lots"}}})

        async def reported() -> bool:
            ss = await get_shardset(api, namespace, "db")
            cond = condition(ss, "Configured")
            evs = await core.list_namespaced_event(
                namespace, field_selector="involvedObject.kind=StatefulSet,"
                "involvedObject.name=db,reason=InvalidAnnotation")
            return bool(cond and cond["status"] == "False" and "lots" in cond["message"]
                        and evs.items and evs.items[0].type == "Warning")
        await eventually(reported, "the bad annotation to be reported")
        # The last good spec stays, and the placement goes on.
        assert (await get_shardset(api, namespace, "db"))["spec"]["shards"] == SHARDS
        assert agents["db-0"].popen.poll() is None
        assert all(p.popen.poll() is None for p in procs if p.name == "operator")

        # -- opting out removes the ShardSet -------------------------------------------
        await apps.patch_namespaced_stateful_set(
            "db", namespace, {"metadata": {"annotations": {"shardlease.io/shards": None}}})

        async def removed() -> bool:
            try:
                await get_shardset(api, namespace, "db")
                return False
            except client.ApiException as e:
                return e.status == 404
        await eventually(removed, "the ShardSet to be deleted on opt-out")
    except BaseException:
        for p in procs:
            print(f"----- {p.name} -----\n{p.tail(60)}")
        raise
    finally:
        for p in procs:
            p.stop()
        for a in apps_by_pod.values():
            await a.stop()
        await delete_cluster_roles(api, created_roles)
        try:
            await client.AdmissionregistrationV1Api(api).delete_mutating_webhook_configuration(
                f"shardlease-{namespace}")
        except client.ApiException:
            pass


async def _gone(core: client.CoreV1Api, namespace: str, name: str) -> bool:
    try:
        await core.read_namespaced_pod(name, namespace)
        return False
    except client.ApiException as e:
        return e.status == 404


def _open_twice(apps: dict[str, RecordingApp], exclude: str) -> dict[int, list[str]]:
    seen: dict[int, list[str]] = {}
    for pod, app in apps.items():
        if pod == exclude:
            continue
        for s in app.open:
            seen.setdefault(s, []).append(pod)
    return {s: p for s, p in seen.items() if len(p) > 1}

