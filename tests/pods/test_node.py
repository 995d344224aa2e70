"""The kind cluster runs real pods of the project's image: every node is
Ready, a StatefulSet becomes Ready, a deleted pod comes back, logs and exec
work, and a pod reaches the API server through the `kubernetes` Service with
its ServiceAccount token."""

from __future__ import annotations

import ipaddress
import json
import time

import pytest

from tests.support.kind import kindmod

from .conftest import clmod, fresh_namespace

pytestmark = pytest.mark.slow

# The container proves the image's CLI starts (`shardlease --help`), then
# marks itself ready and waits for SIGTERM.
APP = r"""
import signal, subprocess, sys, time
out = subprocess.run(["shardlease", "--help"], capture_output=True, text=True)
print("shardlease --help exit", out.returncode, flush=True)
print(out.stdout.splitlines()[0] if out.stdout else out.stderr, flush=True)
if out.returncode != 0:
    sys.exit(1)
open("/tmp/ready", "w").close()
print("ready", flush=True)
signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
while True:
    time.sleep(3600)
"""

# Run inside a pod: GET /version and POST a SelfSubjectReview through the
# `kubernetes` Service (found by its DNS name), authenticated by the pod's
# ServiceAccount token and verifying the API server with the mounted CA.
WHOAMI = r"""
import json, os, ssl, urllib.request
import socket
sa = "/var/run/secrets/kubernetes.io/serviceaccount"
# by name, through the cluster DNS, to the Service's ClusterIP
base = "https://kubernetes.default.svc:443"
resolved = socket.gethostbyname("kubernetes.default.svc")
ctx = ssl.create_default_context(cafile=sa + "/ca.crt")
hdr = {"Authorization": "Bearer " + open(sa + "/token").read().strip(),
       "Content-Type": "application/json"}
def call(path, body=None):
    req = urllib.request.Request(base + path, headers=hdr,
                                 data=None if body is None else json.dumps(body).encode())
    with urllib.request.urlopen(req, context=ctx, timeout=10) as r:
        return json.loads(r.read())
version = call("/version")
review = call("/apis/authentication.k8s.io/v1/selfsubjectreviews",
              {"apiVersion": "authentication.k8s.io/v1", "kind": "SelfSubjectReview"})
print(json.dumps({"resolved": resolved, "env_host": os.environ["KUBERNETES_SERVICE_HOST"],
                  "version": version["gitVersion"],
                  "user": review["status"]["userInfo"]["username"]}))
"""


def _statefulset(image: str) -> dict:
    labels = {"app": "smoke"}
    return {
        "apiVersion": "apps/v1", "kind": "StatefulSet",
        "metadata": {"name": "smoke"},
        "spec": {
            "serviceName": "smoke", "replicas": 2,
            "selector": {"matchLabels": labels},
            "template": {
                "metadata": {"labels": labels},
                "spec": {
                    "terminationGracePeriodSeconds": 5,
                    "containers": [{
                        "name": "app", "image": image, "imagePullPolicy": "Never",
                        "command": ["python", "-c", APP],
                        "readinessProbe": {"exec": {"command": ["test", "-f", "/tmp/ready"]},
                                           "periodSeconds": 1},
                    }],
                },
            },
        },
    }


def _ready_pods(cluster, ns: str) -> dict[str, dict]:
    pods = cluster.get("-n", ns, "pods", "-l", "app=smoke")["items"]
    return {p["metadata"]["name"]: p for p in pods
            if p["status"].get("phase") == "Running"
            and any(c["type"] == "Ready" and c["status"] == "True"
                    for c in p["status"].get("conditions", []))}


def _until(what: str, check, timeout: float = 180):
    deadline = time.monotonic() + timeout
    while True:
        got = check()
        if got:
            return got
        assert time.monotonic() < deadline, f"{what}: not within {timeout:.0f}s"
        time.sleep(0.5)


@pytest.fixture(scope="module")
def smoke(cluster):
    """A Ready StatefulSet `smoke` of 2 pods of the project's image."""
    with fresh_namespace(cluster) as ns:
        t0 = time.monotonic()
        cluster.kubectl("-n", ns, "apply", "-f", "-",
                        input=json.dumps(_statefulset(cluster.image)))
        cluster.kubectl("-n", ns, "rollout", "status", "statefulset/smoke", "--timeout=300s",
                        timeout=320)
        print(f"\n[smoke] StatefulSet of 2 Ready in {time.monotonic() - t0:.1f}s")
        yield ns


def test_every_node_is_ready_and_real(cluster):
    """One control plane and two workers (kind's nodes), each a real kubelet
    on containerd, each at its own address on the kind network."""
    nodes = cluster.get("nodes")["items"]
    names = sorted(n["metadata"]["name"] for n in nodes)
    assert names == sorted([cluster.node_name, *cluster.workers]), names
    addresses = set()
    for node in nodes:
        ready = {c["type"]: c["status"] for c in node["status"]["conditions"]}
        assert ready["Ready"] == "True", node["metadata"]["name"]
        info = node["status"]["nodeInfo"]
        assert info["kubeletVersion"] == clmod.cp.K8S_VERSION
        assert info["containerRuntimeVersion"].startswith("containerd://")
        (internal,) = [a["address"] for a in node["status"]["addresses"]
                       if a["type"] == "InternalIP"]
        addresses.add(internal)
    assert len(addresses) == len(nodes), addresses


def test_statefulset_pods_run_the_image(cluster, smoke):
    pods = _ready_pods(cluster, smoke)
    assert sorted(pods) == ["smoke-0", "smoke-1"]
    for pod in pods.values():
        (status,) = pod["status"]["containerStatuses"]
        assert status["ready"] is True
        assert status["restartCount"] == 0
        assert status["image"] == clmod.IMAGE_REF
        assert ipaddress.ip_address(pod["status"]["podIP"]) in \
            ipaddress.ip_network(kindmod.POD_SUBNET)
    logs = cluster.kubectl("-n", smoke, "logs", "smoke-0").stdout
    assert "shardlease --help exit 0" in logs
    assert "ready" in logs.splitlines()


def test_pod_reaches_api_server_with_its_service_account(cluster, smoke):
    out = cluster.kubectl("-n", smoke, "exec", "smoke-0", "--", "python", "-c", WHOAMI).stdout
    got = json.loads(out.strip().splitlines()[-1])
    assert got["version"] == clmod.cp.K8S_VERSION
    assert got["user"] == f"system:serviceaccount:{smoke}:default"
    # the `kubernetes` Service's ClusterIP (DNATed by kube-proxy to the node
    # address), by DNS as by the environment the kubelet injects
    svc = cluster.get("-n", "default", "service", "kubernetes")
    assert got["resolved"] == got["env_host"] == svc["spec"]["clusterIP"]


def test_deleted_pod_is_recreated_and_ready(cluster, smoke):
    old = _ready_pods(cluster, smoke)["smoke-1"]["metadata"]["uid"]
    t0 = time.monotonic()
    cluster.kubectl("-n", smoke, "delete", "pod", "smoke-1", "--wait=true", timeout=120)

    def back():
        pod = _ready_pods(cluster, smoke).get("smoke-1")
        return pod if pod and pod["metadata"]["uid"] != old else None

    pod = _until("smoke-1 recreated and Ready", back)
    print(f"\n[smoke] deleted pod back to Ready in {time.monotonic() - t0:.1f}s")
    assert pod["metadata"]["uid"] != old
    assert sorted(_ready_pods(cluster, smoke)) == ["smoke-0", "smoke-1"]


def test_the_runtime_image_holds_what_runs_in_production_and_nothing_else(cluster) -> None:
    """`docker build .` (the runtime target) carries shardlease and its pinned
    dependencies: not the example app, the development tools, the demo's
    `rich`, moto, kubernetes_asyncio, nor pip, and botocore's models of S3 and
    its credential providers only. Read from inside the image by e2e/cluster.py's
    build (runtime-image.json); the sizes are printed, not asserted."""
    report = json.loads((clmod.cp.cache_dir() / "runtime-image.json").read_text())
    print(f"\n[image] {report['image']}: {report['size_bytes'] / 1e6:.0f} MB "
          f"(with the example app: {report['example_size_bytes'] / 1e6:.0f} MB); "
          f"the agent's and operator's modules imported: "
          f"{report['agent_import_rss_mb']:.1f} MB resident")
    assert report["help_exit"] == 0
    assert all(report["absent"].values()), report["absent"]
    assert set(report["absent"]) >= {"shardlease_examples", "shardlease_tools", "rich", "pip",
                                     "kubernetes_asyncio"}
    # botocore's models are pruned to the S3 store's and its credential
    # providers' (the Dockerfile's PRUNE_BOTOCORE): each client still loads.
    assert report.get("botocore_clients") == ["s3", "sso", "sso-oidc", "sts"], report
