"""kopf login and identity for the agent's and the operator's registries.

A registry of our own (`kopf.OperatorRegistry()`) has none of kopf's default
login handlers, so each registers this one: the pod's ServiceAccount inside
a cluster, else the kubeconfig.

kopf names every operator process by an identity. Left to itself it builds
one from `getpass.getuser()`, which looks the uid up in /etc/passwd and
raises `KeyError` when the uid has none: the case of the image's uid 65532,
and of every arbitrary uid that OpenShift assigns. So both commands hand kopf
an identity made from the pod's name (downward API), or the host name and
pid outside a pod, and never consult the passwd database.
"""

from __future__ import annotations

import os
import socket
from typing import Any

import kopf

# kopf's identity type is not re-exported; it is a NewType of str.
from kopf._core.engines.peering import Identity


def register_login(registry: kopf.OperatorRegistry) -> None:
    @kopf.on.login(registry=registry)
    def login(**kwargs: Any) -> kopf.ConnectionInfo | None:
        return kopf.login_with_service_account(**kwargs) or kopf.login_with_kubeconfig(**kwargs)


def identity(pod_name: str | None = None) -> Identity:
    """A kopf identity that works for any uid, with or without a passwd entry."""
    name = pod_name or os.environ.get("POD_NAME") or socket.gethostname() or "shardlease"
    return Identity(f"{name}/{os.getpid()}")
