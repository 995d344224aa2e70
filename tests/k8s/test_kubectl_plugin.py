"""`kubectl shardlease ...`, typed as a user types it: the real kubectl finds
the `kubectl-shardlease` console script on PATH and runs it against a real
API server."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from kubernetes_asyncio import client

from shardlease.routing import shard_for_key

from .conftest import cpmod
from .scenario import apply_crd, mark_ready, pod_for, statefulset

pytestmark = pytest.mark.slow
GROUP, VERSION, PLURAL = "shardlease.io", "v1alpha1", "shardsets"
NOW = "2026-11-30T12:00:00Z"


def kubectl(kubeconfig: str, *args: str) -> subprocess.CompletedProcess[str]:
    bindir = str(Path(sys.executable).parent)  # where pip put kubectl-shardlease
    env = {**os.environ, "KUBECONFIG": kubeconfig, "PATH": f"{bindir}:{os.environ['PATH']}"}
    return subprocess.run([str(cpmod.binary_path("kubectl")), *args], env=env,
                          capture_output=True, text=True, timeout=60)


async def make_shardset(api: client.ApiClient, ns: str) -> dict[str, Any]:
    await apply_crd(api)
    apps = client.AppsV1Api(api)
    sts = api.sanitize_for_serialization(
        await apps.create_namespaced_stateful_set(ns, statefulset("db", ns, {})))
    core = client.CoreV1Api(api)
    for i in (0, 1):
        await core.create_namespaced_pod(ns, pod_for(sts, i))
        await mark_ready(api, ns, f"db-{i}")
    custom = client.CustomObjectsApi(api)
    await custom.create_namespaced_custom_object(GROUP, VERSION, ns, PLURAL, {
        "apiVersion": f"{GROUP}/{VERSION}", "kind": "ShardSet", "metadata": {"name": "db"},
        "spec": {"statefulSet": "db", "shards": 4, "store": f"kubernetes://{ns}",
                 "selector": {"app": "db"}}})
    status = {"owners": {"0": "db-0", "1": "db-1", "2": "db-0", "3": "db-9"},
              "generations": {"0": 3, "1": 7, "2": 2, "3": 11}, "ownedShards": 4,
              "since": {"0": "2026-11-30T11:59:00Z", "1": NOW},
              "liveNodes": 2, "nodes": ["db-0", "db-1"], "publishedBy": "db-0",
              "observedTime": NOW,
              "conditions": [{"type": "Balanced", "status": "False", "reason": "OwnersNotLive",
                              "message": "owners not seen live: db-9",
                              "lastTransitionTime": NOW}]}
    await custom.patch_namespaced_custom_object_status(
        GROUP, VERSION, ns, PLURAL, "db", {"status": status},
        _content_type="application/merge-patch+json")
    return status


async def test_kubectl_shardlease_shows_owners_lookups_and_a_description(
        namespace: str, kubeconfig: str, api_client: client.ApiClient) -> None:
    await make_shardset(api_client, namespace)

    out = kubectl(kubeconfig, "shardlease", "owners", "db", "-n", namespace)
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    # The same table as `shardlease owners`: owner, generation, since when.
    assert lines[0].split() == ["SHARD", "OWNER", "GENERATION", "SINCE"]
    assert lines[1].split()[:3] == ["0", "db-0", "3"]
    assert lines[1].split()[3][-1] in "smhd"  # an age
    assert lines[3].split() == ["2", "db-0", "2", "-"]  # no time published
    assert lines[4].split() == ["3", "db-9", "*", "11", "-"]  # not a live pod
    assert "db-0: 2 shard(s): 0 2" in out.stdout and "db-9: 1 shard(s): 3" in out.stdout
    assert "* not a live pod" in out.stdout

    as_json = kubectl(kubeconfig, "shardlease", "-n", namespace, "owners", "db", "-o", "json")
    rows = json.loads(as_json.stdout)["shards"]
    assert rows[1] == {"shard": 1, "owner": "db-1", "generation": 7, "since": NOW,
                       "live": True}
    assert rows[3]["live"] is False

    key = next(k for k in (f"k{i}" for i in range(100)) if shard_for_key(k, 4) == 1)
    found = kubectl(kubeconfig, "shardlease", "lookup", "db", key, "-n", namespace)
    assert found.returncode == 0, found.stderr
    assert "shard 1 -> db-1 (127.0.0.1), generation 7" in found.stdout
    dead = next(k for k in (f"k{i}" for i in range(100)) if shard_for_key(k, 4) == 3)
    assert "owner db-9 is not live" in kubectl(
        kubeconfig, "shardlease", "lookup", "db", dead, "-n", namespace).stdout

    described = kubectl(kubeconfig, "shardlease", "describe", "db", "-n", namespace)
    assert described.returncode == 0, described.stderr
    text = described.stdout
    assert "Shards:       4" in text and "OwnersNotLive" in text
    pods = {line.split()[0]: line.split()[1:] for line in text.splitlines()
            if line.startswith("db-")}
    assert pods["db-0"][:2] == ["2", "127.0.0.1"] and pods["db-9"][-1] == "NO"
    assert "Reserved:" not in text  # handoff: move, nothing kept
    assert "Last rollout" not in text  # none counted yet

    # The operator counted a rollout: its moves.
    custom = client.CustomObjectsApi(api_client)
    await custom.patch_namespaced_custom_object_status(
        GROUP, VERSION, namespace, PLURAL, "db", {"status": {"lastRollout": {
            "revision": "db-7f9c", "startedAt": "2026-11-30T11:58:00Z",
            "finishedAt": "2026-11-30T11:59:00Z", "moves": 6}}},
        _content_type="application/merge-patch+json")
    text = kubectl(kubeconfig, "shardlease", "describe", "db", "-n", namespace).stdout
    line = next(x for x in text.splitlines() if x.startswith("Last rollout:"))
    assert line.startswith("Last rollout: to db-7f9c, started ") and line.endswith(
        "ago: 6 move(s)") and " done " in line, line

    # handoff: hold, and a pod being replaced: what is kept for it.
    await custom.patch_namespaced_custom_object(
        GROUP, VERSION, namespace, PLURAL, "db", {"spec": {"handoff": "hold", "holdSeconds": 45}},
        _content_type="application/merge-patch+json")
    await custom.patch_namespaced_custom_object_status(
        GROUP, VERSION, namespace, PLURAL, "db",
        {"status": {"owners": {"0": "db-0", "2": "db-0"}, "reserved": {"1": "db-1", "3": "db-1"}}},
        _content_type="application/merge-patch+json")
    text = kubectl(kubeconfig, "shardlease", "describe", "db", "-n", namespace).stdout
    assert "Handoff:      hold, 45" in text, text
    kept = [line.split() for line in text.split("Reserved:", 1)[1].splitlines()[1:3]]
    assert kept[1] == ["db-1", "1", "3"], text


async def test_kubectl_shardlease_says_what_is_missing(
        namespace: str, kubeconfig: str, api_client: client.ApiClient) -> None:
    await apply_crd(api_client)
    out = kubectl(kubeconfig, "shardlease", "owners", "nope", "-n", namespace)
    assert out.returncode == 1
    assert out.stderr.strip() == (
        f'kubectl shardlease: shardset "nope" not found in namespace "{namespace}"')
    usage = kubectl(kubeconfig, "shardlease", "frobnicate")
    assert usage.returncode == 2 and "invalid choice" in usage.stderr


async def test_kubectl_shardlease_takes_the_namespace_of_the_context_it_is_given(
        namespace: str, kubeconfig: str, api_client: client.ApiClient,
        tmp_path: Path) -> None:
    # kubectl's rule: no -n, so the named context's namespace (before, the
    # current context's was read whatever --context said).
    await make_shardset(api_client, namespace)
    config = json.loads(Path(kubeconfig).read_text())
    current = next(c for c in config["contexts"] if c["name"] == config["current-context"])
    config["contexts"].append({"name": "team", "context": {**current["context"],
                                                           "namespace": namespace}})
    path = tmp_path / "kubeconfig"
    path.write_text(json.dumps(config))
    out = kubectl(str(path), "shardlease", "--context", "team", "owners", "db", "-o", "json")
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout)["shards"][1]["owner"] == "db-1"
    wrong = kubectl(str(path), "shardlease", "--context", "nope", "owners", "db")
    assert wrong.returncode == 1
    assert wrong.stderr.startswith("kubectl shardlease: kubeconfig ")
    assert "no context 'nope' (there are: " in wrong.stderr and "team" in wrong.stderr
    assert "Traceback" not in wrong.stderr
