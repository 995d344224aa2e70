"""StatefulSet annotations become a validated ShardSet spec, or a clear error."""

import pytest

from shardlease.errors import ConfigError
from shardlease.k8s.spec import ShardSetSpec, inject_wanted, spec_from_annotations


def sts(annotations: dict[str, str] | None, name: str = "db") -> dict:
    return {"metadata": {"name": name, "namespace": "shop", "annotations": annotations or {}},
            "spec": {"selector": {"matchLabels": {"app": "db"}}}}


def test_a_statefulset_without_the_shards_annotation_did_not_opt_in() -> None:
    assert spec_from_annotations(sts(None)) is None
    assert spec_from_annotations(sts({"other.io/x": "1"})) is None


def test_the_shards_annotation_alone_gives_the_seed_defaults_and_the_namespace_store() -> None:
    spec = spec_from_annotations(sts({"shardlease.io/shards": "64"}))
    assert spec is not None
    assert spec.to_body() == {
        "statefulSet": "db", "selector": {"app": "db"}, "shards": 64,
        "store": "kubernetes://shop", "leaseTTL": 15.0, "maxConcurrency": 16,
        "renewal": "node", "handoff": "move", "holdSeconds": 30.0,
        "host": {"url": "http://127.0.0.1:8080"},
    }
    opts = spec.options(name="db-0", cluster="db")
    assert (opts.interval_s, opts.margin_s) == (5.0, 2.5)


def test_every_option_annotation_reaches_the_spec() -> None:
    spec = spec_from_annotations(sts({
        "shardlease.io/shards": "8", "shardlease.io/store": "s3://bucket/p",
        "shardlease.io/lease-ttl": "6", "shardlease.io/interval": "1.5",
        "shardlease.io/margin": "1", "shardlease.io/max-concurrency": "4",
        "shardlease.io/host-url": "http://127.0.0.1:9000", "shardlease.io/inject": "false",
        "shardlease.io/renewal": "node", "shardlease.io/handoff": "hold",
        "shardlease.io/hold-seconds": "45",
    }))
    assert spec is not None
    assert (spec.shards, spec.store, spec.lease_ttl, spec.interval, spec.margin,
            spec.max_concurrency, spec.host.url, spec.renewal, spec.handoff,
            spec.hold_seconds) == (
        8, "s3://bucket/p", 6.0, 1.5, 1.0, 4, "http://127.0.0.1:9000", "node", "hold", 45.0)
    assert spec.options(name="db-0", cluster="db").renewal == "node"


@pytest.mark.parametrize(("annotations", "expected"), [
    ({"shardlease.io/shards": "many"}, "shardlease.io/shards must be an integer, not 'many'"),
    ({"shardlease.io/shards": "0"}, "shardlease.io/shards: Input should be greater than"),
    ({"shardlease.io/shards": "4", "shardlease.io/lease-ttl": "soon"},
     "shardlease.io/lease-ttl must be a number of seconds"),
    ({"shardlease.io/shards": "4", "shardlease.io/margin": "20"},
     "margin (20s) must be less than lease_ttl (15s)"),
    ({"shardlease.io/shards": "4", "shardlease.io/interval": "14"},
     "interval (14s) must be less than lease_ttl - margin"),
    ({"shardlease.io/shards": "4", "shardlease.io/store": "ftp://x"},
     "shardlease.io/store: must be kubernetes://NAMESPACE or s3://bucket/prefix"),
    ({"shardlease.io/shards": "4", "shardlease.io/shard": "4"},
     "unknown annotation(s) shardlease.io/shard"),
    ({"shardlease.io/shards": "4", "shardlease.io/inject": "yes"},
     'shardlease.io/inject must be "true" or "false"'),
    ({"shardlease.io/shards": "4", "shardlease.io/renewal": "epoch"},
     "shardlease.io/renewal: Input should be 'shard' or 'node'"),
    ({"shardlease.io/shards": "4", "shardlease.io/host-url": "localhost:80"},
     "shardlease.io/host-url"),
    ({"shardlease.io/shards": "4", "shardlease.io/handoff": "keep"},
     "shardlease.io/handoff: Input should be 'move' or 'hold'"),
    ({"shardlease.io/shards": "4", "shardlease.io/hold-seconds": "a while"},
     "shardlease.io/hold-seconds must be a number of seconds"),
    ({"shardlease.io/shards": "4", "shardlease.io/hold-seconds": "0"},
     "shardlease.io/hold-seconds: Input should be greater than 0"),
    ({"shardlease.io/shards": "4", "shardlease.io/hold-seconds": "7200"},
     "shardlease.io/hold-seconds: Input should be less than or equal to 3600"),
])
def test_a_malformed_annotation_is_refused_with_a_message_naming_it(
        annotations: dict[str, str], expected: str) -> None:
    with pytest.raises(ConfigError) as e:
        spec_from_annotations(sts(annotations))
    assert expected in str(e.value)


def test_inject_is_on_by_default_and_can_be_turned_off() -> None:
    assert inject_wanted(sts({"shardlease.io/shards": "4"}))
    assert not inject_wanted(sts({"shardlease.io/shards": "4", "shardlease.io/inject": "false"}))
    assert not inject_wanted(sts({}))


def test_the_spec_round_trips_through_its_wire_form() -> None:
    spec = spec_from_annotations(sts({"shardlease.io/shards": "3"}))
    assert spec is not None
    assert ShardSetSpec.model_validate(spec.to_body()) == spec


def test_agent_annotations_shape_the_injected_agent_on_top_of_the_chart_values() -> None:
    from shardlease.k8s.inject import AgentConfig
    from shardlease.k8s.spec import agent_config_from_annotations, drain_containers

    base = AgentConfig.model_validate({"envFrom": [{"secretRef": {"name": "global"}}]})
    body = sts({"shardlease.io/shards": "4", "shardlease.io/agent-cpu-request": "100m",
                "shardlease.io/agent-memory-limit": "1Gi",
                "shardlease.io/agent-image-pull-policy": "Never",
                "shardlease.io/agent-env-from-secret": "s3-creds, other",
                "shardlease.io/agent-env-from-configmap": "s3-config",
                "shardlease.io/native-sidecar": "false",
                "shardlease.io/agent-log-format": "json",
                "shardlease.io/agent-log-level": "debug",
                "shardlease.io/drain-containers": "app,worker"})
    assert spec_from_annotations(body) is not None
    config = agent_config_from_annotations(body, base)
    assert config.resources == {"requests": {"cpu": "100m", "memory": "64Mi"},
                                "limits": {"memory": "1Gi"}}
    assert config.image_pull_policy == "Never"
    assert config.env_from == [{"secretRef": {"name": "global"}},
                               {"secretRef": {"name": "s3-creds"}},
                               {"secretRef": {"name": "other"}},
                               {"configMapRef": {"name": "s3-config"}}]
    assert config.native_sidecar is False
    assert (config.log_format, config.log_level) == ("json", "debug")
    assert (base.log_format, base.log_level) == ("text", "info")
    assert base.env_from == [{"secretRef": {"name": "global"}}]  # the base is not changed
    assert drain_containers(body) == ["app", "worker"]
    assert drain_containers(sts({"shardlease.io/shards": "4"})) is None


@pytest.mark.parametrize(("key", "value", "message"), [
    ("agent-cpu-request", "lots", "quantity"),
    ("agent-image-pull-policy", "Sometimes", "Always, IfNotPresent or Never"),
    ("agent-env-from-secret", "Not_A_Name", "not a valid name"),
    ("native-sidecar", "yes", '"true" or "false"'),
    ("allow-default-service-account", "1", '"true" or "false"'),
    ("drain-containers", "app,,UPPER", "not a valid name"),
    ("agent-log-format", "xml", "text or json, not 'xml'"),
    ("agent-log-level", "loud", "debug, info, warning or error, not 'loud'"),
])
def test_a_malformed_agent_annotation_is_refused_with_a_message_naming_it(
        key: str, value: str, message: str) -> None:
    with pytest.raises(ConfigError) as e:
        spec_from_annotations(sts({"shardlease.io/shards": "4", f"shardlease.io/{key}": value}))
    assert key in str(e.value) and message in str(e.value)
