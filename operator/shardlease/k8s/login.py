"""kopf login and identity for the agent's and the operator's registries.

A registry of our own (`kopf.OperatorRegistry()`) has none of kopf's default
login handlers, so each registers this one. It logs in exactly as
`shardlease.kubeapi` does for the calls of our own (the pod's ServiceAccount
inside a cluster, else the kubeconfig and its context, exec plugins
included), so kopf's watches and our requests never use two different
identities. Credentials that expire (an exec plugin's) carry their expiry,
and kopf logs in again when they pass it or on a 401.

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

from shardlease import kubeapi


def register_login(registry: kopf.OperatorRegistry, kubeconfig: str | None = None) -> None:
    @kopf.on.login(registry=registry)
    async def login(**_: Any) -> kopf.ConnectionInfo:
        return await connection_info(kubeapi.login(kubeconfig))


async def connection_info(login: kubeapi.Login) -> kopf.ConnectionInfo:
    """kopf's form of a kubeapi Login, with its credentials of this moment."""
    creds = await kubeapi.credentials(login)
    auth = creds.headers.get("Authorization", "")
    scheme, _, token = auth.partition(" ")
    return kopf.ConnectionInfo(
        server=login.server, ca_path=login.ca_file, ca_data=login.ca_data,
        insecure=login.insecure or None,
        scheme=scheme or None, token=token or None,
        certificate_path=None if (creds.cert_data or login.cert_data) else login.cert_file,
        certificate_data=creds.cert_data or login.cert_data,
        private_key_path=None if (creds.key_data or login.key_data) else login.key_file,
        private_key_data=creds.key_data or login.key_data,
        default_namespace=login.namespace, expiration=creds.expires)


def identity(pod_name: str | None = None) -> Identity:
    """A kopf identity that works for any uid, with or without a passwd entry."""
    name = pod_name or os.environ.get("POD_NAME") or socket.gethostname() or "shardlease"
    return Identity(f"{name}/{os.getpid()}")
