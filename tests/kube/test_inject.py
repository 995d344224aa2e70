"""The sidecar injection is a pure transformation of a pod."""

from shardlease.k8s.inject import AGENT, AGENT_PORT, INJECTED, inject, owner_statefulset


def pod(**extra: object) -> dict:
    body = {
        "metadata": {"name": "db-0", "namespace": "shop",
                     "ownerReferences": [{"apiVersion": "apps/v1", "kind": "StatefulSet",
                                          "name": "db", "uid": "u1"}]},
        "spec": {"containers": [{"name": "app", "image": "app:1"}]},
    }
    body.update(extra)
    return body


def test_the_owner_statefulset_comes_from_the_owner_references() -> None:
    assert owner_statefulset(pod()) == "db"
    assert owner_statefulset({"metadata": {"ownerReferences": [
        {"apiVersion": "apps/v1", "kind": "ReplicaSet", "name": "x"}]}}) is None
    assert owner_statefulset({"metadata": {}}) is None


def test_the_agent_is_added_with_the_downward_api_and_a_drain_hook_on_the_app() -> None:
    original = pod()
    out = inject(original, "shardlease:1", "db")
    assert original["spec"]["containers"] == [{"name": "app", "image": "app:1"}]  # not mutated
    names = [c["name"] for c in out["spec"]["containers"]]
    assert names == ["app", AGENT]
    agent = out["spec"]["containers"][1]
    assert agent["image"] == "shardlease:1"
    assert agent["args"][:3] == ["agent", "--shardset", "db"]
    env = {e["name"]: e["valueFrom"]["fieldRef"]["fieldPath"] for e in agent["env"]}
    assert env == {"POD_NAME": "metadata.name", "POD_NAMESPACE": "metadata.namespace",
                   "POD_IP": "status.podIP"}
    assert agent["securityContext"]["runAsNonRoot"] is True
    assert agent["securityContext"]["readOnlyRootFilesystem"] is True
    app = out["spec"]["containers"][0]
    assert app["lifecycle"]["preStop"] == {"httpGet": {"path": "/drain", "port": AGENT_PORT}}
    assert out["metadata"]["annotations"][INJECTED] == "true"


def test_an_existing_prestop_hook_is_kept() -> None:
    body = pod()
    body["spec"]["containers"][0]["lifecycle"] = {"preStop": {"exec": {"command": ["x"]}}}
    out = inject(body, "img", "db")
    assert out["spec"]["containers"][0]["lifecycle"]["preStop"] == {"exec": {"command": ["x"]}}


def test_injecting_twice_changes_nothing() -> None:
    once = inject(pod(), "img", "db")
    assert inject(once, "img", "db") == once
