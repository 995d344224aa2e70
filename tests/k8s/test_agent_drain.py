"""`/drain` trusts no request, on a real kube-apiserver: anyone on the pod
network may call it, so what it comes to is what the API server says
(k8s/drain.py). Two agents run as local processes with recording
applications (no kubelet: the test writes the pods' status and the kubelet's
event as the kubelet would).

- a pod that is not being deleted, with no stop announced: refused (403),
  and its shards stay open where they are;
- the kubelet's Killing event for the application container (written a
  moment after the request, as the kubelet's events reach the API server
  asynchronously): a pause; the shards go to the peer, and come back once
  the container restarted;
- a pod with a deletion timestamp: final, every shard handed off.
"""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from aiohttp.test_utils import make_mocked_request
from kubernetes_asyncio import client

from shardlease.k8s.agent import Agent
from shardlease.kubeapi import KubeClient, login

from .scenario import Proc, RecordingApp, eventually, free_port, mark_ready, shardset_for, spawn

PODS = ("db-0", "db-1")
SHARDS = 4
TTL = 3.0

pytestmark = pytest.mark.slow


def stamp(t: float) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(t))


async def app_running(core: client.CoreV1Api, ns: str, pod: str, restarts: int,
                      since: float) -> None:
    """The app container's status, as the kubelet reports it."""
    await core.patch_namespaced_pod_status(pod, ns, {"status": {"containerStatuses": [{
        "name": "app", "ready": True, "restartCount": restarts, "image": "example/app:1",
        "imageID": "", "state": {"running": {"startedAt": stamp(since)}}}]}})


async def drain(port: int) -> tuple[int, str]:
    async with aiohttp.ClientSession() as http, \
            http.get(f"http://127.0.0.1:{port}/drain",
                     timeout=aiohttp.ClientTimeout(total=60)) as r:
        return r.status, await r.text()


async def test_a_drain_is_refused_paused_or_final_as_the_api_server_says(
        namespace: str, kubeconfig: str, api_client: client.ApiClient, tmp_path: Path) -> None:
    ns, core = namespace, client.CoreV1Api(api_client)
    await shardset_for(api_client, ns, "db", shards=SHARDS, replicas=2, leaseTTL=TTL)
    ports = {name: free_port() for name in PODS}
    started = time.time() - 60
    for name in PODS:
        # As injected: the app's preStop is the agent's /drain, and no secret.
        await core.create_namespaced_pod(ns, {
            "apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name, "labels": {"app": "db"},
                         "finalizers": ["shardlease.io/test-keeps-it"]},
            "spec": {"containers": [{"name": "app", "image": "example/app:1", "lifecycle": {
                "preStop": {"httpGet": {"path": "/drain", "port": ports[name]}}}}]}})
        await mark_ready(api_client, ns, name)
        await app_running(core, ns, name, 0, started)

    calls: list[dict[str, Any]] = []
    apps: dict[str, RecordingApp] = {}
    procs: dict[str, Proc] = {}
    try:
        for name in PODS:
            apps[name] = app = RecordingApp(name, calls)
            await app.start()
            procs[name] = spawn(f"agent-{name}", [
                "agent", "--shardset", "db", "--namespace", ns, "--name", name,
                "--port", str(ports[name]), "--host-url", f"http://127.0.0.1:{app.port}"],
                tmp_path, env={"KUBECONFIG": kubeconfig})

        async def shares(a: int, b: int) -> bool:
            held = [set(apps[n].open) for n in PODS]
            return [len(h) for h in held] == [a, b] and not held[0] & held[1]
        await eventually(lambda: shares(2, 2), "two shards open on each pod", timeout=90)

        # 1. Not being deleted, nothing announced: refused, and nothing moves.
        before = dict(apps["db-0"].open)
        seen = len(calls)
        code, text = await drain(ports["db-0"])
        assert code == 403 and "refused" in text, (code, text)
        assert apps["db-0"].open == before
        assert not [c for c in calls[seen:] if c["action"] == "close"], calls[seen:]
        assert "drain from 127.0.0.1 refused" in procs["db-0"].log.read_text()

        # 2. The kubelet stops the app container (a failed liveness probe): its
        # event lands a moment after the hook's request.
        request = asyncio.create_task(drain(ports["db-0"]))
        await asyncio.sleep(1.0)
        now = time.time()
        await core.create_namespaced_event(ns, {
            "metadata": {"generateName": "db-0."}, "reason": "Killing", "type": "Normal",
            "message": "Container app failed liveness probe, will be restarted",
            "firstTimestamp": stamp(now), "lastTimestamp": stamp(now), "count": 1,
            "source": {"component": "kubelet", "host": "node-1"},
            "involvedObject": {"kind": "Pod", "name": "db-0", "namespace": ns,
                               "uid": (await core.read_namespaced_pod("db-0", ns)).metadata.uid,
                               "fieldPath": "spec.containers{app}"}})
        code, text = await request
        assert code == 200 and "paused" in text, (code, text)
        assert apps["db-0"].open == {}  # answered once closed: the app may now stop
        await eventually(lambda: shares(0, 4), "db-1 to take every shard", timeout=60)
        # The container restarted: db-0 takes its share again.
        await app_running(core, ns, "db-0", 1, time.time())
        await eventually(lambda: shares(2, 2), "db-0 to take shards again", timeout=90)
        assert "the application restarted after the drain" in procs["db-0"].log.read_text()

        # 3. db-1 is being deleted (kept by its finalizer): the drain is final.
        await core.delete_namespaced_pod("db-1", ns)
        code, text = await drain(ports["db-1"])
        assert (code, text) == (200, "drained\n"), (code, text)
        assert apps["db-1"].open == {}
        await eventually(lambda: shares(4, 0), "db-0 to take every shard", timeout=60)
    finally:
        for p in procs.values():
            p.stop()
        for a in apps.values():
            await a.stop()
        for name in PODS:
            try:
                await core.patch_namespaced_pod(name, ns, {"metadata": {"finalizers": None}})
            except client.ApiException:
                pass


class CountingClient(KubeClient):
    """A real client that counts the requests it sends."""

    def __init__(self, login: Any) -> None:
        super().__init__(login)
        self.sent = 0

    async def call(self, *args: Any, **kwargs: Any) -> tuple[int, dict[str, Any]]:
        self.sent += 1
        return await super().call(*args, **kwargs)


async def test_drains_that_come_together_share_one_look_and_each_gets_its_full_wait(
        namespace: str, kubeconfig: str, api_client: client.ApiClient) -> None:
    # Anyone on the pod network can ask for a drain. Before, each request
    # polled the API server on its own for the announce wait (a GET and a
    # LIST every 0.25 s): 20 at once cost 20 times one look.
    ns, core = namespace, client.CoreV1Api(api_client)
    await core.create_namespaced_pod(ns, {
        "apiVersion": "v1", "kind": "Pod", "metadata": {"name": "db-0"},
        "spec": {"containers": [{"name": "app", "image": "example/app:1"}]}})
    agent = Agent(namespace=ns, shardset="db", pod_name="db-0", port=8470,
                  kubeconfig=kubeconfig)
    agent.announce_wait = 1.0
    agent._api = api = CountingClient(login(kubeconfig))
    loop = asyncio.get_running_loop()
    try:
        started = loop.time()
        answers = await asyncio.gather(*(agent._drain(make_mocked_request("GET", "/drain"))
                                         for _ in range(20)))
        assert [a.status for a in answers] == [403] * 20
        one_look = 2 * (agent.announce_wait / 0.25 + 1)
        assert api.sent <= one_look + 2, api.sent
        assert loop.time() - started >= agent.announce_wait

        # A request that joins a look in progress gets its own full wait.
        first = asyncio.create_task(agent._drain(make_mocked_request("GET", "/drain")))
        await asyncio.sleep(0.6)
        joined_at = loop.time()
        second = asyncio.create_task(agent._drain(make_mocked_request("GET", "/drain")))
        assert (await first).status == 403 and (await second).status == 403
        assert loop.time() - joined_at >= agent.announce_wait
    finally:
        await api.close()
