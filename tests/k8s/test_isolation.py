"""The chart's isolation policies (templates/isolation.yaml) on a real
kube-apiserver: two ShardSets in one namespace, each with its agents'
ServiceAccount bound to the chart's agent role. Acting as A's account, every
write to B's Leases (by name, by label, relabelled) and to B's status is
refused with the policy's message, and so is any Lease that is not a
shardlease one under `isolation.strictLeases` (without it, A's application
may use Leases of its own); A's own writes and B's own keep working. No
ServiceAccount may write the kubelet's word that it stops a container
(an Event `Killing`) about a ShardSet's pods: the agents pause on it.

The policies are the ones `helm template` renders, bound to this test's
namespace only (the API server is shared with the other tests)."""

from __future__ import annotations

import contextlib
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from kubernetes_asyncio import client, config

from .conftest import cpmod
from .scenario import (
    apply_cluster_roles,
    apply_crd,
    bind_cluster_role,
    chart_cluster_roles,
    chart_documents,
    delete_cluster_roles,
    eventually,
    service_account_kubeconfig,
)

GROUP, VERSION, PLURAL = "shardlease.io", "v1alpha1", "shardsets"
AGENT_ROLE = "shardlease-agent"

pytestmark = pytest.mark.slow


@contextlib.asynccontextmanager
async def policies_in(api: client.ApiClient, namespace: str,
                      docs: list[dict[str, Any]]) -> AsyncIterator[None]:
    """The chart's policies under names of this test, bound to `namespace` only."""
    adm = client.AdmissionregistrationV1Api(api)
    made: list[tuple[str, str]] = []
    try:
        for doc in docs:
            doc = dict(doc)
            doc["metadata"] = {**doc["metadata"], "name": f"{doc['metadata']['name']}-{namespace}"}
            if doc["kind"] == "ValidatingAdmissionPolicy":
                await adm.create_validating_admission_policy(doc)
            else:
                spec = dict(doc["spec"])
                spec["policyName"] = f"{spec['policyName']}-{namespace}"
                spec["matchResources"] = {"namespaceSelector": {"matchLabels": {
                    "kubernetes.io/metadata.name": namespace}}}
                doc["spec"] = spec
                await adm.create_validating_admission_policy_binding(doc)
            made.append((doc["kind"], doc["metadata"]["name"]))
        yield
    finally:
        for kind, name in reversed(made):
            with contextlib.suppress(client.ApiException):
                if kind == "ValidatingAdmissionPolicy":
                    await adm.delete_validating_admission_policy(name)
                else:
                    await adm.delete_validating_admission_policy_binding(name)


async def client_for(kubeconfig: str) -> client.ApiClient:
    cfg = client.Configuration()
    await config.load_kube_config(config_file=kubeconfig, client_configuration=cfg)
    return client.ApiClient(configuration=cfg)


def lease(name: str, cluster: str | None) -> dict[str, Any]:
    labels = {"shardlease.io/cluster": cluster} if cluster else {}
    return {"apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
            "metadata": {"name": name, "labels": labels}, "spec": {"holderIdentity": "x"}}


async def refused(call: Any, *args: Any, **kwargs: Any) -> str:
    """The message of the 403 a call gets (fails if it is not refused)."""
    try:
        await call(*args, **kwargs)
    except client.ApiException as e:
        assert e.status == 403, (e.status, e.body)
        return str(e.body)
    raise AssertionError(f"{getattr(call, '__name__', call)}{args[:2]} was allowed")


def event(pod: str, reason: str, ns: str) -> dict[str, Any]:
    """A core/v1 Event about a container of `pod`, shaped as the kubelet's."""
    now = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    return {"metadata": {"generateName": f"{pod}."}, "reason": reason, "type": "Normal",
            "message": "Stopping container app", "count": 1,
            "firstTimestamp": now, "lastTimestamp": now, "source": {"component": "kubelet"},
            "involvedObject": {"kind": "Pod", "name": pod, "namespace": ns,
                               "fieldPath": "spec.containers{app}"}}


async def kubelets_word_is_not_forged(admin_api: client.ApiClient, a_api: client.ApiClient,
                                      ns: str) -> None:
    core = client.CoreV1Api(a_api)

    async def in_force() -> str | None:
        try:
            made = await core.create_namespaced_event(ns, event("b-0", "Killing", ns))
        except client.ApiException as e:
            return str(e.body) if e.status == 403 else None
        await client.CoreV1Api(admin_api).delete_namespaced_event(made.metadata.name, ns)
        return None
    msg = await eventually(in_force, "the policy to refuse a forged Killing event", 60)
    assert "only the kubelet announces" in msg and "ShardSet b" in msg, msg
    # About A's own pods too: nobody but the kubelet says it.
    assert "ShardSet a" in await refused(core.create_namespaced_event, ns,
                                          event("a-1", "Killing", ns))
    # Through the newer Events API as well.
    micro = time.strftime("%Y-%m-%dT%H:%M:%S.000000Z", time.gmtime())
    assert "only the kubelet announces" in await refused(
        client.EventsV1Api(a_api).create_namespaced_event, ns, {
            "metadata": {"generateName": "b-0-"}, "reason": "Killing", "action": "Killing",
            "type": "Normal", "eventTime": micro, "reportingController": "kubelet",
            "reportingInstance": "node-1",
            "regarding": {"kind": "Pod", "name": "b-0", "namespace": ns}})
    # An event of another reason turned into one.
    released = await core.create_namespaced_event(ns, event("b-0", "Released", ns))
    assert "only the kubelet announces" in await refused(
        core.patch_namespaced_event, released.metadata.name, ns, {"reason": "Killing"})
    # The agents' own events, and a Killing event about a pod of no ShardSet, pass.
    await core.create_namespaced_event(ns, event("web-0", "Killing", ns))


@pytest.mark.parametrize("strict", [False, True], ids=["default", "strictLeases"])
async def test_one_shardsets_agents_cannot_touch_anothers_leases_or_status(
        namespace: str, kubeconfig: str, api_client: client.ApiClient, tmp_path: Path,
        strict: bool) -> None:
    api, ns = api_client, namespace
    helm = str(cpmod.ensure_binaries(("helm",))["helm"])
    await apply_crd(api)
    created = await apply_cluster_roles(api, chart_cluster_roles(helm, tmp_path))
    custom = client.CustomObjectsApi(api)
    try:
        configs = {}
        for name in ("a", "b"):
            account = f"sa-{name}"
            # As the operator makes them: labelled with the agents' account.
            await custom.create_namespaced_custom_object(GROUP, VERSION, ns, PLURAL, {
                "apiVersion": f"{GROUP}/{VERSION}", "kind": "ShardSet",
                "metadata": {"name": name, "labels": {
                    "app.kubernetes.io/managed-by": "shardlease",
                    "shardlease.io/service-account": account}},
                "spec": {"statefulSet": name, "shards": 2, "store": f"kubernetes://{ns}"}})
            configs[name] = await service_account_kubeconfig(
                api, kubeconfig, ns, account, tmp_path / f"{account}.kubeconfig")
            await bind_cluster_role(api, ns, AGENT_ROLE, account)
        admin = client.CoordinationV1Api(api)
        await admin.create_namespaced_lease(ns, lease("other-app-leader", None))
        policies = chart_documents(
            helm, tmp_path, "ValidatingAdmissionPolicy", "ValidatingAdmissionPolicyBinding",
            args=("--api-versions", "admissionregistration.k8s.io/v1/ValidatingAdmissionPolicy",
                  "--set", f"isolation.strictLeases={str(strict).lower()}"))
        assert len(policies) == 6
        async with policies_in(api, ns, policies):
            a_api, b_api = await client_for(configs["a"]), await client_for(configs["b"])
            try:
                a, b = client.CoordinationV1Api(a_api), client.CoordinationV1Api(b_api)
                # B's agents write B's lease (and may, once the policy is in force).
                await b.create_namespaced_lease(ns, lease("shardlease.b.shard.0", "b"))

                async def in_force() -> str | None:
                    try:
                        await a.create_namespaced_lease(ns, lease("shardlease.b.shard.1", "a"))
                    except client.ApiException as e:
                        return str(e.body) if e.status == 403 else None
                    await admin.delete_namespaced_lease("shardlease.b.shard.1", ns)
                    return None
                msg = await eventually(in_force, "the policy to refuse A a lease named B's", 60)
                assert "belongs to ShardSet b" in msg and "sa-b" in msg, msg

                # A's own leases: created, changed, deleted.
                mine = await a.create_namespaced_lease(ns, lease("shardlease.a.shard.0", "a"))
                mine.spec.holder_identity = "a-0"
                await a.replace_namespaced_lease("shardlease.a.shard.0", ns, mine)
                await a.create_namespaced_lease(ns, lease("shardlease.a.node.a-0", "a"))
                await a.delete_namespaced_lease("shardlease.a.node.a-0", ns)

                # B's: changed, relabelled, deleted, or made under another name.
                theirs = await admin.read_namespaced_lease("shardlease.b.shard.0", ns)
                theirs.spec.holder_identity = "a-0"
                assert "belongs to ShardSet b" in await refused(
                    a.replace_namespaced_lease, "shardlease.b.shard.0", ns, theirs)
                theirs.metadata.labels = {"shardlease.io/cluster": "a"}
                assert "belongs to ShardSet b" in await refused(
                    a.replace_namespaced_lease, "shardlease.b.shard.0", ns, theirs)
                assert "belongs to ShardSet b" in await refused(
                    a.patch_namespaced_lease, "shardlease.b.shard.0", ns,
                    {"metadata": {"labels": {"shardlease.io/cluster": None}}})
                assert "belongs to ShardSet b" in await refused(
                    a.delete_namespaced_lease, "shardlease.b.shard.0", ns)
                assert "belongs to ShardSet b" in await refused(
                    a.create_namespaced_lease, ns, lease("shardlease-h.shard.0123abcd", "b"))
                if strict:
                    # No Lease that is not a shardlease one (another app's leader election).
                    other = await refused(a.patch_namespaced_lease, "other-app-leader", ns,
                                          {"spec": {"holderIdentity": "a-0"}})
                    assert "may change only shardlease Leases" in other, other
                    assert "may change only shardlease Leases" in await refused(
                        a.create_namespaced_lease, ns, lease("my-leader", None))
                else:
                    # A's application elects its leader with a Lease of its own.
                    await a.create_namespaced_lease(ns, lease("my-leader", None))
                    await a.delete_namespaced_lease("my-leader", ns)
                # B's lease is as B left it; B still changes it.
                kept = await b.read_namespaced_lease("shardlease.b.shard.0", ns)
                assert kept.spec.holder_identity == "x"
                assert kept.metadata.labels == {"shardlease.io/cluster": "b"}
                kept.spec.holder_identity = "b-0"
                await b.replace_namespaced_lease("shardlease.b.shard.0", ns, kept)

                # The published owners: A's agents publish A's only.
                a_custom = client.CustomObjectsApi(a_api)
                forged = {"status": {"owners": {"0": "a-0"}, "publishedBy": "a-0"}}

                async def status_refused() -> str | None:
                    # (A policy of its own: it may come into force after the
                    # leases' one.)
                    try:
                        await a_custom.patch_namespaced_custom_object_status(
                            GROUP, VERSION, ns, PLURAL, "b", {"status": {"publishedBy": "x"}},
                            _content_type="application/merge-patch+json")
                    except client.ApiException as e:
                        return str(e.body) if e.status == 403 else None
                    return None
                await eventually(status_refused, "the policy to refuse A B's status", 60)
                status = await refused(a_custom.patch_namespaced_custom_object_status,
                                       GROUP, VERSION, ns, PLURAL, "b", forged,
                                       _content_type="application/merge-patch+json")
                assert "status of ShardSet b is published by its agents" in status, status
                got = await custom.get_namespaced_custom_object(GROUP, VERSION, ns, PLURAL, "b")
                assert "owners" not in (got.get("status") or {}), got
                await a_custom.patch_namespaced_custom_object_status(
                    GROUP, VERSION, ns, PLURAL, "a", forged,
                    _content_type="application/merge-patch+json")

                await kubelets_word_is_not_forged(api, a_api, ns)
            finally:
                await a_api.close()
                await b_api.close()
    finally:
        await delete_cluster_roles(api, created)
