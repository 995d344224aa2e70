"""Whether a stopping pod's shards are kept for its name (`handoff: hold`).

A pod of a StatefulSet that stops for a rollout comes back under the same
name, so its shards wait for it (docs/renewal.md rule 13); one that stops for
a scale-down never comes back, so its shards must go to the others at once.
The StatefulSet controller lowers `spec.replicas` before it deletes the pods
above them, so the replicas read as the pod stops tell the two apart.

A read that fails is retried within a budget: under a loaded API server one
slow GET would otherwise turn every held restart into a move. If no read
succeeds the shards are freed for the others: a move costs a close and an
open, a hold for a pod that is gone leaves its shards closed for holdSeconds.

The budget is a share of the pod's grace period that is left (`read_budget`):
the kubelet kills the agent when the grace runs out, and what the read takes
from it is taken from closing the shards and freeing their leases. A pod
killed before it freed them is still safe (its leases expire and it fenced
before that), but its shards stay closed for a lease TTL instead of reopening
at once.
"""

from __future__ import annotations

import asyncio
import math
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any

#: Seconds the replicas may take to read, over every attempt, as a pod stops
#: (well inside the 30 s grace period a pod has by default).
READ_BUDGET = 12.0
#: Seconds one attempt may take.
ATTEMPT_TIMEOUT = 5.0
#: The share of the grace period left that the read may take; the rest is
#: for closing the shards and freeing their leases. With the API's default
#: grace (30 s) it is the whole READ_BUDGET.
GRACE_SHARE = 0.4
#: The API's default terminationGracePeriodSeconds.
DEFAULT_GRACE = 30.0


@dataclass(frozen=True)
class Hold:
    """How long the shards are kept for the pod's name, and why."""

    seconds: float
    why: str
    #: The StatefulSet could not be read: nobody knows if the pod comes back.
    unknown: bool = False


@dataclass(frozen=True)
class ReplicasRead:
    """What reading the StatefulSet gave: its replicas, or why there are none."""

    replicas: int | None
    error: str = ""
    #: The StatefulSet is not there (deleted): nothing brings the pod back.
    gone: bool = False


@dataclass(frozen=True)
class Budget:
    """How long the replicas may take to read as this pod stops, and why."""

    seconds: float
    why: str


def _seconds(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    return float(value) if math.isfinite(value) and value >= 0 else None


def _timestamp(value: Any) -> datetime | None:
    if not isinstance(value, str) or not value:
        return None
    try:
        parsed = datetime.fromisoformat(value.replace("Z", "+00:00"))
    except ValueError:
        return None
    return parsed if parsed.tzinfo is not None else None


def read_budget(pod: Mapping[str, Any] | None, now: datetime, stopping_for: float) -> Budget:
    """The read's budget: GRACE_SHARE of the grace left, at most READ_BUDGET.

    The grace is the deletion's (`kubectl delete --grace-period` sets
    metadata.deletionGracePeriodSeconds), else the pod's
    spec.terminationGracePeriodSeconds, else the API's default; what is left
    of it is counted from when the stop began here (`stopping_for` seconds
    ago) and, when the pod is being deleted, is at most what is left until
    its deletionTimestamp. The kubelet counts the grace from when it begins
    to stop the pod, at or after that timestamp's start, so the second bound
    only ever shortens the budget: it covers an agent told late (a native
    sidecar is stopped after the application's containers), and a node clock
    far ahead of the API server's makes it 0, which costs the hold, not
    safety. `now` is timezone-aware.
    """
    meta, spec = ((pod or {}).get(k) for k in ("metadata", "spec"))
    meta = meta if isinstance(meta, Mapping) else {}
    spec = spec if isinstance(spec, Mapping) else {}
    grace, source = DEFAULT_GRACE, "the default grace period"
    for value, named in ((meta.get("deletionGracePeriodSeconds"), "the deletion's grace period"),
                         (spec.get("terminationGracePeriodSeconds"), "the pod's grace period")):
        if (seconds := _seconds(value)) is not None:
            grace, source = seconds, named
            break
    left = grace - max(0.0, stopping_for)
    why = f"{source} ({grace:g}s), {max(0.0, left):.1f}s of it left"
    deleted = _timestamp(meta.get("deletionTimestamp"))
    if deleted is not None and (until := (deleted - now).total_seconds()) < left:
        left = until
        why = f"{max(0.0, until):.1f}s left until the pod's deletionTimestamp"
    seconds = min(READ_BUDGET, max(0.0, GRACE_SHARE * left))
    return Budget(round(seconds, 3), why)


def ordinal(pod_name: str) -> int | None:
    _, _, tail = pod_name.rpartition("-")
    return int(tail) if tail.isdigit() else None


def needs_replicas(handoff: str, pod_name: str) -> bool:
    """Whether the decision needs the StatefulSet's replicas at all."""
    return handoff == "hold" and ordinal(pod_name) is not None


def decide(handoff: str, hold_seconds: float, pod_name: str,
           read: ReplicasRead | None) -> Hold:
    if handoff != "hold":
        return Hold(0.0, f"handoff: {handoff}")
    n = ordinal(pod_name)
    if n is None:
        # Not a StatefulSet's pod name: nothing scales it away.
        return Hold(hold_seconds, f"{pod_name} is no StatefulSet ordinal, nothing scales it away")
    if read is None or (read.replicas is None and not read.gone):
        error = read.error if read is not None else "not read"
        return Hold(0.0, f"the StatefulSet could not be read ({error}): nobody knows whether "
                    f"{pod_name} comes back", unknown=True)
    if read.gone or read.replicas is None:
        return Hold(0.0, "the StatefulSet is gone")
    if n >= read.replicas:
        return Hold(0.0, f"{pod_name} is scaled away (replicas {read.replicas})")
    return Hold(hold_seconds, f"{pod_name} is below replicas {read.replicas}: it comes back")


def parse_replicas(code: int, body: Any) -> tuple[ReplicasRead, bool]:
    """A GET's answer as a read, and whether another attempt may do better."""
    body = body if isinstance(body, dict) else {}
    if code == 200:
        replicas = (body.get("spec") or {}).get("replicas", 1)  # the API's default is 1
        if isinstance(replicas, int) and not isinstance(replicas, bool):
            return ReplicasRead(replicas), False
        return ReplicasRead(None, f"spec.replicas is {replicas!r}"), False
    if code == 404:
        return ReplicasRead(None, "404", gone=True), False
    error = f"{code} {body.get('message', '')}".strip()
    return ReplicasRead(None, error), code == 429 or code >= 500


async def read_replicas(get: Callable[[], Awaitable[tuple[int, Any]]],
                        budget: float = READ_BUDGET, attempt_timeout: float = ATTEMPT_TIMEOUT,
                        clock: Callable[[], float] = time.monotonic) -> ReplicasRead:
    """Read the replicas, retrying failures that may pass until `budget` is spent."""
    deadline = clock() + budget
    pause, attempts = 0.25, 0
    last = ReplicasRead(None, "not read")
    while True:
        attempts += 1
        left = deadline - clock()
        try:
            async with asyncio.timeout(max(0.1, min(attempt_timeout, left))):
                code, body = await get()
        except Exception as e:
            last, again = ReplicasRead(None, f"{type(e).__name__}: {e}".rstrip(": ")), True
        else:
            last, again = parse_replicas(code, body)
        if not again or clock() + pause >= deadline:
            break
        await asyncio.sleep(pause)
        pause = min(pause * 2, 2.0)
    if last.replicas is None and not last.gone:
        last = ReplicasRead(None, f"{last.error}, after {attempts} attempt(s) within {budget:g}s")
    return last
