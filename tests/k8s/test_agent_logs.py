"""An agent's JSON logs (#43 item 3), from a real `shardlease agent --log-format
json` on the real kube-apiserver: its claims, opens, a self-fence (the
process stopped past its deadlines, SIGSTOP) and its releases (SIGTERM)
each say which ShardSet, pod, shard and generation they are about, as
fields a log pipeline reads without parsing the message; and every line the
process writes is one JSON object."""

from __future__ import annotations

import asyncio
import json
import signal
from pathlib import Path
from typing import Any

import pytest
from kubernetes_asyncio import client

from .scenario import RecordingApp, eventually, free_port, ready_pods, shardset_for, spawn

pytestmark = pytest.mark.slow

SHARDS = 2
TTL = 3.0  # margin 0.5 s: the deadline is 2.5 s past the last renewal


def records(log: str) -> list[dict[str, Any]]:
    out = []
    for line in log.splitlines():
        if line.strip():
            try:
                out.append(json.loads(line))
            except json.JSONDecodeError:
                raise AssertionError(f"a line that is not JSON: {line!r}") from None
    return out


async def test_an_agents_json_records_name_shardset_pod_shard_and_generation(
        namespace: str, kubeconfig: str, api_client: client.ApiClient, tmp_path: Path) -> None:
    ns = namespace
    await shardset_for(api_client, ns, "db", shards=SHARDS, replicas=1, leaseTTL=TTL)
    await ready_pods(api_client, ns, ["db-0"], {"app": "db"})
    calls: list[dict[str, Any]] = []
    app = RecordingApp("db-0", calls)
    await app.start()
    proc = spawn("agent", ["agent", "--shardset", "db", "--namespace", ns, "--name", "db-0",
                           "--port", str(free_port()), "--host-url",
                           f"http://127.0.0.1:{app.port}", "--log-format", "json"],
                 tmp_path, env={"KUBECONFIG": kubeconfig})
    try:
        async def all_open() -> bool:
            return len(app.open) == SHARDS
        await eventually(all_open, "both shards open", timeout=90)
        first = dict(app.open)

        async def fenced() -> list[dict[str, Any]]:
            return [r for r in records(proc.log.read_text())
                    if r.get("event") == "closed" and r.get("reason") == "fenced"]
        # Stopped past every deadline: once running again, the runner fences
        # before any renewal can answer (and nobody else takes the leases).
        proc.signal(signal.SIGSTOP)
        await asyncio.sleep(TTL + 1.5)
        proc.signal(signal.SIGCONT)
        await eventually(fenced, "the fenced shards' closes", timeout=30)
        await eventually(all_open, "both shards open again", timeout=60)
        proc.signal(signal.SIGTERM)
        assert await proc.wait(60) == 0, proc.tail()
    finally:
        proc.stop()
        await app.stop()

    logged = records(proc.log.read_text())
    assert logged, "the agent wrote nothing"
    for r in logged:
        assert {"ts", "level", "logger", "msg"} <= r.keys(), r
        # Every record of the process: one pod of one ShardSet.
        assert (r["shardset"], r["pod"]) == ("db", "db-0"), r

    def events(kind: str, **match: object) -> list[dict[str, Any]]:
        return [r for r in logged if r.get("event") == kind
                and all(r.get(k) == v for k, v in match.items())]

    # A record of an event about one shard this agent held carries its
    # generation, the events that do not (a release, a close) included.
    for r in logged:
        if r.get("event") in ("claim", "opened", "closed", "release", "lost", "overrun",
                              "left_to_expire"):
            assert isinstance(r["shard"], int) and isinstance(r["generation"], int), r
    for shard, generation in first.items():
        assert events("claim", shard=shard, generation=generation), (shard, generation)
        assert events("opened", shard=shard, generation=generation), (shard, generation)
    # (The first fence: on a loaded machine a later round may fence again.)
    fence = events("self_fence")[0]
    assert sorted(fence["shards"]) == sorted(first)
    assert fence["generations"] == [first[s] for s in fence["shards"]]
    for shard in first:
        closed = events("closed", shard=shard, reason="fenced")[0]
        assert closed["generation"] == first[shard], closed
    # The runner's own line about the fence names its shards too (read from
    # its format string's arguments: shardlease.logs.shard_fields).
    said = [r for r in logged if r["logger"] == "shardlease.runner"
            and r["msg"].startswith("self-fencing shards")]
    assert said and sorted(said[0]["shards"]) == sorted(first), said
    # The stop: each shard released with the generation it was last claimed at.
    for shard in first:
        last_claim = events("claim", shard=shard)[-1]
        releases = events("release", shard=shard)
        assert releases and releases[-1]["generation"] == last_claim["generation"], \
            (last_claim, releases)
    print(f"\n[logs] {len(logged)} JSON records; the fence: {json.dumps(fence)}")
