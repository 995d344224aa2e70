"""Fixtures for the Helm chart tests: a real helm (and kubectl) binary from
the control plane cache, and the session control plane of ``tests/k8s``.

Nothing here is skipped: a binary that cannot be built fails the tests.
"""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:  # so that `tests.k8s.conftest` imports however pytest was started
    sys.path.insert(0, str(ROOT))

# The control plane fixtures come from tests/conftest.py (one per session).
from tests.k8s.fixtures import cpmod  # noqa: E402

CHART = ROOT / "charts" / "shardlease"


def _binary(name: str) -> str:
    try:
        return str(cpmod.ensure_binaries((name,))[name])
    except cpmod.BuildError as e:
        pytest.fail(f"cannot build {name} (e2e/controlplane build {name}):\n{e}", pytrace=False)


class Helm:
    """The real helm binary, with its own config/cache/data directories so that
    nothing from the user's helm setup leaks in."""

    def __init__(self, path: str, home: Path) -> None:
        self.path = path
        self.env = {
            "PATH": "/usr/bin:/bin",
            "HOME": str(home),
            "HELM_CONFIG_HOME": str(home / "config"),
            "HELM_CACHE_HOME": str(home / "cache"),
            "HELM_DATA_HOME": str(home / "data"),
        }

    def run(self, *args: str, kubeconfig: str | None = None, check: bool = True,
            timeout: float = 120) -> subprocess.CompletedProcess[str]:
        env = dict(self.env)
        if kubeconfig:
            env["KUBECONFIG"] = kubeconfig
        proc = subprocess.run([self.path, *args], env=env, capture_output=True, text=True,
                              timeout=timeout)
        if check and proc.returncode != 0:
            pytest.fail(f"helm {' '.join(args)} failed ({proc.returncode}):\n"
                        f"{proc.stdout}\n{proc.stderr}", pytrace=False)
        return proc

    def template(self, *args: str, namespace: str = "shardlease-system",
                 release: str = "shardlease") -> list[dict]:
        """Render the chart (client side only) and return its documents."""
        out = self.run("template", release, str(CHART), "--namespace", namespace, *args).stdout
        return [d for d in yaml.safe_load_all(out) if d]


@pytest.fixture(scope="session")
def helm(tmp_path_factory: pytest.TempPathFactory) -> Helm:
    return Helm(_binary("helm"), tmp_path_factory.mktemp("helm-home"))


class Kubectl:
    def __init__(self, path: str, kubeconfig: str) -> None:
        self.path = path
        self.kubeconfig = kubeconfig

    def run(self, *args: str, check: bool = True, input: str | None = None,
            timeout: float = 60) -> subprocess.CompletedProcess[str]:
        proc = subprocess.run([self.path, "--kubeconfig", self.kubeconfig, *args],
                              capture_output=True, text=True, input=input, timeout=timeout)
        if check and proc.returncode != 0:
            pytest.fail(f"kubectl {' '.join(args)} failed ({proc.returncode}):\n"
                        f"{proc.stdout}\n{proc.stderr}", pytrace=False)
        return proc


@pytest.fixture(scope="session")
def kubectl(kubeconfig: str) -> Iterator[Kubectl]:
    yield Kubectl(_binary("kubectl"), kubeconfig)
