"""A real single-node Kubernetes cluster on this machine, for tests with real pods.

etcd + kube-apiserver (from controlplane.py, started for a node) +
kube-controller-manager + kube-scheduler + kubelet + kube-proxy (iptables) +
containerd + runc + bridge CNI. Every part runs as a plain process of this
machine; its state lives under ${SHARDLEASE_CACHE:-~/.cache/shardlease}/cluster
and `down` undoes every change made to the host. See e2e/README.md.

Stdlib only. Used by the ``e2e/cluster`` CLI and by ``tests/pods/conftest.py``.
"""

from __future__ import annotations

import contextlib
import hashlib
import io
import json
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import tarfile
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import controlplane as cp  # a sibling file, not a package

# The node's address: a /32 on `lo`, since this kernel has no dummy device.
# The API server binds and advertises it, so pods reach it behind the
# `kubernetes` Service DNAT (127.0.0.1 would be their own loopback).
NODE_IP = "10.99.0.1"
NODE_NAME = "shardlease-node"
POD_CIDR = "10.244.0.0/16"
NODE_POD_CIDR = "10.244.0.0/24"
SERVICE_CIDR = "10.0.0.0/24"
BRIDGE = "shl0"
# A tag that marks the iptables rules this script adds itself.
RULE_COMMENT = "shardlease-node"
PAUSE_IMAGE = "shardlease.local/pause:1"
BASE_IMAGE = "shardlease-base/python:3.11-bookworm"
#: The final stages' base: BASE_IMAGE without pip, venv and the docs (as a
#: slim Python image has none): the runtime image copies a ready virtualenv.
RUNTIME_BASE_IMAGE = "shardlease-base/python:3.11-bookworm-runtime"
IMAGE = "shardlease:dev"
#: The production image (the Dockerfile's default target), built beside IMAGE.
RUNTIME_IMAGE = "shardlease:runtime"
#: Run inside RUNTIME_IMAGE: what it can import, and what that costs.
RUNTIME_PROBE = """
import importlib.util, json, resource, subprocess
import shardlease.cli, shardlease.k8s.agent, shardlease.k8s.commands, shardlease.k8s.operator
absent = {m: importlib.util.find_spec(m) is None for m in (
    "shardlease_examples", "shardlease_tools", "rich", "moto", "pip", "setuptools",
    "kubernetes_asyncio")}
rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
import botocore.session
session = botocore.session.get_session()
clients = sorted(name for name in ("s3", "sts", "sso", "sso-oidc") if session.create_client(
    name, region_name="us-east-1", aws_access_key_id="k", aws_secret_access_key="s"))
code = subprocess.run(["shardlease", "--help"], capture_output=True).returncode
print(json.dumps({"absent": absent, "agent_import_rss_mb": rss, "help_exit": code,
                  "botocore_clients": clients}))
"""
# What `image: shardlease:dev` in a pod spec resolves to.
IMAGE_REF = "docker.io/library/shardlease:dev"
NS = "k8s.io"

# Host sysctls the node changes (the kubelet sets the first three, the
# bridge CNI plugin and we set the rest); `down` puts back what they were.
SYSCTLS = (
    "vm.overcommit_memory", "kernel.panic", "kernel.panic_on_oops",
    "net.ipv4.ip_forward", "net.bridge.bridge-nf-call-iptables",
    "net.ipv4.conf.all.route_localnet",
)

# program -> Debian package that provides it
HOST_PACKAGES = {
    "containerd": "containerd", "runc": "runc", "ctr": "containerd",
    "iptables": "iptables", "conntrack": "conntrack", "ip": "iproute2",
    "openssl": "openssl", "gcc": "gcc", "socat": "socat",
    "/usr/lib/cni/bridge": "containernetworking-plugins",
    "/usr/lib/x86_64-linux-gnu/libc.a": "libc6-dev",
}
IMAGE_PACKAGES = {"dockerd": "docker.io", "/usr/bin/docker": "docker.io",
                  "debootstrap": "debootstrap"}

COMPONENTS = ("containerd", "kube-controller-manager", "kube-scheduler", "kubelet",
              "kube-proxy", "coredns")


class ClusterError(RuntimeError):
    pass


def _log(msg: str) -> None:
    # stdout is kept for the export line of `up`.
    print(f"[cluster] {msg}", file=sys.stderr, flush=True)


# ---------------------------------------------------------------------------
# Paths
# ---------------------------------------------------------------------------
def cluster_dir() -> Path:
    return cp.cache_dir() / "cluster"


def images_dir() -> Path:
    return cp.cache_dir() / "images"


def _d(*parts: str) -> Path:
    return cluster_dir().joinpath(*parts)


def containerd_sock() -> Path:
    return _d("containerd", "containerd.sock")


def kubeconfig_path() -> Path:
    return _d("controlplane", "kubeconfig")


def _state_file() -> Path:
    return _d("state.json")


def _baseline_file() -> Path:
    # Outside cluster_dir's removable parts and written once, so a crashed
    # run never records its own changes as the host's original values.
    return cp.cache_dir() / "cluster-host-baseline.json"


def _load_state() -> dict:
    with contextlib.suppress(OSError, ValueError):
        return json.loads(_state_file().read_text())
    return {}


def _save_state(state: dict) -> None:
    _d().mkdir(parents=True, exist_ok=True)
    tmp = _state_file().with_suffix(".tmp")
    tmp.write_text(json.dumps(state, indent=2) + "\n")
    os.replace(tmp, _state_file())


# ---------------------------------------------------------------------------
# Host helpers
# ---------------------------------------------------------------------------
def _run(cmd: list[str], check: bool = True, input: bytes | None = None,
         timeout: float | None = 300, env: dict | None = None) -> subprocess.CompletedProcess:
    p = subprocess.run(cmd, input=input, capture_output=True, timeout=timeout, env=env)
    if check and p.returncode != 0:
        raise ClusterError(f"{' '.join(cmd)} failed ({p.returncode}):\n"
                           f"{p.stderr.decode(errors='replace')[-3000:]}")
    return p


def _have(prog: str) -> bool:
    return os.path.exists(prog) if prog.startswith("/") else shutil.which(prog) is not None


def ensure_packages(wanted: dict[str, str]) -> None:
    """apt-get install whatever of `wanted` (program -> package) is missing."""
    missing = sorted({pkg for prog, pkg in wanted.items() if not _have(prog)})
    if not missing:
        return
    if os.geteuid() != 0:
        raise ClusterError(f"missing packages {', '.join(missing)} and not root to install them")
    _log(f"apt-get install {' '.join(missing)} ...")
    env = dict(os.environ, DEBIAN_FRONTEND="noninteractive")
    _run(["apt-get", "update", "-q"], env=env, timeout=900)
    _run(["apt-get", "install", "-y", "-q", "--no-install-recommends", *missing], env=env,
         timeout=1800)
    still = sorted(prog for prog in wanted if not _have(prog))
    if still:
        raise ClusterError(f"still missing after apt-get install: {', '.join(still)}")


def _sysctl_path(name: str) -> Path:
    return Path("/proc/sys") / name.replace(".", "/")


def _sysctl_get(name: str) -> str | None:
    with contextlib.suppress(OSError):
        return _sysctl_path(name).read_text().strip()
    return None


def _sysctl_set(name: str, value: str) -> None:
    with contextlib.suppress(OSError):
        if _sysctl_get(name) != value:
            _sysctl_path(name).write_text(value + "\n")


def _iptables_chains() -> dict[str, list[str]]:
    out: dict[str, list[str]] = {}
    for table in ("filter", "nat", "mangle"):
        p = _run(["iptables", "-t", table, "-S"], check=False)
        out[table] = [ln.split()[1] for ln in p.stdout.decode().splitlines()
                      if ln.startswith("-N ")]
    return out


def _record_baseline() -> None:
    if _baseline_file().exists():
        return
    base = {
        "sysctls": {n: _sysctl_get(n) for n in SYSCTLS},
        "iptables_chains": _iptables_chains(),
        "lo_address": _lo_has_ip(),
        "bridge": Path(f"/sys/class/net/{BRIDGE}").exists(),
    }
    _baseline_file().write_text(json.dumps(base, indent=2) + "\n")


def _lo_has_ip() -> bool:
    out = _run(["ip", "-o", "-4", "addr", "show", "dev", "lo"], check=False).stdout.decode()
    return f" {NODE_IP}/32 " in out


def _ours(chain: str) -> bool:
    return chain.startswith(("KUBE-", "CNI-"))


def _iptables_cleanup(keep: dict[str, list[str]] | None) -> None:
    """Remove the rules we tagged, the KUBE-*/CNI-* chains that were not on
    the host before (kube-proxy, the kubelet and the CNI plugins add them),
    and the rules of other chains that jump to those. keep=None: only the
    tagged rules."""
    for table in ("filter", "nat", "mangle"):
        rules = _run(["iptables", "-t", table, "-S"], check=False).stdout.decode().splitlines()
        added = set()
        if keep is not None:
            kept = set(keep.get(table, []))
            added = {ln.split()[1] for ln in rules if ln.startswith("-N ")
                     and _ours(ln.split()[1]) and ln.split()[1] not in kept}
        for ln in rules:
            if not ln.startswith("-A "):
                continue
            parts = ln.split()
            chain = parts[1]
            if chain in added:
                continue  # flushed with its chain below
            jump = parts[parts.index("-j") + 1] if "-j" in parts else ""
            if jump in added or RULE_COMMENT in ln:
                # `-S` output is shell-quoted (comments with spaces)
                spec = shlex.split(ln)[2:]
                _run(["iptables", "-t", table, "-D", chain, *spec], check=False)
        for chain in added:
            _run(["iptables", "-t", table, "-F", chain], check=False)
        for chain in added:
            _run(["iptables", "-t", table, "-X", chain], check=False)


def _add_forward_rules() -> None:
    # dockerd sets the FORWARD policy to DROP; pod traffic on the bridge
    # (pod -> Service -> pod) is forwarded, so let the pod CIDR through.
    for direction in ("-s", "-d"):
        spec = [direction, POD_CIDR, "-m", "comment", "--comment", RULE_COMMENT, "-j", "ACCEPT"]
        if _run(["iptables", "-C", "FORWARD", *spec], check=False).returncode != 0:
            _run(["iptables", "-I", "FORWARD", "1", *spec])


def _mounts_under(prefix: Path) -> list[str]:
    out = []
    pre = str(prefix).rstrip("/") + "/"
    with contextlib.suppress(OSError):
        for ln in Path("/proc/self/mountinfo").read_text().splitlines():
            mp = ln.split()[4].replace("\\040", " ")
            if mp.startswith(pre):
                out.append(mp)
    return sorted(set(out), key=len, reverse=True)


def _umount_all(prefix: Path) -> None:
    for mp in _mounts_under(prefix):
        _run(["umount", "-l", mp], check=False)


def _kubepods_cgroups() -> list[Path]:
    found = []
    root = Path("/sys/fs/cgroup")
    with contextlib.suppress(OSError):
        for ctl in root.iterdir():
            if (ctl / "kubepods").is_dir():
                found.append(ctl / "kubepods")
        if (root / "kubepods.slice").is_dir():
            found.append(root / "kubepods.slice")
    return found


def _remove_cgroups() -> None:
    for top in _kubepods_cgroups():
        # deepest first: cgroup directories are removed with rmdir only
        dirs = sorted((p for p in top.rglob("*") if p.is_dir()), key=lambda p: len(p.parts),
                      reverse=True)
        for p in [*dirs, top]:
            with contextlib.suppress(OSError):
                p.rmdir()


def _procs_matching(needle: str) -> list[int]:
    pids = []
    for p in Path("/proc").iterdir():
        if not p.name.isdigit() or int(p.name) == os.getpid():
            continue
        cmd = cp._cmdline(int(p.name))
        if needle in cmd:
            pids.append(int(p.name))
    return pids


# ---------------------------------------------------------------------------
# Files: PKI, kubeconfigs, configs
# ---------------------------------------------------------------------------
def _node_cert(pki: Path) -> None:
    if (pki / "kubelet.crt").exists():
        return
    cp._openssl("req", "-newkey", "rsa:2048", "-nodes", "-keyout", "kubelet.key",
                "-out", "kubelet.csr", "-subj", f"/O=system:nodes/CN=system:node:{NODE_NAME}",
                cwd=pki)
    cp._openssl("x509", "-req", "-in", "kubelet.csr", "-CA", "ca.crt", "-CAkey", "ca.key",
                "-CAcreateserial", "-out", "kubelet.crt", "-days", "3650",
                "-extfile", "client.ext", cwd=pki)
    (pki / "kubelet.key").chmod(0o600)


def _kubeconfig(path: Path, server: str, pki: Path, user: str) -> None:
    cfg = {
        "apiVersion": "v1", "kind": "Config",
        "clusters": [{"name": "shardlease", "cluster": {
            "server": server, "certificate-authority": str(pki / "ca.crt")}}],
        "users": [{"name": user, "user": {"client-certificate": str(pki / f"{user}.crt"),
                                          "client-key": str(pki / f"{user}.key")}}],
        "contexts": [{"name": "shardlease", "context": {"cluster": "shardlease", "user": user}}],
        "current-context": "shardlease",
    }
    path.write_text(json.dumps(cfg, indent=2) + "\n")
    path.chmod(0o600)


def _containerd_config() -> str:
    c = _d("containerd")
    return f"""version = 2
root = "{c / 'root'}"
state = "{c / 'state'}"
[grpc]
  address = "{containerd_sock()}"
[ttrpc]
  address = "{containerd_sock()}.ttrpc"
[debug]
  level = "warn"
[metrics]
  address = ""
[plugins."io.containerd.internal.v1.opt"]
  path = "{c / 'opt'}"
[plugins."io.containerd.grpc.v1.cri"]
  sandbox_image = "{PAUSE_IMAGE}"
  # root here lacks CAP_SYS_RESOURCE: runc fails to lower oom_score_adj
  # (`can't get final child's PID from pipe: EOF`) unless it is clamped.
  restrict_oom_score_adj = true
  # netns bind mounts under our state dir, not /run/netns
  netns_mounts_under_state_dir = true
  enable_cdi = false
  [plugins."io.containerd.grpc.v1.cri".containerd]
    snapshotter = "overlayfs"
    default_runtime_name = "runc"
    [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]
        SystemdCgroup = false
  [plugins."io.containerd.grpc.v1.cri".cni]
    bin_dir = "/usr/lib/cni"
    conf_dir = "{_d('cni', 'net.d')}"
"""


def _cni_config() -> str:
    return json.dumps({
        "cniVersion": "0.4.0", "name": "shardlease",
        "plugins": [
            {"type": "bridge", "bridge": BRIDGE, "isGateway": True, "ipMasq": False,
             "hairpinMode": True,
             "ipam": {"type": "host-local", "ranges": [[{"subnet": NODE_POD_CIDR}]],
                      "routes": [{"dst": "0.0.0.0/0"}], "dataDir": str(_d("cni", "ipam"))}},
            {"type": "portmap", "capabilities": {"portMappings": True}},
        ],
    }, indent=2) + "\n"


def _kubelet_config(ports: dict[str, int], pki: Path) -> str:
    k = _d("kubelet")
    return json.dumps({
        "apiVersion": "kubelet.config.k8s.io/v1beta1", "kind": "KubeletConfiguration",
        # kubelet >= 1.35 refuses cgroup v1 (this machine's hybrid layout) unless told.
        "failCgroupV1": False,
        "cgroupDriver": "cgroupfs",
        "containerRuntimeEndpoint": f"unix://{containerd_sock()}",
        "address": NODE_IP, "port": ports["kubelet"], "readOnlyPort": 0,
        "healthzBindAddress": "127.0.0.1", "healthzPort": ports["kubelet-healthz"],
        "authentication": {"anonymous": {"enabled": False}, "webhook": {"enabled": False},
                           "x509": {"clientCAFile": str(pki / "ca.crt")}},
        "authorization": {"mode": "AlwaysAllow"},
        "failSwapOn": False,
        # A shared, small disk must stay usable: evict only when nearly full,
        # never garbage-collect the images we imported (nothing can pull them).
        "evictionHard": {"memory.available": "1%", "nodefs.available": "1%",
                         "imagefs.available": "1%", "nodefs.inodesFree": "1%"},
        "imageGCHighThresholdPercent": 100, "imageGCLowThresholdPercent": 99,
        "podLogsDir": str(k / "pod-logs"),
        "resolvConf": "/etc/resolv.conf",
        "clusterDNS": [NODE_IP], "clusterDomain": "cluster.local",
        "podCIDR": NODE_POD_CIDR,
        "serializeImagePulls": False,
        "registerNode": True,
    }, indent=2) + "\n"


def _corefile() -> str:
    # Cluster names only: no `forward`, since nothing outside is reachable.
    return f"""cluster.local:53 in-addr.arpa:53 ip6.arpa:53 {{
    bind {NODE_IP}
    errors
    kubernetes cluster.local in-addr.arpa ip6.arpa {{
        kubeconfig {kubeconfig_path()} shardlease
        pods insecure
        fallthrough in-addr.arpa ip6.arpa
    }}
    cache 30
}}
.:53 {{
    bind {NODE_IP}
    errors
}}
"""


def _kube_proxy_config(ports: dict[str, int]) -> str:
    return json.dumps({
        "apiVersion": "kubeproxy.config.k8s.io/v1alpha1", "kind": "KubeProxyConfiguration",
        "mode": "iptables",
        "clientConnection": {"kubeconfig": str(kubeconfig_path())},
        "hostnameOverride": NODE_NAME,
        "clusterCIDR": POD_CIDR,
        "healthzBindAddress": f"127.0.0.1:{ports['kube-proxy-healthz']}",
        "metricsBindAddress": f"127.0.0.1:{ports['kube-proxy-metrics']}",
        "nodePortAddresses": [f"{NODE_IP}/32"],
        # 0 = leave the host's conntrack sysctls as they are
        "conntrack": {"maxPerCore": 0, "min": 0, "tcpEstablishedTimeout": "0s",
                      "tcpCloseWaitTimeout": "0s"},
        # true would set net.ipv4.conf.all.route_localnet on the host
        "iptables": {"localhostNodePorts": False},
    }, indent=2) + "\n"


# ---------------------------------------------------------------------------
# Images
# ---------------------------------------------------------------------------
PAUSE_C = r"""
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>
static void quit(int s) { (void)s; _exit(0); }
static void reap(int s) { (void)s; while (waitpid(-1, 0, WNOHANG) > 0) {} }
int main(void) {
  signal(SIGINT, quit);
  signal(SIGTERM, quit);
  signal(SIGCHLD, reap);
  for (;;) pause();
}
"""


def _docker_archive(binary: bytes, name: str, entry: str) -> bytes:
    """A `docker save`-format archive of a FROM-scratch image holding one
    static binary at /`entry` (what `ctr images import` reads)."""
    layer = io.BytesIO()
    with tarfile.open(fileobj=layer, mode="w", format=tarfile.PAX_FORMAT) as t:
        ti = tarfile.TarInfo(entry)
        ti.size, ti.mode, ti.mtime = len(binary), 0o755, 0
        t.addfile(ti, io.BytesIO(binary))
    layer_bytes = layer.getvalue()
    diff_id = "sha256:" + hashlib.sha256(layer_bytes).hexdigest()
    config = json.dumps({
        "architecture": "amd64", "os": "linux",
        "config": {"Entrypoint": [f"/{entry}"]},
        "rootfs": {"type": "layers", "diff_ids": [diff_id]},
        "history": [{"created_by": "e2e/cluster.py (static pause)"}],
    }).encode()
    cfg_name = hashlib.sha256(config).hexdigest() + ".json"
    manifest = json.dumps([{"Config": cfg_name, "RepoTags": [name],
                            "Layers": ["layer/layer.tar"]}]).encode()
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w") as t:
        for fname, data in ((cfg_name, config), ("layer/layer.tar", layer_bytes),
                            ("manifest.json", manifest)):
            ti = tarfile.TarInfo(fname)
            ti.size, ti.mode, ti.mtime = len(data), 0o644, 0
            t.addfile(ti, io.BytesIO(data))
    return out.getvalue()


def pause_archive() -> Path:
    """The pause image, built from a tiny static C program (no image can be
    pulled here); cached in images_dir()."""
    out = images_dir() / "pause.tar"
    if out.exists():
        return out
    images_dir().mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as d:
        (Path(d) / "pause.c").write_text(PAUSE_C)
        _run(["gcc", "-static", "-Os", "-s", "-o", f"{d}/pause", f"{d}/pause.c"])
        data = _docker_archive((Path(d) / "pause").read_bytes(), PAUSE_IMAGE, "pause")
    tmp = out.with_suffix(".tmp")
    tmp.write_bytes(data)
    os.replace(tmp, out)
    return out


def _ctr(*args: str, check: bool = True, input: bytes | None = None,
         timeout: float = 300) -> str:
    p = _run(["ctr", "-a", str(containerd_sock()), "-n", NS, *args], check=check,
             input=input, timeout=timeout)
    return p.stdout.decode()


def _containerd_answers() -> bool:
    return _run(["ctr", "-a", str(containerd_sock()), "version"], check=False,
                timeout=5).returncode == 0


def _ctr_image_config(ref: str) -> str | None:
    """The config digest (what docker calls the image ID) of `ref` in the
    node's containerd, or None."""
    for ln in _ctr("images", "ls").splitlines()[1:]:
        parts = ln.split()
        if parts and parts[0] == ref:
            manifest = json.loads(_ctr("content", "get", parts[2]))
            if "manifests" in manifest:  # an index: take the first manifest
                manifest = json.loads(_ctr("content", "get",
                                           manifest["manifests"][0]["digest"]))
            return manifest["config"]["digest"]
    return None


# ---------------------------------------------------------------------------
# Processes
# ---------------------------------------------------------------------------
def _spawn(name: str, argv: list[str], state: dict) -> subprocess.Popen:
    logs = _d("logs")
    logs.mkdir(parents=True, exist_ok=True)
    with open(logs / f"{name}.log", "ab") as logf:
        p = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=logf,
                             stderr=subprocess.STDOUT, cwd=_d(), start_new_session=True)
    state.setdefault("pids", {})[name] = p.pid
    _save_state(state)  # at once: a run killed mid-`up` leaves pids to clean
    return p


def _log_tail(name: str, n: int = 25) -> str:
    with contextlib.suppress(OSError):
        return "\n".join(_d("logs", f"{name}.log").read_text(errors="replace").splitlines()[-n:])
    return ""


def _expect(name: str) -> str:
    # what the command line of each component contains
    return {"containerd": "containerd"}.get(name, name)


def _alive(state: dict, name: str) -> bool:
    pid = state.get("pids", {}).get(name)
    return bool(pid and cp._alive(pid) and _expect(name) in cp._cmdline(pid)
                and str(cluster_dir()) in cp._cmdline(pid))


def _wait(what: str, check, timeout: float, proc: subprocess.Popen | None = None,
          logname: str | None = None, interval: float = 0.25):
    deadline = time.monotonic() + timeout
    last: object = None
    while time.monotonic() < deadline:
        if proc is not None and proc.poll() is not None:
            raise ClusterError(f"{logname} exited with {proc.returncode}:\n"
                               f"{_log_tail(logname or '')}")
        try:
            last = check()
            if last:
                return last
        except Exception as e:  # retried until the deadline
            last = e
        time.sleep(interval)
    tail = f"\n{_log_tail(logname)}" if logname else ""
    raise ClusterError(f"timed out after {timeout:.0f}s waiting for {what} ({last}){tail}")


def _controlplane(state: dict) -> cp.ControlPlane | None:
    return cp.ControlPlane.load(_d("controlplane"))


def _api_get(plane: cp.ControlPlane, path: str) -> dict:
    with urllib.request.urlopen(f"{plane.server}{path}", timeout=5,
                                context=plane.ssl_context()) as r:
        return json.loads(r.read())


def _node_ready(plane: cp.ControlPlane) -> bool:
    try:
        node = _api_get(plane, f"/api/v1/nodes/{NODE_NAME}")
    except (OSError, ValueError):
        return False
    return any(c["type"] == "Ready" and c["status"] == "True"
               for c in node.get("status", {}).get("conditions", []))


def _dns_answers(name: str) -> bool:
    """One A query to the node's DNS: answered with at least one record?"""
    import socket
    import struct
    qname = b"".join(bytes([len(p)]) + p.encode() for p in name.split(".")) + b"\0"
    query = struct.pack(">HHHHHH", 0x5348, 0x0100, 1, 0, 0, 0) + qname + struct.pack(">HH", 1, 1)
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        s.settimeout(2)
        s.sendto(query, (NODE_IP, 53))
        reply = s.recv(2048)
    _id, flags, _qd, ancount = struct.unpack(">HHHH", reply[:8])
    return _id == 0x5348 and flags & 0xF == 0 and ancount > 0


def healthy() -> bool:
    """Every process of the node runs and the node is Ready."""
    state = _load_state()
    if not state.get("up"):
        return False
    plane = _controlplane(state)
    if plane is None or not all(plane.running().values()):
        return False
    if not all(_alive(state, n) for n in COMPONENTS):
        return False
    return _node_ready(plane)


# ---------------------------------------------------------------------------
# up
# ---------------------------------------------------------------------------
def build() -> None:
    """Everything `up` and `image` need that can be made ahead: host
    packages, the binaries (cached Go builds) and the pause image."""
    ensure_packages(HOST_PACKAGES)
    cp.ensure_binaries(("etcd", "kube-apiserver", "kubectl", *cp.NODE_BINARIES))
    pause_archive()


def up() -> Path:
    """Start the node (or find it running); return the admin kubeconfig path."""
    with cp._file_lock("cluster.lock"):
        if healthy():
            return kubeconfig_path()
        if _state_file().exists() or _procs_matching(str(cluster_dir())):
            _log("cleaning up what an earlier run left")
            _teardown()
        t0 = time.monotonic()
        try:
            _up()
        except BaseException:
            _log("start failed; undoing what was started")
            with contextlib.suppress(Exception):
                _teardown()
            raise
        _log(f"node {NODE_NAME} Ready in {time.monotonic() - t0:.1f}s")
        return kubeconfig_path()


def _up() -> None:
    build()
    bins = {n: cp.binary_path(n) for n in ("kubectl", *cp.NODE_BINARIES)}
    for sub in ("logs", "cni/net.d", "cni/ipam", "kubelet/root", "kubelet/certs",
                "kubelet/pod-logs", "containerd/root", "containerd/state"):
        _d(sub).mkdir(parents=True, exist_ok=True)
    state: dict = {"up": False, "pids": {}}
    _save_state(state)

    _record_baseline()
    if not _lo_has_ip():
        _run(["ip", "addr", "add", f"{NODE_IP}/32", "dev", "lo"])
    _sysctl_set("net.ipv4.ip_forward", "1")
    # pod -> Service -> pod on the same bridge: the reply must cross iptables
    # to be un-DNATed.
    _sysctl_set("net.bridge.bridge-nf-call-iptables", "1")
    _add_forward_rules()

    # containerd
    _d("containerd", "config.toml").write_text(_containerd_config())
    _d("cni", "net.d", "10-shardlease.conflist").write_text(_cni_config())
    p = _spawn("containerd", ["containerd", "--config", str(_d("containerd", "config.toml"))],
               state)
    _wait("containerd", _containerd_answers, 60, p, "containerd")
    if PAUSE_IMAGE not in _ctr("images", "ls", "-q").split():
        _ctr("images", "import", str(pause_archive()))

    # etcd + kube-apiserver, started for a node
    plane = cp.ControlPlane(state_dir=_d("controlplane"), die_with_parent=False,
                            node=True, address=NODE_IP).start()
    state["pids"]["etcd"] = plane.etcd_pid
    state["pids"]["kube-apiserver"] = plane.apiserver_pid
    _save_state(state)
    pki = plane.pki
    _node_cert(pki)
    _kubeconfig(_d("kubelet", "kubeconfig"), plane.server, pki, "kubelet")
    kc = str(kubeconfig_path())

    ports = {n: cp.free_port() for n in ("kube-controller-manager", "kube-scheduler", "kubelet",
                                         "kubelet-healthz", "kube-proxy-healthz",
                                         "kube-proxy-metrics")}
    state["ports"] = ports
    _spawn("kube-controller-manager", [
        str(bins["kube-controller-manager"]), f"--kubeconfig={kc}",
        f"--authentication-kubeconfig={kc}", f"--authorization-kubeconfig={kc}",
        "--bind-address=127.0.0.1", f"--secure-port={ports['kube-controller-manager']}",
        f"--cert-dir={_d('controlplane', 'kcm-certs')}",
        "--controllers=*", "--use-service-account-credentials=true",
        f"--service-account-private-key-file={pki / 'sa.key'}",
        f"--root-ca-file={pki / 'ca.crt'}",
        f"--service-cluster-ip-range={SERVICE_CIDR}", "--leader-elect=false",
    ], state)
    _spawn("kube-scheduler", [
        str(bins["kube-scheduler"]), f"--kubeconfig={kc}",
        f"--authentication-kubeconfig={kc}", f"--authorization-kubeconfig={kc}",
        "--bind-address=127.0.0.1", f"--secure-port={ports['kube-scheduler']}",
        f"--cert-dir={_d('controlplane', 'scheduler-certs')}", "--leader-elect=false",
    ], state)
    _d("kubelet", "config.json").write_text(_kubelet_config(ports, pki))
    kubelet = _spawn("kubelet", [
        str(bins["kubelet"]), f"--config={_d('kubelet', 'config.json')}",
        f"--kubeconfig={_d('kubelet', 'kubeconfig')}",
        f"--root-dir={_d('kubelet', 'root')}", f"--cert-dir={_d('kubelet', 'certs')}",
        f"--hostname-override={NODE_NAME}", f"--node-ip={NODE_IP}",
    ], state)
    _d("kube-proxy.json").write_text(_kube_proxy_config(ports))
    _spawn("kube-proxy", [str(bins["kube-proxy"]), f"--config={_d('kube-proxy.json')}"], state)
    # DNS as a host process on the node address (the kubelet's clusterDNS):
    # no image to build, and pods reach the node address directly.
    _d("coredns").mkdir(exist_ok=True)
    _d("coredns", "Corefile").write_text(_corefile())
    _spawn("coredns", [str(bins["coredns"]), "-conf", str(_d("coredns", "Corefile"))], state)

    _wait(f"node {NODE_NAME} Ready", lambda: _node_ready(plane), 180, kubelet, "kubelet")
    # Pods are refused until the ServiceAccount controller made `default`.
    _wait("ServiceAccount default/default",
          lambda: _api_get(plane, "/api/v1/namespaces/default/serviceaccounts/default"),
          120, None, "kube-controller-manager")
    _wait("endpoints of the kubernetes Service", lambda: _api_get(
        plane, "/api/v1/namespaces/default/endpoints/kubernetes").get("subsets"), 60)
    _wait("DNS for kubernetes.default.svc.cluster.local",
          lambda: _dns_answers("kubernetes.default.svc.cluster.local"), 60, None, "coredns")
    for name in COMPONENTS:
        if not _alive(state, name):
            raise ClusterError(f"{name} died during start:\n{_log_tail(name)}")
    state["up"] = True
    state["started"] = time.time()
    _save_state(state)


# ---------------------------------------------------------------------------
# down
# ---------------------------------------------------------------------------
def down() -> bool:
    """Stop everything and undo the host changes; True if anything ran."""
    with cp._file_lock("cluster.lock"):
        existed = _state_file().exists() or _baseline_file().exists()
        _teardown()
        return existed


def _stop_pid(pid: int | None, expect: str) -> None:
    if pid:
        t0 = time.monotonic()
        cp._terminate(pid, expect, timeout=20)
        if time.monotonic() - t0 > 3:
            _log(f"{expect} took {time.monotonic() - t0:.0f}s to stop")


def _reset_runtime() -> None:
    """Kill every container of the node's containerd and delete them, so no
    pod process outlives the node."""
    t0 = time.monotonic()
    tasks = _ctr("tasks", "ls", "-q", check=False, timeout=30).split()
    for tid in tasks:
        _ctr("tasks", "kill", "-a", "-s", "SIGKILL", tid, check=False, timeout=30)
    for tid in tasks:
        _ctr("tasks", "delete", "--force", tid, check=False, timeout=30)
    containers = _ctr("containers", "ls", "-q", check=False, timeout=30).split()
    for cid in containers:
        _ctr("containers", "delete", cid, check=False, timeout=30)
    if tasks or containers:
        _log(f"killed {len(tasks)} tasks, deleted {len(containers)} containers "
             f"in {time.monotonic() - t0:.1f}s")


def _stop_strays(names: tuple[str, ...]) -> None:
    """Stop processes of these cached binaries that run with our state dir."""
    binaries = {str(cp.binary_path(n)) for n in names}
    for pid in _procs_matching(str(cluster_dir())):
        cmd = cp._cmdline(pid)
        if cmd and cmd.split()[0] in binaries:
            cp._terminate(pid, str(cluster_dir()), timeout=20)


def _teardown() -> None:
    state = _load_state()
    pids = state.get("pids", {})
    mine = str(cluster_dir())
    for name in ("kube-controller-manager", "kube-scheduler", "kube-proxy", "kubelet",
                 "coredns"):
        _stop_pid(pids.get(name), name)
    # A run killed before it saved a pid: find its processes by their paths.
    # Shims are left to containerd (killing them would orphan the pods).
    # Only our own binaries: a user's `kubectl --kubeconfig <ours>` stays.
    # etcd and the API server go last (below), the API server first.
    _stop_strays(cp.NODE_BINARIES)
    shims = [p for p in _procs_matching(str(containerd_sock())) if "shim" in cp._cmdline(p)]
    containerd_pid = pids.get("containerd")
    if not (containerd_pid and cp._alive(containerd_pid)
            and "containerd" in cp._cmdline(containerd_pid)):
        # its pid may be lost with the state file: find it by its config
        containerd_pid = next((p for p in _procs_matching(str(_d("containerd", "config.toml")))
                               if cp._cmdline(p).split()[0].endswith("containerd")), None)
    started_here = None
    if shims and containerd_pid is None:
        # Containers still run from an earlier containerd: start one to kill them.
        _d("containerd", "config.toml").parent.mkdir(parents=True, exist_ok=True)
        if _d("containerd", "config.toml").exists():
            started_here = _spawn("containerd", [
                "containerd", "--config", str(_d("containerd", "config.toml"))], state)
            containerd_pid = started_here.pid
            with contextlib.suppress(ClusterError):
                _wait("containerd", _containerd_answers, 30)
    if containerd_pid and cp._alive(containerd_pid):
        _reset_runtime()
    _stop_pid(containerd_pid, "containerd")
    for pid in _procs_matching(str(_d("containerd", "config.toml"))):
        if cp._cmdline(pid).split()[0].endswith("containerd"):
            cp._terminate(pid, mine, timeout=20)
    plane = cp.ControlPlane.load(_d("controlplane"))
    if plane is not None:
        plane.stop(remove=False)
    _stop_strays(("kube-apiserver",))
    _stop_strays(("etcd",))

    proxy = cp.binary_path("kube-proxy")
    if proxy.exists():
        _run([str(proxy), "--cleanup"], check=False, timeout=60)
    baseline: dict = {}
    with contextlib.suppress(OSError, ValueError):
        baseline = json.loads(_baseline_file().read_text())
    # No baseline: `up` changed nothing yet (it records one first), so only
    # our own tagged rules can be there.
    _iptables_cleanup(baseline.get("iptables_chains"))
    _umount_all(cluster_dir())
    if not baseline.get("bridge") and Path(f"/sys/class/net/{BRIDGE}").exists():
        _run(["ip", "link", "delete", BRIDGE], check=False)
    if not baseline.get("lo_address") and _lo_has_ip():
        _run(["ip", "addr", "del", f"{NODE_IP}/32", "dev", "lo"], check=False)
    for name, value in baseline.get("sysctls", {}).items():
        if value is not None:
            _sysctl_set(name, value)
    _remove_cgroups()
    # Keep the node's image store (imports are slow); drop everything else.
    if cluster_dir().exists():
        for child in cluster_dir().iterdir():
            if child.name == "containerd":
                for sub in child.iterdir():
                    if sub.name != "root":
                        _rm(sub)
            else:
                _rm(child)
    with contextlib.suppress(FileNotFoundError):
        _baseline_file().unlink()


def _rm(p: Path) -> None:
    if p.is_dir() and not p.is_symlink():
        shutil.rmtree(p, ignore_errors=True)
    else:
        with contextlib.suppress(FileNotFoundError):
            p.unlink()


# ---------------------------------------------------------------------------
# image
# ---------------------------------------------------------------------------
def _docker_env() -> dict:
    return dict(os.environ, DOCKER_HOST="unix:///var/run/docker.sock")


def _docker_cli() -> str:
    # Debian's client matches Debian's engine; another `docker` on PATH may not.
    return "/usr/bin/docker" if os.path.exists("/usr/bin/docker") else "docker"


def _docker(*args: str, check: bool = True, input: bytes | None = None,
            timeout: float = 1800) -> subprocess.CompletedProcess:
    return _run([_docker_cli(), *args], check=check, input=input, timeout=timeout,
                env=_docker_env())


@contextlib.contextmanager
def docker_engine():
    """A Docker engine for the duration: the running one, or a dockerd
    started here and stopped at the end. It is started without iptables
    rules, bridge or ip_forward change: builds use the host network."""
    ensure_packages(IMAGE_PACKAGES)
    if _docker("info", check=False, timeout=30).returncode == 0:
        yield
        return
    _log("starting dockerd")
    logs = cp.cache_dir() / "dockerd.log"
    with open(logs, "ab") as logf:
        p = subprocess.Popen(["dockerd", "--iptables=false", "--ip-forward=false",
                              "--bridge=none", "--ip-masq=false"],
                             stdin=subprocess.DEVNULL, stdout=logf, stderr=subprocess.STDOUT,
                             start_new_session=True)
    (cp.cache_dir() / "dockerd.pid").write_text(f"{p.pid}\n")
    try:
        _wait("dockerd", lambda: _docker("info", check=False, timeout=10).returncode == 0,
              90, p, None)
        yield
    finally:
        stop_docker()
        with contextlib.suppress(subprocess.TimeoutExpired):
            p.wait(timeout=5)


def stop_docker() -> bool:
    """Stop a dockerd that docker_engine started (never another)."""
    f = cp.cache_dir() / "dockerd.pid"
    if not f.exists():
        return False
    with contextlib.suppress(ValueError, OSError):
        cp._terminate(int(f.read_text()), "dockerd", timeout=30)
    f.unlink()
    return True


def _debian_mirror() -> str:
    """The Debian archive the host's apt uses (so no host is named here)."""
    env = os.environ.get("SHARDLEASE_DEBIAN_MIRROR")
    if env:
        return env
    texts = []
    for f in [Path("/etc/apt/sources.list"), *sorted(Path("/etc/apt/sources.list.d").glob("*"))]:
        with contextlib.suppress(OSError):
            texts.append(f.read_text())
    for text in texts:
        for stanza in re.split(r"\n\s*\n", text):  # deb822 .sources
            fields = dict(re.findall(r"^(\w[\w-]*):\s*(.*)$", stanza, re.M))
            suites = fields.get("Suites", "").split()
            if "bookworm" in suites and "main" in fields.get("Components", "").split():
                return fields.get("URIs", "").split()[0]
        for ln in text.splitlines():  # one-line format
            m = re.match(r"^deb\s+(?:\[[^]]*\]\s+)?(\S+)\s+bookworm\s+.*\bmain\b", ln)
            if m:
                return m.group(1)
    raise ClusterError("no Debian bookworm archive in the host's apt sources; "
                       "set SHARDLEASE_DEBIAN_MIRROR")


ROOTFS_IMAGE = "shardlease-base/bookworm-rootfs:latest"
HOST_CA_DIR = Path("/usr/local/share/ca-certificates")


def _host_cas() -> tuple[list[Path], str]:
    """The CA certificates the host's admin added to its trust store, and a
    digest of them."""
    cas = sorted(HOST_CA_DIR.rglob("*.crt")) if HOST_CA_DIR.is_dir() else []
    h = hashlib.sha256()
    for c in cas:
        h.update(c.name.encode() + b"\0" + c.read_bytes())
    return cas, h.hexdigest()[:16]


def _rootfs_tarball() -> Path:
    """Debian bookworm (minbase) with Debian's Python 3.11: python3, venv,
    pip. Made with debootstrap, since no image can be pulled; cached."""
    tarball = images_dir() / "bookworm-python3.tar"
    if tarball.exists():
        return tarball
    images_dir().mkdir(parents=True, exist_ok=True)
    t0 = time.monotonic()
    _log("debootstrap bookworm (minbase + python3) ...")
    with tempfile.TemporaryDirectory(dir=images_dir()) as d:
        root = Path(d) / "rootfs"
        _run(["debootstrap", "--variant=minbase",
              "--include=python3,python3-venv,python3-pip,python-is-python3,ca-certificates",
              "bookworm", str(root), _debian_mirror()], timeout=1800)
        for junk in ("var/lib/apt/lists", "var/cache/apt/archives", "var/log"):
            for p in (root / junk).glob("*"):
                _rm(p)
        tmp = Path(d) / "rootfs.tar"
        _run(["tar", "-C", str(root), "--numeric-owner", "-cf", str(tmp), "."], timeout=900)
        os.replace(tmp, tarball)
    _log(f"debootstrap done in {time.monotonic() - t0:.0f}s")
    return tarball


#: What the runtime base leaves out of the debootstrap root: the packages
#: that only make a virtualenv (a runtime image copies a finished one), and
#: documentation, manual pages and translations. Bump RUNTIME_ROOTFS_RECIPE
#: when this changes (the cached root is made again).
RUNTIME_PURGE = ("python3-pip", "python3-venv", "python3.11-venv", "python3-pip-whl",
                 "python3-setuptools-whl", "python3-setuptools", "python3-wheel",
                 "python3-pkg-resources", "python3-distutils", "python3-lib2to3")
RUNTIME_STRIP = ("usr/share/doc", "usr/share/man", "usr/share/info", "usr/share/locale")
RUNTIME_ROOTFS_RECIPE = "1"
RUNTIME_ROOTFS_IMAGE = "shardlease-base/bookworm-rootfs-runtime:" + RUNTIME_ROOTFS_RECIPE


def _runtime_tarball() -> Path:
    """The debootstrap root without RUNTIME_PURGE's packages (purged by
    dpkg, so its database agrees) and RUNTIME_STRIP's files; made from the
    cached root, itself cached."""
    tarball = images_dir() / f"bookworm-python3-runtime-{RUNTIME_ROOTFS_RECIPE}.tar"
    if tarball.exists():
        return tarball
    full = _rootfs_tarball()
    t0 = time.monotonic()
    with tempfile.TemporaryDirectory(dir=images_dir()) as d:
        root = Path(d) / "rootfs"
        root.mkdir()
        _run(["tar", "-C", str(root), "--numeric-owner", "-xf", str(full)], timeout=900)
        listed = _run(["chroot", str(root), "dpkg-query", "-W", "-f", "${Package}\\n"],
                      timeout=120).stdout.decode().split()
        purge = [pkg for pkg in RUNTIME_PURGE if pkg in listed]
        if purge:
            _run(["chroot", str(root), "dpkg", "--purge", *purge], timeout=600,
                 env={"PATH": "/usr/sbin:/usr/bin:/sbin:/bin", "DEBIAN_FRONTEND": "noninteractive"})
        for junk in RUNTIME_STRIP:
            for p in (root / junk).glob("*"):
                _rm(p)
        tmp = Path(d) / "rootfs.tar"
        _run(["tar", "-C", str(root), "--numeric-owner", "-cf", str(tmp), "."], timeout=900)
        os.replace(tmp, tarball)
    _log(f"runtime root (without {len(purge)} packages and the docs) in "
         f"{time.monotonic() - t0:.0f}s")
    return tarball


def base_image() -> str:
    """The Python base image the Dockerfile's build stages run on here: the
    debootstrap root filesystem, trusting the CAs the host trusts (pip inside
    the build goes through the same network as the host's). Rebuilt only
    when missing or when the host's CAs changed."""
    return _base(BASE_IMAGE, ROOTFS_IMAGE, _rootfs_tarball)


def runtime_base_image() -> str:
    """The base of the Dockerfile's final stages here (`RUNTIME_BASE`): the
    same root without pip, venv and the docs (`_runtime_tarball`), with the
    same CAs."""
    return _base(RUNTIME_BASE_IMAGE, RUNTIME_ROOTFS_IMAGE, _runtime_tarball)


def _base(tag: str, rootfs_image: str, tarball: Callable[[], Path]) -> str:
    cas, digest = _host_cas()
    label = "io.shardlease.host-ca"
    p = _docker("image", "inspect", "-f", f'{{{{index .Config.Labels "{label}"}}}}',
                tag, check=False)
    if p.returncode == 0 and p.stdout.decode().strip() == digest:
        return tag
    if _docker("image", "inspect", rootfs_image, check=False).returncode != 0:
        with open(tarball(), "rb") as f:
            p = subprocess.run([_docker_cli(), "import",
                                "--change", "ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:"
                                            "/usr/bin:/sbin:/bin",
                                "--change", "ENV LANG=C.UTF-8",
                                "--change", 'CMD ["python3"]', "-", rootfs_image],
                               stdin=f, capture_output=True, env=_docker_env(), timeout=900)
        if p.returncode != 0:
            raise ClusterError(f"docker import failed: {p.stderr.decode()[-2000:]}")
    with tempfile.TemporaryDirectory() as d:
        (Path(d) / "ca").mkdir()
        for c in cas:
            shutil.copy(c, Path(d) / "ca" / c.name)
        (Path(d) / "Dockerfile").write_text(
            f"FROM {rootfs_image}\n"
            "COPY ca/ /usr/local/share/ca-certificates/\n"
            "RUN update-ca-certificates\n"
            f"LABEL {label}={digest}\n")
        p = _run([_docker_cli(), "build", "-t", tag, d], check=False, timeout=600,
                 env=dict(_docker_env(), DOCKER_BUILDKIT="0"))
        if p.returncode != 0:
            raise ClusterError(f"base image build failed:\n{p.stdout.decode()[-3000:]}"
                               f"{p.stderr.decode()[-2000:]}")
    return tag


def image(load: bool = True) -> str:
    """Build shardlease:dev from the Dockerfile on the local base image and,
    if `load`, import it into the node's containerd unless already there.
    Returns the image ID."""
    root = Path(__file__).resolve().parents[1]
    with cp._file_lock("image.lock"), docker_engine():
        base, runtime_base = base_image(), runtime_base_image()
        t0 = time.monotonic()
        # The classic builder: BuildKit is not part of Debian's engine.
        rev = subprocess.run(["git", "-C", str(root), "rev-parse", "HEAD"],
                             capture_output=True, text=True).stdout.strip() or "unknown"
        # The `example` target (the runtime plus the example app, which the
        # scenarios run beside the agent) as IMAGE; the runtime target too,
        # the default of `docker build .`, for what it weighs.
        for target, tag in (("example", IMAGE), ("runtime", RUNTIME_IMAGE)):
            p = _run([_docker_cli(), "build", "--network", "host", "--target", target,
                      "--build-arg", f"PYTHON_IMAGE={base}",
                      "--build-arg", f"RUNTIME_BASE={runtime_base}",
                      "--build-arg", f"REVISION={rev}",
                      "-t", tag, str(root)],
                     check=False, timeout=1800, env=dict(_docker_env(), DOCKER_BUILDKIT="0"))
            if p.returncode != 0:
                raise ClusterError(f"docker build --target {target} failed:\n"
                                   f"{p.stdout.decode()[-4000:]}{p.stderr.decode()[-2000:]}")
        image_id = _docker("image", "inspect", "-f", "{{.Id}}", IMAGE).stdout.decode().strip()
        sizes = {tag: int(_docker("image", "inspect", "-f", "{{.Size}}", tag).stdout.decode())
                 for tag in (IMAGE, RUNTIME_IMAGE)}
        _log(f"docker build {IMAGE} ({image_id[:19]}) and {RUNTIME_IMAGE} in "
             f"{time.monotonic() - t0:.1f}s; sizes: " + ", ".join(
                 f"{tag} {size / 1e6:.0f} MB" for tag, size in sizes.items()))
        # What the runtime image holds, read from inside it while the engine
        # is up (tests/pods/test_node.py asserts on it).
        probe = _docker("run", "--rm", "--network", "none", "--entrypoint", "python",
                        RUNTIME_IMAGE, "-c", RUNTIME_PROBE, timeout=120).stdout.decode()
        report = {"image": RUNTIME_IMAGE, "size_bytes": sizes[RUNTIME_IMAGE],
                  "example_size_bytes": sizes[IMAGE], **json.loads(probe)}
        (cp.cache_dir() / "runtime-image.json").write_text(json.dumps(report) + "\n")
        if load:
            with cp._file_lock("cluster.lock"):
                _load_image(image_id)
    return image_id


def _load_image(image_id: str) -> None:
    if not _alive(_load_state(), "containerd"):
        raise ClusterError("the node is not running: `e2e/cluster up` first")
    if _ctr_image_config(IMAGE_REF) == image_id:
        return
    t0 = time.monotonic()
    for attempt in range(3):
        save = subprocess.Popen([_docker_cli(), "save", IMAGE], stdout=subprocess.PIPE,
                                env=_docker_env())
        imp = subprocess.run(["ctr", "-a", str(containerd_sock()), "-n", NS, "images",
                              "import", "-"], stdin=save.stdout, capture_output=True,
                             timeout=900)
        save.wait()
        err = imp.stderr.decode()
        # Replacing the tag leaves the old image's layers unreferenced, and
        # containerd's garbage collector may remove a snapshot the new unpack
        # was about to use as a parent ("parent snapshot ... does not exist",
        # seen once in CI): the next attempt unpacks from what is there.
        if imp.returncode != 0 and "snapshot" in err and attempt < 2:
            _log(f"image import failed ({err.strip()[-200:]}); retrying")
            time.sleep(2)
            continue
        break
    if save.returncode != 0 or imp.returncode != 0:
        raise ClusterError(f"image import failed: {err[-2000:]}")
    got = _ctr_image_config(IMAGE_REF)
    if got != image_id:
        raise ClusterError(f"imported {IMAGE_REF} has id {got}, expected {image_id}")
    _log(f"imported {IMAGE} into the node in {time.monotonic() - t0:.1f}s")


# ---------------------------------------------------------------------------
# status / CLI
# ---------------------------------------------------------------------------
def status() -> tuple[bool, str]:
    state = _load_state()
    if not state:
        return False, "not running"
    lines = []
    plane = _controlplane(state)
    run = plane.running() if plane else {}
    ok = True
    for name in ("etcd", "kube-apiserver", *COMPONENTS):
        pid = state.get("pids", {}).get(name)
        alive = run.get(name, False) if name in ("etcd", "kube-apiserver") else _alive(state,
                                                                                     name)
        ok &= bool(alive)
        lines.append(f"{name:24} pid={pid} {'running' if alive else 'DEAD'}")
    ready = bool(plane and _node_ready(plane))
    ok &= ready
    lines.append(f"node {NODE_NAME:19} {'Ready' if ready else 'NOT Ready'} ({NODE_IP})")
    if plane:
        lines.append(f"{'api server':24} {plane.server}")
    if ready and _alive(state, "containerd"):
        have = _ctr_image_config(IMAGE_REF)
        lines.append(f"{'image ' + IMAGE:24} {have or 'not loaded'}")
    lines.append(f"{'kubeconfig':24} {kubeconfig_path()}")
    lines.append(f"{'state dir':24} {cluster_dir()}")
    return ok, "\n".join(lines)


USAGE = """usage: e2e/cluster COMMAND
  build    install missing host packages, build the node's binaries, the pause image,
           the base image and shardlease:dev (all cached)
  up       start the node (building what is missing); prints `export KUBECONFIG=...`
  image    build shardlease:dev from the Dockerfile and load it into the node (if up)
  down     stop everything and undo the host changes (also stops a dockerd it started)
  status   what runs
cache: $SHARDLEASE_CACHE (default ~/.cache/shardlease)"""


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if len(argv) != 1 or argv[0] not in ("build", "up", "image", "down", "status"):
        print(USAGE, file=sys.stderr if argv[:1] not in (["-h"], ["--help"]) else sys.stdout)
        return 0 if argv[:1] in (["-h"], ["--help"]) else 2
    cmd = argv[0]
    try:
        if cmd == "build":
            t0 = time.monotonic()
            build()
            image(load=False)
            print(f"node binaries and images ready; {time.monotonic() - t0:.1f}s")
        elif cmd == "up":
            path = up()
            print(f"export KUBECONFIG={path}")
        elif cmd == "image":
            running = _alive(_load_state(), "containerd")
            print(image(load=running))
            if not running:
                _log("the node is not running: built, not loaded (`up` first)")
        elif cmd == "down":
            ran = down()
            docker = stop_docker()
            print("stopped and cleaned up" if ran or docker else "not running")
        elif cmd == "status":
            ok, text = status()
            print(text)
            return 0 if ok else 1
    except (ClusterError, cp.BuildError, RuntimeError) as e:
        print(f"e2e/cluster {cmd} failed: {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    signal.signal(signal.SIGPIPE, signal.SIG_DFL)
    sys.exit(main())
