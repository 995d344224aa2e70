"""`/drain`: whether a drain is the pod's end, a pause, or refused.

The kubelet runs a container's preStop hook in two cases: the pod is being
deleted (a rollout, a scale-down, an eviction), and the container alone is
being restarted (a failed liveness or startup probe). Only the first is the
end of this pod's shards; after the second the application comes back in the
same pod and the agent must take shards again.

The hook is an HTTP GET from the kubelet to a port anyone on the pod network
can reach, and a hook's headers are plain text in the pod spec, which anyone
who can read pods can read: no secret can ride on it. So the request is not
trusted at all; it only asks the agent to look at what the API server says:

- the pod has a deletion timestamp: the drain is final. A caller can only
  hurry a hand-off that is coming anyway;
- the kubelet announced that it is stopping one of the containers that carry
  this drain hook (an Event, reason `Killing`, about that container, newer
  than the container's start; the kubelet records it just before it runs the
  hook): the drain is a pause until a container restarted;
- neither (within `ANNOUNCE_WAIT`, since the kubelet's events reach the API
  server asynchronously): refused, and nothing changes.

Events are written by whoever may create them in the namespace: the chart's
isolation policy (charts/shardlease/templates/isolation.yaml) refuses an
Event with reason `Killing` about a ShardSet's pods from the namespace's
ServiceAccounts, so that one workload cannot forge the kubelet's word to
pause another's pods.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from datetime import datetime
from typing import Any, Literal

#: The path and reason the kubelet uses.
DRAIN_PATH = "/drain"
KILLING = "Killing"

#: Seconds a drain request that is neither final nor announced waits for the
#: kubelet's event before it is refused (the preStop hook has the pod's
#: termination grace period, 30 s by default).
ANNOUNCE_WAIT = 5.0

Verdict = Literal["final", "pause", "refuse"]


def terminating(pod: Mapping[str, Any] | None) -> bool:
    return bool(((pod or {}).get("metadata") or {}).get("deletionTimestamp"))


def drain_containers(pod: Mapping[str, Any] | None, port: int) -> set[str]:
    """The regular containers whose preStop hook is this agent's drain."""
    out: set[str] = set()
    for c in ((pod or {}).get("spec") or {}).get("containers") or []:
        get = (((c.get("lifecycle") or {}).get("preStop") or {}).get("httpGet") or {})
        if get.get("path") == DRAIN_PATH and str(get.get("port")) == str(port):
            out.add(str(c.get("name")))
    return out


def _time(value: Any) -> datetime | None:
    if not isinstance(value, str) or not value:
        return None
    try:
        return datetime.fromisoformat(value.replace("Z", "+00:00"))
    except ValueError:
        return None


def event_time(event: Mapping[str, Any]) -> datetime | None:
    """When an Event last happened: core/v1 Events carry lastTimestamp (the
    kubelet's) or, from the newer API, eventTime and series.lastObservedTime."""
    series = event.get("series") or {}
    times = [_time(v) for v in (event.get("lastTimestamp"), series.get("lastObservedTime"),
                                event.get("eventTime"), event.get("firstTimestamp"))]
    found = [t for t in times if t is not None]
    return max(found) if found else None


def started(pod: Mapping[str, Any] | None, container: str) -> datetime | None:
    """When the running instance of `container` started (None: not running)."""
    for c in ((pod or {}).get("status") or {}).get("containerStatuses") or []:
        if c.get("name") == container:
            return _time(((c.get("state") or {}).get("running") or {}).get("startedAt"))
    return None


def stop_announced(pod: Mapping[str, Any] | None, events: Iterable[Mapping[str, Any]],
                   port: int) -> str | None:
    """The drain container whose stop the kubelet announced for its running
    instance (an Event `Killing` about it, at or after its start), else None."""
    meta = (pod or {}).get("metadata") or {}
    hooked = drain_containers(pod, port)
    for event in events:
        about = event.get("involvedObject") or {}
        if event.get("reason") != KILLING or about.get("kind", "Pod") != "Pod":
            continue
        if about.get("name") != meta.get("name") or (
                meta.get("uid") and about.get("uid") != meta.get("uid")):
            continue
        path = str(about.get("fieldPath") or "")
        if not (path.startswith("spec.containers{") and path.endswith("}")):
            continue
        name = path[len("spec.containers{"):-1]
        since, at = started(pod, name), event_time(event)
        if name in hooked and since is not None and at is not None and at >= since:
            return name
    return None


def verdict(pod: Mapping[str, Any] | None, events: Iterable[Mapping[str, Any]],
            port: int) -> tuple[Verdict, str]:
    """What a drain request comes to, from the API server's view alone, and
    why (for the log and the answer)."""
    if terminating(pod):
        return "final", "the pod is being deleted"
    which = stop_announced(pod, events, port)
    if which is not None:
        return "pause", f"the kubelet is stopping container {which}"
    return "refuse", ("the pod is not being deleted and the kubelet announced no stop of a "
                      "container with this drain hook")


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
