"""Generations never restart through the agent, on a real kube-apiserver
(#18 item 4): the ShardSet's status publishes the highest generation handed
out per shard (`highestGenerations`, owned or not), and an agent's claims go
above it and above what its earlier loops saw, whatever the store holds.

- every lease deleted while the agents were down, then fresh agent
  processes (nothing in memory): the status alone says where to go on;
- the ShardSet's store changed in place, to an empty one (another
  namespace): the running agents restart their loops above everything.

The recording applications accept any generation: what is checked is the
agent's side alone (the example application's refusal of an old generation,
the last word, is tests/examples/test_generations.py).
"""

from __future__ import annotations

import signal
import uuid
from pathlib import Path
from typing import Any

import pytest
from kubernetes_asyncio import client

from .scenario import Proc, RecordingApp, eventually, free_port, ready_pods, shardset_for, spawn

GROUP, VERSION, PLURAL = "shardlease.io", "v1alpha1", "shardsets"
PODS = ("db-0", "db-1")
SHARDS = 4
TTL = 3.0

pytestmark = pytest.mark.slow


def highest_opened(calls: list[dict[str, Any]], since: int = 0) -> dict[int, int]:
    out: dict[int, int] = {}
    for c in calls[since:]:
        if c["action"] == "open":
            out[c["shard"]] = max(int(c["generation"]), out.get(c["shard"], 0))
    return out


def first_opened(calls: list[dict[str, Any]], since: int) -> dict[int, int]:
    out: dict[int, int] = {}
    for c in calls[since:]:
        if c["action"] == "open":
            out.setdefault(c["shard"], int(c["generation"]))
    return out


async def test_a_lost_store_and_a_store_change_never_hand_out_a_generation_again(
        namespace: str, kubeconfig: str, api_client: client.ApiClient, tmp_path: Path) -> None:
    ns, core = namespace, client.CoreV1Api(api_client)
    custom = client.CustomObjectsApi(api_client)
    leases = client.CoordinationV1Api(api_client)
    other = f"t-{uuid.uuid4().hex[:10]}"
    await core.create_namespace({"metadata": {"name": other,
                                              "labels": {"shardlease.test": "true"}}})
    await shardset_for(api_client, ns, "db", shards=SHARDS, replicas=2, leaseTTL=TTL)
    await ready_pods(api_client, ns, PODS, {"app": "db"})

    calls: list[dict[str, Any]] = []
    apps = {name: RecordingApp(name, calls) for name in PODS}
    procs: dict[str, Proc] = {}
    runs = {name: 0 for name in PODS}

    def start(name: str) -> None:
        runs[name] += 1
        procs[name] = spawn(f"agent-{name}-{runs[name]}", [
            "agent", "--shardset", "db", "--namespace", ns, "--name", name,
            "--port", str(free_port()), "--host-url", f"http://127.0.0.1:{apps[name].port}"],
            tmp_path, env={"KUBECONFIG": kubeconfig})

    async def placed() -> bool:
        held = [set(a.open) for a in apps.values()]
        return len(held[0]) == len(held[1]) == 2 and held[0] | held[1] == set(range(SHARDS))

    async def published(want: dict[int, int]) -> dict[str, Any] | None:
        body = await custom.get_namespaced_custom_object(GROUP, VERSION, ns, PLURAL, "db")
        got = (body.get("status") or {}).get("highestGenerations") or {}
        return body if all(int(got.get(str(s), 0)) >= g for s, g in want.items()) else None

    async def stop_all() -> None:
        for proc in procs.values():
            proc.signal(signal.SIGTERM)
            assert await proc.wait(60) == 0, proc.tail()

    try:
        for app in apps.values():
            await app.start()
        for name in PODS:
            start(name)
        await eventually(placed, "two shards open on each pod", timeout=90)
        # Generations climb: db-1 killed (its shards go to db-0), then back.
        procs["db-1"].signal(signal.SIGKILL)
        await procs["db-1"].wait(30)

        async def all_on_db0() -> bool:
            return set(apps["db-0"].open) == set(range(SHARDS))
        await eventually(all_on_db0, "db-0 to take every shard", timeout=60)
        start("db-1")
        await eventually(placed, "two shards each again", timeout=90)
        before = highest_opened(calls)
        assert max(before.values()) >= 2, before
        await eventually(lambda: published(before), "the status to publish the highest", 60)
        await stop_all()

        # 1. Every record lost while nobody ran; fresh processes.
        await leases.delete_collection_namespaced_lease(
            ns, label_selector="shardlease.io/cluster=db")
        assert not (await leases.list_namespaced_lease(
            ns, label_selector="shardlease.io/cluster=db")).items
        seen = len(calls)
        for name in PODS:
            start(name)
        await eventually(placed, "two shards each on the emptied store", timeout=90)
        first = first_opened(calls, seen)
        assert set(first) == set(range(SHARDS))
        assert all(first[s] > before[s] for s in first), (before, first)

        # 2. The store changed in place to an empty one.
        before = highest_opened(calls)
        await eventually(lambda: published(before), "the status to publish the highest", 60)
        seen = len(calls)
        await custom.patch_namespaced_custom_object(
            GROUP, VERSION, ns, PLURAL, "db", {"spec": {"store": f"kubernetes://{other}"}},
            _content_type="application/merge-patch+json")

        async def moved() -> bool:
            now = await leases.list_namespaced_lease(
                other, label_selector="shardlease.io/cluster=db")
            return len([x for x in now.items if ".shard." in x.metadata.name]) == SHARDS \
                and await placed()
        await eventually(moved, "every shard claimed in the new store", timeout=90)
        first = first_opened(calls, seen)
        assert set(first) == set(range(SHARDS))
        assert all(first[s] > before[s] for s in first), (before, first)
    finally:
        for p in procs.values():
            p.stop()
        for a in apps.values():
            await a.stop()
        try:
            await core.delete_namespace(other)
        except client.ApiException:
            pass
