"""Validated options of the placement loop (seconds, as in the seed)."""

from __future__ import annotations

import os
import socket
from typing import Self

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from shardlease.errors import ConfigError
from shardlease.records import MAX_LEASE_TTL, Renewal


class Options(BaseModel):
    """Options of one node's loop.

    Defaults follow the seed: `lease_ttl` 15 s, `interval` a third of it,
    `margin` a sixth of it, `max_concurrency` 16.
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    shards: int = Field(ge=1, description="Number of shards of the cluster.")
    lease_ttl: float = Field(default=15.0, gt=0, le=MAX_LEASE_TTL,
                             description="Lease lifetime, seconds (at most an hour: "
                             "readers refuse records that claim longer).")
    interval: float | None = Field(
        default=None, gt=0, description="Seconds between rounds; default lease_ttl/3."
    )
    margin: float | None = Field(
        default=None,
        ge=0,
        description="Seconds before the lease would expire at which a shard is fenced; "
        "default lease_ttl/6.",
    )
    name: str = Field(default_factory=lambda: os.environ.get("POD_NAME") or socket.gethostname(),
                      min_length=1, max_length=253,
                      pattern=r"^[A-Za-z0-9]([-A-Za-z0-9._]*[A-Za-z0-9])?$",
                      description="This node's name: letters, digits, '-', '.', '_'.")
    cluster_name: str = Field(default="default", min_length=1, max_length=63,
                              pattern=r"^[a-z0-9]([-a-z0-9._]*[a-z0-9])?$")
    max_concurrency: int = Field(default=16, ge=1)
    open_timeout: float = Field(default=60.0, gt=0, description="Seconds an open may take.")
    close_timeout: float = Field(default=60.0, gt=0, description="Seconds one close try may take.")
    max_moves_per_round: int | None = Field(
        default=None, ge=1,
        description="Shards this node releases above its share per round, at most (None: "
        "all of them at once): spreads a large scale change over rounds.")
    renewal: Renewal = Field(
        default="node",
        description="How held leases are kept: 'node' (the default) rewrites only this "
        "node's epoch record, and a lease only when it is claimed or freed (store traffic "
        "grows with the nodes, not the shards); 'shard' rewrites every lease every interval.")

    @property
    def interval_s(self) -> float:
        return self.interval if self.interval is not None else self.lease_ttl / 3

    @property
    def margin_s(self) -> float:
        return self.margin if self.margin is not None else self.lease_ttl / 6

    @model_validator(mode="after")
    def _coherent(self) -> Self:
        # close_timeout and open_timeout need no check against the others: a
        # fence interrupts an open whatever open_timeout says, and a fenced
        # close gets min(close_timeout, margin), so no combination of them
        # can outlast the lease. What can never work is no margin at all.
        if self.margin_s <= 0:
            raise ValueError(
                "margin must be above 0s: it is all the time a fenced shard's close gets "
                "before another node may take its lease, and what covers the delivery of "
                "the validity an application keeps (its deadline would otherwise be the "
                "lease's expiry itself)"
            )
        if self.margin_s >= self.lease_ttl:
            raise ValueError(
                f"margin ({self.margin_s:g}s) must be less than lease_ttl ({self.lease_ttl:g}s): "
                "a shard must be fenced before its lease expires"
            )
        if self.interval_s >= self.lease_ttl - self.margin_s:
            raise ValueError(
                f"interval ({self.interval_s:g}s) must be less than lease_ttl - margin "
                f"({self.lease_ttl - self.margin_s:g}s), or a shard would be fenced between "
                "two renewals"
            )
        return self

    @classmethod
    def make(cls, **kwargs: object) -> Options:
        """Build options, turning pydantic's report into one `ConfigError` line per problem."""
        try:
            return cls.model_validate({k: v for k, v in kwargs.items() if v is not None})
        except ValidationError as e:
            raise ConfigError(describe_validation_error(e, "option")) from None


def describe_validation_error(e: ValidationError, what: str) -> str:
    lines = []
    for err in e.errors():
        loc = ".".join(str(p) for p in err["loc"])
        msg = err["msg"].removeprefix("Value error, ")
        lines.append(f"invalid {what} {loc}: {msg}" if loc else f"invalid {what}s: {msg}")
    return "; ".join(lines)
