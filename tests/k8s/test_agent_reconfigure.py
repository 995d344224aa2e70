"""A ShardSet spec change reaches running agents in place, on a real
kube-apiserver: no agent restarts its loop, the change closes no shard
anywhere (a renewal with no answer at the shortest TTL still fences), and the
leases carry the new TTL. The agents run as local processes (no kubelet),
each with a recording application behind its HTTP host."""

from __future__ import annotations

import signal
from pathlib import Path
from typing import Any

import pytest
from kubernetes_asyncio import client

from shardlease.stores.kubernetes import ANN_TTL, lease_name
from tests.support.fencelog import fenced_unanswered

from .scenario import Proc, RecordingApp, apply_crd, eventually, free_port, ready_pods, spawn

GROUP, VERSION, PLURAL = "shardlease.io", "v1alpha1", "shardsets"
PODS = ("db-0", "db-1")

pytestmark = pytest.mark.slow


async def lease_ttls(api: client.ApiClient, ns: str, shards: int) -> set[str | None]:
    coord = client.CoordinationV1Api(api)
    out: set[str | None] = set()
    for s in range(shards):
        obj = await coord.read_namespaced_lease(lease_name("db", s), ns)
        out.add((obj.metadata.annotations or {}).get(ANN_TTL))
    return out


async def test_a_lease_ttl_change_closes_no_shard_on_any_agent(
        namespace: str, kubeconfig: str, api_client: client.ApiClient, tmp_path: Path) -> None:
    api = api_client
    core, custom = client.CoreV1Api(api), client.CustomObjectsApi(api)
    await apply_crd(api)
    await custom.create_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, {
        "apiVersion": f"{GROUP}/{VERSION}", "kind": "ShardSet", "metadata": {"name": "db"},
        # Shard renewal: each lease record carries the TTL its last renewal
        # wrote. (In node mode an epoch keeps its TTL for its life, so a new
        # one shows in the next epoch: tests/test_reconfigure.py.)
        "spec": {"statefulSet": "db", "selector": {"app": "db"}, "shards": 6,
                 "store": f"kubernetes://{namespace}", "leaseTTL": 3.0, "renewal": "shard"}})
    await ready_pods(api, namespace, PODS, {"app": "db"})

    calls: list[dict[str, Any]] = []
    apps: dict[str, RecordingApp] = {}
    procs: list[Proc] = []
    try:
        for name in PODS:
            apps[name] = app = RecordingApp(name, calls)
            await app.start()
            procs.append(spawn(f"agent-{name}", [
                "agent", "--shardset", "db", "--namespace", namespace, "--name", name,
                "--port", str(free_port()), "--host-url", f"http://127.0.0.1:{app.port}"],
                tmp_path, env={"KUBECONFIG": kubeconfig}))

        async def placed() -> bool:
            held = [set(a.open) for a in apps.values()]
            return len(held[0]) == len(held[1]) == 3 and held[0] | held[1] == set(range(6))
        await eventually(placed, "both agents to open three shards each", timeout=90)
        assert await lease_ttls(api, namespace, 6) == {"3.0"}
        before = {name: dict(a.open) for name, a in apps.items()}
        seen = len(calls)

        # Four times the TTL, a slower pace, other concurrency and timeouts.
        await custom.patch_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, "db", {
            "spec": {"leaseTTL": 12.0, "interval": 2.0, "maxConcurrency": 4,
                     "host": {"openTimeout": 20.0, "closeTimeout": 20.0}}},
            _content_type="application/merge-patch+json")

        async def renewed_with_the_new_ttl() -> bool:
            return await lease_ttls(api, namespace, 6) == {"12.0"}
        await eventually(renewed_with_the_new_ttl, "every lease to carry the new TTL")
        assert calls[seen:] == []  # no shard closed (nor opened) anywhere

        async def reported() -> list[str]:
            events = await core.list_namespaced_event(namespace)
            return [e.message for e in events.items if e.reason == "Reconfigured"]
        messages = await eventually(
            lambda: _all_reported(reported), "each agent to report the change")
        assert all("leaseTTL 3.0 -> 12.0" in m and "maxConcurrency 16 -> 4" in m
                   for m in messages)

        # Then down again, below where it started.
        await custom.patch_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, "db", {
            "spec": {"leaseTTL": 2.0, "interval": None}},
            _content_type="application/merge-patch+json")

        async def shortened() -> bool:
            return await lease_ttls(api, namespace, 6) == {"2.0"}
        await eventually(shortened, "every lease to carry the shorter TTL")
        # Several renewals at the new pace, and every shard kept.
        versions: dict[int, list[str]] = {s: [] for s in range(6)}

        async def renewed_five_times() -> bool:
            coord = client.CoordinationV1Api(api)
            for s, seen_versions in versions.items():
                obj = await coord.read_namespaced_lease(lease_name("db", s), namespace)
                if obj.metadata.resource_version not in seen_versions:
                    seen_versions.append(obj.metadata.resource_version)
            return all(len(v) >= 5 for v in versions.values())
        await eventually(renewed_five_times, "renewals at the new pace", every=0.2)

        # The change itself closes nothing. But at a 2 s TTL an agent whose
        # renewal the API server does not answer within its budget (the
        # suite's groups share 2 cores) fences, as it must, and takes the shard
        # back at a new generation. So every close since the first change is
        # a self-fence of a shard whose renewal got no answer, a repeat of a
        # close is one of the same generation (calls are idempotent per
        # generation), and the other shards are open where they were, at the
        # same generation.
        fenced = {p.name.removeprefix("agent-"):
                  fenced_unanswered(p.log.read_text(errors="replace")) for p in procs}
        since = _once_per_generation(calls[seen:])
        for c in since:
            assert c["action"] == "open" or c["shard"] in fenced[c["pod"]], \
                f"{c} is not a fence after a renewal with no answer: {fenced}"
        now = {s: (name, g) for name, a in apps.items() for s, g in a.open.items()}
        then = {s: (name, g) for name, held in before.items() for s, g in held.items()}
        assert set(now) == set(range(6)), now
        again = {s for s in now if now[s] != then[s]}
        assert again <= {c["shard"] for c in since if c["action"] == "close"}, (now, then)
        assert all(now[s][1] > then[s][1] for s in again), (now, then)
        print(f"\n[reconfigure] at a 2 s TTL: {len(again)} shard(s) fenced after a "
              f"renewal with no answer, and reopened at a new generation: {sorted(again)}")
        for p in procs:
            assert p.popen.poll() is None, p.tail()
            log = p.log.read_text(errors="replace")
            assert "applied in place" in log
            assert "closing every shard" not in log
        for p in procs:
            p.signal(signal.SIGTERM)
        for p in procs:
            assert await p.wait(60) == 0, p.tail()
        # The graceful stop closed every shard. The agents are stopped one
        # after the other, so the second may still claim what the first just
        # released and close it at its own stop: a shard may then be closed
        # twice, but never open on two pods at once, and every open is paired
        # with a close on the same pod.
        _assert_handoffs_pair_up(
            {s: name for name, held in before.items() for s in held},
            _once_per_generation(calls[seen:]))
        assert {c["shard"] for c in calls[seen:] if c["action"] == "close"} == set(range(6))
        assert all(a.open == {} for a in apps.values()), {n: a.open for n, a in apps.items()}
    finally:
        for p in procs:
            p.stop()
        for a in apps.values():
            await a.stop()


async def _all_reported(reported: Any) -> list[str] | None:
    messages: list[str] = await reported()
    return messages if {m.split(" ", 1)[0] for m in messages} >= set(PODS) else None



def _once_per_generation(calls: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The calls without the repeats of a close: an agent that gave up on a
    close repeats it before it opens the shard again."""
    out, closed = [], set()
    for c in calls:
        key = (c["pod"], c["shard"], c["generation"])
        if c["action"] == "close":
            if key in closed:
                continue
            closed.add(key)
        out.append(c)
    return out


def _assert_handoffs_pair_up(held: dict[int, str], calls: list[dict[str, Any]]) -> None:
    """Replays the applications' calls in the order they landed, from who held
    what: a shard is opened only where no other pod holds it, and closed only
    where it is open."""
    holder = dict(held)
    for c in calls:
        shard, pod = c["shard"], c["pod"]
        if c["action"] == "open":
            assert holder.get(shard, pod) == pod, f"shard {shard} opened on {pod} " \
                f"while open on {holder[shard]}: {calls}"
            holder[shard] = pod
        else:
            assert holder.get(shard) == pod, f"shard {shard} closed on {pod} " \
                f"while held by {holder.get(shard)}: {calls}"
            del holder[shard]
    assert holder == {}, f"left open: {holder}"
