"""The operator on a real kube-apiserver, beyond the happy path: a pod that
arrives right behind its StatefulSet, the `default` ServiceAccount, and Ready
pods that run without the agent."""

from __future__ import annotations

import base64
from pathlib import Path
from typing import Any

import pytest
from kubernetes_asyncio import client

from .scenario import (
    Proc,
    apply_crd,
    eventually,
    free_port,
    make_webhook_cert,
    mark_ready,
    pod_for,
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
                         tmp_path: Path) -> tuple[Proc, str]:
    cert = make_webhook_cert(tmp_path / "certs")
    port = free_port()
    proc = spawn("operator", [
        "operator", "--namespace", namespace, "--agent-image", "shardlease:test",
        "--webhook-cert-dir", str(tmp_path / "certs"), "--webhook-addr", "127.0.0.1",
        "--webhook-port", str(port), "--liveness", ""], tmp_path,
        env={"KUBECONFIG": kubeconfig})
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
            "failurePolicy": "Ignore", "sideEffects": "None",
            "admissionReviewVersions": ["v1"], "timeoutSeconds": 5,
        }]})
    return proc, webhook


async def test_pods_created_right_behind_their_statefulset_get_the_agent(
        namespace: str, kubeconfig: str, api_client: client.ApiClient, tmp_path: Path) -> None:
    api = api_client
    apps, core = client.AppsV1Api(api), client.CoreV1Api(api)
    await apply_crd(api)
    proc, webhook = await start_operator(api, namespace, kubeconfig, tmp_path)
    try:
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

        # A StatefulSet that did not opt in, just as fresh, is left alone.
        plain = api.sanitize_for_serialization(await apps.create_namespaced_stateful_set(
            namespace, statefulset("plain", namespace, {})))
        assert not has_agent(await core.create_namespaced_pod(namespace, pod_for(plain, 0)))
    finally:
        proc.stop()
        await client.AdmissionregistrationV1Api(api).delete_mutating_webhook_configuration(
            webhook)


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
        events = await core.list_namespaced_event(
            namespace, field_selector="involvedObject.name=db")
        reasons = {ev.reason for ev in events.items}
        assert {"DefaultServiceAccount", "AgentMissing"} <= reasons, reasons

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
        c = (await conditions(api, namespace, "db"))["Configured"]
        assert (c["status"], c["reason"]) == ("True", "AnnotationsValid")
    finally:
        proc.stop()
        await client.AdmissionregistrationV1Api(api).delete_mutating_webhook_configuration(
            webhook)
