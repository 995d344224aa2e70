"""The ShardSet spec, and how a StatefulSet's annotations become one.

Opt-in annotations on a StatefulSet (values are strings, as annotations are):

    shardlease.io/shards            "64"   required: the number of shards; opts in
    shardlease.io/store             "kubernetes://NAMESPACE" (default: the
                                    StatefulSet's namespace) or "s3://bucket/prefix"
    shardlease.io/lease-ttl         "15"   seconds
    shardlease.io/interval          "5"    seconds (default lease-ttl/3)
    shardlease.io/margin            "2.5"  seconds (default lease-ttl/6)
    shardlease.io/max-concurrency   "16"
    shardlease.io/host-url          "http://127.0.0.1:8080"  the app's shard endpoints
    shardlease.io/inject            "true" | "false"  inject the agent sidecar
                                    (false: the application embeds the library)
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from shardlease.errors import ConfigError
from shardlease.options import Options

PREFIX = "shardlease.io/"
SHARDS = PREFIX + "shards"
KNOWN = {
    "shards", "store", "lease-ttl", "interval", "margin", "max-concurrency", "host-url",
    "inject",
}
DEFAULT_HOST_URL = "http://127.0.0.1:8080"


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
    shards: int = Field(ge=1, le=65536)
    store: str = Field(min_length=1)
    lease_ttl: float = Field(default=15.0, gt=0, alias="leaseTTL")
    interval: float | None = Field(default=None, gt=0)
    margin: float | None = Field(default=None, gt=0)
    max_concurrency: int = Field(default=16, ge=1, alias="maxConcurrency")
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
            close_timeout=self.host.close_timeout)

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
    if ours.get("inject", "true") not in ("true", "false"):
        raise ConfigError(f'{PREFIX}inject must be "true" or "false", not {ours["inject"]!r}')
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
        "host": {"url": ours["host-url"]} if "host-url" in ours else None,
    }
    names = {"statefulSet": "name", "shards": "shards", "store": "store",
             "leaseTTL": "lease-ttl", "interval": "interval", "margin": "margin",
             "maxConcurrency": "max-concurrency", "host": "host-url"}
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
