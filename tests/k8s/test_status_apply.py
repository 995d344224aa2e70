"""Status writers by server-side apply, on a real API server: an agent that
publishes from a stale copy of the ShardSet never drops the operator's
conditions, and each side's conditions keep their own transition times."""

from __future__ import annotations

from typing import Any

from kubernetes_asyncio import client

from shardlease.k8s.agent import Agent
from shardlease.k8s.spec import ShardSetSpec
from shardlease.kubeapi import KubeClient
from shardlease.loop import Owner

from .scenario import apply_crd

GROUP, VERSION, PLURAL = "shardlease.io", "v1alpha1", "shardsets"


class Placement:
    """What publish_once reads of a loop: the owners, the live nodes and the
    highest generations."""

    def __init__(self, owners: dict[int, str], reserved: dict[int, str] | None = None) -> None:
        self._owners = owners
        self._reserved = reserved or {}

    def owners(self) -> list[Owner]:
        return [Owner(shard=s, owner=o, generation=1) for s, o in self._owners.items()] + [
            Owner(shard=s, owner=None, generation=1, reserved_for=o)
            for s, o in self._reserved.items()]

    def live_nodes(self) -> list[str]:
        return sorted(set(self._owners.values()))

    def highest_generations(self) -> dict[int, int]:
        return {s: 1 for s in [*self._owners, *self._reserved]}


async def conditions(custom: client.CustomObjectsApi, ns: str) -> dict[str, dict[str, Any]]:
    obj = await custom.get_namespaced_custom_object(GROUP, VERSION, ns, PLURAL, "db")
    return {c["type"]: c for c in obj["status"]["conditions"]}


async def test_a_stale_agent_never_drops_the_operators_conditions(
        namespace: str, kubeconfig: str, api_client: client.ApiClient) -> None:
    custom = client.CustomObjectsApi(api_client)
    spec, created, agent = await shardset_and_agent(namespace, kubeconfig, api_client)
    try:
        agent.body = created  # the agent's copy, from before the operator wrote
        # The operator writes its condition (its own field manager).
        await custom.patch_namespaced_custom_object_status(
            GROUP, VERSION, namespace, PLURAL, "db",
            {"apiVersion": f"{GROUP}/{VERSION}", "kind": "ShardSet",
             "metadata": {"name": "db", "namespace": namespace},
             "status": {"conditions": [{"type": "Configured", "status": "True",
                                        "reason": "AnnotationsValid", "message": "ok",
                                        "lastTransitionTime": "2026-11-30T12:00:00Z"}]}},
            field_manager="shardlease-operator-configured", force=True,
            _content_type="application/apply-patch+yaml")
        shardset = ShardSetSpec.model_validate(spec)
        assert await agent.publish_once(Placement({0: "db-0", 1: "db-0"}), shardset)  # type: ignore[arg-type]
        got = await conditions(custom, namespace)
        assert got["Configured"]["status"] == "True"  # kept, though the agent never saw it
        assert got["Balanced"]["status"] == "True"
        first = got["Balanced"]["lastTransitionTime"]
        # Unbalanced now: Balanced flips, Configured is still there.
        agent.body = created
        assert await agent.publish_once(Placement({0: "db-0"}), shardset)  # type: ignore[arg-type]
        got = await conditions(custom, namespace)
        assert got["Balanced"]["status"] == "False"
        assert got["Configured"]["lastTransitionTime"] == "2026-11-30T12:00:00Z"
        assert first  # a transition time was written for each of the agent's conditions
    finally:
        await agent._api.close()


async def shardset_and_agent(namespace: str, kubeconfig: str, api: client.ApiClient
                             ) -> tuple[dict[str, Any], dict[str, Any], Agent]:
    """A ShardSet of 2 shards (its spec and the object created), and an
    agent of pod db-0 with its own API client (to close)."""
    await apply_crd(api)
    spec = {"statefulSet": "db", "shards": 2, "store": f"kubernetes://{namespace}"}
    created = await client.CustomObjectsApi(api).create_namespaced_custom_object(
        GROUP, VERSION, namespace, PLURAL, {
            "apiVersion": f"{GROUP}/{VERSION}", "kind": "ShardSet", "metadata": {"name": "db"},
            "spec": spec})
    agent = Agent(namespace=namespace, shardset="db", pod_name="db-0", kubeconfig=kubeconfig)
    agent._api = KubeClient.from_config(kubeconfig)
    return spec, created, agent


async def test_maps_that_empty_out_are_published(
        namespace: str, kubeconfig: str, api_client: client.ApiClient) -> None:
    # A reservation taken back (handoff: hold), or every owner gone: a map of
    # the status goes from entries to none, and the apply must still land
    # (on the real pods it was refused, 422 "reserved ... must be of type
    # object", and the status went stale for good).
    custom = client.CustomObjectsApi(api_client)
    spec, created, agent = await shardset_and_agent(namespace, kubeconfig, api_client)
    shardset = ShardSetSpec.model_validate(spec)
    try:
        agent.body = created
        assert await agent.publish_once(Placement({0: "db-0"}, {1: "db-1"}), shardset)  # type: ignore[arg-type]
        obj = await custom.get_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, "db")
        assert obj["status"]["reserved"] == {"1": "db-1"}
        assert await agent.publish_once(Placement({0: "db-0", 1: "db-1"}), shardset)  # type: ignore[arg-type]
        obj = await custom.get_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, "db")
        assert obj["status"].get("reserved", {}) == {}
        assert obj["status"]["owners"] == {"0": "db-0", "1": "db-1"}
        assert await agent.publish_once(Placement({}), shardset)  # type: ignore[arg-type]
        obj = await custom.get_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, "db")
        assert obj["status"].get("owners", {}) == {} and obj["status"]["ownedShards"] == 0
    finally:
        await agent._api.close()
