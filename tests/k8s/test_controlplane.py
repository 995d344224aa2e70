"""The control plane the Kubernetes tests run against behaves like Kubernetes."""

from __future__ import annotations

import asyncio
import json
import subprocess

import pytest
from kubernetes_asyncio import client
from kubernetes_asyncio.client.rest import ApiException

from .conftest import cpmod

pytestmark = [pytest.mark.slow, pytest.mark.asyncio]


def _lease(name: str, holder: str | None = None, labels: dict | None = None) -> client.V1Lease:
    return client.V1Lease(
        metadata=client.V1ObjectMeta(name=name, labels=labels or {}),
        spec=client.V1LeaseSpec(holder_identity=holder, lease_duration_seconds=15))


async def test_version_is_pinned(api_client):
    info = await client.VersionApi(api_client).get_code()
    assert info.git_version == cpmod.K8S_VERSION
    assert info.major == "1"
    assert info.minor == cpmod.K8S_MINOR


async def test_lease_replace_with_stale_resource_version_conflicts(api_client, namespace):
    coord = client.CoordinationV1Api(api_client)
    created = await coord.create_namespaced_lease(namespace, _lease("shard-0", "node-a"))
    stale_rv = created.metadata.resource_version

    created.spec.holder_identity = "node-b"
    updated = await coord.replace_namespaced_lease("shard-0", namespace, created)
    assert updated.spec.holder_identity == "node-b"
    assert updated.metadata.resource_version != stale_rv

    # A writer that still holds the old version must lose the compare-and-swap.
    stale = _lease("shard-0", "node-c")
    stale.metadata.resource_version = stale_rv
    with pytest.raises(ApiException) as exc:
        await coord.replace_namespaced_lease("shard-0", namespace, stale)
    assert exc.value.status == 409

    # Creating an existing lease is a conflict too (create-if-absent).
    with pytest.raises(ApiException) as exc:
        await coord.create_namespaced_lease(namespace, _lease("shard-0", "node-d"))
    assert exc.value.status == 409

    current = await coord.read_namespaced_lease("shard-0", namespace)
    assert current.spec.holder_identity == "node-b"


async def test_label_selector_filters_list(api_client, namespace):
    coord = client.CoordinationV1Api(api_client)
    for i, group in enumerate(["a", "a", "b"]):
        await coord.create_namespaced_lease(
            namespace, _lease(f"l-{i}", labels={"shardlease.test/group": group}))
    a = await coord.list_namespaced_lease(namespace, label_selector="shardlease.test/group=a")
    assert sorted(x.metadata.name for x in a.items) == ["l-0", "l-1"]
    not_a = await coord.list_namespaced_lease(namespace, label_selector="shardlease.test/group!=a")
    assert [x.metadata.name for x in not_a.items] == ["l-2"]
    everything = await coord.list_namespaced_lease(namespace)
    assert len(everything.items) == 3


async def _until_allowed(call, timeout: float = 10.0):
    """RBAC changes reach the authorizer through an informer: retry 403s briefly."""
    deadline = asyncio.get_running_loop().time() + timeout
    while True:
        try:
            return await call()
        except ApiException as e:
            if e.status != 403 or asyncio.get_running_loop().time() > deadline:
                raise
            await asyncio.sleep(0.2)


async def test_serviceaccount_token_authenticates_and_rbac_denies(
        api_client, namespace, controlplane):
    core = client.CoreV1Api(api_client)
    rbac = client.RbacAuthorizationV1Api(api_client)
    await core.create_namespaced_service_account(
        namespace, client.V1ServiceAccount(metadata=client.V1ObjectMeta(name="worker")))
    tr = await core.create_namespaced_service_account_token(
        "worker", namespace,
        client.AuthenticationV1TokenRequest(
            spec=client.V1TokenRequestSpec(audiences=[], expiration_seconds=600)))
    token = tr.status.token
    assert token

    cfg = client.Configuration(host=controlplane.server)
    cfg.ssl_ca_cert = str(controlplane.pki / "ca.crt")
    cfg.api_key = {"BearerToken": token}
    cfg.api_key_prefix = {"BearerToken": "Bearer"}
    async with client.ApiClient(configuration=cfg) as sa_api:
        # The token authenticates as the service account.
        review = await client.AuthenticationV1Api(sa_api).create_self_subject_review(
            client.V1SelfSubjectReview())
        assert review.status.user_info.username == f"system:serviceaccount:{namespace}:worker"

        sa_coord = client.CoordinationV1Api(sa_api)
        # Nothing granted yet: denied.
        with pytest.raises(ApiException) as exc:
            await sa_coord.list_namespaced_lease(namespace)
        assert exc.value.status == 403

        # Grant get/list on leases in this namespace only.
        await rbac.create_namespaced_role(namespace, client.V1Role(
            metadata=client.V1ObjectMeta(name="lease-reader"),
            rules=[client.V1PolicyRule(api_groups=["coordination.k8s.io"],
                                       resources=["leases"], verbs=["get", "list"])]))
        await rbac.create_namespaced_role_binding(namespace, client.V1RoleBinding(
            metadata=client.V1ObjectMeta(name="lease-reader"),
            role_ref=client.V1RoleRef(api_group="rbac.authorization.k8s.io",
                                      kind="Role", name="lease-reader"),
            subjects=[client.RbacV1Subject(kind="ServiceAccount", name="worker",
                                           namespace=namespace)]))
        listed = await _until_allowed(lambda: sa_coord.list_namespaced_lease(namespace))
        assert listed.items == []

        # What is not granted stays denied: writes here, reads elsewhere.
        with pytest.raises(ApiException) as exc:
            await sa_coord.create_namespaced_lease(namespace, _lease("x", "worker"))
        assert exc.value.status == 403
        with pytest.raises(ApiException) as exc:
            await sa_coord.list_namespaced_lease("default")
        assert exc.value.status == 403
        with pytest.raises(ApiException) as exc:
            await client.CoreV1Api(sa_api).list_namespaced_secret(namespace)
        assert exc.value.status == 403

    # A garbage token does not authenticate at all.
    cfg.api_key = {"BearerToken": token[:-4] + "AAAA"}
    async with client.ApiClient(configuration=cfg) as bad_api:
        with pytest.raises(ApiException) as exc:
            await client.CoordinationV1Api(bad_api).list_namespaced_lease(namespace)
        assert exc.value.status == 401


async def test_kubectl_talks_to_the_control_plane(kubeconfig, namespace):
    try:
        kubectl = cpmod.ensure_binaries(["kubectl"])["kubectl"]
    except cpmod.BuildError as e:
        pytest.fail(f"cannot build kubectl:\n{e}", pytrace=False)
    out = await asyncio.to_thread(
        subprocess.run, [str(kubectl), "--kubeconfig", kubeconfig, "version", "-o", "json"],
        capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    v = json.loads(out.stdout)
    assert v["clientVersion"]["gitVersion"] == cpmod.K8S_VERSION
    assert v["serverVersion"]["gitVersion"] == cpmod.K8S_VERSION
    out = await asyncio.to_thread(
        subprocess.run, [str(kubectl), "--kubeconfig", kubeconfig, "get", "namespace",
                         namespace, "-o", "jsonpath={.metadata.name}"],
        capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout == namespace
