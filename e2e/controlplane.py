"""A real Kubernetes control plane (etcd + kube-apiserver) on loopback for tests.

envtest-style: no controller-manager, no scheduler, no kubelet. Binaries are
built from Go modules with the local Go toolchain into a cache keyed by
version:

    ${SHARDLEASE_CACHE:-$HOME/.cache/shardlease}/bin/<name>-<version>

Stdlib only. Used by the ``e2e/controlplane`` CLI and by ``tests/k8s/conftest.py``.
"""

from __future__ import annotations

import atexit
import base64
import contextlib
import ctypes
import fcntl
import hashlib
import json
import os
import shutil
import signal
import socket
import ssl
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

# ---------------------------------------------------------------------------
# Pinned versions.
# ---------------------------------------------------------------------------
# Newest stable release the module proxy serves that builds with our Go
# (k8s.io/kubernetes v1.37.x and v1.36.x both declare `go 1.26.0`).
K8S_VERSION = "v1.37.2"
# Newest etcd 3.6 release (declares `go 1.26.0`).
ETCD_VERSION = "v3.6.16"
# Newest Helm 3 release (declares `go 1.26.0`).
HELM_VERSION = "v3.22.0"
# MinIO tags its releases RELEASE.<date>, which are not semver, so Go only
# knows it by pseudo-version. This is the last commit (2026-02-12) on the
# default branch; it declares `go 1.24.0`.
MINIO_VERSION = "v0.0.0-20260212201848-7aac2a2c5b7c"

# Cluster DNS for the real node (e2e/cluster); declares `go 1.24`.
COREDNS_VERSION = "v1.15.0"
KIND_VERSION = "v0.33.0"
#: kind v0.33.0's base image carries crictl v1.36.0; the module served here
#: nearest it is v1.37.0 (its CRI API is the kubelet's, v1.37).
CRICTL_VERSION = "v1.37.0"
#: MinIO's client, for e2e/manifests/minio.yaml's bucket Job on kind (the
#: image kind.sh names cannot be pulled here). Like MinIO it has no semver
#: tags; this is the newest commit the Go proxy serves (it declares go 1.23.0).
MC_VERSION = "v0.0.0-20250313080218-cf909e1063a9"

K8S_MINOR = K8S_VERSION.lstrip("v").split(".")[1]

BINARIES = ("etcd", "kube-apiserver", "kubectl", "helm", "minio")
# What a real node adds (e2e/cluster); built only when asked for, so the
# envtest-style control plane costs no more than before.
NODE_BINARIES = ("kubelet", "kube-controller-manager", "kube-scheduler", "kube-proxy",
                 "coredns")
# What a kind cluster of our own needs beside those (issue 20, e2e/kind-plan.md):
# built only when asked for.
KIND_BINARIES = ("kubeadm", "kind", "crictl", "mc")
#: The linearizability checker of `shardlease verify` (docs/verify.md). Its
#: source is in this repository, not a published module, so its cache key is
#: a digest of that source: an edit builds a new binary beside the old one.
TOOL_BINARIES = ("porcupine-check",)
PORCUPINE_CHECK_SRC = Path(__file__).resolve().parent.parent / "tools" / "porcupine-check"
ALL_BINARIES = BINARIES + NODE_BINARIES + KIND_BINARIES + TOOL_BINARIES


def cache_dir() -> Path:
    env = os.environ.get("SHARDLEASE_CACHE")
    if env:
        return Path(env).expanduser().resolve()
    return Path.home() / ".cache" / "shardlease"


def bin_dir() -> Path:
    return cache_dir() / "bin"


def versions() -> dict[str, str]:
    return {
        "etcd": ETCD_VERSION,
        "kube-apiserver": K8S_VERSION,
        "kubectl": K8S_VERSION,
        "helm": HELM_VERSION,
        "minio": MINIO_VERSION,
        **{n: K8S_VERSION for n in NODE_BINARIES if n.startswith("kube")},
        "coredns": COREDNS_VERSION,
        "kubeadm": K8S_VERSION,
        "kind": KIND_VERSION,
        "crictl": CRICTL_VERSION,
        "mc": MC_VERSION,
        "porcupine-check": source_version(PORCUPINE_CHECK_SRC),
    }


def source_version(src: Path) -> str:
    """A digest of a Go module in this repository (go.mod, go.sum, *.go)."""
    h = hashlib.sha256()
    files = sorted(f for f in src.glob("*") if f.name in ("go.mod", "go.sum")
                   or f.suffix == ".go") if src.is_dir() else []
    if not files:
        # Without its source (a copy of e2e/ alone) nothing can be built;
        # the name still says so rather than matching a stale binary.
        return "nosource"
    for f in files:
        h.update(f.name.encode() + b"\0" + f.read_bytes() + b"\0")
    return "src-" + h.hexdigest()[:16]


def binary_path(name: str) -> Path:
    return bin_dir() / f"{name}-{versions()[name]}"


class BuildError(RuntimeError):
    pass


def _log(msg: str) -> None:
    # Build progress goes to stderr: `up` keeps stdout for the export line.
    print(f"[controlplane] {msg}", file=sys.stderr, flush=True)


def _go() -> str:
    go = shutil.which("go") or "/usr/local/go/bin/go"
    if not os.path.exists(go):
        raise BuildError("the `go` toolchain is not installed (need Go >= 1.26)")
    return go


def _go_env(extra: dict[str, str] | None = None) -> dict[str, str]:
    env = dict(os.environ)
    env["CGO_ENABLED"] = "0"
    # Never download another toolchain: build with the installed one or fail.
    env["GOTOOLCHAIN"] = "local"
    env["GOFLAGS"] = "-buildvcs=false"
    env.setdefault("GOPATH", str(Path.home() / "go"))
    if extra:
        env.update(extra)
    return env


def _run(cmd: list[str], cwd: Path | None = None, env: dict[str, str] | None = None,
         log: Path | None = None) -> None:
    """Run a build command, streaming its output to `log` (or a temp file);
    raise BuildError with the tail of that output on failure."""
    with contextlib.ExitStack() as stack:
        if log is not None:
            out = stack.enter_context(open(log, "a+"))
        else:
            out = stack.enter_context(tempfile.TemporaryFile("w+"))
        out.write(f"\n$ (cd {cwd}; {' '.join(cmd)})\n")
        out.flush()
        start = out.tell()
        proc = subprocess.run(cmd, cwd=cwd, env=env or _go_env(), stdout=out,
                              stderr=subprocess.STDOUT)
        out.seek(start)
        text = out.read()
        out.write(f"[exit {proc.returncode}]\n")
    if proc.returncode != 0:
        tail = "\n".join(text.splitlines()[-40:])
        raise BuildError(f"command failed ({proc.returncode}): {' '.join(cmd)}\n{tail}")


def _mod_download(mod: str) -> dict:
    """`go mod download -json mod@ver` outside any module; returns its JSON."""
    with tempfile.TemporaryDirectory() as d:
        out = subprocess.run([_go(), "mod", "download", "-json", mod], cwd=d,
                             env=_go_env({"GOFLAGS": "-mod=mod", "GO111MODULE": "on"}),
                             capture_output=True, text=True)
    try:
        info = json.loads(out.stdout)
    except json.JSONDecodeError:
        raise BuildError(f"go mod download {mod} failed:\n{out.stderr}") from None
    if info.get("Error") or out.returncode != 0:
        raise BuildError(f"go mod download {mod} failed: {info.get('Error') or out.stderr}")
    return info


def _local_replaces(gomod_text: str) -> list[str]:
    """Module paths that a go.mod replaces with a local directory (./ or ../)."""
    mods: list[str] = []
    in_block = False
    for raw in gomod_text.splitlines():
        line = raw.split("//", 1)[0].strip()
        if not line:
            continue
        if line.startswith("replace ("):
            in_block = True
            continue
        if in_block and line == ")":
            in_block = False
            continue
        if line.startswith("replace "):
            line = line[len("replace "):].strip()
        elif not in_block:
            continue
        if "=>" not in line:
            continue
        left, right = (s.strip() for s in line.split("=>", 1))
        target = right.split()[0]
        if target.startswith("./") or target.startswith("../"):
            mods.append(left.split()[0])
    return mods


def _wrapper_module(workdir: Path, name: str, require: str, version: str,
                    replaces: dict[str, str]) -> None:
    """Write a throwaway main module that requires `require@version` and
    pins `replaces` (module -> published version)."""
    workdir.mkdir(parents=True, exist_ok=True)
    lines = [f"module shardlease.invalid/build/{name}", "", "go 1.26.0", "",
             f"require {require} {version}", ""]
    if replaces:
        lines.append("replace (")
        for mod, ver in sorted(replaces.items()):
            lines.append(f"\t{mod} => {mod} {ver}")
        lines.append(")")
    (workdir / "go.mod").write_text("\n".join(lines) + "\n")
    (workdir / "go.sum").touch()


def _finish(tmp: Path, final: Path) -> None:
    if not tmp.exists():
        raise BuildError(f"build produced no binary at {tmp}")
    tmp.chmod(0o755)
    os.replace(tmp, final)


def _k8s_replaces() -> dict[str, str]:
    """Staging modules of k8s.io/kubernetes -> their published v0.Y.Z tag,
    read from the k8s.io/kubernetes go.mod itself."""
    info = _mod_download(f"k8s.io/kubernetes@{K8S_VERSION}")
    staging = _local_replaces(Path(info["GoMod"]).read_text())
    if not staging:
        raise BuildError("found no ./staging replaces in k8s.io/kubernetes go.mod")
    tag = "v0." + K8S_VERSION.lstrip("v").split(".", 1)[1]
    return {m: tag for m in staging}


def _k8s_ldflags() -> str:
    flags = ["-s", "-w"]
    for pkg in ("k8s.io/component-base/version", "k8s.io/client-go/pkg/version"):
        flags += [f"-X {pkg}.gitVersion={K8S_VERSION}", f"-X {pkg}.gitMajor=1",
                  f"-X {pkg}.gitMinor={K8S_MINOR}", f"-X {pkg}.gitTreeState=clean"]
    return " ".join(flags)


def _build_k8s(name: str, log: Path) -> None:
    pkg = f"k8s.io/kubernetes/cmd/{name}"
    work = cache_dir() / "build" / f"kubernetes-{K8S_VERSION}"
    # Regenerated on every build (cheap): `-mod=mod` re-adds requirements.
    _wrapper_module(work, "kubernetes", "k8s.io/kubernetes", K8S_VERSION, _k8s_replaces())
    final = binary_path(name)
    tmp = final.with_name(f".{final.name}.tmp{os.getpid()}")
    _run([_go(), "build", "-mod=mod", "-trimpath", "-ldflags", _k8s_ldflags(),
          "-o", str(tmp), pkg], cwd=work, log=log)
    _finish(tmp, final)


def _build_etcd(log: Path) -> None:
    work = cache_dir() / "build" / f"etcd-{ETCD_VERSION}"
    info = _mod_download(f"go.etcd.io/etcd/server/v3@{ETCD_VERSION}")
    local = _local_replaces(Path(info["GoMod"]).read_text())
    # The server's go.mod points its sibling modules (api, client, pkg) at
    # ../ directories and points forbidden ones at ./FORBIDDEN_DEPENDENCY;
    # pin the siblings to the same published tag, keep forbidden ones out.
    reps = {m: ETCD_VERSION for m in local if m.startswith("go.etcd.io/etcd/")
            and m.endswith("/v3") and m != "go.etcd.io/etcd/v3"}
    _wrapper_module(work, "etcd", "go.etcd.io/etcd/server/v3", ETCD_VERSION, reps)
    final = binary_path("etcd")
    tmp = final.with_name(f".{final.name}.tmp{os.getpid()}")
    _run([_go(), "build", "-mod=mod", "-trimpath", "-ldflags", "-s -w", "-o", str(tmp),
          "go.etcd.io/etcd/server/v3"], cwd=work, log=log)
    _finish(tmp, final)


def _go_install(name: str, pkg_at_version: str, ldflags: str, log: Path) -> None:
    final = binary_path(name)
    tmpdir = Path(tempfile.mkdtemp(prefix=f".{name}-", dir=bin_dir()))
    try:
        with tempfile.TemporaryDirectory() as cwd:
            _run([_go(), "install", "-trimpath", "-ldflags", ldflags, pkg_at_version],
                 cwd=Path(cwd), env=_go_env({"GOBIN": str(tmpdir)}), log=log)
        base = pkg_at_version.split("@")[0].rsplit("/", 1)[-1]
        _finish(tmpdir / base, final)
    finally:
        shutil.rmtree(tmpdir, ignore_errors=True)


def _build_porcupine_check(log: Path) -> None:
    final = binary_path("porcupine-check")
    if final.name.endswith("-nosource"):
        raise BuildError(f"no Go source for porcupine-check in {PORCUPINE_CHECK_SRC}")
    tmp = final.with_name(f".{final.name}.tmp{os.getpid()}")
    # -mod=readonly: the module's go.sum is in the repository, so the build
    # fetches exactly what it names and never rewrites the source tree.
    _run([_go(), "build", "-mod=readonly", "-trimpath", "-ldflags", "-s -w", "-o", str(tmp),
          "."], cwd=PORCUPINE_CHECK_SRC, log=log)
    _finish(tmp, final)


def _build_helm(log: Path) -> None:
    ld = ["-s", "-w", f"-X helm.sh/helm/v3/internal/version.version={HELM_VERSION}",
          "-X helm.sh/helm/v3/internal/version.gitTreeState=clean"]
    for pkg in ("helm.sh/helm/v3/pkg/chartutil", "helm.sh/helm/v3/pkg/lint/rules"):
        ld += [f"-X {pkg}.k8sVersionMajor=1", f"-X {pkg}.k8sVersionMinor={K8S_MINOR}"]
    _go_install("helm", f"helm.sh/helm/v3/cmd/helm@{HELM_VERSION}", " ".join(ld), log)


def _build_minio(log: Path) -> None:
    # Pseudo-version v0.0.0-YYYYMMDDhhmmss-commit -> MinIO's own stamps.
    _, stamp, commit = MINIO_VERSION.split("-")
    t = time.strptime(stamp, "%Y%m%d%H%M%S")
    version = time.strftime("%Y-%m-%dT%H:%M:%SZ", t)
    ld = ["-s", "-w", f"-X github.com/minio/minio/cmd.Version={version}",
          f"-X github.com/minio/minio/cmd.ReleaseTag=RELEASE.{version.replace(':', '-')}",
          f"-X github.com/minio/minio/cmd.CommitID={commit}",
          f"-X github.com/minio/minio/cmd.ShortCommitID={commit}",
          f"-X github.com/minio/minio/cmd.CopyrightYear={t.tm_year}"]
    _go_install("minio", f"github.com/minio/minio@{MINIO_VERSION}", " ".join(ld), log)


_BUILDERS = {
    "etcd": lambda log: _build_etcd(log),
    "kube-apiserver": lambda log: _build_k8s("kube-apiserver", log),
    "kubectl": lambda log: _build_k8s("kubectl", log),
    "helm": lambda log: _build_helm(log),
    "minio": lambda log: _build_minio(log),
    # Same wrapper module as kube-apiserver: most packages are shared, so
    # these reuse its compiled objects from the Go build cache.
    **{n: (lambda log, n=n: _build_k8s(n, log)) for n in NODE_BINARIES if n.startswith("kube")},
    "coredns": lambda log: _go_install("coredns", f"github.com/coredns/coredns@{COREDNS_VERSION}",
                                       "-s -w", log),
    "kubeadm": lambda log: _build_k8s("kubeadm", log),
    "kind": lambda log: _go_install("kind", f"sigs.k8s.io/kind@{KIND_VERSION}", "-s -w", log),
    "crictl": lambda log: _go_install(
        "crictl", f"sigs.k8s.io/cri-tools/cmd/crictl@{CRICTL_VERSION}",
        f"-s -w -X sigs.k8s.io/cri-tools/pkg/version.Version={CRICTL_VERSION}", log),
    "mc": lambda log: _go_install("mc", f"github.com/minio/mc@{MC_VERSION}", "-s -w", log),
    "porcupine-check": lambda log: _build_porcupine_check(log),
}


@contextlib.contextmanager
def _file_lock(name: str):
    """An exclusive lock on a file of the cache dir (builds; the CLI's up/down)."""
    cache_dir().mkdir(parents=True, exist_ok=True)
    with open(cache_dir() / name, "w") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def ensure_binaries(names: tuple[str, ...] | list[str] = BINARIES) -> dict[str, Path]:
    """Build whichever of `names` is missing from the cache; return their paths.

    Idempotent and safe to call from concurrent processes (file lock). Raises
    BuildError if a build fails; never returns a half-written binary.
    """
    names = list(names)
    for n in names:
        if n not in _BUILDERS:
            raise ValueError(f"unknown binary {n!r}; known: {', '.join(ALL_BINARIES)}")
    paths = {n: binary_path(n) for n in names}
    if all(p.exists() for p in paths.values()):
        return paths
    with _file_lock("build.lock"):
        bin_dir().mkdir(parents=True, exist_ok=True)
        log = cache_dir() / "build.log"
        total = time.monotonic()
        for n in names:
            if paths[n].exists():
                continue
            _log(f"building {paths[n].name} (log: {log}) ...")
            t0 = time.monotonic()
            try:
                _BUILDERS[n](log)
            except BuildError:
                _log(f"FAILED {paths[n].name} after {time.monotonic() - t0:.0f}s")
                raise
            _log(f"built {paths[n].name} in {time.monotonic() - t0:.0f}s")
        _log(f"build done in {time.monotonic() - total:.0f}s")
    return paths


# ---------------------------------------------------------------------------
# Control plane
# ---------------------------------------------------------------------------
def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _openssl(*args: str, cwd: Path) -> None:
    proc = subprocess.run(["openssl", *args], cwd=cwd, stdout=subprocess.PIPE,
                          stderr=subprocess.STDOUT, text=True)
    if proc.returncode != 0:
        raise RuntimeError(f"openssl {' '.join(args)} failed:\n{proc.stdout}")


def _make_pki(d: Path, address: str = "127.0.0.1", node: bool = False) -> None:
    """CA, apiserver serving cert (address, 127.0.0.1/localhost), admin client
    cert in system:masters, and the service-account signing key pair. For a
    node also a front-proxy CA and its client (what the controller manager
    and scheduler need to authenticate delegated requests)."""
    d.mkdir(parents=True, exist_ok=True)
    _openssl("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", "ca.key",
             "-out", "ca.crt", "-days", "3650", "-subj", "/CN=shardlease-test-ca", cwd=d)
    extra_ip = f"IP:{address}," if address != "127.0.0.1" else ""
    (d / "serving.ext").write_text(
        f"subjectAltName={extra_ip}IP:127.0.0.1,DNS:localhost,DNS:kubernetes,"
        "DNS:kubernetes.default,DNS:kubernetes.default.svc,"
        "DNS:kubernetes.default.svc.cluster.local,IP:10.0.0.1\n"
        "extendedKeyUsage=serverAuth\nkeyUsage=digitalSignature,keyEncipherment\n")
    (d / "client.ext").write_text(
        "extendedKeyUsage=clientAuth\nkeyUsage=digitalSignature,keyEncipherment\n")
    certs = [("apiserver", "/CN=kube-apiserver", "serving.ext", "ca"),
             ("admin", "/O=system:masters/CN=shardlease-admin", "client.ext", "ca")]
    if node:
        _openssl("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", "front-proxy-ca.key",
                 "-out", "front-proxy-ca.crt", "-days", "3650",
                 "-subj", "/CN=shardlease-front-proxy-ca", cwd=d)
        certs.append(("front-proxy-client", "/CN=front-proxy-client", "client.ext",
                      "front-proxy-ca"))
    for name, subj, ext, ca in certs:
        _openssl("req", "-newkey", "rsa:2048", "-nodes", "-keyout", f"{name}.key",
                 "-out", f"{name}.csr", "-subj", subj, cwd=d)
        _openssl("x509", "-req", "-in", f"{name}.csr", "-CA", f"{ca}.crt", "-CAkey", f"{ca}.key",
                 "-CAcreateserial", "-out", f"{name}.crt", "-days", "3650",
                 "-extfile", ext, cwd=d)
    _openssl("genrsa", "-out", "sa.key", "2048", cwd=d)
    _openssl("rsa", "-in", "sa.key", "-pubout", "-out", "sa.pub", cwd=d)
    for p in d.glob("*.key"):
        p.chmod(0o600)


def _pdeathsig() -> None:
    """preexec_fn: SIGTERM the child when the parent dies (Linux)."""
    with contextlib.suppress(Exception):
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    # a zombie counts as dead
    with contextlib.suppress(OSError):
        stat = Path(f"/proc/{pid}/stat").read_text()
        if stat.rsplit(")", 1)[1].split()[0] == "Z":
            return False
    return True


def _cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
    except OSError:
        return ""


def _terminate(pid: int, expect: str, timeout: float = 15.0) -> None:
    """SIGTERM pid (only if its command line contains `expect`), then SIGKILL."""
    if not _alive(pid):
        return
    cmdline = _cmdline(pid)
    for _ in range(20):
        # Read empty once, of a live `sleep` a test had just started and
        # whose pid file named it (a warm fresh-clone run at b5da602, rest
        # group under load): a process's command line is never empty, so an
        # empty read is looked at again rather than taken for another's.
        if cmdline or not _alive(pid):
            break
        time.sleep(0.05)
        cmdline = _cmdline(pid)
    if expect not in cmdline:
        # The pid may be another process's now; said, since a daemon left
        # running when its stop returned is otherwise a mystery.
        print(f"[controlplane] not stopping pid {pid}: its command line {cmdline!r} "
              f"does not name {expect}", file=sys.stderr, flush=True)
        return
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        with contextlib.suppress(ChildProcessError, OSError):
            os.waitpid(pid, os.WNOHANG)
        if not _alive(pid):
            return
        time.sleep(0.1)
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGKILL)
    with contextlib.suppress(ChildProcessError, OSError):
        os.waitpid(pid, 0)


@dataclass
class ControlPlane:
    """etcd + kube-apiserver on 127.0.0.1 with an admin kubeconfig.

    state_dir: where data, certs, logs and the kubeconfig live; a fresh temp
    dir if None. die_with_parent: the processes get SIGTERM when the creating
    process exits (what test fixtures want; the CLI turns it off).

    node: start the API server for a real node (e2e/cluster) rather than
    envtest style: it binds and advertises `address` (pods cannot reach
    127.0.0.1 behind the Service DNAT), keeps the ServiceAccount admission
    plugin and the endpoint reconciler on (so pods get tokens and the
    `kubernetes` Service has endpoints), routes webhook calls to endpoint
    IPs, and trusts a front-proxy CA.
    """

    state_dir: Path | None = None
    die_with_parent: bool = True
    start_timeout: float = 120.0
    etcd_port: int = 0
    etcd_peer_port: int = 0
    apiserver_port: int = 0
    etcd_pid: int | None = None
    apiserver_pid: int | None = None
    node: bool = False
    address: str = "127.0.0.1"
    _procs: list = field(default_factory=list, repr=False)
    _owns_dir: bool = field(default=False, repr=False)

    # -- paths ------------------------------------------------------------
    @property
    def kubeconfig(self) -> Path:
        return self.dir / "kubeconfig"

    @property
    def server(self) -> str:
        return f"https://{self.address}:{self.apiserver_port}"

    @property
    def etcd_url(self) -> str:
        return f"http://127.0.0.1:{self.etcd_port}"

    @property
    def dir(self) -> Path:
        assert self.state_dir is not None
        return Path(self.state_dir)

    @property
    def pki(self) -> Path:
        return self.dir / "pki"

    @property
    def state_file(self) -> Path:
        return self.dir / "state.json"

    # -- lifecycle --------------------------------------------------------
    def start(self) -> ControlPlane:
        bins = ensure_binaries(("etcd", "kube-apiserver"))
        if self.state_dir is None:
            self.state_dir = Path(tempfile.mkdtemp(prefix="shardlease-cp-"))
            self._owns_dir = True
        self.dir.mkdir(parents=True, exist_ok=True)
        if not (self.pki / "admin.crt").exists():
            _make_pki(self.pki, self.address, self.node)
        if self.die_with_parent:
            atexit.register(self._kill_procs)
        last: Exception | None = None
        # Ports are picked free then bound by the child: retry on a lost race.
        for _attempt in range(3):
            try:
                self._start_etcd(bins["etcd"])
                self._start_apiserver(bins["kube-apiserver"])
                self._write_kubeconfig()
                self._write_state()
                return self
            except Exception as e:
                last = e
                self._kill_procs()
                if "address already in use" not in str(e):
                    break
        raise RuntimeError(f"control plane failed to start: {last}") from last

    def _popen(self, argv: list[str], logname: str) -> subprocess.Popen:
        # PR_SET_PDEATHSIG fires when the *thread* that forked exits, so only
        # use it from the main thread; atexit (in start) covers the rest.
        pdeath = self.die_with_parent and threading.current_thread() is threading.main_thread()
        logf = open(self.dir / logname, "ab")
        try:
            p = subprocess.Popen(
                argv, stdin=subprocess.DEVNULL, stdout=logf, stderr=subprocess.STDOUT,
                cwd=self.dir, start_new_session=True,
                preexec_fn=_pdeathsig if pdeath else None)
        finally:
            logf.close()
        self._procs.append(p)
        return p

    def _log_tail(self, logname: str, n: int = 30) -> str:
        with contextlib.suppress(OSError):
            return "\n".join((self.dir / logname).read_text(errors="replace").splitlines()[-n:])
        return ""

    def _start_etcd(self, etcd: Path) -> None:
        self.etcd_port, self.etcd_peer_port = free_port(), free_port()
        data = self.dir / "etcd-data"
        shutil.rmtree(data, ignore_errors=True)
        peer = f"http://127.0.0.1:{self.etcd_peer_port}"
        p = self._popen([
            str(etcd), "--name=default", f"--data-dir={data}",
            f"--listen-client-urls={self.etcd_url}", f"--advertise-client-urls={self.etcd_url}",
            f"--listen-peer-urls={peer}", f"--initial-advertise-peer-urls={peer}",
            f"--initial-cluster=default={peer}", "--initial-cluster-state=new",
            "--unsafe-no-fsync=true", "--log-level=warn",
        ], "etcd.log")
        self.etcd_pid = p.pid
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            if p.poll() is not None:
                raise RuntimeError(
                    f"etcd exited with {p.returncode}:\n{self._log_tail('etcd.log')}")
            try:
                with urllib.request.urlopen(f"{self.etcd_url}/health", timeout=2) as r:
                    if json.loads(r.read()).get("health") == "true":
                        return
            except (OSError, ValueError):
                pass
            time.sleep(0.2)
        raise RuntimeError(f"etcd not healthy after 30s:\n{self._log_tail('etcd.log')}")

    def _start_apiserver(self, apiserver: Path, port: int = 0) -> None:
        self.apiserver_port = port or free_port()
        pki = self.pki
        certdir = self.dir / "apiserver-certs"
        certdir.mkdir(exist_ok=True)
        p = self._popen([
            str(apiserver),
            f"--etcd-servers={self.etcd_url}",
            f"--bind-address={self.address}",
            f"--advertise-address={self.address}",
            f"--secure-port={self.apiserver_port}",
            f"--cert-dir={certdir}",
            f"--tls-cert-file={pki / 'apiserver.crt'}",
            f"--tls-private-key-file={pki / 'apiserver.key'}",
            f"--client-ca-file={pki / 'ca.crt'}",
            "--authorization-mode=Node,RBAC",
            f"--service-account-issuer={self.server}",
            f"--service-account-key-file={pki / 'sa.pub'}",
            f"--service-account-signing-key-file={pki / 'sa.key'}",
            "--service-cluster-ip-range=10.0.0.0/24",
            "--allow-privileged=true",
            *(self._node_args() if self.node else
              ["--disable-admission-plugins=ServiceAccount", "--endpoint-reconciler-type=none"]),
        ], "kube-apiserver.log")
        self.apiserver_pid = p.pid
        ctx = self.ssl_context()
        deadline = time.monotonic() + self.start_timeout
        last = ""
        while time.monotonic() < deadline:
            if p.poll() is not None:
                raise RuntimeError(f"kube-apiserver exited with {p.returncode}:\n"
                                   f"{self._log_tail('kube-apiserver.log')}")
            try:
                with urllib.request.urlopen(f"{self.server}/readyz", timeout=3, context=ctx) as r:
                    if r.status == 200:
                        return
            except urllib.error.HTTPError as e:
                last = f"HTTP {e.code}"
            except (OSError, ValueError) as e:
                last = str(e)
            time.sleep(0.25)
        raise RuntimeError(f"kube-apiserver not ready after {self.start_timeout:.0f}s ({last}):\n"
                           f"{self._log_tail('kube-apiserver.log')}")

    def restart_apiserver(self, while_stopped: Callable[[], object] | None = None) -> None:
        """Stop the API server and start it again on the same port, with the
        same etcd (clients keep their kubeconfig; their connections break and
        the new server's watch cache starts from etcd's current revision);
        `while_stopped` runs in between."""
        if self.apiserver_pid:
            _terminate(self.apiserver_pid, "kube-apiserver")
        if while_stopped is not None:
            while_stopped()
        self._start_apiserver(binary_path("kube-apiserver"), self.apiserver_port)
        self._write_state()

    def _node_args(self) -> list[str]:
        pki = self.pki
        return [
            # Webhook Services are called at their endpoint IPs: the API
            # server runs on the host, outside the Service network.
            "--enable-aggregator-routing=true",
            # The node's name is not in any DNS; exec/logs/port-forward dial its IP.
            "--kubelet-preferred-address-types=InternalIP,Hostname",
            f"--kubelet-client-certificate={pki / 'admin.crt'}",
            f"--kubelet-client-key={pki / 'admin.key'}",
            f"--requestheader-client-ca-file={pki / 'front-proxy-ca.crt'}",
            "--requestheader-allowed-names=front-proxy-client",
            "--requestheader-username-headers=X-Remote-User",
            "--requestheader-group-headers=X-Remote-Group",
            "--requestheader-extra-headers-prefix=X-Remote-Extra-",
            f"--proxy-client-cert-file={pki / 'front-proxy-client.crt'}",
            f"--proxy-client-key-file={pki / 'front-proxy-client.key'}",
        ]

    def ssl_context(self) -> ssl.SSLContext:
        ctx = ssl.create_default_context(cafile=str(self.pki / "ca.crt"))
        ctx.load_cert_chain(str(self.pki / "admin.crt"), str(self.pki / "admin.key"))
        return ctx

    def _write_kubeconfig(self) -> None:
        def b64(name: str) -> str:
            return base64.b64encode((self.pki / name).read_bytes()).decode()

        cfg = {
            "apiVersion": "v1", "kind": "Config", "preferences": {},
            "clusters": [{"name": "shardlease", "cluster": {
                "server": self.server, "certificate-authority-data": b64("ca.crt")}}],
            "users": [{"name": "admin", "user": {
                "client-certificate-data": b64("admin.crt"),
                "client-key-data": b64("admin.key")}}],
            "contexts": [{"name": "shardlease", "context": {
                "cluster": "shardlease", "user": "admin", "namespace": "default"}}],
            "current-context": "shardlease",
        }
        # JSON is valid YAML, so every kubeconfig reader accepts it.
        tmp = self.kubeconfig.with_suffix(".tmp")
        tmp.write_text(json.dumps(cfg, indent=2) + "\n")
        tmp.chmod(0o600)
        os.replace(tmp, self.kubeconfig)

    def _write_state(self) -> None:
        state = {
            "etcd": {"pid": self.etcd_pid, "port": self.etcd_port,
                     "peer_port": self.etcd_peer_port, "url": self.etcd_url,
                     "binary": str(binary_path("etcd"))},
            "kube-apiserver": {"pid": self.apiserver_pid, "port": self.apiserver_port,
                               "url": self.server, "binary": str(binary_path("kube-apiserver")),
                               "version": K8S_VERSION},
            "kubeconfig": str(self.kubeconfig),
            "state_dir": str(self.dir),
            "node": self.node,
            "address": self.address,
        }
        self.state_file.write_text(json.dumps(state, indent=2) + "\n")

    @classmethod
    def load(cls, state_dir: Path) -> ControlPlane | None:
        """Re-attach to a control plane started by another process (the CLI)."""
        sf = Path(state_dir) / "state.json"
        if not sf.exists():
            return None
        s = json.loads(sf.read_text())
        return cls(state_dir=Path(state_dir), die_with_parent=False,
                   etcd_port=s["etcd"]["port"], etcd_peer_port=s["etcd"]["peer_port"],
                   apiserver_port=s["kube-apiserver"]["port"],
                   etcd_pid=s["etcd"]["pid"], apiserver_pid=s["kube-apiserver"]["pid"],
                   node=s.get("node", False), address=s.get("address", "127.0.0.1"))

    def running(self) -> dict[str, bool]:
        return {
            "etcd": bool(self.etcd_pid and _alive(self.etcd_pid)
                         and "etcd" in _cmdline(self.etcd_pid)),
            "kube-apiserver": bool(self.apiserver_pid and _alive(self.apiserver_pid)
                                   and "kube-apiserver" in _cmdline(self.apiserver_pid)),
        }

    def ready(self) -> bool:
        try:
            with urllib.request.urlopen(f"{self.server}/readyz", timeout=3,
                                        context=self.ssl_context()) as r:
                return r.status == 200
        except (OSError, ValueError):
            return False

    def _kill_procs(self) -> None:
        # apiserver first, so it does not spin on a vanished etcd.
        for pid, expect in ((self.apiserver_pid, "kube-apiserver"), (self.etcd_pid, "etcd")):
            if pid:
                _terminate(pid, expect)
        for p in self._procs:
            with contextlib.suppress(Exception):
                p.wait(timeout=1)
        self._procs.clear()

    def stop(self, remove: bool = True) -> None:
        """Stop both processes and (by default) delete all their data."""
        self._kill_procs()
        self.etcd_pid = self.apiserver_pid = None
        if remove and self.state_dir is not None:
            shutil.rmtree(self.dir, ignore_errors=True)

    def __enter__(self) -> ControlPlane:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()


# ---------------------------------------------------------------------------
# CLI (e2e/controlplane)
# ---------------------------------------------------------------------------
def default_state_dir() -> Path:
    return cache_dir() / "controlplane"


def _cmd_build(args: list[str]) -> int:
    names = args or list(BINARIES)
    t0 = time.monotonic()
    missing = [n for n in names if not binary_path(n).exists()]
    try:
        paths = ensure_binaries(names)
    except (BuildError, ValueError) as e:
        print(f"build failed: {e}", file=sys.stderr)
        return 1
    for n, p in paths.items():
        print(f"{n:15} {versions()[n]:40} {p}")
    what = f"built {', '.join(missing)}" if missing else "all cached"
    print(f"{what}; {time.monotonic() - t0:.1f}s")
    return 0


def _cmd_up(args: list[str]) -> int:
    with _file_lock("controlplane.lock"):
        return _up()


def _up() -> int:
    sd = default_state_dir()
    cp = ControlPlane.load(sd)
    if cp is not None and all(cp.running().values()) and cp.ready():
        print(f"export KUBECONFIG={cp.kubeconfig}")
        return 0
    if cp is not None:  # stale or half-dead: clean it up first
        cp.stop()
    try:
        cp = ControlPlane(state_dir=sd, die_with_parent=False).start()
    except BuildError as e:
        print(f"build failed: {e}", file=sys.stderr)
        return 1
    except RuntimeError as e:
        print(str(e), file=sys.stderr)
        return 1
    print(f"export KUBECONFIG={cp.kubeconfig}")
    return 0


def _cmd_down(args: list[str]) -> int:
    with _file_lock("controlplane.lock"):
        return _down()


def _down() -> int:
    sd = default_state_dir()
    cp = ControlPlane.load(sd)
    if cp is None:
        shutil.rmtree(sd, ignore_errors=True)
        print("not running")
        return 0
    cp.stop()
    print(f"stopped; removed {sd}")
    return 0


def _cmd_status(args: list[str]) -> int:
    cp = ControlPlane.load(default_state_dir())
    if cp is None:
        print("not running")
        for n in ALL_BINARIES:
            state = "(cached)" if binary_path(n).exists() else "(missing)"
            print(f"binary {n}: {binary_path(n)} {state}")
        return 1
    run = cp.running()
    print(f"etcd           pid={cp.etcd_pid} {'running' if run['etcd'] else 'DEAD'} {cp.etcd_url}")
    print(f"kube-apiserver pid={cp.apiserver_pid} "
          f"{'running' if run['kube-apiserver'] else 'DEAD'} {cp.server} "
          f"{'ready' if run['kube-apiserver'] and cp.ready() else 'not ready'} ({K8S_VERSION})")
    print(f"kubeconfig     {cp.kubeconfig}")
    print(f"state dir      {cp.dir}")
    return 0 if all(run.values()) else 1


USAGE = """usage: e2e/controlplane COMMAND
  build [NAME...]  build missing binaries into the cache (default: the first five of
                   {names})
  up               build what is missing, start etcd + kube-apiserver on 127.0.0.1,
                   print `export KUBECONFIG=...`
  down             stop them and remove their data
  status           show pids, ports, kubeconfig
  path NAME        print the cached binary path of NAME (building it if missing)
cache: $SHARDLEASE_CACHE (default ~/.cache/shardlease)"""


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in ("-h", "--help", "help"):
        print(USAGE.format(names=", ".join(ALL_BINARIES)))
        return 0 if argv else 2
    cmd, rest = argv[0], argv[1:]
    if cmd == "path":
        if len(rest) != 1:
            print("usage: e2e/controlplane path NAME", file=sys.stderr)
            return 2
        try:
            print(ensure_binaries([rest[0]])[rest[0]])
        except (BuildError, ValueError) as e:
            print(f"build failed: {e}", file=sys.stderr)
            return 1
        return 0
    handlers = {"build": _cmd_build, "up": _cmd_up, "down": _cmd_down, "status": _cmd_status}
    if cmd not in handlers:
        print(USAGE.format(names=", ".join(ALL_BINARIES)), file=sys.stderr)
        return 2
    return handlers[cmd](rest)


if __name__ == "__main__":
    try:
        sys.exit(main())
    except BrokenPipeError:  # e.g. `e2e/controlplane status | head -1`
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        sys.exit(0)
