"""shardlease: place the shards of a sharded application with leases.

What a library user needs, from one place:

- the engine: `PlacementLoop(store, host, options)`, configured by `Options`;
- the application side: `Host` (open/close a shard), `LeasedHost` and
  `Validity` for a host that also learns how long each shard may act, and
  `HttpHost`, the host that calls an application over HTTP;
- the stores: `open_store(url)` and their interface `LeaseStore`;
- the records in a store: `Lease`, `Epoch`, `Heartbeat`;
- telemetry: `Telemetry` (subscribe a callable) and the events it delivers;
- every error shardlease raises on purpose, under `ShardleaseError`
  (see `shardlease.errors`).
"""

from typing import TYPE_CHECKING, Any

from shardlease.errors import (
    ConfigError,
    Conflict,
    CorruptRecord,
    DemoError,
    EngineError,
    HostError,
    KubeAPIError,
    LoopDied,
    OutdatedGeneration,
    PluginError,
    RunnerDied,
    ShardleaseError,
    StoreError,
    StoreUnsafe,
)
from shardlease.hosts.base import Host, LeasedHost, Validity
from shardlease.options import Options
from shardlease.records import Epoch, Heartbeat, Lease
from shardlease.stores import LeaseStore, open_store
from shardlease.telemetry import (
    Claim,
    Closed,
    CorruptLease,
    DeadlineMoved,
    EpochEnded,
    Event,
    ExtendFailed,
    Joined,
    LeftToExpire,
    Lost,
    NewerRecord,
    Opened,
    Overrun,
    Release,
    RenewFailed,
    RenewSlow,
    Round,
    SelfFence,
    Telemetry,
)

if TYPE_CHECKING:
    from shardlease.hosts.http import HttpHost
    from shardlease.loop import PlacementLoop


def __getattr__(name: str) -> Any:
    # Imported on first use, not with the package: aiohttp (for HttpHost)
    # and the engine are most of a process's start (0.6 and 0.5 of its 1.2
    # CPU-seconds here), which `owners` and every other command but `node`
    # and `agent` never need (a node on the file store needs the engine only).
    if name == "HttpHost":
        from shardlease.hosts.http import HttpHost
        return HttpHost
    if name == "PlacementLoop":
        from shardlease.loop import PlacementLoop
        return PlacementLoop
    raise AttributeError(f"module 'shardlease' has no attribute {name!r}")


__all__ = [
    "Claim",
    "Closed",
    "ConfigError",
    "Conflict",
    "CorruptLease",
    "CorruptRecord",
    "DeadlineMoved",
    "DemoError",
    "EngineError",
    "Epoch",
    "EpochEnded",
    "Event",
    "ExtendFailed",
    "Heartbeat",
    "Host",
    "HostError",
    "HttpHost",
    "Joined",
    "KubeAPIError",
    "Lease",
    "LeaseStore",
    "LeasedHost",
    "LeftToExpire",
    "LoopDied",
    "Lost",
    "NewerRecord",
    "Opened",
    "Options",
    "OutdatedGeneration",
    "Overrun",
    "PlacementLoop",
    "PluginError",
    "Release",
    "RenewFailed",
    "RenewSlow",
    "Round",
    "RunnerDied",
    "SelfFence",
    "ShardleaseError",
    "StoreError",
    "StoreUnsafe",
    "Telemetry",
    "Validity",
    "open_store",
]
