"""kopf login for the agent's and the operator's registries.

A registry of our own (`kopf.OperatorRegistry()`) has none of kopf's default
login handlers, so each registers this one: the pod's ServiceAccount inside
a cluster, else the kubeconfig.
"""

from __future__ import annotations

from typing import Any

import kopf


def register_login(registry: kopf.OperatorRegistry) -> None:
    @kopf.on.login(registry=registry)
    def login(**kwargs: Any) -> kopf.ConnectionInfo | None:
        return kopf.login_with_service_account(**kwargs) or kopf.login_with_kubeconfig(**kwargs)
