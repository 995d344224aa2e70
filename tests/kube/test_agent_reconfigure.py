"""How the agent applies a ShardSet change to a running loop: in place, but
for a store change (a restart) and a change the loop cannot take (kept)."""

from __future__ import annotations

from typing import Any

from shardlease.hosts.http import ABORT_TIMEOUT, HttpHost
from shardlease.k8s.agent import Agent, spec_changes
from shardlease.k8s.spec import ShardSetSpec
from shardlease.options import Options

BASE = {"statefulSet": "db", "shards": 4, "store": "kubernetes://ns", "leaseTTL": 15.0}


def spec(**changes: Any) -> ShardSetSpec:
    return ShardSetSpec.model_validate({**BASE, **changes})


class Loop:
    """What `_apply_in_place` uses of a loop."""

    def __init__(self) -> None:
        self.applied: list[Options] = []

    def reconfigure(self, options: Options) -> None:
        self.applied.append(options)


async def test_a_change_is_applied_in_place_and_named() -> None:
    agent = Agent(namespace="ns", shardset="db", pod_name="db-0")
    loop, host = Loop(), HttpHost("http://127.0.0.1:8080", open_timeout=60, close_timeout=60)
    agent.spec = new = spec(leaseTTL=30.0, shards=6, host={"url": "http://127.0.0.1:9090",
                                                          "openTimeout": 5.0})
    assert await agent._apply_in_place(loop, host, spec()) is new  # type: ignore[arg-type]
    (options,) = loop.applied
    assert (options.lease_ttl, options.shards, options.open_timeout) == (30.0, 6, 5.0)
    assert (options.name, options.cluster_name) == ("db-0", "db")
    assert host.base_url == "http://127.0.0.1:9090"
    assert host.timeouts["open"].total == 5.0 and host.timeouts["close"].total == 60.0
    # The other calls' bounds are the host's own, and stay.
    assert host.timeouts["abort"].total == ABORT_TIMEOUT
    assert host.timeouts["lease"].total is None
    assert spec_changes(spec(), new) == [
        "shards 4 -> 6", "leaseTTL 15.0 -> 30.0", "host.url http://127.0.0.1:8080 -> "
        "http://127.0.0.1:9090", "host.openTimeout None -> 5.0"]
    await host.aclose()


async def test_a_store_or_renewal_change_restarts_and_an_incoherent_one_is_not_applied(
        ) -> None:
    agent = Agent(namespace="ns", shardset="db", pod_name="db-0", host_url="http://h:1")
    loop, host = Loop(), HttpHost("http://h:1")
    agent.spec = spec(store="s3://bucket/prefix", leaseTTL=30.0)
    assert await agent._apply_in_place(loop, host, spec()) is None  # type: ignore[arg-type]
    agent.spec = spec(renewal="shard")  # (BASE has the default, node)
    assert await agent._apply_in_place(loop, host, spec()) is None  # type: ignore[arg-type]
    current = spec()
    agent.spec = spec(leaseTTL=6.0, interval=5.0)  # interval >= ttl - margin
    assert await agent._apply_in_place(loop, host, current) is current  # type: ignore[arg-type]
    # --host-url wins: a host.url change alone is nothing to apply.
    agent.spec = only_url = spec(host={"url": "http://other:2"})
    assert await agent._apply_in_place(loop, host, current) is only_url  # type: ignore[arg-type]
    assert loop.applied == [] and host.base_url == "http://h:1"
    agent._stopping.set()
    agent.spec = spec(leaseTTL=30.0)
    assert await agent._apply_in_place(loop, host, current) is None  # type: ignore[arg-type]
    await host.aclose()
