"""What the chart's RBAC must grant, and only that: the calls the operator and
the agent make (DESIGN.md, issue 4). Both the rendering tests and the tests
against the API server read these tables.

A rule is (apiGroup, resource, verbs, resourceNames).
"""

from __future__ import annotations

ALL_VERBS = ("get", "list", "watch", "create", "update", "patch", "delete")

OPERATOR_ROLE = "shardlease-operator"
AGENT_ROLE = "shardlease-agent"
WEBHOOK_CONFIG = "shardlease"

OPERATOR_RULES: list[tuple[str, str, tuple[str, ...], tuple[str, ...]]] = [
    # Watches StatefulSets for the opt-in annotation; never writes them.
    ("apps", "statefulsets", ("get", "list", "watch"), ()),
    # Lists an opted-in StatefulSet's pods to report those without the agent.
    ("", "pods", ("get", "list"), ()),
    # Owns one ShardSet per opted-in StatefulSet.
    ("shardlease.io", "shardsets", ALL_VERBS, ()),
    # The Configured condition of a malformed annotation.
    ("shardlease.io", "shardsets/status", ("get", "patch", "update"), ()),
    # kopf's and its own Events (both APIs).
    ("", "events", ("create", "patch"), ()),
    ("events.k8s.io", "events", ("create", "patch"), ()),
    # One RoleBinding per opted-in StatefulSet, to the agent's ClusterRole...
    ("rbac.authorization.k8s.io", "rolebindings", ALL_VERBS, ()),
    # ...which it may bind, and no other role.
    ("rbac.authorization.k8s.io", "clusterroles", ("bind",), (AGENT_ROLE,)),
]

AGENT_RULES: list[tuple[str, str, tuple[str, ...], tuple[str, ...]]] = [
    # The lease store (kubernetes://NAMESPACE).
    ("coordination.k8s.io", "leases", ALL_VERBS, ()),
    # Its spec, and the owners it publishes in the status.
    ("shardlease.io", "shardsets", ("get", "list", "watch"), ()),
    ("shardlease.io", "shardsets/status", ("get", "patch", "update"), ()),
    # Peer discovery.
    ("", "pods", ("get", "list", "watch"), ()),
    # handoff: hold reads the StatefulSet's replicas as a pod stops.
    ("apps", "statefulsets", ("get",), ()),
    # Its own events; list: a drain is honoured on the kubelet's Killing event.
    ("", "events", ("create", "patch", "list"), ()),
    ("events.k8s.io", "events", ("create", "patch"), ()),
]


def normalize(rules: list[dict]) -> set[tuple[str, str, str, tuple[str, ...]]]:
    """ClusterRole rules -> {(group, resource, verb, resourceNames)}."""
    out = set()
    for r in rules:
        for g in r.get("apiGroups", []):
            for res in r.get("resources", []):
                for v in r.get("verbs", []):
                    out.add((g, res, v, tuple(sorted(r.get("resourceNames") or ()))))
    return out


def expand(table: list[tuple[str, str, tuple[str, ...], tuple[str, ...]]]
           ) -> set[tuple[str, str, str, tuple[str, ...]]]:
    return {(g, res, v, tuple(sorted(names))) for g, res, verbs, names in table for v in verbs}
