"""The agent's kopf handlers run on the event loop's thread. kopf runs a
sync handler in a thread pool; the agent's handlers set asyncio Events the
supervisor waits on and fill the peer table the loop iterates, neither of
which may be touched from another thread (an Event set there wakes nobody
until something else wakes the loop; a dict filled there while the loop
iterates it raises)."""

from __future__ import annotations

import threading
from typing import Any

import kopf
from kopf._core.actions.invocation import invoke

from shardlease.k8s.agent import Agent

POD = {"metadata": {"name": "db-0", "labels": {"app": "db"}},
       "status": {"podIP": "10.0.0.1",
                  "conditions": [{"type": "Ready", "status": "True"}]}}
SHARDSET = {"metadata": {"name": "db"},
            "spec": {"statefulSet": "db", "shards": 4, "store": "kubernetes://ns",
                     "selector": {"app": "db"}}}


async def test_every_watch_handler_of_the_agent_runs_on_the_event_loops_thread() -> None:
    agent = Agent(namespace="ns", shardset="db", pod_name="db-0")
    here = threading.get_ident()
    threads: dict[str, int] = {}
    observe, on_shardset = agent.peers.observe, agent.on_shardset

    def observed(*args: Any) -> None:
        threads["pods"] = threading.get_ident()
        observe(*args)

    def shardset(*args: Any) -> None:
        threads["shardset"] = threading.get_ident()
        on_shardset(*args)

    agent.peers.observe = observed  # type: ignore[method-assign]
    agent.on_shardset = shardset  # type: ignore[method-assign]
    handlers = agent.registry._watching.get_all_handlers()
    assert len(handlers) == 2, handlers
    for handler in handlers:
        body = POD if handler.fn.__name__ == "pod_event" else SHARDSET
        await invoke(handler.fn, settings=kopf.OperatorSettings(),
                     kwargs={"type": "ADDED", "body": kopf.Body(body)})
    assert threads == {"pods": here, "shardset": here}
    # What they did, they did.
    assert set(agent.peers.pods) == {"db-0"} and agent.own_pod is not None
    assert agent.spec is not None and agent._changed.is_set() and agent._own_pod_changed.is_set()
