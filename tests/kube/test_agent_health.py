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
