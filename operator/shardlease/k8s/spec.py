"""The ShardSet spec, and how a StatefulSet's annotations become one.

Opt-in annotations on a StatefulSet (values are strings, as annotations are):

    shardlease.io/shards            "64"   required: the number of shards; opts in
    shardlease.io/store             "kubernetes://NAMESPACE" (default: the
                                    StatefulSet's namespace) or "s3://bucket/prefix"
    shardlease.io/lease-ttl         "15"   seconds
    shardlease.io/interval          "5"    seconds (default lease-ttl/3)
    shardlease.io/margin            "2.5"  seconds (default lease-ttl/6)
    shardlease.io/max-concurrency   "16"
    shardlease.io/max-moves-per-round  "4"  shards a pod releases above its share
                                    per round, at most (default: no cap)
    shardlease.io/renewal           "shard" | "node"  how held leases are kept
                                    (docs/renewal.md)
    shardlease.io/handoff           "move" | "hold"  what a pod being replaced does
                                    with its shards: free them for anyone (move,
                                    the default), or keep them for its own name
                                    (hold) until it is back or hold-seconds pass
    shardlease.io/hold-seconds      "30"   how long a hold keeps them
    shardlease.io/host-url          "http://127.0.0.1:8080"  the app's shard endpoints
    shardlease.io/inject            "true" | "false"  inject the agent sidecar
                                    (false: the application embeds the library)

How the injected agent looks, on top of the chart's `agent` values:

    shardlease.io/agent-cpu-request, agent-cpu-limit,
    shardlease.io/agent-memory-request, agent-memory-limit    "100m", "128Mi"
    shardlease.io/agent-image-pull-policy   Always | IfNotPresent | Never
    shardlease.io/agent-env-from-secret     "s3-creds,other"  (envFrom secretRef)
    shardlease.io/agent-env-from-configmap  "s3-config"       (envFrom configMapRef)
    shardlease.io/native-sidecar    "true" | "false"  (default: by server version)
    shardlease.io/agent-log-format  text | json
    shardlease.io/agent-log-level   debug | info | warning | error
    shardlease.io/drain-containers  "app,worker"  the containers that get the
                                    preStop drain (default: every container
                                    that is not a known sidecar)
    shardlease.io/allow-default-service-account  "true": bind the agent's role
                                    to the namespace's `default` ServiceAccount
                                    (refused otherwise: every pod using it would
                                    get the agent's permissions)
"""

from __future__ import annotations

import re
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from shardlease.errors import ConfigError
from shardlease.k8s.inject import AgentConfig
from shardlease.logs import LOG_FORMATS, LOG_LEVELS
from shardlease.options import Options
from shardlease.records import MAX_HOLD, MAX_LEASE_TTL, Renewal

PREFIX = "shardlease.io/"
SHARDS = PREFIX + "shards"
KNOWN = {
    "shards", "store", "lease-ttl", "interval", "margin", "max-concurrency", "renewal", "host-url",
    "handoff", "hold-seconds", "max-moves-per-round",
    "inject", "agent-cpu-request", "agent-cpu-limit", "agent-memory-request",
    "agent-memory-limit", "agent-image-pull-policy", "agent-env-from-secret",
    "agent-env-from-configmap", "native-sidecar", "drain-containers",
    "allow-default-service-account", "agent-log-format", "agent-log-level",
}
BOOLEAN = ("inject", "native-sidecar", "allow-default-service-account")
#: A Kubernetes quantity ("100m", "0.5", "128Mi", "1G").
QUANTITY = re.compile(r"^[0-9]+(\.[0-9]+)?(m|k|M|G|T|Ki|Mi|Gi|Ti)?$")
#: A DNS-1123 label (container, Secret and ConfigMap names).
NAME = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
DEFAULT_HOST_URL = "http://127.0.0.1:8080"
MAX_SHARDS = 8192


class HostSpec(BaseModel):
    model_config = ConfigDict(populate_by_name=True, extra="forbid")

    url: str = Field(default=DEFAULT_HOST_URL, pattern=r"^https?://\S+$")
    open_timeout: float | None = Field(default=None, gt=0, alias="openTimeout")
    close_timeout: float | None = Field(default=None, gt=0, alias="closeTimeout")


class ShardSetSpec(BaseModel):
    """`spec` of a ShardSet (camelCase on the wire)."""

    model_config = ConfigDict(populate_by_name=True, extra="forbid")

    stateful_set: str = Field(alias="statefulSet", min_length=1, max_length=253)
    selector: dict[str, str] = Field(default_factory=dict)
    #: The status holds an owner and a generation per shard: 8192 is what
    #: still fits one object with 63-character pod names (tests/k8s/test_crd.py).
    shards: int = Field(ge=1, le=MAX_SHARDS)
    store: str = Field(min_length=1)
    lease_ttl: float = Field(default=15.0, gt=0, le=MAX_LEASE_TTL, alias="leaseTTL")
    interval: float | None = Field(default=None, gt=0)
    margin: float | None = Field(default=None, gt=0)
    max_concurrency: int = Field(default=16, ge=1, alias="maxConcurrency")
    max_moves_per_round: int | None = Field(default=None, ge=1, alias="maxMovesPerRound")
    renewal: Renewal = "node"
    #: What a pod being replaced (not scaled away) does with its shards:
    #: "move" frees them for anyone; "hold" keeps them for its own name
    #: until it is back or `holdSeconds` pass (its data stays on the pod).
    handoff: Literal["move", "hold"] = "move"
    hold_seconds: float = Field(default=30.0, gt=0, le=MAX_HOLD, alias="holdSeconds")
    host: HostSpec = Field(default_factory=HostSpec)

    @field_validator("store")
    @classmethod
    def _known_scheme(cls, v: str) -> str:
        if not v.startswith(("kubernetes://", "s3://")):
            raise ValueError("must be kubernetes://NAMESPACE or s3://bucket/prefix")
        return v

    def options(self, name: str, cluster: str) -> Options:
        """The loop's options for pod `name`; raises ConfigError if incoherent."""
        return Options.make(
            shards=self.shards, lease_ttl=self.lease_ttl, interval=self.interval,
            margin=self.margin, max_concurrency=self.max_concurrency, name=name,
            cluster_name=cluster, open_timeout=self.host.open_timeout,
            close_timeout=self.host.close_timeout, renewal=self.renewal,
            max_moves_per_round=self.max_moves_per_round)

    def to_body(self) -> dict[str, Any]:
        return self.model_dump(by_alias=True, exclude_none=True)


def spec_from_annotations(sts: dict[str, Any]) -> ShardSetSpec | None:
    """The ShardSet a StatefulSet asks for, or None if it did not opt in.

    Raises ConfigError naming the annotation and what is wrong with it.
    """
    meta = sts.get("metadata") or {}
    ann: dict[str, str] = meta.get("annotations") or {}
    if SHARDS not in ann:
        return None
    ours = {k.removeprefix(PREFIX): v for k, v in ann.items() if k.startswith(PREFIX)}
    unknown = sorted(set(ours) - KNOWN)
    if unknown:
        raise ConfigError(
            f"unknown annotation(s) {', '.join(PREFIX + u for u in unknown)}; "
            f"known: {', '.join(PREFIX + k for k in sorted(KNOWN))}")
    for key in BOOLEAN:
        if key in ours and ours[key] not in ("true", "false"):
            raise ConfigError(f'{PREFIX}{key} must be "true" or "false", not {ours[key]!r}')
    agent_config_from_annotations(sts, AgentConfig())  # raises on a bad agent-* value
    drain_containers(sts)
    namespace = meta.get("namespace") or "default"
    selector = ((sts.get("spec") or {}).get("selector") or {}).get("matchLabels") or {}

    def number(key: str, kind: type) -> Any:
        raw = ours.get(key)
        if raw is None:
            return None
        try:
            return kind(raw.strip())
        except ValueError:
            what = "an integer" if kind is int else "a number of seconds"
            raise ConfigError(f"{PREFIX}{key} must be {what}, not {raw!r}") from None

    body: dict[str, Any] = {
        "statefulSet": meta.get("name", ""),
        "selector": selector,
        "shards": number("shards", int),
        "store": ours.get("store", f"kubernetes://{namespace}"),
        "leaseTTL": number("lease-ttl", float),
        "interval": number("interval", float),
        "margin": number("margin", float),
        "maxConcurrency": number("max-concurrency", int),
        "maxMovesPerRound": number("max-moves-per-round", int),
        "renewal": ours.get("renewal"),
        "handoff": ours.get("handoff"),
        "holdSeconds": number("hold-seconds", float),
        "host": {"url": ours["host-url"]} if "host-url" in ours else None,
    }
    names = {"statefulSet": "name", "shards": "shards", "store": "store",
             "leaseTTL": "lease-ttl", "interval": "interval", "margin": "margin",
             "maxConcurrency": "max-concurrency", "renewal": "renewal",
             "handoff": "handoff", "holdSeconds": "hold-seconds",
             "maxMovesPerRound": "max-moves-per-round", "host": "host-url"}
    try:
        spec = ShardSetSpec.model_validate({k: v for k, v in body.items() if v is not None})
        spec.options(name="probe", cluster=meta.get("name") or "x")
    except ValidationError as e:
        first = e.errors()[0]
        key = names.get(str(first["loc"][0]), str(first["loc"][0])) if first["loc"] else ""
        msg = first["msg"].removeprefix("Value error, ")
        raise ConfigError(f"{PREFIX}{key}: {msg}") from None
    except ConfigError as e:
        raise ConfigError(f"shardlease.io annotations: {e}") from None
    return spec


def inject_wanted(sts: dict[str, Any]) -> bool:
    ann = (sts.get("metadata") or {}).get("annotations") or {}
    return SHARDS in ann and ann.get(PREFIX + "inject", "true") == "true"


def _names(ours: dict[str, str], key: str) -> list[str]:
    names = [n.strip() for n in ours.get(key, "").split(",") if n.strip()]
    for n in names:
        if not NAME.match(n):
            raise ConfigError(f"{PREFIX}{key}: {n!r} is not a valid name")
    return names


def agent_config_from_annotations(sts: dict[str, Any], base: AgentConfig) -> AgentConfig:
    """The chart's agent settings with this StatefulSet's agent-* annotations on top."""
    ann: dict[str, str] = (sts.get("metadata") or {}).get("annotations") or {}
    ours = {k.removeprefix(PREFIX): v.strip() for k, v in ann.items() if k.startswith(PREFIX)}
    config = base.model_copy(deep=True)
    for key, (section, resource) in {
            "agent-cpu-request": ("requests", "cpu"), "agent-cpu-limit": ("limits", "cpu"),
            "agent-memory-request": ("requests", "memory"),
            "agent-memory-limit": ("limits", "memory")}.items():
        if key in ours:
            if not QUANTITY.match(ours[key]):
                raise ConfigError(f"{PREFIX}{key} must be a quantity such as 100m or 128Mi, "
                                  f"not {ours[key]!r}")
            config.resources.setdefault(section, {})[resource] = ours[key]
    if "agent-image-pull-policy" in ours:
        policy = ours["agent-image-pull-policy"]
        if policy not in ("Always", "IfNotPresent", "Never"):
            raise ConfigError(f"{PREFIX}agent-image-pull-policy must be Always, IfNotPresent "
                              f"or Never, not {policy!r}")
        config.image_pull_policy = policy  # type: ignore[assignment]
    config.env_from += [{"secretRef": {"name": n}}
                        for n in _names(ours, "agent-env-from-secret")]
    config.env_from += [{"configMapRef": {"name": n}}
                        for n in _names(ours, "agent-env-from-configmap")]
    if "native-sidecar" in ours:
        config.native_sidecar = ours["native-sidecar"] == "true"
    for key, field, allowed in (("agent-log-format", "log_format", LOG_FORMATS),
                                ("agent-log-level", "log_level", LOG_LEVELS)):
        if key in ours:
            if ours[key] not in allowed:
                raise ConfigError(f"{PREFIX}{key} must be {', '.join(allowed[:-1])} or "
                                  f"{allowed[-1]}, not {ours[key]!r}")
            setattr(config, field, ours[key])
    return config


def drain_containers(sts: dict[str, Any]) -> list[str] | None:
    ann: dict[str, str] = (sts.get("metadata") or {}).get("annotations") or {}
    if PREFIX + "drain-containers" not in ann:
        return None
    return _names({"drain-containers": ann[PREFIX + "drain-containers"]}, "drain-containers")


def default_account_allowed(sts: dict[str, Any]) -> bool:
    ann = (sts.get("metadata") or {}).get("annotations") or {}
    return ann.get(PREFIX + "allow-default-service-account") == "true"
