"""The agent's liveness follows its placement loop: a loop that died fails
/healthz (so the kubelet restarts the container), a requested stop does not."""

from __future__ import annotations

import asyncio
import socket

import aiohttp

from shardlease.k8s.agent import Agent, LoopDied
from shardlease.k8s.spec import ShardSetSpec


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


async def status(port: int, path: str) -> tuple[int, str]:
    async with aiohttp.ClientSession() as http, \
            http.get(f"http://127.0.0.1:{port}{path}") as r:
        return r.status, await r.text()


async def started_agent(run_loop: object) -> tuple[Agent, int]:
    port = free_port()
    agent = Agent(namespace="ns", shardset="db", pod_name="db-0", port=port)
    agent._run_loop = run_loop  # type: ignore[method-assign]
    agent.spec = ShardSetSpec.model_validate(
        {"statefulSet": "db", "shards": 4, "store": "kubernetes://ns"})
    await agent._serve()
    agent._supervisor = asyncio.create_task(agent._supervise())
    return agent, port


async def test_a_loop_that_died_fails_liveness_and_readiness() -> None:
    async def dying(spec: ShardSetSpec) -> None:
        raise LoopDied("the placement loop died: RunnerDied: the shard runner stopped")

    agent, port = await started_agent(dying)
    try:
        await asyncio.wait_for(agent._supervisor, 5)  # type: ignore[arg-type]
        code, text = await status(port, "/healthz")
        assert code == 500
        assert "RunnerDied" in text
        assert (await status(port, "/readyz"))[0] == 503
    finally:
        await agent.close()


async def test_a_requested_stop_keeps_liveness() -> None:
    running = asyncio.Event()

    async def until_stopped(spec: ShardSetSpec) -> None:
        running.set()
        await agent._changed.wait()

    agent, port = await started_agent(until_stopped)
    try:
        await asyncio.wait_for(running.wait(), 5)
        assert (await status(port, "/healthz"))[0] == 200
        await asyncio.wait_for(agent.shutdown(), 5)
        assert agent._supervisor is not None and agent._supervisor.done()
        assert (await status(port, "/healthz"))[0] == 200
    finally:
        await agent.close()


async def drain(port: int) -> tuple[int, str]:
    async with aiohttp.ClientSession() as http, \
            http.get(f"http://127.0.0.1:{port}/drain") as r:
        return r.status, await r.text()


STARTED = "2026-12-02T10:00:00Z"


def own_pod(restarts: int, deleting: bool = False, port: int = 8470) -> dict:
    meta: dict = {"name": "db-0", "uid": "u-1"}
    if deleting:
        meta["deletionTimestamp"] = "2026-11-30T15:00:00Z"
    return {"metadata": meta,
            "spec": {"containers": [{"name": "app", "lifecycle": {"preStop": {
                "httpGet": {"path": "/drain", "port": port}}}}]},
            "status": {"containerStatuses": [
                {"name": "app", "restartCount": restarts,
                 "state": {"running": {"startedAt": STARTED}}}]}}


def announce(agent: Agent, events: list[dict]) -> None:
    """What the API server would list as this pod's Killing events (there is
    no API server in these tests: tests/k8s/test_agent_drain.py has one)."""
    async def kubelet_stops(pod: object) -> list[dict]:
        return events
    agent._kubelet_stops = kubelet_stops  # type: ignore[method-assign]


KILLING = {"reason": "Killing", "lastTimestamp": "2026-12-02T10:05:00Z",
           "involvedObject": {"kind": "Pod", "name": "db-0", "uid": "u-1",
                              "fieldPath": "spec.containers{app}"}}


async def test_a_drain_the_api_server_does_not_back_is_refused_and_changes_nothing() -> None:
    runs: list[str] = []

    async def run_loop(spec: ShardSetSpec) -> None:
        runs.append("run")
        await agent._changed.wait()

    agent, port = await started_agent(run_loop)
    agent.announce_wait = 0.3
    try:
        await asyncio.sleep(0.1)
        code, text = await drain(port)  # nothing known of the pod
        assert code == 403 and "refused" in text
        agent.own_pod = own_pod(restarts=0, port=port)
        announce(agent, [{**KILLING, "lastTimestamp": "2026-12-02T09:00:00Z"}])
        assert (await drain(port))[0] == 403  # a stop of an earlier instance
        assert runs == ["run"] and not agent._stopping.is_set()
    finally:
        await agent.close()


async def test_a_drain_while_the_pod_stays_is_a_pause_until_the_app_restarts() -> None:
    runs: list[str] = []

    async def run_loop(spec: ShardSetSpec) -> None:
        runs.append("run")
        agent._changed.clear()
        await agent._changed.wait()
        runs.append("stopped")

    agent, port = await started_agent(run_loop)
    agent.own_pod = own_pod(restarts=0, port=port)  # no API server: the watch's copy
    announce(agent, [KILLING])
    try:
        await asyncio.sleep(0.1)
        code, text = await drain(port)
        assert code == 200 and "paused" in text
        assert runs == ["run", "stopped"]  # answered only once the loop had stopped
        assert (await status(port, "/readyz"))[0] == 503
        assert (await status(port, "/healthz"))[0] == 200
        # The kubelet restarted the application: the agent takes shards again.
        agent.own_pod = own_pod(restarts=1, port=port)
        agent._own_pod_changed.set()
        for _ in range(50):
            if runs.count("run") == 2:
                break
            await asyncio.sleep(0.05)
        assert runs == ["run", "stopped", "run"]
    finally:
        await agent.close()


async def test_a_drain_of_a_terminating_pod_is_final() -> None:
    async def run_loop(spec: ShardSetSpec) -> None:
        agent._changed.clear()
        await agent._changed.wait()

    agent, port = await started_agent(run_loop)
    agent.own_pod = own_pod(restarts=0, deleting=True)
    try:
        await asyncio.sleep(0.1)
        code, text = await drain(port)
        assert (code, text) == (200, "drained\n")
        assert agent._stopped.is_set() and agent._stopping.is_set()
    finally:
        await agent.close()
