"""What the real pods of the tests need, built on this machine: the host's
packages, the binaries kind's node image packs (from controlplane.py), the
debootstrap base images, the pause image, and the project's images
(shardlease:dev, shardlease:runtime, and the runtime image's report), with a
Docker engine started for the build when none answers. All cached under
${SHARDLEASE_CACHE:-~/.cache/shardlease}. See e2e/README.md.

The cluster those pods run on is e2e/kindcluster.py's (`e2e/kind-cluster`),
which imports this file for these helpers. Stdlib only. Used by the
``e2e/cluster`` CLI, by e2e/kindcluster.py and by the tests.
"""

from __future__ import annotations

import contextlib
import hashlib
import io
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tarfile
import tempfile
import time
import uuid
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import controlplane as cp  # a sibling file, not a package

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
# What `image: shardlease:dev` in a pod spec resolves to (the image a pod
# runs, as its status reports it).
IMAGE_REF = "docker.io/library/shardlease:dev"

# program -> Debian package that provides it: what `build` installs on the
# host when missing. gcc and libc6-dev make the pause image, openssl the
# control plane's certificates; the rest are the packages the host-run node
# needed, still installed as before.
HOST_PACKAGES = {
    "containerd": "containerd", "runc": "runc", "ctr": "containerd",
    "iptables": "iptables", "conntrack": "conntrack", "ip": "iproute2",
    "openssl": "openssl", "gcc": "gcc", "socat": "socat",
    "/usr/lib/cni/bridge": "containernetworking-plugins",
    "/usr/lib/x86_64-linux-gnu/libc.a": "libc6-dev",
}
IMAGE_PACKAGES = {"dockerd": "docker.io", "/usr/bin/docker": "docker.io",
                  "debootstrap": "debootstrap"}


class ClusterError(RuntimeError):
    pass


def _log(msg: str) -> None:
    # stdout is kept for what a command prints (`image`: the image ID).
    print(f"[cluster] {msg}", file=sys.stderr, flush=True)


def images_dir() -> Path:
    return cp.cache_dir() / "images"


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


# Sysctls: e2e/kindcluster.py sets the ones its nodes need through these.
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


def _wait(what: str, check, timeout: float, proc: subprocess.Popen | None = None,
          interval: float = 0.25):
    deadline = time.monotonic() + timeout
    last: object = None
    while time.monotonic() < deadline:
        if proc is not None and proc.poll() is not None:
            raise ClusterError(f"{what} exited with {proc.returncode}")
        try:
            last = check()
            if last:
                return last
        except Exception as e:  # retried until the deadline
            last = e
        time.sleep(interval)
    raise ClusterError(f"timed out after {timeout:.0f}s waiting for {what} ({last})")


def _rm(p: Path) -> None:
    if p.is_dir() and not p.is_symlink():
        shutil.rmtree(p, ignore_errors=True)
    else:
        with contextlib.suppress(FileNotFoundError):
            p.unlink()


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


def build() -> None:
    """Everything the images and kind's node image need that can be made
    ahead: host packages, the binaries (cached Go builds: etcd,
    kube-apiserver, kubectl, kubelet, kube-controller-manager,
    kube-scheduler, kube-proxy, CoreDNS) and the pause image."""
    ensure_packages(HOST_PACKAGES)
    cp.ensure_binaries(("etcd", "kube-apiserver", "kubectl", *cp.NODE_BINARIES))
    pause_archive()


# ---------------------------------------------------------------------------
# Docker, the base images and the project's images
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
def shared_daemon(name: str, running: Callable[[], bool], start: Callable[[], int],
                  stop: Callable[[int], None]):
    """A daemon for the duration, shared by every process of this machine
    that asks for it: the running one, or one started here, stopped by the
    last user to leave (never one started by somebody else).

    Why not "whoever started it stops it": the suite's two pytest processes
    each ask for the Docker engine, and the first to finish stopped it under
    the other (a kind.sh test failed with "Cannot connect to the Docker
    daemon"). Each user leaves a file named after its pid in `<name>.users/`,
    so a user that died without leaving is not waited for."""
    users = cp.cache_dir() / f"{name}.users"
    pidfile = cp.cache_dir() / f"{name}.pid"
    me = users / f"{os.getpid()}-{uuid.uuid4().hex[:8]}"

    def ours() -> int | None:
        with contextlib.suppress(ValueError, OSError):
            pid = int(pidfile.read_text())
            if cp._alive(pid):
                return pid
        return None

    with cp._file_lock(f"{name}.lock"):
        if running() and ours() is None:
            owned = False  # somebody else's: used, never stopped
        else:
            owned = True
            if not running():
                pidfile.write_text(f"{start()}\n")
            users.mkdir(parents=True, exist_ok=True)
            me.touch()
    try:
        yield
    finally:
        if owned:
            with cp._file_lock(f"{name}.lock"):
                me.unlink(missing_ok=True)
                left = [u for u in users.iterdir()
                        if cp._alive(int(u.name.split("-", 1)[0]))]
                for u in set(users.iterdir()) - set(left):
                    u.unlink(missing_ok=True)  # a user that died without leaving
                pid = ours()
                if not left and pid is not None:
                    stop(pid)
                    pidfile.unlink(missing_ok=True)


def _start_dockerd() -> int:
    _log("starting dockerd")
    logs = cp.cache_dir() / "dockerd.log"
    with open(logs, "ab") as logf:
        p = subprocess.Popen(["dockerd", "--iptables=false", "--ip-forward=false",
                              "--bridge=none", "--ip-masq=false"],
                             stdin=subprocess.DEVNULL, stdout=logf, stderr=subprocess.STDOUT,
                             start_new_session=True)
    try:
        _wait("dockerd", lambda: _docker("info", check=False, timeout=10).returncode == 0,
              90, p)
    except BaseException:
        cp._terminate(p.pid, "dockerd", timeout=30)
        raise
    return p.pid


def _stop_dockerd(pid: int) -> None:
    cp._terminate(pid, "dockerd", timeout=30)


@contextlib.contextmanager
def docker_engine():
    """A Docker engine for the duration: the running one, or a dockerd
    started here and stopped when its last user (of any process) is done.
    It is started without iptables rules, bridge or ip_forward change:
    builds use the host network."""
    ensure_packages(IMAGE_PACKAGES)
    with shared_daemon("dockerd",
                       lambda: _docker("info", check=False, timeout=30).returncode == 0,
                       _start_dockerd, _stop_dockerd):
        yield


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


def image() -> str:
    """Build shardlease:dev and shardlease:runtime from the Dockerfile on
    the local base images, and write the runtime image's report. Returns
    shardlease:dev's image ID. Putting it on a cluster is the caller's
    business (`kind load docker-image`: tests/support/kind.py)."""
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
    return image_id


# ---------------------------------------------------------------------------
# CLI
# ---------------------------------------------------------------------------
USAGE = """usage: e2e/cluster COMMAND
  build    install missing host packages, build the binaries kind's node image packs, the
           pause image, the base images, shardlease:dev and shardlease:runtime (all cached)
  image    (re)build shardlease:dev and shardlease:runtime; prints shardlease:dev's image ID
a cluster to run them on: e2e/kind-cluster up|down|status
cache: $SHARDLEASE_CACHE (default ~/.cache/shardlease)"""

#: The commands of the single node this file used to run on the host.
REMOVED = ("up", "down", "status")


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if len(argv) == 1 and argv[0] in REMOVED:
        print(f"e2e/cluster {argv[0]}: removed (the single node is gone); use "
              f"e2e/kind-cluster {argv[0]}", file=sys.stderr)
        return 2
    if len(argv) != 1 or argv[0] not in ("build", "image"):
        print(USAGE, file=sys.stderr if argv[:1] not in (["-h"], ["--help"]) else sys.stdout)
        return 0 if argv[:1] in (["-h"], ["--help"]) else 2
    cmd = argv[0]
    try:
        if cmd == "build":
            t0 = time.monotonic()
            build()
            image()
            print(f"node binaries and images ready; {time.monotonic() - t0:.1f}s")
        elif cmd == "image":
            print(image())
    except (ClusterError, cp.BuildError, RuntimeError) as e:
        print(f"e2e/cluster {cmd} failed: {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    signal.signal(signal.SIGPIPE, signal.SIG_DFL)
    sys.exit(main())
