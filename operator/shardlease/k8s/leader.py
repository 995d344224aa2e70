"""Leader election for the operator's reconciler, on a coordination.k8s.io Lease.

Every replica serves the webhook (so pods get their agent while one replica
restarts), but only the leader writes ShardSets, RoleBindings and conditions.
client-go's leader election, in small:

- the Lease names its holder; the holder renews it every `retry_period`;
- a replica that is not the holder takes the Lease over only once it has seen
  the same record (its resourceVersion) unchanged for `lease_duration` on its
  own monotonic clock, so skewed wall clocks cannot make two leaders;
- every write is a compare-and-swap on the resourceVersion read;
- a leader that could not renew for `renew_deadline` stops leading before
  anyone else may start (renew_deadline < lease_duration).
"""

from __future__ import annotations

import asyncio
import datetime as dt
import logging
from collections.abc import Awaitable, Callable
from typing import Any

from shardlease.errors import ConfigError
from shardlease.kubeapi import KubeClient
from shardlease.observed import Observed

logger = logging.getLogger("shardlease.leader")


def _now_micro() -> str:
    return dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


class LeaderElector:
    def __init__(self, api: Callable[[], Awaitable[KubeClient]], *, namespace: str, name: str,
                 identity: str, lease_duration: float = 15.0, renew_deadline: float = 10.0,
                 retry_period: float = 2.0) -> None:
        if not retry_period < renew_deadline < lease_duration:
            raise ConfigError("leader election needs retry_period < renew_deadline < "
                              f"lease_duration, not {retry_period}, {renew_deadline}, "
                              f"{lease_duration}")
        self.api, self.namespace, self.name = api, namespace, name
        self.identity = identity
        self.lease_duration, self.renew_deadline = lease_duration, renew_deadline
        self.retry_period = retry_period
        self.leading = asyncio.Event()
        #: The Lease's resourceVersion (and spec) as last seen, and since when
        #: on the event loop's monotonic clock (client-go's observedRecord and
        #: observedTime); keyed by `path`, the only record watched.
        self._observed: Observed[str, dict[str, Any]] = Observed()
        self._last_renew = 0.0
        self._taken = False  # the last round saw another live holder

    @property
    def path(self) -> str:
        return f"/apis/coordination.k8s.io/v1/namespaces/{self.namespace}/leases/{self.name}"

    def _spec(self, transitions: int, acquired: str | None) -> dict[str, Any]:
        now = _now_micro()
        return {"holderIdentity": self.identity,
                "leaseDurationSeconds": max(1, round(self.lease_duration)),
                "acquireTime": acquired or now, "renewTime": now,
                "leaseTransitions": transitions}

    async def try_acquire_or_renew(self) -> bool:
        """One round; True while this replica holds the Lease."""
        loop = asyncio.get_running_loop()
        api = await self.api()
        code, lease = await api.call("GET", self.path)
        if code == 404:
            body = {"apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
                    "metadata": {"name": self.name, "namespace": self.namespace},
                    "spec": self._spec(0, None)}
            code, _ = await api.call("POST", self.path.rsplit("/", 1)[0], body)
            return code == 201
        if code != 200:
            raise ConfigError(f"cannot read the leader Lease {self.namespace}/{self.name}: "
                              f"{code} {lease.get('message', '')}")
        meta, spec = lease.get("metadata") or {}, lease.get("spec") or {}
        version = str(meta.get("resourceVersion"))
        holder = spec.get("holderIdentity")
        now = loop.time()
        self._taken = False
        self._observed.see(self.path, version, now, spec)
        if holder == self.identity:
            new = self._spec(int(spec.get("leaseTransitions") or 0), spec.get("acquireTime"))
        elif holder and (self._observed.unchanged_for(self.path, now) or 0.0) \
                < self.lease_duration:
            self._taken = True  # someone else holds it and has renewed within the duration
            return False
        else:
            new = self._spec(int(spec.get("leaseTransitions") or 0) + 1, None)
        body = {"metadata": {"resourceVersion": version}, "spec": new}
        code, answer = await api.call("PATCH", self.path, body,
                                      "application/merge-patch+json")
        if code == 200:
            self._observed.see(self.path,
                               str((answer.get("metadata") or {}).get("resourceVersion")),
                               loop.time(), answer.get("spec") or new)
            return True
        return False  # 409: someone wrote first; look again next round

    async def run(self, on_started: Callable[[], Awaitable[None]]) -> None:
        """Campaign forever; call `on_started` each time leadership is won."""
        loop = asyncio.get_running_loop()
        while True:
            started = loop.time()
            try:
                async with asyncio.timeout(self.retry_period):
                    held = await self.try_acquire_or_renew()
            except Exception as e:
                logger.warning("leader election: %s", e)
                held = False
            if held:
                self._last_renew = started
                if not self.leading.is_set():
                    logger.info("%s is now the leader (Lease %s/%s)", self.identity,
                                self.namespace, self.name)
                    self.leading.set()
                    await on_started()
            elif self.leading.is_set() and (
                    self._taken or loop.time() - self._last_renew >= self.renew_deadline):
                logger.warning("%s lost the leadership: %s", self.identity,
                               "another replica holds the Lease" if self._taken else
                               f"no renewal for {self.renew_deadline:.0f}s")
                self.leading.clear()
            await asyncio.sleep(max(0.0, self.retry_period - (loop.time() - started)))
