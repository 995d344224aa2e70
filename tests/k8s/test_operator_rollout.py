"""The operator counts the moves of a StatefulSet's rollout into the
ShardSet's `status.lastRollout`, on a real kube-apiserver. No controller
manager runs here: the test writes the StatefulSet's status as its
controller would, and the ShardSet's owners as the agents would."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest
from kubernetes_asyncio import client

from .scenario import apply_crd, eventually, spawn, statefulset

GROUP, VERSION, PLURAL = "shardlease.io", "v1alpha1", "shardsets"
NOW = "2026-12-01T12:00:00Z"


def now() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())

pytestmark = pytest.mark.slow


async def test_the_moves_of_a_rollout_are_counted_until_the_shards_are_balanced(
        namespace: str, kubeconfig: str, api_client: client.ApiClient, tmp_path: Path) -> None:
    api = api_client
    custom, apps = client.CustomObjectsApi(api), client.AppsV1Api(api)
    await apply_crd(api)
    sts = api.sanitize_for_serialization(
        await apps.create_namespaced_stateful_set(namespace, statefulset("db", namespace, {})))
    await custom.create_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, {
        "apiVersion": f"{GROUP}/{VERSION}", "kind": "ShardSet", "metadata": {"name": "db"},
        "spec": {"statefulSet": "db", "shards": 4, "store": f"kubernetes://{namespace}"}})

    async def owners(owners: dict[str, str], balanced: bool = False, live: int = 3) -> None:
        # As the agent publishes (a merge patch replaces the owners map only
        # if it is set to null first).
        await custom.patch_namespaced_custom_object_status(
            GROUP, VERSION, namespace, PLURAL, "db", {"status": {"owners": None}},
            _content_type="application/merge-patch+json")
        await custom.patch_namespaced_custom_object_status(
            GROUP, VERSION, namespace, PLURAL, "db", {"status": {
                "owners": owners, "liveNodes": live, "observedTime": now(), "conditions": [{
                    "type": "Balanced", "status": "True" if balanced else "False",
                    "reason": "FairShares" if balanced else "UnownedShards", "message": "-",
                    "lastTransitionTime": NOW}]}},
            _content_type="application/merge-patch+json")

    async def rollout_status(update: str, current: str, updated: int) -> None:
        await apps.patch_namespaced_stateful_set_status("db", namespace, {"status": {
            "replicas": 3, "readyReplicas": 3, "updatedReplicas": updated,
            "currentRevision": current, "updateRevision": update,
            "observedGeneration": sts["metadata"]["generation"]}})

    async def record(**want: Any) -> dict[str, Any] | None:
        obj = await custom.get_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, "db")
        got = (obj.get("status") or {}).get("lastRollout") or {}
        return got if all(got.get(k) == v for k, v in want.items()) else None

    await owners({"0": "db-0", "1": "db-1", "2": "db-2", "3": "db-0"}, balanced=True)
    await rollout_status("db-r1", "db-r1", 3)
    proc = spawn("operator", ["operator", "--namespace", namespace, "--agent-image", "x",
                              "--http", ""], tmp_path, env={"KUBECONFIG": kubeconfig})
    try:
        # db-2 is replaced first: its shard goes to db-0, then comes back.
        await rollout_status("db-r2", "db-r1", 0)
        started = await eventually(lambda: record(revision="db-r2", moves=0),
                                   "a rollout counted from 0", 30)
        assert "finishedAt" not in started and started["startedAt"]
        await owners({"0": "db-0", "1": "db-1", "3": "db-0"}, live=2)  # unowned: no move
        await owners({"0": "db-0", "1": "db-1", "2": "db-0", "3": "db-0"}, live=2)
        await eventually(lambda: record(moves=1), "one move", 30)
        await rollout_status("db-r2", "db-r1", 1)
        await owners({"0": "db-0", "1": "db-1", "2": "db-2", "3": "db-0"}, balanced=True)
        await eventually(lambda: record(moves=2), "two moves", 30)
        # Every pod updated and Ready, but the last one back not seen live by
        # the agents yet (Balanced over the other two): going on.
        await owners({"0": "db-0", "1": "db-1", "2": "db-2", "3": "db-0"}, balanced=True,
                     live=2)
        await rollout_status("db-r2", "db-r2", 3)
        await owners({"0": "db-1", "1": "db-1", "2": "db-2", "3": "db-0"})
        await eventually(lambda: record(moves=3), "three moves", 30)
        assert "finishedAt" not in (await record() or {})
        await owners({"0": "db-1", "1": "db-1", "2": "db-2", "3": "db-0"}, balanced=True)

        async def finished() -> dict[str, Any] | None:
            # As an agent refreshes the status (observedTime) every other interval.
            await custom.patch_namespaced_custom_object_status(
                GROUP, VERSION, namespace, PLURAL, "db", {"status": {"observedTime": now()}},
                _content_type="application/merge-patch+json")
            r = await record(moves=3, revision="db-r2")
            return r if r and r.get("finishedAt") else None
        done = await eventually(finished, "the rollout to end once the shards are balanced", 30)
        assert done["startedAt"] == started["startedAt"]
        # The next rollout starts a new count.
        await rollout_status("db-r3", "db-r2", 0)
        await eventually(lambda: record(revision="db-r3", moves=0), "a new count", 30)
    finally:
        proc.stop()
