"""The agent sidecar the operator injects into the pods of opted-in StatefulSets.

Pure functions over pod bodies, so the webhook handler stays thin and the
shape of the injection is unit-tested without an API server.
"""

from __future__ import annotations

import copy
from typing import Any

AGENT = "shardlease-agent"
AGENT_PORT = 8470
INJECTED = "shardlease.io/injected"


def owner_statefulset(pod: dict[str, Any]) -> str | None:
    for ref in (pod.get("metadata") or {}).get("ownerReferences") or []:
        if ref.get("kind") == "StatefulSet" and ref.get("apiVersion", "").startswith("apps/"):
            return str(ref.get("name"))
    return None


def agent_container(image: str, shardset: str, pull_policy: str = "IfNotPresent"
                    ) -> dict[str, Any]:
    def field(path: str) -> dict[str, Any]:
        return {"valueFrom": {"fieldRef": {"fieldPath": path}}}

    probe = {"httpGet": {"path": "/healthz", "port": AGENT_PORT}, "periodSeconds": 10}
    return {
        "name": AGENT,
        "image": image,
        "imagePullPolicy": pull_policy,
        "args": ["agent", "--shardset", shardset, "--port", str(AGENT_PORT)],
        "env": [
            {"name": "POD_NAME", **field("metadata.name")},
            {"name": "POD_NAMESPACE", **field("metadata.namespace")},
            {"name": "POD_IP", **field("status.podIP")},
        ],
        "ports": [{"name": "shardlease", "containerPort": AGENT_PORT, "protocol": "TCP"}],
        "livenessProbe": probe,
        "readinessProbe": {"httpGet": {"path": "/readyz", "port": AGENT_PORT},
                           "periodSeconds": 5},
        "resources": {"requests": {"cpu": "20m", "memory": "64Mi"},
                      "limits": {"memory": "256Mi"}},
        # No runAsUser: the image's numeric USER applies, or whatever uid the
        # pod's securityContext or the platform (OpenShift) assigns.
        "securityContext": {
            "runAsNonRoot": True, "readOnlyRootFilesystem": True,
            "allowPrivilegeEscalation": False, "capabilities": {"drop": ["ALL"]},
            "seccompProfile": {"type": "RuntimeDefault"},
        },
    }


def inject(pod: dict[str, Any], image: str, shardset: str) -> dict[str, Any]:
    """The pod with the agent added, or unchanged if it is already there.

    Each application container without a preStop hook gets one that calls the
    agent's /drain: the kubelet runs it before the application's SIGTERM, so
    the agent closes every shard (through the still-running application) and
    frees every lease before the application stops.
    """
    out = copy.deepcopy(pod)
    spec = out.setdefault("spec", {})
    containers = spec.setdefault("containers", [])
    if any(c.get("name") == AGENT for c in containers):
        return out
    for c in containers:
        lifecycle = c.setdefault("lifecycle", {})
        lifecycle.setdefault("preStop", {"httpGet": {"path": "/drain", "port": AGENT_PORT}})
    containers.append(agent_container(image, shardset))
    meta = out.setdefault("metadata", {})
    meta.setdefault("annotations", {})[INJECTED] = "true"
    return out
