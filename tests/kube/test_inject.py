"""The sidecar injection is a pure transformation of a pod."""

from shardlease.k8s.inject import (
    AGENT,
    AGENT_PORT,
    INJECTED,
    AgentConfig,
    has_agent,
    inject,
    native_sidecars_supported,
    owner_statefulset,
)


def pod(**extra: object) -> dict:
    body = {
        "metadata": {"name": "db-0", "namespace": "shop",
                     "ownerReferences": [{"apiVersion": "apps/v1", "kind": "StatefulSet",
                                          "name": "db", "uid": "u1"}]},
        "spec": {"containers": [{"name": "app", "image": "app:1"}]},
    }
    body.update(extra)
    return body


def env_of(container: dict) -> dict:
    return {e["name"]: e.get("value", e.get("valueFrom")) for e in container["env"]}


def test_the_owner_statefulset_comes_from_the_owner_references() -> None:
    assert owner_statefulset(pod()) == "db"
    assert owner_statefulset({"metadata": {"ownerReferences": [
        {"apiVersion": "apps/v1", "kind": "ReplicaSet", "name": "x"}]}}) is None
    assert owner_statefulset({"metadata": {}}) is None


def test_the_agent_is_a_native_sidecar_that_starts_first_and_the_app_drains_without_a_secret(
        ) -> None:
    original = pod()
    out = inject(original, "shardlease:1", "db")
    assert original["spec"]["containers"] == [{"name": "app", "image": "app:1"}]  # not mutated
    assert [c["name"] for c in out["spec"]["containers"]] == ["app"]
    (agent,) = out["spec"]["initContainers"]
    assert agent["name"] == AGENT and agent["restartPolicy"] == "Always"
    assert agent["startupProbe"]["httpGet"]["path"] == "/healthz"
    assert agent["image"] == "shardlease:1"
    assert agent["args"][:3] == ["agent", "--shardset", "db"]
    env = env_of(agent)
    assert env["POD_NAME"] == {"fieldRef": {"fieldPath": "metadata.name"}}
    assert env["POD_NAMESPACE"] == {"fieldRef": {"fieldPath": "metadata.namespace"}}
    assert not [k for k in env if "TOKEN" in k]  # nothing secret in the pod spec
    assert agent["securityContext"]["runAsNonRoot"] is True
    assert "runAsUser" not in agent["securityContext"]  # any uid the platform assigns
    assert agent["securityContext"]["readOnlyRootFilesystem"] is True
    app = out["spec"]["containers"][0]
    assert app["lifecycle"]["preStop"] == {"httpGet": {"path": "/drain", "port": AGENT_PORT}}
    assert out["metadata"]["annotations"][INJECTED] == "true"
    assert has_agent(out) and not has_agent(original)


def test_on_old_servers_the_agent_is_a_regular_container() -> None:
    out = inject(pod(), "img", "db", native=False)
    assert [c["name"] for c in out["spec"]["containers"]] == ["app", AGENT]
    assert "initContainers" not in out["spec"]
    assert "restartPolicy" not in out["spec"]["containers"][1]


def test_native_sidecars_from_the_server_version() -> None:
    assert native_sidecars_supported("1", "29")
    assert native_sidecars_supported("1", "37+")
    assert not native_sidecars_supported("1", "28")
    assert not native_sidecars_supported("", "")


def test_only_application_containers_get_the_drain_hook() -> None:
    body = pod()
    body["spec"]["containers"] += [{"name": "istio-proxy"}, {"name": "worker"}]
    body["spec"]["initContainers"] = [{"name": "mesh", "restartPolicy": "Always"}]
    out = inject(body, "img", "db")
    hooks = {c["name"]: "lifecycle" in c for c in out["spec"]["containers"]}
    assert hooks == {"app": True, "istio-proxy": False, "worker": True}
    assert "lifecycle" not in out["spec"]["initContainers"][0]
    assert [c["name"] for c in out["spec"]["initContainers"]] == ["mesh", AGENT]
    chosen = inject(body, "img", "db", drain_containers=["worker"])
    hooks = {c["name"]: "lifecycle" in c for c in chosen["spec"]["containers"]}
    assert hooks == {"app": False, "istio-proxy": False, "worker": True}


def test_the_agent_takes_its_settings_from_the_config() -> None:
    config = AgentConfig.model_validate({
        "imagePullPolicy": "Never",
        "resources": {"requests": {"cpu": "5m"}},
        "env": [{"name": "AWS_REGION", "value": "eu-west-1"},
                {"name": "POD_NAME", "value": "stolen"}],
        "envFrom": [{"secretRef": {"name": "s3"}}],
        "imagePullSecrets": ["regcred"],
    })
    out = inject(pod(), "img", "db", config=config)
    agent = out["spec"]["initContainers"][0]
    assert agent["imagePullPolicy"] == "Never"
    assert agent["resources"] == {"requests": {"cpu": "5m"}}
    env = env_of(agent)
    assert env["AWS_REGION"] == "eu-west-1"
    assert env["POD_NAME"] == {"fieldRef": {"fieldPath": "metadata.name"}}  # never replaced
    assert agent["envFrom"] == [{"secretRef": {"name": "s3"}}]
    assert out["spec"]["imagePullSecrets"] == [{"name": "regcred"}]


def test_an_existing_prestop_hook_is_kept() -> None:
    body = pod()
    body["spec"]["containers"][0]["lifecycle"] = {"preStop": {"exec": {"command": ["x"]}}}
    out = inject(body, "img", "db")
    assert out["spec"]["containers"][0]["lifecycle"]["preStop"] == {"exec": {"command": ["x"]}}


def test_injecting_twice_changes_nothing() -> None:
    once = inject(pod(), "img", "db")
    assert inject(once, "img", "db") == once
    legacy = inject(pod(), "img", "db", native=False)
    assert inject(legacy, "img", "db") == legacy


def test_the_agents_log_options_are_passed_only_when_not_the_default() -> None:
    def args(**config: str) -> list[str]:
        (agent,) = inject(pod(), "shardlease:1", "db",
                          config=AgentConfig.model_validate(config))["spec"]["initContainers"]
        return list(agent["args"])

    # A default install injects what it always did (an older agent image starts it).
    assert args() == ["agent", "--shardset", "db", "--port", str(AGENT_PORT)]
    assert args(logFormat="json")[-2:] == ["--log-format", "json"]
    assert args(logLevel="warning")[-2:] == ["--log-level", "warning"]
    both = args(logFormat="json", logLevel="debug")
    assert both[both.index("--log-format") + 1] == "json"
    assert both[both.index("--log-level") + 1] == "debug"
