"""The operator on a real kube-apiserver, beyond the happy path: a pod that
arrives right behind its StatefulSet, the `default` ServiceAccount, Ready
pods that run without the agent, and a reconciliation that failed."""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from kubernetes_asyncio import client

from .conftest import cpmod
from .scenario import (
    Proc,
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

GROUP, VERSION, PLURAL = "shardlease.io", "v1alpha1", "shardsets"
AGENT = "shardlease-agent"

pytestmark = pytest.mark.slow


def has_agent(pod: Any) -> bool:
    return any(c.name == AGENT for c in (pod.spec.init_containers or []) +
               (pod.spec.containers or []))


async def conditions(api: client.ApiClient, ns: str, name: str) -> dict[str, dict[str, Any]]:
    try:
        obj = await client.CustomObjectsApi(api).get_namespaced_custom_object(
            GROUP, VERSION, ns, PLURAL, name)
    except client.ApiException:
        return {}
    return {c["type"]: c for c in (obj.get("status") or {}).get("conditions") or []}


async def start_operator(api: client.ApiClient, namespace: str, kubeconfig: str,
                         tmp_path: Path, http: str = "", extra: tuple[str, ...] = ()
                         ) -> tuple[Proc, str]:
    cert = make_webhook_cert(tmp_path / "certs")
    port = free_port()
    proc = spawn("operator", [
        "operator", "--namespace", namespace, "--agent-image", "shardlease:test",
        "--webhook-cert-dir", str(tmp_path / "certs"), "--webhook-addr", "127.0.0.1",
        "--webhook-port", str(port), "--http", http, *extra], tmp_path,
        env={"KUBECONFIG": kubeconfig})
    return proc, await register_webhook(api, namespace, port, cert, "Ignore")


async def register_webhook(api: client.ApiClient, namespace: str, port: int, cert: bytes,
                           failure_policy: str) -> str:
    """The injection webhook for this namespace's pods, served on loopback."""
    webhook = f"shardlease-{namespace}"
    await client.AdmissionregistrationV1Api(api).create_mutating_webhook_configuration({
        "metadata": {"name": webhook},
        "webhooks": [{
            "name": "inject-agent.shardlease.io",
            "clientConfig": {"url": f"https://127.0.0.1:{port}/inject-agent",
                             "caBundle": base64.b64encode(cert).decode()},
            "rules": [{"operations": ["CREATE"], "apiGroups": [""], "apiVersions": ["v1"],
                       "resources": ["pods"]}],
            "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": namespace}},
            "failurePolicy": failure_policy, "sideEffects": "None",
            "admissionReviewVersions": ["v1"], "timeoutSeconds": 5,
        }]})
    return webhook


async def test_pods_created_right_behind_their_statefulset_get_the_agent(
        namespace: str, kubeconfig: str, api_client: client.ApiClient, tmp_path: Path) -> None:
    api = api_client
    apps, core = client.AppsV1Api(api), client.CoreV1Api(api)
    await apply_crd(api)
    http = free_port()
    # In JSON, and injecting agents that log in JSON at debug (the chart's
    # agent.logFormat and agent.logLevel, #43): checked at the end.
    proc, webhook = await start_operator(
        api, namespace, kubeconfig, tmp_path, http=f"127.0.0.1:{http}",
        extra=("--log-format", "json", "--agent-config",
               '{"logFormat": "json", "logLevel": "debug"}'))
    try:
        async def ready() -> bool:
            async with aiohttp.ClientSession() as s, \
                    s.get(f"http://127.0.0.1:{http}/readyz") as r:
                return r.status == 200
        await eventually(ready, "the operator's /readyz (cache warm, webhook serving)")
        # Wait until the webhook serves (a StatefulSet it has long seen).
        warm = api.sanitize_for_serialization(await apps.create_namespaced_stateful_set(
            namespace, statefulset("warm", namespace, {"shardlease.io/shards": "2"})))

        async def serving() -> bool:
            name = "warm-0"
            try:
                await core.delete_namespaced_pod(name, namespace, grace_period_seconds=0)
            except client.ApiException:
                pass
            try:
                return has_agent(await core.create_namespaced_pod(namespace,
                                                                  pod_for(warm, 0)))
            except client.ApiException:
                return False
        await eventually(serving, "the webhook to serve", timeout=60, every=1)

        # GitOps: the StatefulSet and its pod a moment apart, before the
        # operator's watch can have shown it the StatefulSet.
        injected = []
        for i in range(8):
            sts = api.sanitize_for_serialization(await apps.create_namespaced_stateful_set(
                namespace, statefulset(f"g{i}", namespace, {"shardlease.io/shards": "4"})))
            pod = await core.create_namespaced_pod(namespace, pod_for(sts, 0))
            injected.append(has_agent(pod))
        assert injected == [True] * 8, proc.tail()
        (agent,) = [c for c in pod.spec.init_containers or [] if c.name == AGENT]
        assert agent.args[-4:] == ["--log-format", "json", "--log-level", "debug"], agent.args

        # A StatefulSet that did not opt in, just as fresh, is left alone.
        plain = api.sanitize_for_serialization(await apps.create_namespaced_stateful_set(
            namespace, statefulset("plain", namespace, {})))
        assert not has_agent(await core.create_namespaced_pod(namespace, pod_for(plain, 0)))

        async with aiohttp.ClientSession() as s, \
                s.get(f"http://127.0.0.1:{http}/metrics") as r:
            metrics = await r.text()
        name = 'shardlease_operator_injections_total{result="injected"}'
        injected = next(float(line.split()[-1]) for line in metrics.splitlines()
                        if line.startswith(name))
        assert injected >= 9  # the eight above and the warm-up pod
        assert 'shardlease_operator_reconciles_total{result="ok"}' in metrics
    finally:
        proc.stop()
        await client.AdmissionregistrationV1Api(api).delete_mutating_webhook_configuration(
            webhook)
    # Every line the operator wrote is one JSON record (kopf's and Python's
    # warnings too), and it said something.
    records = []
    for line in proc.log.read_text(errors="replace").splitlines():
        try:
            records.append(json.loads(line))
        except json.JSONDecodeError:
            raise AssertionError(f"a line of the operator's that is not JSON: {line!r}") from None
    assert records and all({"ts", "level", "logger", "msg"} <= r.keys() for r in records)


async def test_the_default_service_account_is_refused_and_missing_agents_are_reported(
        namespace: str, kubeconfig: str, api_client: client.ApiClient, tmp_path: Path) -> None:
    api = api_client
    apps, core = client.AppsV1Api(api), client.CoreV1Api(api)
    rbac = client.RbacAuthorizationV1Api(api)
    await apply_crd(api)
    # Pods made before the operator runs get no agent (the webhook is not there).
    sts = api.sanitize_for_serialization(await apps.create_namespaced_stateful_set(
        namespace, statefulset("db", namespace, {"shardlease.io/shards": "4"})))
    for i in (0, 1):
        await core.create_namespaced_pod(namespace, pod_for(sts, i))
        await mark_ready(api, namespace, f"db-{i}")
    proc, webhook = await start_operator(api, namespace, kubeconfig, tmp_path)
    try:
        async def refused() -> dict[str, Any] | None:
            c = (await conditions(api, namespace, "db")).get("Configured")
            return c if c and c["reason"] == "DefaultServiceAccount" else None
        configured = await eventually(refused, "Configured=False for the default account")
        assert configured["status"] == "False"
        assert "serviceAccountName" in configured["message"]
        with pytest.raises(client.ApiException) as e:
            await rbac.read_namespaced_role_binding("shardlease-agent-db", namespace)
        assert e.value.status == 404

        async def missing() -> dict[str, Any] | None:
            c = (await conditions(api, namespace, "db")).get("AgentsInjected")
            return c if c and c["status"] == "False" else None
        agents = await eventually(missing, "AgentsInjected=False for the pods made earlier")
        assert agents["reason"] == "AgentMissing"
        assert "db-0" in agents["message"] and "db-1" in agents["message"]
        await event_reasons(api, namespace, "involvedObject.name=db",
                            {"DefaultServiceAccount", "AgentMissing"})

        # Allowing the default account by annotation binds it.
        await apps.patch_namespaced_stateful_set("db", namespace, {"metadata": {"annotations": {
            "shardlease.io/allow-default-service-account": "true"}}})

        async def bound() -> Any:
            try:
                return await rbac.read_namespaced_role_binding("shardlease-agent-db", namespace)
            except client.ApiException:
                return None
        rb = await eventually(bound, "the RoleBinding on the default account")
        assert [(s.kind, s.name) for s in rb.subjects] == [("ServiceAccount", "default")]
        # The condition follows the binding (the agents wait on the binding;
        # the condition is for people): read at once, it may still say
        # DefaultServiceAccount (CI's run at bbae792).

        async def valid() -> dict[str, Any] | None:
            c = (await conditions(api, namespace, "db")).get("Configured")
            return c if c and c["reason"] == "AnnotationsValid" else None
        c = await eventually(valid, "Configured=True once the default account is allowed")
        assert c["status"] == "True"
    finally:
        proc.stop()
        await client.AdmissionregistrationV1Api(api).delete_mutating_webhook_configuration(
            webhook)


async def test_pods_running_an_older_agent_are_reported_until_recreated(
        namespace: str, kubeconfig: str, api_client: client.ApiClient, tmp_path: Path) -> None:
    api = api_client
    apps, core = client.AppsV1Api(api), client.CoreV1Api(api)
    await apply_crd(api)
    body = statefulset("db", namespace, {"shardlease.io/shards": "4"})
    body["spec"]["template"]["spec"]["serviceAccountName"] = "db-app"
    sts = api.sanitize_for_serialization(await apps.create_namespaced_stateful_set(namespace, body))
    # Injected by an earlier release of the operator (before this one runs).
    for i, image in ((0, "shardlease:old"), (1, "shardlease:test")):
        pod = pod_for(sts, i)
        pod["spec"]["containers"].append({"name": AGENT, "image": image})
        await core.create_namespaced_pod(namespace, pod)
        await mark_ready(api, namespace, f"db-{i}")
    proc, webhook = await start_operator(api, namespace, kubeconfig, tmp_path)
    try:
        async def current(status: str) -> dict[str, Any] | None:
            c = (await conditions(api, namespace, "db")).get("AgentsCurrent")
            return c if c and c["status"] == status else None
        old = await eventually(lambda: current("False"), "AgentsCurrent=False for db-0")
        assert old["reason"] == "AgentOutdated"
        assert "db-0 (shardlease:old)" in old["message"] and "db-1" not in old["message"], old
        assert "shardlease:test" in old["message"]
        # Recreated, it gets the agent the operator injects now.
        await core.delete_namespaced_pod("db-0", namespace, grace_period_seconds=0)
        await eventually(lambda: _gone(core, namespace, "db-0"), "db-0 deleted")
        created = await core.create_namespaced_pod(namespace, pod_for(sts, 0))
        assert has_agent(created)
        await mark_ready(api, namespace, "db-0")
        # (A pod's readiness reaches the operator through its StatefulSet's status.)
        await apps.patch_namespaced_stateful_set_status("db", namespace, {"status": {
            "replicas": 2, "readyReplicas": 2}})
        now = await eventually(lambda: current("True"), "AgentsCurrent=True once recreated")
        assert "shardlease:test" in now["message"]
    finally:
        proc.stop()
        await client.AdmissionregistrationV1Api(api).delete_mutating_webhook_configuration(
            webhook)


async def _gone(core: client.CoreV1Api, namespace: str, name: str) -> bool:
    try:
        await core.read_namespaced_pod(name, namespace)
    except client.ApiException as e:
        return e.status == 404
    return False


async def test_a_reconciliation_that_failed_is_retried_until_it_succeeds(
        namespace: str, kubeconfig: str, api_client: client.ApiClient, tmp_path: Path) -> None:
    """kopf never retries an event handler: the operator must. Here the
    operator's account lacks the RoleBinding permission at first (a real 403
    from the API server), and gets it later, with no change to the
    StatefulSet: the RoleBinding must still appear."""
    api = api_client
    apps, rbac = client.AppsV1Api(api), client.RbacAuthorizationV1Api(api)
    await apply_crd(api)
    helm = str(cpmod.ensure_binaries(("helm",))["helm"])
    roles = chart_cluster_roles(helm, tmp_path / "helm")
    created = await apply_cluster_roles(api, roles)
    operator_role = next(r for r in roles if r["metadata"]["name"] == "shardlease-operator")
    partial = f"shardlease-operator-partial-{namespace}"
    full_rules = operator_role["rules"]
    without_rolebindings = [r for r in full_rules if "rolebindings" not in r["resources"]]
    assert len(without_rolebindings) < len(full_rules)
    await rbac.create_cluster_role({"metadata": {"name": partial},
                                    "rules": without_rolebindings})
    proc = None
    try:
        await bind_cluster_role(api, namespace, partial, "op")
        operator_kc = await service_account_kubeconfig(
            api, kubeconfig, namespace, "op", tmp_path / "op.kubeconfig")
        await client.CoreV1Api(api).create_namespaced_service_account(
            namespace, {"metadata": {"name": "db-app"}})
        body = statefulset("db", namespace, {"shardlease.io/shards": "4"})
        body["spec"]["template"]["spec"]["serviceAccountName"] = "db-app"
        await apps.create_namespaced_stateful_set(namespace, body)
        proc = spawn("operator", ["operator", "--namespace", namespace, "--agent-image", "x",
                                  "--http", ""], tmp_path, env={"KUBECONFIG": operator_kc})

        async def refused_once() -> bool:
            return "reconciling failed" in proc.log.read_text(errors="replace")
        await eventually(refused_once, "the RoleBinding to be refused (403)")
        assert "Configured" not in await conditions(api, namespace, "db")

        # The permission arrives; nothing about the StatefulSet changes.
        await rbac.patch_cluster_role(partial, {"rules": full_rules})

        async def bound() -> Any:
            try:
                return await rbac.read_namespaced_role_binding("shardlease-agent-db", namespace)
            except client.ApiException:
                return None
        rb = await eventually(bound, "the retried reconciliation to bind the agent's role")
        assert [(s.kind, s.name) for s in rb.subjects] == [("ServiceAccount", "db-app")]
        c = await eventually(lambda: _configured(api, namespace), "Configured=True")
        assert c["reason"] == "AnnotationsValid"
        async def logged() -> bool:  # written just after the condition
            return "reconciled after retrying" in proc.log.read_text(errors="replace")
        await eventually(logged, "the retry to be logged", 10)
    finally:
        if proc is not None:
            proc.stop()
        await rbac.delete_cluster_role(partial)
        await delete_cluster_roles(api, created)


async def _configured(api: client.ApiClient, ns: str) -> dict[str, Any] | None:
    c = (await conditions(api, ns, "db")).get("Configured")
    return c if c and c["status"] == "True" else None


async def test_a_status_nobody_refreshes_is_marked_unknown(
        namespace: str, kubeconfig: str, api_client: client.ApiClient, tmp_path: Path) -> None:
    """Every agent stopped: the last Balanced=True must not stand forever."""
    import datetime as dt

    api = api_client
    custom = client.CustomObjectsApi(api)
    await apply_crd(api)
    for name in ("old", "fresh"):
        await custom.create_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, {
            "apiVersion": f"{GROUP}/{VERSION}", "kind": "ShardSet",
            "metadata": {"name": name},
            "spec": {"statefulSet": name, "shards": 2, "store": f"kubernetes://{namespace}",
                     "leaseTTL": 3}})
    long_ago = (dt.datetime.now(dt.UTC) - dt.timedelta(minutes=5)).strftime("%Y-%m-%dT%H:%M:%SZ")
    for name, seen in (("old", long_ago), ("fresh", "2999-01-01T00:00:00Z")):
        await custom.patch_namespaced_custom_object_status(
            GROUP, VERSION, namespace, PLURAL, name, {"status": {
                "observedTime": seen, "publishedBy": f"{name}-0", "conditions": [{
                    "type": "Balanced", "status": "True", "reason": "FairShares",
                    "message": "2 shard(s)", "lastTransitionTime": long_ago}]}},
            _content_type="application/merge-patch+json")
    proc = spawn("operator", ["operator", "--namespace", namespace, "--agent-image", "x",
                              "--http", ""], tmp_path, env={"KUBECONFIG": kubeconfig})
    try:
        async def unknown() -> dict[str, Any] | None:
            c = (await conditions(api, namespace, "old")).get("Balanced")
            return c if c and c["status"] == "Unknown" else None
        c = await eventually(unknown, "Balanced=Unknown on the stale ShardSet", 30)
        assert c["reason"] == "StatusStale" and "old-0" in c["message"]
        fresh = (await conditions(api, namespace, "fresh"))["Balanced"]
        assert fresh["status"] == "True"
    finally:
        proc.stop()


async def test_two_replicas_one_leader_and_the_other_takes_over(
        namespace: str, kubeconfig: str, api_client: client.ApiClient, tmp_path: Path) -> None:
    """With --leader-election only the holder of the Lease reconciles; killed,
    its Lease expires and the other replica reconciles what came meanwhile."""
    import signal

    api = api_client
    apps, coord = client.AppsV1Api(api), client.CoordinationV1Api(api)
    custom = client.CustomObjectsApi(api)
    await apply_crd(api)
    sa = client.CoreV1Api(api)
    await sa.create_namespaced_service_account(namespace, {"metadata": {"name": "db-app"}})
    procs, ports = [], []
    for i in range(2):
        (tmp_path / f"r{i}").mkdir()
        cert = make_webhook_cert(tmp_path / f"r{i}" / "certs")
        ports.append(free_port())
        procs.append(spawn("operator", [
            "operator", "--namespace", namespace, "--agent-image", "x", "--http", "",
            "--leader-election", "--leader-election-namespace", namespace,
            "--webhook-cert-dir", str(tmp_path / f"r{i}" / "certs"), "--webhook-addr",
            "127.0.0.1", "--webhook-port", str(ports[-1])],
            tmp_path / f"r{i}", env={"KUBECONFIG": kubeconfig}))
    webhook = f"shardlease-{namespace}"
    try:
        def sts(name: str) -> dict[str, Any]:
            body = statefulset(name, namespace, {"shardlease.io/shards": "2"})
            body["spec"]["template"]["spec"]["serviceAccountName"] = "db-app"
            return body

        async def shardset(name: str) -> bool:
            try:
                await custom.get_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL,
                                                          name)
                return True
            except client.ApiException:
                return False
        await apps.create_namespaced_stateful_set(namespace, sts("one"))
        await eventually(lambda: shardset("one"), "the leader to create ShardSet one")
        lease = await coord.read_namespaced_lease("shardlease-operator", namespace)
        holder = lease.spec.holder_identity
        leader = next(p for p in procs if holder.endswith(f"/{p.popen.pid}"))
        follower = next(p for p in procs if p is not leader)
        assert "created ShardSet" not in follower.log.read_text()
        assert "is now the leader" not in follower.log.read_text()

        # The follower serves the webhook from its own view of the StatefulSets.
        port = ports[procs.index(follower)]
        cert = (tmp_path / f"r{procs.index(follower)}" / "certs" / "tls.crt").read_bytes()
        # Fail, not Ignore: a webhook that did not answer must not pass as one that did.
        await register_webhook(api, namespace, port, cert, "Fail")
        three = api.sanitize_for_serialization(
            await apps.create_namespaced_stateful_set(namespace, sts("three")))
        # Long after its watch showed the follower StatefulSet `three` (so it
        # answers from its cache, not from its first listing or a read).
        await asyncio.sleep(3)
        pod = await sa.create_namespaced_pod(namespace, pod_for(three, 0))
        assert has_agent(pod), "the follower did not inject the agent"

        leader.signal(signal.SIGKILL)
        await apps.create_namespaced_stateful_set(namespace, sts("two"))
        await eventually(lambda: shardset("two"), "the other replica to take over", 60)
        lease = await coord.read_namespaced_lease("shardlease-operator", namespace)
        assert lease.spec.holder_identity.endswith(f"/{follower.popen.pid}")
        assert lease.spec.lease_transitions == 1
        assert "is now the leader" in follower.log.read_text()
    finally:
        for p in procs:
            p.stop()
        with contextlib.suppress(client.ApiException):
            await client.AdmissionregistrationV1Api(api).delete_mutating_webhook_configuration(
                webhook)


async def test_an_account_name_the_isolation_policies_cannot_name_is_reported(
        namespace: str, kubeconfig: str, api_client: client.ApiClient, tmp_path: Path) -> None:
    # A ServiceAccount name may be 253 characters, a label value only 63: the
    # ShardSet cannot carry the account label the isolation policies match,
    # so they cannot protect its leases. Before, only a line in the
    # operator's log said so.
    api = api_client
    apps = client.AppsV1Api(api)
    await apply_crd(api)
    long_name = "a" * 64 + "-agents"
    body = statefulset("db", namespace, {"shardlease.io/shards": "4"})
    body["spec"]["template"]["spec"]["serviceAccountName"] = long_name
    await apps.create_namespaced_stateful_set(namespace, body)
    proc, webhook = await start_operator(api, namespace, kubeconfig, tmp_path)
    try:
        async def unlabelled() -> dict[str, Any] | None:
            c = (await conditions(api, namespace, "db")).get("AccountLabelled")
            return c if c and c["status"] == "False" else None
        c = await eventually(unlabelled, "AccountLabelled=False for a 71-character account")
        assert c["reason"] == "AccountNameTooLong" and long_name in c["message"]
        await event_reasons(api, namespace, "involvedObject.name=db", {"AccountNameTooLong"})

        # A name that fits: the label is set and the condition says so.
        await apps.patch_namespaced_stateful_set("db", namespace, {"spec": {"template": {
            "spec": {"serviceAccountName": "db-agents"}}}})

        async def labelled() -> dict[str, Any] | None:
            c = (await conditions(api, namespace, "db")).get("AccountLabelled")
            return c if c and c["status"] == "True" else None
        await eventually(labelled, "AccountLabelled=True once the name fits")
        shardset = await client.CustomObjectsApi(api).get_namespaced_custom_object(
            "shardlease.io", "v1alpha1", namespace, "shardsets", "db")
        assert shardset["metadata"]["labels"]["shardlease.io/service-account"] == "db-agents"
    finally:
        proc.stop()
        await client.AdmissionregistrationV1Api(api).delete_mutating_webhook_configuration(
            webhook)
