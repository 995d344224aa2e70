"""Reads from a cluster's API server for the tests' polls, without a kubectl
process per read.

The tests of real pods poll the cluster several times a second while a fault
runs (the pod list of a sampler, a ShardSet's status, a node's conditions). As
`kubectl get -o json` each poll is a process of about 0.05 s of CPU with a TLS
handshake; a warm run made some 1,700 of them (about 86 core-seconds on a
2-core machine). Here a poll is one GET on a kept-alive connection (one per
thread). Only reads the tests make to watch are served here; what a user
types (`kubectl get shardsets`, `kubectl shardlease`, `kubectl drain`) stays
kubectl, as typed.
"""

from __future__ import annotations

import base64
import http.client
import json
import ssl
import tempfile
import threading
import urllib.parse
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

#: kubectl's resource names the polls use -> (API prefix, plural, namespaced).
RESOURCES: dict[str, tuple[str, str, bool]] = {}
for _names, _where in (
        (("pod", "pods", "po"), ("/api/v1", "pods", True)),
        (("node", "nodes", "no"), ("/api/v1", "nodes", False)),
        (("event", "events", "ev"), ("/api/v1", "events", True)),
        (("statefulset", "statefulsets", "sts"), ("/apis/apps/v1", "statefulsets", True)),
        (("poddisruptionbudget", "poddisruptionbudgets", "pdb"),
         ("/apis/policy/v1", "poddisruptionbudgets", True)),
        (("lease", "leases"), ("/apis/coordination.k8s.io/v1", "leases", True)),
        (("shardset", "shardsets", "shardset.shardlease.io", "shardsets.shardlease.io"),
         ("/apis/shardlease.io/v1alpha1", "shardsets", True))):
    for _name in _names:
        RESOURCES[_name] = _where


class NotServed(Exception):
    """These kubectl arguments are not a plain read served here: use kubectl."""


def api_path(args: tuple[str, ...]) -> str:
    """The API path of `kubectl get -o json ARGS` for a plain read (a
    resource, maybe a name, `-n NS`, `-l SELECTOR`); NotServed otherwise."""
    positional: list[str] = []
    namespace, selector = None, None
    it = iter(args)
    for a in it:
        if a in ("-n", "--namespace"):
            namespace = next(it, None)
        elif a in ("-l", "--selector"):
            selector = next(it, None)
        elif a.startswith("--namespace="):
            namespace = a.split("=", 1)[1]
        elif a.startswith("--selector="):
            selector = a.split("=", 1)[1]
        elif a.startswith("-"):
            raise NotServed(a)
        else:
            positional.append(a)
    if not 1 <= len(positional) <= 2 or positional[0] not in RESOURCES:
        raise NotServed(" ".join(positional))
    prefix, plural, namespaced = RESOURCES[positional[0]]
    if namespaced and namespace is None:
        raise NotServed("no namespace: kubectl would use the kubeconfig's")
    path = f"{prefix}/namespaces/{namespace}/{plural}" if namespaced else f"{prefix}/{plural}"
    if len(positional) == 2:
        if selector is not None:
            raise NotServed("a name and a selector")
        return f"{path}/{urllib.parse.quote(positional[1])}"
    if selector is not None:
        path += "?" + urllib.parse.urlencode({"labelSelector": selector})
    return path


@dataclass
class ApiReader:
    """GETs with the kubeconfig's current context (client certificates, as
    kind and kubeadm write them)."""

    kubeconfig: str
    _local: threading.local = field(default_factory=threading.local)
    _lock: threading.Lock = field(default_factory=threading.Lock)
    _files: tempfile.TemporaryDirectory[str] | None = None
    _context: ssl.SSLContext | None = None
    _host: str = ""
    _port: int = 443

    def _setup(self) -> None:
        config = yaml.safe_load(Path(self.kubeconfig).read_text())
        current = config.get("current-context")
        context = next(c["context"] for c in config["contexts"]
                       if c["name"] == current) if current else config["contexts"][0]["context"]
        cluster = next(c["cluster"] for c in config["clusters"] if c["name"] == context["cluster"])
        user = next(u["user"] for u in config["users"] if u["name"] == context["user"])
        url = urllib.parse.urlsplit(cluster["server"])
        self._host, self._port = url.hostname or "127.0.0.1", url.port or 443
        # (Removed when the reader is collected or the process exits.)
        self._files = tempfile.TemporaryDirectory(prefix="apiread-")
        where = Path(self._files.name)

        def material(key: str, data_key: str) -> str:
            if data_key in user or data_key in cluster:
                path = where / key
                path.write_bytes(base64.b64decode((user | cluster)[data_key]))
                return str(path)
            return str((user | cluster)[key])
        ctx = ssl.create_default_context(cafile=material("certificate-authority",
                                                         "certificate-authority-data"))
        ctx.load_cert_chain(material("client-certificate", "client-certificate-data"),
                            material("client-key", "client-key-data"))
        self._context = ctx

    def _connection(self) -> http.client.HTTPSConnection:
        conn: http.client.HTTPSConnection | None = getattr(self._local, "conn", None)
        if conn is None:
            with self._lock:  # (a sampler's thread and the test's may ask at once)
                if self._context is None:
                    self._setup()
            conn = http.client.HTTPSConnection(self._host, self._port, context=self._context,
                                               timeout=30)
            self._local.conn = conn
        return conn

    def get(self, path: str) -> tuple[int, Any]:
        """(status, parsed body); a dropped kept-alive connection is made again once."""
        for attempt in (1, 2):
            conn = self._connection()
            try:
                conn.request("GET", path, headers={"Accept": "application/json"})
                resp = conn.getresponse()
                data = resp.read()
            except (OSError, http.client.HTTPException):
                conn.close()
                self._local.conn = None
                if attempt == 2:
                    raise
                continue
            try:
                return resp.status, json.loads(data)
            except ValueError:
                return resp.status, data.decode(errors="replace")
        raise AssertionError("unreachable")
