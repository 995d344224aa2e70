"""A kind cluster made on this machine: one control plane and two workers.

kind's published node image cannot be pulled here, and kind's docker provider
cannot start a privileged container on Debian's Docker engine (its bounding
set lacks CAP_SYS_RESOURCE), so this makes kind work the way it can
(e2e/kind-plan.md holds the research and the probes):

- kind's podman provider (`KIND_EXPERIMENTAL_PROVIDER=podman`), on Debian's
  podman with a containers.conf of `default_ulimits = []` and Debian's
  dnsname plugin (workers find the control plane by name);
- a node image of our own: a bookworm debootstrap root with systemd and
  Debian's containerd, runc and CNI plugins, kind's own files from its Go
  module, the kubelet, kubeadm, kubectl and crictl built here, and the
  control plane's images as FROM-scratch archives of the binaries built here,
  imported at boot (no registry);
- no kindnetd (it cannot be built from the modules served here): after
  `kind create cluster`, a ptp/host-local CNI per node for its podCIDR and a
  route to every other node's pod range.

Then `kind`, `kubectl` and `helm` work on it as on any kind cluster: kind.sh
runs against it unchanged (it reuses a cluster of its name), and the tests of
tests/kind use it for whole-node faults (`podman pause`, `podman network
disconnect`, `kubectl drain`).

Stdlib only. Used by the ``e2e/kind-cluster`` CLI and by tests/kind.
"""

from __future__ import annotations

import contextlib
import hashlib
import inspect
import io
import json
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import cluster as node  # a sibling file: its helpers (apt, debootstrap, docker)
import controlplane as cp

#: kind.sh's default cluster name: kind.sh reuses a cluster of that name.
NAME = "shardlease-e2e"
WORKERS = 2
K8S = cp.K8S_VERSION
REPOSITORY = "shardlease.local"
#: Not the real node's ranges (10.244.0.0/24, 10.0.0.0/24): both may run.
POD_SUBNET = "10.245.0.0/16"
SERVICE_SUBNET = "10.97.0.0/16"

HOST_PACKAGES = {
    "podman": "podman",
    "/usr/lib/cni/dnsname": "golang-github-containernetworking-plugin-dnsname",
    "debootstrap": "debootstrap",
    "/usr/bin/docker": "docker.io",
}

#: The node root's packages: kind's base image's, from bookworm (its trixie
#: systemd refuses this host's cgroup v1), less what no test here needs.
ROOT_PACKAGES = ("systemd", "systemd-sysv", "dbus", "iproute2", "procps", "containerd", "runc",
                 "iptables", "nftables", "conntrack", "ethtool", "socat", "ebtables", "kmod",
                 "ca-certificates", "containernetworking-plugins", "libseccomp2", "mount",
                 "util-linux", "e2fsprogs")

#: Podman mounts only some cgroup v1 controllers into a container, and the
#: kubelet wants every one /proc/self/cgroup names ("cgroup [kubelet] has
#: some missing paths"): mounted before kind's entrypoint runs.
ENTRYPOINT_WRAPPER = """#!/bin/sh
for c in hugetlb net_cls,net_prio perf_event; do
  d=/sys/fs/cgroup/$c
  if grep -q ":$c:" /proc/self/cgroup && ! mountpoint -q "$d"; then
    mkdir -p "$d" && mount -t cgroup -o "$c" cgroup "$d"
  fi
done
exec /usr/local/bin/entrypoint "$@"
"""

#: The images a node's pods run, imported before the kubelet starts.
IMAGES_UNIT = """[Unit]
Description=Import the node's images (no registry here)
After=containerd.service
Requires=containerd.service
Before=kubelet.service
[Service]
Type=oneshot
RemainAfterExit=yes
ExecStart=/bin/sh -c 'for f in /kind/images/*.tar; do \\
  ctr -n k8s.io images import --all-platforms "$f" || exit 1; done'
[Install]
WantedBy=multi-user.target
"""

CONTAINERS_CONF = """# Written by e2e/kindcluster.py. Rootful podman raises RLIMIT_NOFILE and
# RLIMIT_NPROC above the hard limits by default, which needs CAP_SYS_RESOURCE,
# which this machine's bounding set lacks: no container would start.
[containers]
default_ulimits = []
# crun refuses this host's hybrid cgroup layout ("cgroups in hybrid mode not
# supported"); runc, which the real node uses too, runs on it.
[engine]
runtime = "runc"
"""

#: The sysctls several kubelets and containerds need beside the host's own
#: (kind's known issue: they share root's inotify budget).
SYSCTLS = (("fs.inotify.max_user_instances", "512"), ("fs.inotify.max_user_watches", "524288"))


class KindError(RuntimeError):
    pass


def _log(msg: str) -> None:
    print(f"[kind-cluster] {msg}", file=sys.stderr, flush=True)


def kind_dir() -> Path:
    return cp.cache_dir() / "kind"


def kubeconfig_path() -> Path:
    return kind_dir() / "kubeconfig"


def containers_conf() -> Path:
    path = kind_dir() / "containers.conf"
    if not path.exists() or path.read_text() != CONTAINERS_CONF:
        kind_dir().mkdir(parents=True, exist_ok=True)
        path.write_text(CONTAINERS_CONF)
    return path


def tool_dir() -> Path:
    """A directory of `kind`, `kubectl`, `helm` (and `docker`: Debian's, which
    matches its engine) under their plain names, for PATH."""
    d = kind_dir() / "bin"
    d.mkdir(parents=True, exist_ok=True)
    for name in ("kind", "kubectl", "helm"):
        link = d / name
        target = cp.binary_path(name)
        if not link.is_symlink() or os.readlink(link) != str(target):
            with contextlib.suppress(FileNotFoundError):
                link.unlink()
            link.symlink_to(target)
    docker = d / "docker"
    if not docker.is_symlink():
        docker.symlink_to("/usr/bin/docker")
    return d


def env() -> dict[str, str]:
    """What kind, kubectl and kind.sh need to find this cluster: the podman
    provider and its configuration, the kubeconfig, the tools on PATH."""
    return dict(os.environ,
                KIND_EXPERIMENTAL_PROVIDER="podman",
                CONTAINERS_CONF=str(containers_conf()),
                KUBECONFIG=str(kubeconfig_path()),
                DOCKER_HOST="unix:///var/run/docker.sock",
                DOCKER_BUILDKIT="0",  # the classic builder: no BuildKit in Debian's engine
                PATH=f"{tool_dir()}:/usr/sbin:/usr/bin:/sbin:/bin:" + os.environ.get("PATH", ""))


def _run(cmd: list[str], *, check: bool = True, input: bytes | None = None,
         timeout: float | None = 600) -> subprocess.CompletedProcess:
    p = subprocess.run(cmd, input=input, capture_output=True, timeout=timeout, env=env())
    if check and p.returncode != 0:
        raise KindError(f"{' '.join(cmd)} failed ({p.returncode}):\n"
                        f"{p.stdout.decode(errors='replace')[-1500:]}"
                        f"{p.stderr.decode(errors='replace')[-3000:]}")
    return p


def podman(*args: str, check: bool = True, input: bytes | None = None,
           timeout: float | None = 600) -> subprocess.CompletedProcess:
    return _run(["podman", *args], check=check, input=input, timeout=timeout)


def kubectl(*args: str, check: bool = True, timeout: float | None = 120) -> str:
    return _run([str(cp.binary_path("kubectl")), *args], check=check,
                timeout=timeout).stdout.decode()


def kind(*args: str, check: bool = True,
         timeout: float | None = 600) -> subprocess.CompletedProcess:
    return _run([str(cp.binary_path("kind")), *args], check=check, timeout=timeout)


# ---------------------------------------------------------------------------
# the node image
# ---------------------------------------------------------------------------

def _kind_files() -> Path:
    """kind's base-image files (entrypoint, units, containerd's config), from
    its Go module."""
    p = subprocess.run([cp._go(), "mod", "download", "-json",
                        f"sigs.k8s.io/kind@{cp.KIND_VERSION}"], capture_output=True,
                       timeout=600, env=cp._go_env(), cwd=tempfile.gettempdir())
    if p.returncode != 0:
        raise KindError(f"go mod download sigs.k8s.io/kind failed: {p.stderr.decode()[-2000:]}")
    files = Path(json.loads(p.stdout)["Dir"]) / "images" / "base" / "files"
    if not (files / "usr/local/bin/entrypoint").exists():
        raise KindError(f"kind's module has no base image files at {files}")
    return files


def _root_tarball() -> Path:
    """The node's bookworm root (debootstrap, cached by its package list)."""
    digest = hashlib.sha256(" ".join(ROOT_PACKAGES).encode()).hexdigest()[:12]
    tarball = kind_dir() / f"node-root-{digest}.tar"
    if tarball.exists():
        return tarball
    kind_dir().mkdir(parents=True, exist_ok=True)
    t0 = time.monotonic()
    _log("debootstrap bookworm for the node image ...")
    with tempfile.TemporaryDirectory(dir=kind_dir()) as d:
        root = Path(d) / "root"
        node._run(["debootstrap", "--variant=minbase", "--include=" + ",".join(ROOT_PACKAGES),
                   "bookworm", str(root), node._debian_mirror()], timeout=1800)
        for junk in ("var/lib/apt/lists", "var/cache/apt/archives", "var/log",
                     "usr/share/doc", "usr/share/man", "usr/share/locale", "usr/share/info"):
            for p in (root / junk).glob("*"):
                node._rm(p)
        tmp = Path(d) / "root.tar"
        node._run(["tar", "-C", str(root), "--numeric-owner", "-cf", str(tmp), "."], timeout=900)
        os.replace(tmp, tarball)
    _log(f"node root in {time.monotonic() - t0:.0f}s")
    return tarball


def _image_archive(name: str, files: dict[str, tuple[bytes, int]],
                   links: dict[str, str], entrypoint: list[str]) -> bytes:
    """A `docker save`-format archive of a FROM-scratch image: `files`
    (path -> bytes, mode), `links` (path -> target) and a few empty
    directories a program may write to."""
    layer = io.BytesIO()
    with tarfile.open(fileobj=layer, mode="w", format=tarfile.PAX_FORMAT) as t:
        dirs = {"tmp", "run", "var", "var/lib", "etc"}
        for path in [*files, *links]:
            parts = Path(path).parts[:-1]
            dirs |= {"/".join(parts[:i]) for i in range(1, len(parts) + 1)}
        for d in sorted(dirs):
            ti = tarfile.TarInfo(d)
            ti.type, ti.mode, ti.mtime = tarfile.DIRTYPE, 0o1777 if d == "tmp" else 0o755, 0
            t.addfile(ti)
        for path, (data, mode) in sorted(files.items()):
            ti = tarfile.TarInfo(path)
            ti.size, ti.mode, ti.mtime = len(data), mode, 0
            t.addfile(ti, io.BytesIO(data))
        for path, target in sorted(links.items()):
            ti = tarfile.TarInfo(path)
            ti.type, ti.linkname, ti.mtime = tarfile.SYMTYPE, target, 0
            t.addfile(ti)
    layer_bytes = layer.getvalue()
    diff_id = "sha256:" + hashlib.sha256(layer_bytes).hexdigest()
    config = json.dumps({
        "architecture": "amd64", "os": "linux",
        "config": {"Entrypoint": entrypoint,
                   "Env": ["PATH=/usr/local/bin:/usr/local/sbin:/usr/sbin:/usr/bin:/sbin:/bin"]},
        "rootfs": {"type": "layers", "diff_ids": [diff_id]},
        "history": [{"created_by": "e2e/kindcluster.py"}],
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


def _binary_image(name: str, tag: str, binary: str, path: str | None = None) -> bytes:
    path = path or f"usr/local/bin/{name}"
    return _image_archive(f"{REPOSITORY}/{name}:{tag}",
                          {path: (cp.binary_path(binary).read_bytes(), 0o755)}, {}, [f"/{path}"])


def _ldd(root: Path, binary: str) -> set[str]:
    out = node._run(["chroot", str(root), "ldd", binary], check=False).stdout.decode()
    return {p for line in out.splitlines() for p in line.split() if p.startswith("/")}


def _kube_proxy_image(root: Path) -> bytes:
    """kube-proxy's image: its static binary and an iptables userland from
    the node root: the nft and legacy binaries, conntrack, the extensions,
    and every library of each (libxt_statistic.so needs libm: without it
    `iptables-restore` cannot load the `statistic` match, and no Service of
    two endpoints syncs)."""
    bins = ["/usr/sbin/xtables-nft-multi", "/usr/sbin/xtables-legacy-multi", "/usr/sbin/conntrack"]
    wanted = set(bins)
    exts = {"/" + str(p.relative_to(root))
            for p in (root / "usr/lib/x86_64-linux-gnu/xtables").glob("*.so")}
    wanted |= exts
    for b in [*bins, *sorted(exts)]:
        wanted |= _ldd(root, b)
    files: dict[str, tuple[bytes, int]] = {}
    for f in sorted(wanted):
        src = root / f[1:]
        real = src.resolve()
        if not str(real).startswith(str(root)):  # an absolute link, inside the root
            real = root / str(real)[1:]
        files[f[1:]] = (real.read_bytes(), 0o755)
    files["usr/local/bin/kube-proxy"] = (cp.binary_path("kube-proxy").read_bytes(), 0o755)
    # The node's iptables is nft (the host's is): kube-proxy's must agree.
    links = {f"usr/sbin/{n}": "xtables-nft-multi"
             for n in ("iptables", "iptables-save", "iptables-restore",
                       "ip6tables", "ip6tables-save", "ip6tables-restore")}
    return _image_archive(f"{REPOSITORY}/kube-proxy:{K8S}", files, links,
                          ["/usr/local/bin/kube-proxy"])


def _component_images(root: Path) -> dict[str, bytes]:
    """Every image a kubeadm cluster's pods run, under the names kubeadm
    asks for with `imageRepository: shardlease.local` (kind_config)."""
    images = {n: _binary_image(n, K8S, n)
              for n in ("kube-apiserver", "kube-controller-manager", "kube-scheduler")}
    images["etcd"] = _binary_image("etcd", cp.ETCD_VERSION, "etcd")
    # kubeadm's CoreDNS Deployment gives only args: the image's entrypoint runs it.
    images["coredns"] = _binary_image("coredns", cp.COREDNS_VERSION, "coredns", "coredns")
    images["kube-proxy"] = _kube_proxy_image(root)
    images["pause"] = node.pause_archive().read_bytes()
    return images


def _recipe() -> str:
    """What the node image is made of, as a digest: a change of any part
    makes it again."""
    h = hashlib.sha256()
    for part in (ROOT_PACKAGES, ENTRYPOINT_WRAPPER, IMAGES_UNIT, cp.KIND_VERSION, K8S,
                 cp.ETCD_VERSION, cp.COREDNS_VERSION, cp.CRICTL_VERSION,
                 inspect.getsource(_node_root), inspect.getsource(_kube_proxy_image),
                 inspect.getsource(_component_images), inspect.getsource(_image_archive)):
        h.update(repr(part).encode() + b"\0")
    return h.hexdigest()[:12]


def node_image() -> str:
    return f"{REPOSITORY}/kind-node:{K8S}-{_recipe()}"


def _node_root(root: Path, files: Path) -> None:
    """kind's base image (images/base/Dockerfile) redone on the bookworm
    root, with this machine's differences."""
    def put(src: Path, dst: str, mode: int) -> None:
        target = root / dst
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(src, target)
        target.chmod(mode)

    for f in files.rglob("*"):
        if f.is_file() and not f.name.startswith("README") and "LICENSES" not in f.parts:
            rel = str(f.relative_to(files))
            put(f, rel, 0o755 if rel.startswith(("usr/local/bin/", "kind/bin/")) else 0o644)
    conf = root / "etc/containerd/config.toml"
    text = conf.read_text()
    # No CAP_SYS_RESOURCE here: the kubelet may not lower an oom_score_adj
    # (every sandbox failed: "can't get final child's PID from pipe").
    text = text.replace("restrict_oom_score_adj = false", "restrict_oom_score_adj = true")
    # The sandbox image is ours: no registry.
    lines = [f'  sandbox_image = "{node.PAUSE_IMAGE}"' if ln.startswith("  sandbox_image = ")
             else ln for ln in text.splitlines()]
    conf.write_text("\n".join(lines) + "\n")
    unit = root / "etc/systemd/system/containerd.service"
    unit.write_text(unit.read_text().replace("/usr/local/bin/containerd", "/usr/bin/containerd"))
    # containerd looks for CNI plugins in /opt/cni/bin; Debian's are in /usr/lib/cni.
    (root / "opt/cni").mkdir(parents=True, exist_ok=True)
    with contextlib.suppress(FileNotFoundError):
        (root / "opt/cni/bin").unlink()
    (root / "opt/cni/bin").symlink_to("/usr/lib/cni")
    (root / "etc/cni/net.d").mkdir(parents=True, exist_ok=True)
    (root / "etc/kubernetes/manifests").mkdir(parents=True, exist_ok=True)
    # kind's pruning of systemd's units (what a container must not start).
    with contextlib.suppress(FileNotFoundError):
        (root / "lib/systemd/system/sysinit.target.wants/systemd-tmpfiles-setup.service").unlink()
    for pattern in ("lib/systemd/system/multi-user.target.wants/*", "etc/systemd/system/*.wants/*",
                    "lib/systemd/system/local-fs.target.wants/*",
                    "lib/systemd/system/sockets.target.wants/*udev*",
                    "lib/systemd/system/sockets.target.wants/*initctl*",
                    "lib/systemd/system/basic.target.wants/*"):
        for p in root.glob(pattern):
            p.unlink()
    with open(root / "etc/systemd/journald.conf", "a") as f:
        f.write("ReadKMsg=no\n")
    for name, path in (("kubelet", "usr/bin/kubelet"), ("kubeadm", "usr/bin/kubeadm"),
                       ("kubectl", "usr/bin/kubectl"), ("crictl", "usr/local/bin/crictl")):
        put(cp.binary_path(name), path, 0o755)
    (root / "kind/version").write_text(K8S + "\n")
    spec = node._run(["chroot", str(root), "ctr", "oci", "spec"]).stdout
    (root / "etc/containerd/cri-base.json").write_bytes(spec)
    wrapper = root / "usr/local/bin/entrypoint-shl"
    wrapper.write_text(ENTRYPOINT_WRAPPER)
    wrapper.chmod(0o755)
    (root / "etc/systemd/system/kind-images.service").write_text(IMAGES_UNIT)
    images = root / "kind/images"
    images.mkdir(parents=True, exist_ok=True)
    for name, data in _component_images(root).items():
        (images / f"{name}.tar").write_bytes(data)
    node._run(["chroot", str(root), "systemctl", "enable", "kubelet.service",
               "containerd.service", "undo-mount-hacks.service", "kind-images.service"])
    node._run(["chroot", str(root), "systemctl", "mask", "systemd-binfmt.service"])
    init = root / "sbin/init"
    if not init.exists():
        init.symlink_to("/usr/lib/systemd/systemd")


def build_node_image() -> str:
    """The node image in podman's store (made if missing); its name."""
    ensure_host()
    cp.ensure_binaries(("kubelet", "kubeadm", "kubectl", "crictl", "kind", "kube-apiserver",
                        "kube-controller-manager", "kube-scheduler", "kube-proxy", "etcd",
                        "coredns"))
    name = node_image()
    if podman("image", "exists", name, check=False).returncode == 0:
        return name
    t0 = time.monotonic()
    files = _kind_files()
    tarball = _root_tarball()
    with tempfile.TemporaryDirectory(dir=kind_dir()) as d:
        root = Path(d) / "root"
        root.mkdir()
        node._run(["tar", "-C", str(root), "--numeric-owner", "-xf", str(tarball)], timeout=900)
        _node_root(root, files)
        tmp = Path(d) / "node.tar"
        node._run(["tar", "-C", str(root), "--numeric-owner", "-cf", str(tmp), "."], timeout=900)
        with open(tmp, "rb") as f:
            entry = '["/usr/local/bin/entrypoint-shl", "/sbin/init"]'
            p = subprocess.run(["podman", "import", "--change", f"ENTRYPOINT {entry}",
                                "--change", "STOPSIGNAL SIGRTMIN+3",
                                "--change", "ENV container=podman", "-", name],
                               stdin=f, capture_output=True, env=env(), timeout=900)
        if p.returncode != 0:
            raise KindError(f"podman import failed: {p.stderr.decode()[-2000:]}")
    size = podman("image", "inspect", "-f", "{{.Size}}", name).stdout.decode().strip()
    _log(f"node image {name} made in {time.monotonic() - t0:.0f}s ({int(size) / 1e9:.2f} GB)")
    for old in podman("images", "--format", "{{.Repository}}:{{.Tag}}",
                      f"{REPOSITORY}/kind-node").stdout.decode().split():
        if old != name and old.endswith(tuple("0123456789abcdef")):
            podman("rmi", old, check=False)
    return name


# ---------------------------------------------------------------------------
# the images kind.sh loads (MinIO and its client, which cannot be pulled)
# ---------------------------------------------------------------------------

MINIO_IMAGE = f"{REPOSITORY}/minio:{cp.MINIO_VERSION}"
MC_IMAGE = f"{REPOSITORY}/mc:{cp.MC_VERSION}"


def workload_images() -> dict[str, str]:
    """MINIO_IMAGE and MC_IMAGE for kind.sh, built here from the binaries
    made here, in the Docker engine (kind.sh loads them with `kind load
    docker-image`). The bucket Job runs `/bin/sh -c "mc ..."`: the client's
    image has Debian's static busybox as its shell."""
    cp.ensure_binaries(("minio", "mc"))
    node.ensure_packages({"/bin/busybox": "busybox-static"})
    busybox = Path("/bin/busybox").read_bytes()
    wanted = {
        MINIO_IMAGE: lambda: _image_archive(
            MINIO_IMAGE, {"usr/bin/minio": (cp.binary_path("minio").read_bytes(), 0o755)}, {},
            ["/usr/bin/minio"]),
        MC_IMAGE: lambda: _image_archive(
            MC_IMAGE, {"usr/bin/mc": (cp.binary_path("mc").read_bytes(), 0o755),
                       "bin/busybox": (busybox, 0o755)},
            {"bin/sh": "busybox"}, ["/usr/bin/mc"]),
    }
    with node.docker_engine():
        for name, make in wanted.items():
            if node._docker("image", "inspect", name, check=False).returncode != 0:
                node._docker("load", input=make(), timeout=600)
    return {"MINIO_IMAGE": MINIO_IMAGE, "MC_IMAGE": MC_IMAGE}


# ---------------------------------------------------------------------------
# the host
# ---------------------------------------------------------------------------

def _state_file() -> Path:
    return kind_dir() / "host-state.json"


def _load_host_state() -> dict:
    return json.loads(_state_file().read_text()) if _state_file().exists() else {}


def _save_host_state(state: dict) -> None:
    kind_dir().mkdir(parents=True, exist_ok=True)
    _state_file().write_text(json.dumps(state))


def ensure_host() -> None:
    """Podman, the dnsname plugin, debootstrap; an empty /lib/modules (kind
    bind-mounts it; this kernel has no modules); the inotify limits. What
    was changed is recorded, and `down` undoes it."""
    node.ensure_packages(HOST_PACKAGES)
    state = _load_host_state()
    if not Path("/lib/modules").exists():
        Path("/lib/modules").mkdir()
        state["made_lib_modules"] = True
    sysctls = state.setdefault("sysctls", {})
    for name, value in SYSCTLS:
        was = node._sysctl_get(name)
        if was is not None and int(was) < int(value):
            sysctls.setdefault(name, was)
            node._sysctl_set(name, value)
    _save_host_state(state)


def restore_host() -> None:
    if not _state_file().exists():
        return
    state = _load_host_state()
    for cidr in state.get("routes", []):
        node._run(["ip", "route", "del", cidr], check=False)
    for name, value in state.get("sysctls", {}).items():
        node._sysctl_set(name, value)
    if state.get("made_lib_modules"):
        with contextlib.suppress(OSError):
            Path("/lib/modules").rmdir()
    _state_file().unlink()


# ---------------------------------------------------------------------------
# the cluster
# ---------------------------------------------------------------------------

def kind_config() -> str:
    nodes = "\n".join(["- role: control-plane", *["- role: worker"] * WORKERS])
    return f"""kind: Cluster
apiVersion: kind.x-k8s.io/v1alpha4
networking:
  # kindnetd cannot be built here: the harness writes each node's CNI.
  disableDefaultCNI: true
  podSubnet: {POD_SUBNET}
  serviceSubnet: {SERVICE_SUBNET}
nodes:
{nodes}
kubeadmConfigPatches:
- |
  kind: ClusterConfiguration
  imageRepository: {REPOSITORY}
  dns:
    imageTag: {cp.COREDNS_VERSION}
  etcd:
    local:
      imageTag: {cp.ETCD_VERSION}
- |
  kind: KubeletConfiguration
  # This host is on cgroup v1, which kubelets since 1.35 refuse by default.
  failCgroupV1: false
"""


def nodes() -> list[str]:
    p = kind("get", "nodes", "--name", NAME, check=False, timeout=60)
    return sorted(p.stdout.decode().split()) if p.returncode == 0 else []


def exists() -> bool:
    p = kind("get", "clusters", check=False, timeout=60)
    return NAME in p.stdout.decode().split()


def _node_table() -> list[tuple[str, str, str]]:
    """(node, podCIDR, InternalIP) of every node that has a podCIDR."""
    got = json.loads(kubectl("get", "nodes", "-o", "json"))
    rows = []
    for n in got["items"]:
        cidr = n["spec"].get("podCIDR")
        ips = [a["address"] for a in n["status"].get("addresses", []) if a["type"] == "InternalIP"]
        if cidr and ips:
            rows.append((n["metadata"]["name"], cidr, ips[0]))
    return rows


def _cni_config(cidr: str) -> str:
    return json.dumps({"cniVersion": "0.4.0", "name": "shardlease", "plugins": [
        {"type": "ptp", "ipMasq": False, "mtu": 1500,
         "ipam": {"type": "host-local", "ranges": [[{"subnet": cidr}]],
                  "routes": [{"dst": "0.0.0.0/0"}]}},
        {"type": "portmap", "capabilities": {"portMappings": True}}]})


def network() -> None:
    """What kindnetd would do, once: each node's CNI for its podCIDR, and a
    route to every other node's pod range through that node. Again after a
    node's restart (its routes are gone)."""
    want = set(nodes())
    deadline = time.monotonic() + 180
    while True:
        table = _node_table()
        if {row[0] for row in table} >= want:
            break
        if time.monotonic() > deadline:
            raise KindError(f"nodes without a podCIDR after 180 s: {sorted(want)} vs {table}")
        time.sleep(1)
    for name, cidr, _ in table:
        podman("exec", "-i", name, "sh", "-c",
               "cat > /etc/cni/net.d/10-shardlease.conflist.tmp && "
               "mv /etc/cni/net.d/10-shardlease.conflist.tmp /etc/cni/net.d/10-shardlease.conflist",
               input=_cni_config(cidr).encode())
        for other, other_cidr, ip in table:
            if other != name:
                podman("exec", name, "ip", "route", "replace", other_cidr, "via", ip)
    # And from this machine: the tests ask the pods directly (as tests/pods
    # do on the real node), and a pod reaches a server of the tests on the
    # network's gateway, which answers through these.
    state = _load_host_state()
    routes = state.setdefault("routes", [])
    for _, cidr, ip in table:
        node._run(["ip", "route", "replace", cidr, "via", ip])
        if cidr not in routes:
            routes.append(cidr)
    _save_host_state(state)


def gateway() -> str:
    """This machine's address on the kind network: where pods reach a
    server the tests run here."""
    got = json.loads(podman("network", "inspect", "kind").stdout)
    for subnet in got[0].get("subnets", []):
        if ":" not in subnet.get("gateway", ":"):
            return str(subnet["gateway"])
    raise KindError(f"the kind network has no IPv4 gateway: {got}")


def _wait(what: str, check, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    last: Exception | None = None
    while time.monotonic() < deadline:
        try:
            if check():
                return
        except (KindError, subprocess.TimeoutExpired) as e:
            last = e
        time.sleep(1)
    raise KindError(f"{what}: not within {timeout:.0f}s" + (f" ({last})" if last else ""))


def _ready() -> bool:
    got = json.loads(kubectl("get", "nodes", "-o", "json"))
    ready = [n for n in got["items"]
             if any(c["type"] == "Ready" and c["status"] == "True"
                    for c in n["status"].get("conditions", []))]
    return len(ready) == WORKERS + 1


def _dns_ready() -> bool:
    got = json.loads(kubectl("-n", "kube-system", "get", "deploy", "coredns", "-o", "json"))
    return got.get("status", {}).get("readyReplicas", 0) >= 1


def healthy() -> bool:
    if not exists() or len(nodes()) != WORKERS + 1:
        return False
    listed = podman("ps", "--all", "--filter", f"label=io.x-k8s.kind.cluster={NAME}",
                    "--format", "json", check=False).stdout.decode()
    try:
        states = {c["Names"][0]: c["State"] for c in json.loads(listed or "[]")}
    except (ValueError, KeyError, IndexError):
        return False
    if sorted(states) != nodes() or set(states.values()) != {"running"}:
        return False
    try:
        return _ready() and _dns_ready()
    except (KindError, subprocess.TimeoutExpired):
        return False


def up() -> Path:
    """The cluster, made if missing or broken; its kubeconfig's path."""
    with cp._file_lock("kind.lock"):
        image = build_node_image()
        if healthy():
            return kubeconfig_path()
        if exists():
            _log(f"deleting the unhealthy cluster {NAME}")
            kind("delete", "cluster", "--name", NAME, check=False, timeout=300)
        t0 = time.monotonic()
        cfg = kind_dir() / "kind.yaml"
        cfg.write_text(kind_config())
        kind("create", "cluster", "--name", NAME, "--image", image, "--config", str(cfg),
             "--kubeconfig", str(kubeconfig_path()), timeout=900)
        created = time.monotonic() - t0
        network()
        _wait("every node Ready", _ready, 300)
        _wait("CoreDNS ready", _dns_ready, 300)
        _log(f"cluster {NAME} up in {time.monotonic() - t0:.1f}s "
             f"(kind create cluster {created:.1f}s)")
        return kubeconfig_path()


def down() -> bool:
    """Delete the cluster and undo the host's changes."""
    with cp._file_lock("kind.lock"):
        ran = exists()
        if ran:
            kind("delete", "cluster", "--name", NAME, timeout=300)
        podman("network", "rm", "-f", "kind", check=False)
        restore_host()
        return ran


USAGE = """usage: e2e/kind-cluster COMMAND
  build    the node image (podman) and the images kind.sh loads (docker), all cached
  up       a kind cluster of one control plane and two workers on that image
           (made if missing); prints the environment kind and kind.sh need
  down     delete the cluster and undo the host changes
  status   whether it runs, and its nodes
cache: $SHARDLEASE_CACHE (default ~/.cache/shardlease)"""


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if len(argv) != 1 or argv[0] not in ("build", "up", "down", "status"):
        print(USAGE, file=sys.stderr if argv[:1] not in (["-h"], ["--help"]) else sys.stdout)
        return 0 if argv[:1] in (["-h"], ["--help"]) else 2
    cmd = argv[0]
    try:
        if cmd == "build":
            t0 = time.monotonic()
            print(build_node_image())
            workload_images()
            print(f"node image and workload images ready; {time.monotonic() - t0:.1f}s")
        elif cmd == "up":
            path = up()
            e = env()
            for key in ("KIND_EXPERIMENTAL_PROVIDER", "CONTAINERS_CONF"):
                print(f"export {key}={e[key]}")
            print(f"export KUBECONFIG={path}")
            print(f"export PATH={tool_dir()}:$PATH")
        elif cmd == "down":
            print("deleted and cleaned up" if down() else "not running")
        elif cmd == "status":
            ok = healthy()
            print(f"cluster {NAME}: {'healthy' if ok else 'not running or not healthy'}")
            for n in nodes():
                print(f"  {n}")
            return 0 if ok else 1
    except (KindError, node.ClusterError, cp.BuildError) as e:
        print(f"e2e/kind-cluster {cmd} failed: {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
