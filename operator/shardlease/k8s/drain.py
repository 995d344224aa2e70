"""`/drain`: who may call it, and whether it is the pod's end or a pause.

The kubelet runs a container's preStop hook in two cases: the pod is being
deleted (a rollout, a scale-down, an eviction), and the container alone is
being restarted after a failed liveness or startup probe. Only the first is
the end of this pod's shards; after the second the application comes back in
the same pod and the agent must take shards again. So a drain asks the API
server whether the pod has a deletion timestamp: if so it is final, if not it
hands the shards off and resumes once an application container restarted.

The hook is an HTTP GET from the kubelet to a port anyone on the pod network
can reach, so it carries a per-pod token: the webhook writes the same random
value into the hook's header and into the agent's environment.
"""

from __future__ import annotations

import hmac
from collections.abc import Mapping
from typing import Any

TOKEN_HEADER = "X-Shardlease-Drain-Token"
TOKEN_ENV = "SHARDLEASE_DRAIN_TOKEN"


def token_accepted(expected: str | None, given: str | None) -> bool:
    """A drain is accepted only with the pod's token; an agent started
    without one (by hand, embedded) accepts none from the network."""
    if not expected or given is None:
        return False
    return hmac.compare_digest(expected.encode(), given.encode())


def terminating(pod: Mapping[str, Any] | None) -> bool:
    return bool(((pod or {}).get("metadata") or {}).get("deletionTimestamp"))


def restart_counts(pod: Mapping[str, Any] | None, skip: str) -> dict[str, int]:
    """restartCount of each regular container but `skip` (the agent)."""
    status = (pod or {}).get("status") or {}
    return {str(c.get("name")): int(c.get("restartCount") or 0)
            for c in status.get("containerStatuses") or [] if c.get("name") != skip}


def restarted(before: Mapping[str, int], pod: Mapping[str, Any] | None, skip: str) -> bool:
    """True once a container that was counted in `before` restarted and runs."""
    status = (pod or {}).get("status") or {}
    for c in status.get("containerStatuses") or []:
        name = c.get("name")
        if name == skip or name not in before:
            continue
        if int(c.get("restartCount") or 0) > before[name] and "running" in (c.get("state") or {}):
            return True
    return False
