"""shardlease: place the shards of a sharded application with leases."""

from shardlease.errors import (
    ConfigError,
    Conflict,
    CorruptRecord,
    EngineError,
    HostError,
    RunnerDied,
    ShardleaseError,
    StoreError,
    StoreUnsafe,
)
from shardlease.options import Options
from shardlease.records import Heartbeat, Lease
from shardlease.stores import LeaseStore, open_store

__all__ = [
    "ConfigError",
    "Conflict",
    "CorruptRecord",
    "EngineError",
    "Heartbeat",
    "HostError",
    "Lease",
    "LeaseStore",
    "Options",
    "RunnerDied",
    "ShardleaseError",
    "StoreError",
    "StoreUnsafe",
    "open_store",
]
