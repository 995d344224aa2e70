"""Peer discovery: the Running and Ready pods of one StatefulSet.

Only names seen here are routed to (lease data never adds a routing target).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Pod:
    name: str
    ip: str | None
    ready: bool
    labels: tuple[tuple[str, str], ...] = ()


def matches(labels: dict[str, str] | None, selector: dict[str, str]) -> bool:
    labels = labels or {}
    return bool(selector) and all(labels.get(k) == v for k, v in selector.items())


def pod_ready(body: dict[str, Any]) -> bool:
    status = body.get("status") or {}
    if status.get("phase") != "Running":
        return False
    return any(c.get("type") == "Ready" and c.get("status") == "True"
               for c in status.get("conditions") or [])


class Peers:
    """Every pod of the namespace seen by the watch; the selector (which may
    change with the ShardSet) picks the peers at query time."""

    def __init__(self, selector: dict[str, str] | None = None) -> None:
        self.selector = dict(selector or {})
        self.pods: dict[str, Pod] = {}

    def observe(self, event_type: str | None, body: dict[str, Any]) -> None:
        """Feed a watch event (ADDED/MODIFIED/DELETED, or None for a listing)."""
        meta = body.get("metadata") or {}
        name = meta.get("name")
        if not name:
            return
        if event_type == "DELETED":
            self.pods.pop(name, None)
            return
        labels = tuple(sorted((meta.get("labels") or {}).items()))
        self.pods[name] = Pod(name, (body.get("status") or {}).get("podIP"), pod_ready(body),
                              labels)

    def _peer(self, pod: Pod | None) -> bool:
        return pod is not None and pod.ready and matches(dict(pod.labels), self.selector)

    def names(self) -> set[str]:
        return {p.name for p in self.pods.values() if self._peer(p)}

    def address(self, name: str) -> str | None:
        pod = self.pods.get(name)
        return pod.ip if pod is not None and self._peer(pod) else None
