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
    }))
    assert spec is not None
    assert (spec.shards, spec.store, spec.lease_ttl, spec.interval, spec.margin,
            spec.max_concurrency, spec.host.url) == (
        8, "s3://bucket/p", 6.0, 1.5, 1.0, 4, "http://127.0.0.1:9000")


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
    ({"shardlease.io/shards": "4", "shardlease.io/host-url": "localhost:80"},
     "shardlease.io/host-url"),
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
