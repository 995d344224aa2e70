"""What the tests of real pods get of a cluster, whichever made it: the admin
kubeconfig, kubectl and helm of the cluster's version, and the project's
image loaded into its nodes (use it with `imagePullPolicy: Never`)."""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field

from tests.support.apiread import ApiReader, NotServed, api_path


@dataclass
class Cluster:
    kubeconfig: str
    kubectl_path: str
    helm_path: str
    image: str
    image_id: str
    node_name: str
    #: The polls' reads (tests/support/apiread.py), made at the first.
    _reader: ApiReader | None = field(default=None, repr=False, compare=False)

    def env(self) -> dict[str, str]:
        return dict(os.environ, KUBECONFIG=self.kubeconfig)

    def kubectl(self, *args: str, check: bool = True, input: str | None = None,
                timeout: float = 180) -> subprocess.CompletedProcess:
        p = subprocess.run([self.kubectl_path, *args], input=input, capture_output=True,
                           text=True, timeout=timeout, env=self.env())
        if check and p.returncode != 0:
            raise AssertionError(f"kubectl {' '.join(args)} failed ({p.returncode}):\n"
                                 f"{p.stdout}\n{p.stderr}")
        return p

    def get(self, *args: str) -> dict:
        """`kubectl get -o json ARGS`: a plain read (a resource, a name, -n,
        -l) as one GET on a kept-alive connection, anything else by kubectl."""
        try:
            path = api_path(args)
        except NotServed:
            return json.loads(self.kubectl("get", "-o", "json", *args).stdout)
        reader = self._reader
        if reader is None:
            reader = self._reader = ApiReader(self.kubeconfig)
        status, body = reader.get(path)
        if status != 200:
            message = body.get("message", body) if isinstance(body, dict) else body
            raise AssertionError(f"kubectl get {' '.join(args)} failed (GET {path}: "
                                 f"{status}): {message}")
        return body  # type: ignore[no-any-return]

    def helm(self, *args: str, check: bool = True,
             timeout: float = 300) -> subprocess.CompletedProcess:
        p = subprocess.run([self.helm_path, *args], capture_output=True, text=True,
                           timeout=timeout, env=self.env())
        if check and p.returncode != 0:
            raise AssertionError(f"helm {' '.join(args)} failed ({p.returncode}):\n"
                                 f"{p.stdout}\n{p.stderr}")
        return p


@contextlib.contextmanager
def fresh_namespace(cluster: Cluster) -> Iterator[str]:
    """A new namespace whose `default` ServiceAccount exists (pods are
    refused before it does); deleted afterwards."""
    name = f"p-{uuid.uuid4().hex[:10]}"
    cluster.kubectl("create", "namespace", name)
    deadline = time.monotonic() + 60
    while cluster.kubectl("-n", name, "get", "serviceaccount", "default",
                          check=False).returncode != 0:
        assert time.monotonic() < deadline, f"no default ServiceAccount in {name} after 60s"
        time.sleep(0.3)
    try:
        yield name
    finally:
        cluster.kubectl("delete", "namespace", name, "--wait=false", check=False)
