"""The ShardSet CRD on a real API server: its schema refuses bad specs."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest
from kubernetes_asyncio import client

from .scenario import apply_crd

GOOD = {"statefulSet": "db", "shards": 4, "store": "kubernetes://ns"}


def shardset(name: str, spec: dict[str, Any]) -> dict[str, Any]:
    return {"apiVersion": "shardlease.io/v1alpha1", "kind": "ShardSet",
            "metadata": {"name": name}, "spec": spec}


@pytest.mark.parametrize(("change", "complaint"), [
    ({"shards": 0}, "spec.shards"),
    ({"shards": 8193}, "spec.shards"),
    ({"leaseTTL": 0}, "spec.leaseTTL"),
    ({"leaseTTL": 3601}, "spec.leaseTTL"),
    ({"interval": -1}, "spec.interval"),
    ({"margin": 20}, "margin must be less than leaseTTL"),
    ({"leaseTTL": 6, "interval": 5.5}, "interval must be less than leaseTTL - margin"),
    ({"store": "ftp://somewhere"}, "spec.store"),
    ({"store": None}, "spec.store"),
    ({"host": {"url": "localhost:8080"}}, "spec.host.url"),
])
async def test_a_bad_spec_is_refused_with_the_field_named(
        namespace: str, api_client: client.ApiClient, change: dict[str, Any],
        complaint: str) -> None:
    await apply_crd(api_client)
    spec = {k: v for k, v in {**GOOD, **change}.items() if v is not None}
    with pytest.raises(client.ApiException) as caught:
        await client.CustomObjectsApi(api_client).create_namespaced_custom_object(
            "shardlease.io", "v1alpha1", namespace, "shardsets", shardset("bad", spec))
    assert caught.value.status == 422
    assert complaint in caught.value.body


async def test_a_good_spec_gets_the_defaults(namespace: str, api_client: client.ApiClient) -> None:
    await apply_crd(api_client)
    made = await client.CustomObjectsApi(api_client).create_namespaced_custom_object(
        "shardlease.io", "v1alpha1", namespace, "shardsets", shardset("good", GOOD))
    assert made["spec"]["leaseTTL"] == 15
    assert made["spec"]["maxConcurrency"] == 16


async def test_the_status_of_the_largest_shardset_fits_with_the_longest_pod_names(
        namespace: str, api_client: client.ApiClient) -> None:
    """8192 shards (the CRD's maximum), 63-character pod names, ten-digit
    generations: the status an agent publishes must be accepted."""
    from shardlease.k8s.spec import MAX_SHARDS
    from shardlease.k8s.status import build_status, merge_conditions
    from shardlease.loop import Owner

    await apply_crd(api_client)
    custom = client.CustomObjectsApi(api_client)
    await custom.create_namespaced_custom_object(
        "shardlease.io", "v1alpha1", namespace, "shardsets",
        shardset("big", {**GOOD, "shards": MAX_SHARDS}))
    pods = [f"{'p' * (62 - len(str(i)))}-{i}" for i in range(16)]
    assert {len(p) for p in pods} == {63}
    owners = [Owner(shard=s, owner=pods[s % 16], generation=4_000_000_000 + s,
                    since=1_800_000_000.0 + s)
              for s in range(MAX_SHARDS)]
    status = build_status(owners, pods, MAX_SHARDS, 1, pods[0])
    status["conditions"] = merge_conditions(status["conditions"], None, 1)  # as the agent does
    size = len(json.dumps(status))
    print(f"status of {MAX_SHARDS} shards: {size / 1e6:.2f} MB")
    await custom.patch_namespaced_custom_object_status(
        "shardlease.io", "v1alpha1", namespace, "shardsets", "big", {"status": status},
        _content_type="application/merge-patch+json")
    got = await custom.get_namespaced_custom_object(
        "shardlease.io", "v1alpha1", namespace, "shardsets", "big")
    assert got["status"]["ownedShards"] == MAX_SHARDS
    assert len(got["status"]["owners"]) == MAX_SHARDS


async def test_the_statefulset_of_a_shardset_cannot_change(
        namespace: str, api_client: client.ApiClient) -> None:
    await apply_crd(api_client)
    custom = client.CustomObjectsApi(api_client)
    await custom.create_namespaced_custom_object(
        "shardlease.io", "v1alpha1", namespace, "shardsets", shardset("pinned", GOOD))
    with pytest.raises(client.ApiException) as caught:
        await custom.patch_namespaced_custom_object(
            "shardlease.io", "v1alpha1", namespace, "shardsets", "pinned",
            {"spec": {"statefulSet": "other"}}, _content_type="application/merge-patch+json")
    assert caught.value.status == 422
    assert "statefulSet is immutable" in caught.value.body
    # Everything else may change.
    await custom.patch_namespaced_custom_object(
        "shardlease.io", "v1alpha1", namespace, "shardsets", "pinned",
        {"spec": {"shards": 8}}, _content_type="application/merge-patch+json")


async def test_a_condition_needs_a_reason_a_message_and_a_transition_time(
        namespace: str, api_client: client.ApiClient) -> None:
    await apply_crd(api_client)
    custom = client.CustomObjectsApi(api_client)
    await custom.create_namespaced_custom_object(
        "shardlease.io", "v1alpha1", namespace, "shardsets", shardset("conds", GOOD))
    with pytest.raises(client.ApiException) as caught:
        await custom.patch_namespaced_custom_object_status(
            "shardlease.io", "v1alpha1", namespace, "shardsets", "conds",
            {"status": {"conditions": [{"type": "Balanced", "status": "True"}]}},
            _content_type="application/merge-patch+json")
    assert caught.value.status == 422
    for field in ("reason", "message", "lastTransitionTime"):
        assert field in caught.value.body


async def test_shardsets_are_not_in_kubectl_get_all(api_client: client.ApiClient) -> None:
    await apply_crd(api_client)
    crd = await client.ApiextensionsV1Api(api_client).read_custom_resource_definition(
        "shardsets.shardlease.io")
    assert "all" not in (crd.spec.names.categories or [])
    columns = [c.name for c in crd.spec.versions[0].additional_printer_columns]
    assert columns == ["Shards", "Owned", "Live", "Ready", "Balanced", "Configured", "Store",
                       "Age", "Message"]


async def test_the_crd_upgrades_in_place_with_server_side_apply(
        namespace: str, kubeconfig: str, api_client: client.ApiClient, tmp_path: Any) -> None:
    """README's upgrade step, as typed: `kubectl apply --server-side
    --force-conflicts -f` a CRD that adds a field, over one in use."""
    import subprocess

    import yaml

    from .conftest import cpmod
    from .scenario import CRD

    await apply_crd(api_client)
    custom = client.CustomObjectsApi(api_client)
    await custom.create_namespaced_custom_object(
        "shardlease.io", "v1alpha1", namespace, "shardsets", shardset("kept", GOOD))
    newer = yaml.safe_load(CRD.read_text())
    spec = newer["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]
    spec["properties"]["upgradeProbe"] = {"type": "string", "description": "added by a test"}
    path = tmp_path / "crd.yaml"
    path.write_text(yaml.safe_dump(newer))
    kubectl = str(cpmod.binary_path("kubectl"))
    try:
        out = await asyncio.to_thread(
            subprocess.run, [kubectl, "--kubeconfig", kubeconfig, "apply", "--server-side",
                             "--force-conflicts", "-f", str(path)],
            capture_output=True, text=True, timeout=60)
        assert out.returncode == 0, out.stderr
        assert "serverside-applied" in out.stdout
        kept = await custom.get_namespaced_custom_object(
            "shardlease.io", "v1alpha1", namespace, "shardsets", "kept")
        assert kept["spec"]["shards"] == GOOD["shards"]

        async def accepted() -> bool:  # the new schema takes a moment to be served
            try:
                await custom.patch_namespaced_custom_object(
                    "shardlease.io", "v1alpha1", namespace, "shardsets", "kept",
                    {"spec": {"upgradeProbe": "yes"}},
                    _content_type="application/merge-patch+json")
            except client.ApiException:
                return False
            got = await custom.get_namespaced_custom_object(
                "shardlease.io", "v1alpha1", namespace, "shardsets", "kept")
            return bool(got["spec"].get("upgradeProbe") == "yes")
        from .scenario import eventually
        await eventually(accepted, "the upgraded CRD to keep the new field", 30)
    finally:
        # Back to the project's CRD for the other tests of this session.
        await asyncio.to_thread(
            subprocess.run, [kubectl, "--kubeconfig", kubeconfig, "apply", "--server-side",
                             "--force-conflicts", "-f", str(CRD)], capture_output=True, timeout=60)
