"""The user story on real pods: `helm install` of the chart with the real
image, the example application's StatefulSet opted in by annotation, and the
things that happen to pods every day.

- the webhook injects the agent, the agents come up Ready, the ShardSet
  becomes Balanced, `kubectl get shardsets` shows it, and keys written through
  `/lookup` land on the owner, fenced by the generation (MinIO on the node);
- `kubectl delete pod` of an owner: its shards reopen with a higher generation;
- `kubectl rollout restart`: every pod replaced, shards handed off before the
  application's SIGTERM (the preStop drain), no key lost; then again under
  `handoff: hold`: every shard back on its own pod, none moved;
- scale 3 -> 5 -> 2: balanced each time;
- the application restarted by the kubelet after a failed liveness probe (the
  drain is then a pause) and the agent killed: each pod takes shards again;
- both pod management policies.

Figures (time to Balanced, moves, unowned shard-seconds) are printed, not
asserted: what is asserted is that things converge and nothing is lost.
"""

from __future__ import annotations

import errno
import json
import math
import os
import re
import signal
import subprocess
import sys
import threading
import time
import traceback
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import pytest

from tests.support.kind import Kind
from tests.support.s3server import minio_server

from .conftest import ROOT, Cluster, clmod, fresh_namespace

pytestmark = pytest.mark.slow

T = TypeVar("T")
SHARDS = 12
TTL = 6  # seconds: interval 2, margin 1
# As e2e/kind.sh installs it: the chart keeps the agents' ClusterRole on uninstall,
# and helm adopts it only into a release of the same name and namespace.
RELEASE, RELEASE_NS = "shardlease", "shardlease"
GROUP = "shardlease.io"
#: What a request to a pod whose application (or the pod) is gone fails with.
GONE = (errno.ECONNREFUSED, errno.EHOSTUNREACH, errno.ENETUNREACH)


def eventually(check: Callable[[], T], what: str, timeout: float = 120.0,
               every: float = 1.0) -> T:
    """`check()` until it is true. Once a second: most checks are kubectl
    calls (about 0.08 s of CPU each, and the API server's work), and the
    figures that need a finer clock (unowned shard-seconds) come from the
    Sampler, not from here."""
    deadline = time.monotonic() + timeout
    last: Any = None
    while True:
        try:
            last = check()
        except Exception as e:  # a poll may race with a restart; keep polling
            last = e
        if last and not isinstance(last, Exception):
            return last  # type: ignore[no-any-return]
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout:.0f}s waiting for {what}; "
                                 f"last: {last!r}")
        time.sleep(every)


def http(method: str, url: str, body: bytes | None = None,
         timeout: float = 5.0) -> tuple[int, bytes]:
    req = urllib.request.Request(url, data=body, method=method)
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            return r.status, r.read()
    except urllib.error.HTTPError as e:
        return e.code, e.read()


# -- MinIO on the node's address, for the application's fenced data ---------------------


@dataclass
class Minio:
    endpoint: str
    bucket: str
    access_key: str
    secret_key: str


@contextmanager
def minio_for(cluster: Kind) -> Iterator[Minio]:
    """MinIO on this machine's address on the cluster's network, where the
    pods reach it (no worker's fault takes it down)."""
    with minio_server(cluster.address()) as server:
        yield Minio(endpoint=server.endpoint, bucket=server.create_bucket("shardapp"),
                    access_key=server.access_key, secret_key=server.secret_key)


# -- the chart, installed once for the module ------------------------------------------


@pytest.fixture(scope="module")
def installed(cluster: Cluster) -> Iterator[Cluster]:
    cluster.helm("uninstall", RELEASE, "-n", RELEASE_NS, "--wait", check=False)
    t0 = time.monotonic()
    cluster.helm("install", RELEASE, str(ROOT / "charts" / "shardlease"),
                 "-n", RELEASE_NS, "--create-namespace", "--wait", "--timeout", "5m",
                 "--set", "image.repository=shardlease", "--set", "image.tag=dev",
                 "--set", "image.pullPolicy=Never")
    print(f"\n[pods] helm install --wait: {time.monotonic() - t0:.1f}s")
    try:
        pods = cluster.get("pods", "-n", RELEASE_NS)["items"]
        assert pods, "the chart made no operator pod"
        for pod in pods:
            statuses = pod["status"].get("containerStatuses") or []
            # The uid-65532 crash showed as restarts; the operator must run as installed.
            assert all(c["ready"] and c["restartCount"] == 0 for c in statuses), (
                statuses, cluster.kubectl("logs", "-n", RELEASE_NS, pod["metadata"]["name"],
                                          "--all-containers", "--previous", check=False).stdout)
        yield cluster
    finally:
        cluster.helm("uninstall", RELEASE, "-n", RELEASE_NS, "--wait", check=False)


@pytest.fixture(scope="module")
def minio(cluster: Kind) -> Iterator[Minio]:
    with minio_for(cluster) as m:
        yield m


# -- the application ---------------------------------------------------------------------


def app_statefulset(ns: str, policy: str, minio: Minio, replicas: int = 3,
                    renewal: str | None = "shard") -> dict[str, Any]:
    """`renewal` None: no annotation, the default (node renewal)."""
    labels = {"app.kubernetes.io/name": "shardapp"}
    store = f"s3://{minio.bucket}/{ns}?endpoint={minio.endpoint}&path_style=true"
    # Liveness fails while /var/tmp/sick exists; the file is in the container's
    # own writable layer, so the restarted container is healthy again. Every
    # 10 s, not 2: each probe is a Python process exec'd in the container,
    # and at 2 s a warm run of the suite exec'd 936 of them (43 CPU-seconds,
    # and runc's and the shim's on top; process accounting at 1579c1f).
    liveness = ["python", "-c", "import os, sys; sys.exit(os.path.exists('/var/tmp/sick'))"]
    return {
        "apiVersion": "apps/v1", "kind": "StatefulSet",
        "metadata": {"name": "shardapp", "namespace": ns, "labels": labels, "annotations": {
            "shardlease.io/shards": str(SHARDS), "shardlease.io/lease-ttl": str(TTL),
            **({"shardlease.io/renewal": renewal} if renewal is not None else {})}},
        "spec": {
            "replicas": replicas, "serviceName": "shardapp", "podManagementPolicy": policy,
            "selector": {"matchLabels": labels},
            "template": {"metadata": {"labels": labels}, "spec": {
                "serviceAccountName": "shardapp",
                "terminationGracePeriodSeconds": 30,
                "securityContext": {"runAsNonRoot": True,
                                    "seccompProfile": {"type": "RuntimeDefault"}},
                "containers": [{
                    "name": "app", "image": clmod.IMAGE, "imagePullPolicy": "Never",
                    "command": ["python", "-m", "shardlease_examples.shardapp", "--port", "8080",
                                "--shards", str(SHARDS), "--store", store,
                                "--agent", "http://127.0.0.1:8470"],
                    "env": [{"name": "AWS_ACCESS_KEY_ID", "value": minio.access_key},
                            {"name": "AWS_SECRET_ACCESS_KEY", "value": minio.secret_key},
                            {"name": "AWS_REGION", "value": "us-east-1"},
                            {"name": "AWS_EC2_METADATA_DISABLED", "value": "true"}],
                    "ports": [{"name": "http", "containerPort": 8080}],
                    "readinessProbe": {"httpGet": {"path": "/healthz", "port": "http"},
                                       "periodSeconds": 2},
                    "livenessProbe": {"exec": {"command": liveness}, "periodSeconds": 10,
                                      "failureThreshold": 1, "timeoutSeconds": 5},
                    "securityContext": {"allowPrivilegeEscalation": False,
                                        "capabilities": {"drop": ["ALL"]}},
                }],
            }},
        },
    }


@dataclass
class App:
    cluster: Cluster
    ns: str

    def pods(self) -> list[dict[str, Any]]:
        items = self.cluster.get("pods", "-n", self.ns, "-l",
                                 "app.kubernetes.io/name=shardapp")["items"]
        return sorted(items, key=lambda p: p["metadata"]["name"])

    def ready_pods(self) -> dict[str, str]:
        """name -> pod IP of the Ready pods not being deleted."""
        out = {}
        for p in self.pods():
            conds = {c["type"]: c["status"] for c in p["status"].get("conditions") or []}
            if conds.get("Ready") == "True" and not p["metadata"].get("deletionTimestamp"):
                out[p["metadata"]["name"]] = p["status"]["podIP"]
        return out

    def shardset(self) -> dict[str, Any]:
        return self.cluster.get(f"shardsets.{GROUP}", "shardapp", "-n", self.ns)

    def balanced(self, nodes: int) -> dict[str, Any] | None:
        """The ShardSet status once it says Balanced over exactly `nodes` pods
        and those pods are the Ready ones, else None."""
        status = self.shardset().get("status") or {}
        conds = {c["type"]: c for c in status.get("conditions") or []}
        ready = set(self.ready_pods())
        if (conds.get("Balanced") or {}).get("status") != "True" or len(ready) != nodes:
            return None
        if set(status.get("nodes") or []) != ready or status.get("ownedShards") != SHARDS:
            return None
        owners = status.get("owners") or {}
        share = math.ceil(SHARDS / nodes)
        counts = {n: list(owners.values()).count(n) for n in ready}
        return status if max(counts.values()) <= share else None

    def serving_pods(self) -> dict[str, str]:
        """name -> pod IP of the pods whose application container is running,
        being deleted or not, Ready or not."""
        out = {}
        for p in self.pods():
            ip = p["status"].get("podIP")
            running = any(c["name"] == "app" and "running" in (c.get("state") or {})
                          for c in p["status"].get("containerStatuses") or [])
            if ip and running:
                out[p["metadata"]["name"]] = ip
        return out

    def last_rollout(self) -> dict[str, Any]:
        """The operator's count of the StatefulSet's last rollout, once it
        says that rollout (the StatefulSet's update revision) is done."""
        def done() -> dict[str, Any] | None:
            sts = self.cluster.get("statefulset", "shardapp", "-n", self.ns)
            record = (self.shardset().get("status") or {}).get("lastRollout") or {}
            revision = (sts.get("status") or {}).get("updateRevision")
            return record if record.get("revision") == revision and \
                record.get("finishedAt") else None
        return eventually(done, "the operator to count the rollout's moves", 60)

    def open_shards(self, pods: dict[str, str]) -> dict[str, dict[int, int]] | None:
        """pod -> {shard: generation} as the application of each of `pods`
        (name -> IP) says; one whose application or pod is gone (refused,
        unreachable) has none. None when a pod did not answer in time (the
        sample would be partial)."""
        out: dict[str, dict[int, int]] = {}
        for name, ip in pods.items():
            try:
                code, body = http("GET", f"http://{ip}:8080/shards", timeout=1)
            except (ConnectionRefusedError, urllib.error.URLError) as e:
                reason = getattr(e, "reason", e)
                if isinstance(reason, OSError) and reason.errno in GONE:
                    out[name] = {}
                    continue
                return None
            except OSError:
                return None
            if code != 200:
                return None
            out[name] = {int(s): v["generation"] for s, v in json.loads(body)["open"].items()}
        return out

    def write(self, key: str, value: str) -> None:
        """Route by the agent's /lookup, as a client would; a 421 (the shard
        just moved) is asked again."""
        def attempt() -> bool:
            ips = list(self.ready_pods().values())
            code, body = http("GET", f"http://{ips[0]}:8470/lookup?key={key}")
            if code != 200:
                return False
            where = json.loads(body)
            if not where.get("address"):
                return False
            code, _ = http("PUT", f"http://{where['address']}:8080/kv/{key}", value.encode())
            return code in (200, 201, 204)
        eventually(attempt, f"a write of {key}", 60)

    def read(self, key: str) -> str | None:
        def attempt() -> tuple[str | None] | None:
            ips = list(self.ready_pods().values())
            code, body = http("GET", f"http://{ips[0]}:8470/lookup?key={key}")
            where = json.loads(body) if code == 200 else {}
            if not where.get("address"):
                return None
            code, body = http("GET", f"http://{where['address']}:8080/kv/{key}")
            if code == 404:
                return (None,)
            return (json.loads(body)["value"],) if code == 200 else None
        return eventually(attempt, f"a read of {key}", 60)[0]


# -- a sampler of who has which shard open ------------------------------------------------


@dataclass
class Sampler:
    """Polls the application of every pod that has one running, for its open
    shards, to measure how long shards stay unowned while pods come and go.

    A pod being deleted counts while its application answers: during its
    preStop drain it still has its shards open and serves them (fenced by
    their generation), and so does a pod not yet Ready. Counting only the
    Ready pods would charge the drain and the readiness delay to the
    handoff. The pod list comes from a slower thread, so that the kubectl
    call does not stretch every sample.
    """

    app: App
    every: float = 0.1
    pods_every: float = 0.5
    samples: list[tuple[float, dict[str, dict[int, int]]]] = field(default_factory=list)
    _stop: threading.Event = field(default_factory=threading.Event)
    _threads: list[threading.Thread] = field(default_factory=list)
    _ips: dict[str, str] = field(default_factory=dict)
    #: How long each sample's round of requests took (the resolution).
    polls: list[float] = field(default_factory=list)

    def __enter__(self) -> Sampler:
        self._ips = self.app.serving_pods()
        self._threads = [threading.Thread(target=self._pods, daemon=True),
                         threading.Thread(target=self._run, daemon=True)]
        for t in self._threads:
            t.start()
        return self

    def __exit__(self, *_: object) -> None:
        self._stop.set()
        for t in self._threads:
            t.join(10)

    def _pods(self) -> None:
        while not self._stop.wait(self.pods_every):
            try:
                self._ips = self.app.serving_pods()
            except Exception:  # a failed listing keeps the last one
                pass

    def _run(self) -> None:
        while not self._stop.is_set():
            began = time.monotonic()
            seen = self.app.open_shards(self._ips)
            if seen is not None:
                self.samples.append((time.monotonic(), seen))
                self.polls.append(time.monotonic() - began)
            self._stop.wait(self.every)

    def figures(self) -> dict[str, float]:
        """Unowned shard-seconds, the longest a shard stayed unowned, and
        moves (a shard seen open on a pod other than its last owner)."""
        return self._tally()[0]

    def moved_shards(self) -> set[int]:
        """The shards that moved at least once (`figures`' moves)."""
        return self._tally()[1]

    def _tally(self) -> tuple[dict[str, float], set[int]]:
        moved: set[int] = set()
        unowned = 0.0
        gap_start: dict[int, float] = {}
        longest = 0.0
        last_owner: dict[int, str] = {}
        moves = 0
        gaps: list[float] = []
        for (t, seen), (t_next, _) in zip(self.samples, self.samples[1:], strict=False):
            owners_of: dict[int, set[str]] = {}
            for pod, shards in seen.items():
                for s in shards:
                    owners_of.setdefault(s, set()).add(pod)
            for s in range(SHARDS):
                owners = owners_of.get(s)
                if not owners:
                    unowned += t_next - t
                    gap_start.setdefault(s, t)
                    continue
                if s in gap_start:
                    gaps.append(t - gap_start.pop(s))
                    longest = max(longest, gaps[-1])
                # The pods are asked one after the other: the old owner may
                # answer before its close and the new one after its open. Seen
                # on both, the shard has not moved yet.
                if last_owner.get(s) in owners:
                    continue
                if s in last_owner:
                    moves += 1
                    moved.add(s)
                last_owner[s] = min(owners)
        if self.samples:  # gaps still open when sampling stopped
            end = self.samples[-1][0]
            longest = max([longest, *(end - t for t in gap_start.values())])
        def median(xs: list[float]) -> float:
            return round(sorted(xs)[len(xs) // 2], 2) if xs else 0.0
        return {"unowned_shard_s": round(unowned, 2), "longest_gap_s": round(longest, 2),
                "moves": moves, "gaps": len(gaps), "median_gap_s": median(gaps),
                "median_poll_s": median(self.polls)}, moved


def fenced_in(message: str) -> set[int]:
    """The shards an agent's SelfFenced or Lost event names ("... closed
    shard(s) 0,2-4 at their deadline", "... lost shard(s) 7")."""
    found = re.search(r"shard\(s\) ([\d,-]+)", message)
    out: set[int] = set()
    for part in (found.group(1).split(",") if found else []):
        first, _, last = part.partition("-")
        out.update(range(int(first), int(last or first) + 1))
    return out


def report(step: str, t0: float, sampler: Sampler) -> None:
    f = sampler.figures()
    print(f"[pods] {step}: Balanced after {time.monotonic() - t0:.1f}s; moves {f['moves']}, "
          f"unowned {f['unowned_shard_s']} shard-s, longest gap {f['longest_gap_s']}s, "
          f"{f['gaps']} gaps, median {f['median_gap_s']}s (a sample takes {f['median_poll_s']}s)")


def generations(status: dict[str, Any]) -> dict[int, int]:
    return {int(s): g for s, g in (status.get("generations") or {}).items()}


def container_pid(container_id: str, needle: str) -> int:
    """The host pid of the process in a container whose command line has `needle`."""
    cid = container_id.split("://", 1)[-1]
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            if cid not in (entry / "cgroup").read_text():
                continue
            cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode()
        except OSError:
            continue
        if needle in cmdline:
            return int(entry.name)
    raise AssertionError(f"no process with {needle!r} in container {cid}")


# -- the scenario ----------------------------------------------------------------------------


# Both pod management policies, and both renewal modes (docs/renewal.md):
# shard by its annotation, node as the default (no annotation).
POLICIES = [("Parallel", "shard"), ("OrderedReady", None)]


def test_the_example_app_on_real_pods(installed: Cluster, minio: Minio) -> None:
    """Both policies' runs at once, each in a namespace of its own: two
    workloads on one cluster and one operator, as a user's would be. One
    after the other they took 11 minutes of the suite's wall time, most of
    it waiting on TTLs, probes and pod starts; side by side they share it.
    Each run's failure is reported with its policy, and both are waited
    for, so one run's failure does not leave the other's pods behind."""
    with ThreadPoolExecutor(len(POLICIES), thread_name_prefix="scenario") as pool:
        runs = {(policy, renewal): pool.submit(one_policy, installed, minio, policy, renewal)
                for policy, renewal in POLICIES}
    failed = {what: run.exception() for what, run in runs.items() if run.exception()}
    for (policy, renewal), error in failed.items():
        print(f"[pods] {policy}, {renewal or 'node'} renewal failed:\n"
              + "".join(traceback.format_exception(error)))
    if failed:
        raise AssertionError("the scenario failed under " + "; ".join(
            f"{policy}, {renewal or 'node'} renewal: {type(e).__name__}: {e}"
            for (policy, renewal), e in failed.items())) from next(iter(failed.values()))


def one_policy(cluster: Cluster, minio: Minio, policy: str, renewal: str | None) -> None:
    with fresh_namespace(cluster) as ns:
        app = App(cluster, ns)
        try:
            scenario(cluster, app, ns, policy, minio, renewal)
        except BaseException:
            # One string per dump: the other run prints at the same time.
            print(cluster.kubectl("get", "pods,shardsets,events", "-n", ns, "-o", "wide",
                                  check=False).stdout)
            for pod in app.pods():
                name = pod["metadata"]["name"]
                print(cluster.kubectl("logs", "-n", ns, name, "--all-containers", "--tail", "40",
                                      check=False).stdout)
            print(cluster.kubectl("logs", "-n", RELEASE_NS, "-l",
                                  "app.kubernetes.io/name=shardlease", "--tail", "60",
                                  check=False).stdout)
            raise


def scenario(cluster: Cluster, app: App, ns: str, policy: str, minio: Minio,
             renewal: str | None = "shard") -> None:
    cluster.kubectl("create", "serviceaccount", "shardapp", "-n", ns)
    t0 = time.monotonic()
    cluster.kubectl("apply", "-f", "-",
                    input=json.dumps(app_statefulset(ns, policy, minio, renewal=renewal)))
    # (the figures' label)
    policy = f"{policy}, {renewal or 'node (the default)'} renewal"

    # -- opt in: injection, Ready agents, Balanced, kubectl's view ---------------------
    with Sampler(app) as sampler:
        status = eventually(lambda: app.balanced(3), "Balanced over 3 pods", 240)
    report(f"{policy}: start", t0, sampler)
    for pod in app.pods():
        init = {c["name"]: c for c in pod["spec"].get("initContainers") or []}
        agent = init.get("shardlease-agent")
        assert agent is not None and agent["restartPolicy"] == "Always", pod["spec"]
        hook = pod["spec"]["containers"][0]["lifecycle"]["preStop"]["httpGet"]
        assert hook["path"] == "/drain" and not hook.get("httpHeaders")  # no secret in it
    # What an agent's start costs, as it logs it once ready (#19; printed).
    for pod in app.pods():
        name = pod["metadata"]["name"]
        logs = cluster.kubectl("logs", "-n", ns, name, "-c", "shardlease-agent").stdout
        said = [ln for ln in logs.splitlines() if "ready: " in ln]
        assert said, f"{name}'s agent never logged that it was ready:\n{logs[-2000:]}"
        # The agent is its container's first process: its resident memory
        # in the image, with the pod's shards open.
        proc = cluster.kubectl("exec", "-n", ns, name, "-c", "shardlease-agent", "--",
                               "cat", "/proc/1/status").stdout
        rss = [int(ln.split()[1]) / 1024 for ln in proc.splitlines() if ln.startswith("VmRSS:")]
        assert rss, proc
        print(f"[pods] {policy}: {name}'s agent: {rss[0]:.1f} MB resident; "
              f"{said[0][said[0].index('ready: '):][:200]}")
    table = cluster.kubectl("get", "shardsets", "-n", ns).stdout
    assert "shardapp" in table and "True" in table, table
    # No annotation: node renewal, the default.
    assert app.shardset()["spec"].get("renewal") == (renewal or "node")
    print(f"[pods] kubectl get shardsets:\n{table}")
    # The plugin, as typed: kubectl finds kubectl-shardlease on PATH.
    path = f"{Path(sys.executable).parent}:{os.environ.get('PATH', '')}"
    plugin = subprocess.run([cluster.kubectl_path, "shardlease", "owners", "shardapp", "-n", ns],
                            env={**cluster.env(), "PATH": path}, capture_output=True, text=True,
                            timeout=60)
    assert plugin.returncode == 0, plugin.stderr
    rows = [line.split() for line in plugin.stdout.splitlines()[1:SHARDS + 1]]
    assert [int(r[0]) for r in rows] == list(range(SHARDS))
    assert {r[1] for r in rows} == set(app.ready_pods()), plugin.stdout  # all live, none "*"

    # A drain from the pod network, of a pod that is not being deleted and
    # whose containers the kubelet is not stopping, is refused: nothing moves.
    some_ip = next(iter(app.ready_pods().values()))
    code, text = http("GET", f"http://{some_ip}:8470/drain", timeout=30)
    assert code == 403 and b"refused" in text, (code, text)
    after = app.balanced(3)
    assert after and after["owners"] == status["owners"], (status["owners"], after)

    # -- keys through /lookup, fenced by the generation ---------------------------------
    keys = {f"key-{i}": f"value-{i}" for i in range(40)}
    for k, v in keys.items():
        app.write(k, v)
    assert {k: app.read(k) for k in keys} == keys

    # -- delete an owner ----------------------------------------------------------------
    before = generations(status)
    victim = status["owners"]["0"]
    moved = {int(s) for s, o in status["owners"].items() if o == victim}
    t0 = time.monotonic()
    with Sampler(app) as sampler:
        cluster.kubectl("delete", "pod", victim, "-n", ns, "--wait=false")
        status = eventually(lambda: (s := app.balanced(3)) and all(
            generations(s).get(x, 0) > before[x] for x in moved) and s,
            "the deleted pod's shards to reopen with a higher generation", 180)
    report(f"{policy}: delete {victim}", t0, sampler)
    assert {k: app.read(k) for k in keys} == keys

    # -- rollout restart: every pod replaced, handed off by the preStop drain -------------
    uids = {p["metadata"]["name"]: p["metadata"]["uid"] for p in app.pods()}
    owners_before = dict(status["owners"])
    t0 = time.monotonic()
    with Sampler(app) as sampler:
        cluster.kubectl("rollout", "restart", "statefulset/shardapp", "-n", ns)
        cluster.kubectl("rollout", "status", "statefulset/shardapp", "-n", ns,
                        "--timeout", "300s", timeout=320)
        status = eventually(lambda: app.balanced(3), "Balanced after the rollout", 180)
    report(f"{policy}: rollout restart", t0, sampler)
    # Printed, not asserted: a pod above its share gives back the shards it
    # took last, so each pod back gets its own (unless the StatefulSet moved
    # on to the next pod before the shards settled).
    home = sum(status["owners"].get(s) == o for s, o in owners_before.items())
    counted = app.last_rollout()
    print(f"[pods] {policy}: rollout restart: {home} of {SHARDS} shards back on their own pod; "
          f"the operator counted {counted['moves']} moves (status.lastRollout)")
    new_uids = {p["metadata"]["name"]: p["metadata"]["uid"] for p in app.pods()}
    assert set(new_uids) == set(uids) and not set(new_uids.values()) & set(uids.values())
    assert {k: app.read(k) for k in keys} == keys
    events = cluster.get("events", "-n", ns)["items"]
    assert any(e["reason"] == "Released" for e in events), "no hand-off was announced"

    # -- rollout restart under handoff: hold: every shard back on its own pod ------------
    # (600 s: a scale-down that held would not be Balanced within its wait below.)
    cluster.kubectl("annotate", "statefulset/shardapp", "-n", ns,
                    "shardlease.io/handoff=hold", "shardlease.io/hold-seconds=600")
    eventually(lambda: app.shardset()["spec"].get("handoff") == "hold",
               "the ShardSet to say handoff: hold", 60)
    eventually(lambda: len([e for e in cluster.get("events", "-n", ns)["items"]
                            if e["reason"] == "Reconfigured"
                            and "handoff move -> hold" in e.get("message", "")]) >= 3 or None,
               "every agent to apply handoff: hold", 60)
    # The owners read again now, not those of the first rollout's end: what
    # the hold keeps is where the shards are as the held rollout begins.
    # (CI's runs at 29394cb and bbae792 failed below with 2 and 6 shards
    # on other pods than the earlier read said, the stops unseen: cut from
    # the output.)
    earlier = dict(status["owners"])
    status = eventually(lambda: app.balanced(3), "Balanced before the held rollout", 60)
    owners_before = dict(status["owners"])
    if owners_before != earlier:
        print(f"[pods] {policy}: shards moved between the rollouts: " + ", ".join(
            f"{s} {earlier.get(s)} -> {o}" for s, o in sorted(owners_before.items())
            if earlier.get(s) != o))
    seen_before = {e["metadata"]["name"] for e in cluster.get("events", "-n", ns)["items"]}
    t0 = time.monotonic()
    with Sampler(app) as sampler:
        cluster.kubectl("rollout", "restart", "statefulset/shardapp", "-n", ns)
        cluster.kubectl("rollout", "status", "statefulset/shardapp", "-n", ns,
                        "--timeout", "300s", timeout=320)
        status = eventually(lambda: app.balanced(3), "Balanced after the held rollout", 180)
    report(f"{policy}: rollout restart, handoff hold", t0, sampler)
    # Each agent says at its stop whether it held and why (HandoffHold, or
    # HandoffMove with the reason): what a moved shard needs explained.
    new_events = [e for e in sorted(cluster.get("events", "-n", ns)["items"],
                                    key=lambda e: e["metadata"].get("creationTimestamp") or "")
                  if e["metadata"]["name"] not in seen_before]
    told = [f"{e['reason']}: {e.get('message', '')}" for e in new_events
            if e["reason"] in ("HandoffHold", "HandoffMove", "SelfFenced", "Lost", "RenewFailed",
                               "LeftToExpire")]
    print(f"[pods] {policy}: the held rollout's stops: " + "; ".join(told))
    # A hold keeps a stopping pod's shards for its name; a shard its owner
    # fenced (or lost) during the rollout is free for anyone, hold or not: a
    # store slowed by a loaded machine (a warm fresh-clone run at 77ba15f:
    # "renewal of shard 0: no answer within 2.69s", four shards fenced, and
    # one moved and back four times). Every moved shard must be one of those.
    fenced = set().union(*(fenced_in(e.get("message", "")) for e in new_events
                           if e["reason"] in ("SelfFenced", "Lost")))
    moved = {s: f"{o} -> {status['owners'].get(s)}" for s, o in sorted(owners_before.items())
             if status["owners"].get(s) != o}
    unexplained = (set(moved) | sampler.moved_shards()) - fenced
    # (Raised, not a bare assert: pytest's diff of two maps would push the
    # stops out of the few lines of output CI keeps.)
    if unexplained:
        raise AssertionError(
            f"the held rollout moved shards {sorted(unexplained)} that were not fenced "
            f"(owners changed: {moved}; the sampler saw {sampler.figures()['moves']} moves of "
            f"{sorted(sampler.moved_shards())}); the stops said: {told}")
    counted = app.last_rollout()["moves"]
    if fenced:
        print(f"[pods] {policy}: the held rollout: shard(s) {sorted(fenced)} fenced or lost "
              f"under load; moved: {moved}, sampled moves of {sorted(sampler.moved_shards())}; "
              f"the operator counted {counted} moves")
    else:
        assert counted == 0, counted
    assert {k: app.read(k) for k in keys} == keys

    # -- scale 3 -> 5 -> 2 ----------------------------------------------------------------
    for replicas in (5, 2):
        t0 = time.monotonic()
        with Sampler(app) as sampler:
            cluster.kubectl("scale", "statefulset/shardapp", "-n", ns, f"--replicas={replicas}")
            status = eventually(lambda r=replicas: app.balanced(r),  # type: ignore[misc]
                                f"Balanced over {replicas} pods", 240)
        report(f"{policy}: scale to {replicas}", t0, sampler)
        assert {k: app.read(k) for k in keys} == keys

    # -- the kubelet restarts the application (liveness): a drain that is a pause -----------
    target = "shardapp-0"

    def app_restarts() -> int:
        pod = next(p for p in app.pods() if p["metadata"]["name"] == target)
        return next(c["restartCount"] for c in pod["status"]["containerStatuses"]
                    if c["name"] == "app")
    restarts = app_restarts()
    t0 = time.monotonic()
    with Sampler(app) as sampler:
        cluster.kubectl("exec", "-n", ns, target, "-c", "app", "--", "python", "-c",
                        "open('/var/tmp/sick', 'w').close()")
        eventually(lambda: app_restarts() > restarts, "the kubelet to restart the app", 120)
        status = eventually(lambda: (s := app.balanced(2)) and target in s["owners"].values()
                            and s, f"{target} to take shards again after its app restarted", 180)
    report(f"{policy}: app restarted by its liveness probe", t0, sampler)
    logs = cluster.kubectl("logs", "-n", ns, target, "-c", "shardlease-agent").stdout
    assert "the application restarted after the drain" in logs, logs[-3000:]

    # -- the agent killed (SIGKILL from the node): the kubelet restarts it ------------------
    pod = next(p for p in app.pods() if p["metadata"]["name"] == target)
    agent = next(c for c in pod["status"]["initContainerStatuses"]
                 if c["name"] == "shardlease-agent")
    os.kill(container_pid(agent["containerID"], "shardlease agent"), signal.SIGKILL)
    t0 = time.monotonic()
    with Sampler(app) as sampler:
        def agent_back() -> bool:
            p = next(x for x in app.pods() if x["metadata"]["name"] == target)
            st = next(c for c in p["status"]["initContainerStatuses"]
                      if c["name"] == "shardlease-agent")
            return st["restartCount"] > agent["restartCount"] and st.get("ready")
        eventually(agent_back, "the agent to come back", 120)
        status = eventually(lambda: (s := app.balanced(2)) and target in s["owners"].values()
                            and s, f"{target} to hold shards again after its agent died", 180)
    report(f"{policy}: agent killed", t0, sampler)
    assert {k: app.read(k) for k in keys} == keys
