"""The chart, rendered by the real helm: lint, defaults, cert-manager mode,
the values schema, the webhook certificate, RBAC and security contexts."""

from __future__ import annotations

import base64
import json
import subprocess
from pathlib import Path

import pytest
import yaml

from .conftest import CHART, ROOT
from .contract import AGENT_ROLE, AGENT_RULES, OPERATOR_ROLE, OPERATOR_RULES, expand, normalize

RESTRICTED_CONTAINER = {
    "runAsNonRoot": True,
    "runAsUser": 65532,
    "readOnlyRootFilesystem": True,
    "allowPrivilegeEscalation": False,
    "capabilities": {"drop": ["ALL"]},
    "seccompProfile": {"type": "RuntimeDefault"},
}


def by_kind(docs: list[dict], kind: str) -> list[dict]:
    return [d for d in docs if d["kind"] == kind]


def one(docs: list[dict], kind: str, name: str | None = None) -> dict:
    found = [d for d in by_kind(docs, kind) if name is None or d["metadata"]["name"] == name]
    assert len(found) == 1, f"expected one {kind} {name or ''}, got {len(found)}"
    return found[0]


def env_of(container: dict) -> dict:
    return {e["name"]: e.get("value", e.get("valueFrom")) for e in container.get("env", [])}


# -- the CRD ---------------------------------------------------------------------------------


def test_chart_crd_is_a_byte_for_byte_copy_of_the_source():
    source = ROOT / "crds" / "shardlease.io_shardsets.yaml"
    copy = CHART / "crds" / "shardlease.io_shardsets.yaml"
    assert copy.read_bytes() == source.read_bytes(), (
        f"{copy} differs from {source}: cp {source} {copy}")
    assert sorted(p.name for p in (CHART / "crds").iterdir()) == [source.name]


def test_chart_metadata():
    chart = yaml.safe_load((CHART / "Chart.yaml").read_text())
    assert chart["apiVersion"] == "v2"
    assert chart["name"] == "shardlease"
    assert chart["appVersion"] == "0.1.0"
    assert chart["kubeVersion"] == ">=1.29.0-0"


# -- lint ------------------------------------------------------------------------------------


@pytest.mark.parametrize("args", [
    [],
    ["--strict"],
    ["--strict", "--set", "webhook.certManager.enabled=true"],
    ["--strict", "--set", "webhook.certManager.enabled=true",
     "--set", "webhook.certManager.issuerRef.name=ca", "--set",
     "webhook.certManager.issuerRef.kind=ClusterIssuer"],
    ["--strict", "--namespace", "ops", "--set", "image.digest=sha256:" + "a" * 64],
], ids=["default", "strict", "cert-manager", "cert-manager-issuer", "digest"])
def test_helm_lint_passes(helm, args):
    proc = helm.run("lint", str(CHART), *args)
    assert "1 chart(s) linted, 0 chart(s) failed" in proc.stdout, proc.stdout
    assert "[WARNING]" not in proc.stdout and "[ERROR]" not in proc.stdout, proc.stdout


# -- the values schema -----------------------------------------------------------------------


BAD_VALUES = [
    ("--set", "image.tag=5"),
    ("--set-json", "image.tag=5"),
    ("--set", "image.repository="),
    ("--set", "image.pullPolicy=Sometimes"),
    ("--set", "image.digest=latest"),
    ("--set", "replicas=-1"),
    ("--set", "replicas=11"),
    ("--set-string", "replicas=1"),
    ("--set", "webhook.failurePolicy=Maybe"),
    ("--set", "webhook.timeoutSeconds=60"),
    ("--set", "webhook.certManager.enabled=yes please"),
    ("--set", "webhook.certManager.issuerRef.kind=Secret"),
    ("--set", "webhook.certValidityDays=0"),
    ("--set", "webhook.excludeNamespaces[0]=Not_A_Namespace"),
    ("--set", "resources.requests.cpu=lots"),
    ("--set", "resources.limits.gpu=1"),
    ("--set", "serviceAccount.create=maybe"),
    ("--set", "operator.extraArgs[0]=1"),
    ("--set", "imageTag=0.2.0"),
    ("--set", "operator.logFormat=xml"),
    ("--set", "agent.logLevel=trace"),
]


@pytest.mark.parametrize(("flag", "value"), BAD_VALUES,
                         ids=[f"{flag[2:]}:{value}" for flag, value in BAD_VALUES])
def test_schema_rejects_a_bad_value(helm, flag, value):
    for command in ("template", "lint"):
        args = ["shardlease"] if command == "template" else []
        proc = helm.run(command, *args, str(CHART), flag, value, check=False)
        assert proc.returncode != 0, f"helm {command} {flag} {value} was accepted"
        out = proc.stdout + proc.stderr
        assert "values don't meet the specifications of the schema" in out, out


#: What a cluster with ValidatingAdmissionPolicy (Kubernetes >= 1.30) tells helm.
VAP = ("--api-versions", "admissionregistration.k8s.io/v1/ValidatingAdmissionPolicy")


def policies(docs: list[dict]) -> dict[tuple[str, str], dict]:
    return {(d["kind"], d["metadata"]["name"]): d for d in docs
            if d["kind"].startswith("ValidatingAdmissionPolicy")}


def test_isolation_can_be_turned_off_and_names_the_operators_account(helm):
    assert not policies(helm.template(*VAP, "--set", "isolation.enabled=false"))
    # A cluster without the API (Kubernetes 1.29) gets no policy, not a failed install.
    assert not policies(helm.template())
    on = policies(helm.template(*VAP, "--set", "serviceAccount.name=ops"))
    leases = on[("ValidatingAdmissionPolicy", "shardlease-isolation-leases")]
    conditions = {c["name"]: c["expression"] for c in leases["spec"]["matchConditions"]}
    assert "'system:serviceaccount:shardlease-system:ops'" in conditions["not-by-the-operator"]
    # A policy that cannot be evaluated fails open (it must not stop Lease
    # writes across the cluster).
    assert {p["spec"]["failurePolicy"] for k, p in on.items()
            if k[0] == "ValidatingAdmissionPolicy"} == {"Ignore"}


def test_isolation_spares_the_system_namespaces_and_follows_watched_ones(helm):
    on = policies(helm.template(*VAP, "--set", "webhook.excludeNamespaces={infra}",
                                "--set", "watchNamespaces={shop}"))
    for name in ("shardlease-isolation-leases", "shardlease-isolation-status",
                 "shardlease-isolation-events"):
        binding = on[("ValidatingAdmissionPolicyBinding", name)]
        exprs = binding["spec"]["matchResources"]["namespaceSelector"]["matchExpressions"]
        assert exprs == [
            {"key": "kubernetes.io/metadata.name", "operator": "NotIn",
             "values": ["kube-system", "shardlease-system", "infra"]},
            {"key": "kubernetes.io/metadata.name", "operator": "In", "values": ["shop"]}]


def test_only_strict_isolation_keeps_the_agents_accounts_off_other_leases(helm):
    def rules(*args: str) -> list[str]:
        leases = policies(helm.template(*VAP, *args))[
            ("ValidatingAdmissionPolicy", "shardlease-isolation-leases")]
        return [v["expression"] for v in leases["spec"]["validations"]]
    assert len(rules()) == 1  # the application may use Leases of its own
    strict = rules("--set", "isolation.strictLeases=true")
    assert len(strict) == 2 and "startsWith('shardlease.')" in strict[1]


def test_watched_namespaces_scope_the_operator_and_the_webhook(helm):
    default = helm.template()
    hook = one(default, "MutatingWebhookConfiguration", "shardlease")["webhooks"][0]
    assert [e["operator"] for e in hook["namespaceSelector"]["matchExpressions"]] == [
        "NotIn", "NotIn"]
    assert "StatefulSet" in hook["matchConditions"][0]["expression"]
    scoped = helm.template("--set", "watchNamespaces={shop,billing}")
    hook = one(scoped, "MutatingWebhookConfiguration", "shardlease")["webhooks"][0]
    assert {"key": "kubernetes.io/metadata.name", "operator": "In",
            "values": ["shop", "billing"]} in hook["namespaceSelector"]["matchExpressions"]
    args = one(scoped, "Deployment", "shardlease")["spec"]["template"]["spec"][
        "containers"][0]["args"]
    assert args[:4] == ["operator", "--leader-election", "--namespace=shop",
                        "--namespace=billing"]


def test_the_replicas_prefer_different_nodes_unless_told_otherwise(helm):
    spec = one(helm.template(), "Deployment", "shardlease")["spec"]["template"]["spec"]
    term = spec["affinity"]["podAntiAffinity"][
        "preferredDuringSchedulingIgnoredDuringExecution"][0]["podAffinityTerm"]
    assert term["topologyKey"] == "kubernetes.io/hostname"
    assert term["labelSelector"]["matchLabels"]["app.kubernetes.io/name"] == "shardlease"
    mine = helm.template("--set", "affinity.nodeAffinity.x=y")
    spec = one(mine, "Deployment", "shardlease")["spec"]["template"]["spec"]
    assert spec["affinity"] == {"nodeAffinity": {"x": "y"}}


def test_values_yaml_is_valid_json_schema_and_the_defaults_pass(helm):
    schema = json.loads((CHART / "values.schema.json").read_text())
    values = yaml.safe_load((CHART / "values.yaml").read_text())
    # Every top-level value is described by the schema, and nothing else is allowed.
    assert schema["additionalProperties"] is False
    assert set(values) <= set(schema["properties"])
    helm.template()  # renders: the defaults pass the schema


# -- defaults --------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def docs(helm) -> list[dict]:
    return helm.template(*VAP)


def test_default_render_has_exactly_the_expected_objects(docs):
    kinds = sorted((d["kind"], d["metadata"]["name"]) for d in docs)
    assert kinds == sorted([
        ("ClusterRole", AGENT_ROLE),
        ("ClusterRole", OPERATOR_ROLE),
        ("ClusterRoleBinding", OPERATOR_ROLE),
        ("ValidatingAdmissionPolicy", "shardlease-isolation-events"),
        ("ValidatingAdmissionPolicy", "shardlease-isolation-leases"),
        ("ValidatingAdmissionPolicy", "shardlease-isolation-status"),
        ("ValidatingAdmissionPolicyBinding", "shardlease-isolation-events"),
        ("ValidatingAdmissionPolicyBinding", "shardlease-isolation-leases"),
        ("ValidatingAdmissionPolicyBinding", "shardlease-isolation-status"),
        ("Deployment", "shardlease"),
        ("MutatingWebhookConfiguration", "shardlease"),
        ("PodDisruptionBudget", "shardlease"),
        ("Role", "shardlease-leader-election"),
        ("RoleBinding", "shardlease-leader-election"),
        ("Secret", "shardlease-webhook-tls"),
        ("Service", "shardlease"),
        ("ServiceAccount", "shardlease"),
    ])
    for d in docs:
        if d["kind"] not in ("ClusterRole", "ClusterRoleBinding", "MutatingWebhookConfiguration",
                             "ValidatingAdmissionPolicy", "ValidatingAdmissionPolicyBinding"):
            assert d["metadata"]["namespace"] == "shardlease-system", d["metadata"]
        assert d["metadata"]["labels"]["app.kubernetes.io/managed-by"] == "Helm"


def test_crd_is_installed_from_the_crds_directory(helm):
    out = helm.run("show", "crds", str(CHART)).stdout
    assert out.strip() == (ROOT / "crds" / "shardlease.io_shardsets.yaml").read_text().strip()


def test_operator_deployment(docs):
    dep = one(docs, "Deployment", "shardlease")
    assert dep["spec"]["replicas"] == 2
    pod = dep["spec"]["template"]
    assert dep["spec"]["selector"]["matchLabels"].items() <= pod["metadata"]["labels"].items()
    spec = pod["spec"]
    assert spec["serviceAccountName"] == "shardlease"
    (c,) = spec["containers"]
    assert c["image"] == "shardlease:0.1.0"
    assert c["imagePullPolicy"] == "IfNotPresent"
    assert "command" not in c, "the image's ENTRYPOINT (shardlease) must stay"
    assert c["args"] == ["operator", "--leader-election", "--log-format=text",
                         "--log-level=info"]
    env = env_of(c)
    assert env["SHARDLEASE_AGENT_IMAGE"] == c["image"]
    assert env["SHARDLEASE_WEBHOOK_CERT_DIR"] == "/certs"
    assert env["POD_NAMESPACE"] == {"fieldRef": {"fieldPath": "metadata.namespace"}}
    ports = {p["name"]: p["containerPort"] for p in c["ports"]}
    assert ports == {"webhook": 9443, "http": 8080}
    assert c["livenessProbe"]["httpGet"] == {"path": "/healthz", "port": "http"}
    # Ready means: the StatefulSet cache is warm and the webhook serves.
    assert c["readinessProbe"]["httpGet"] == {"path": "/readyz", "port": "http"}
    assert c["resources"] == {"requests": {"cpu": "50m", "memory": "128Mi"},
                              "limits": {"cpu": "500m", "memory": "256Mi"}}
    mounts = {m["mountPath"]: m for m in c["volumeMounts"]}
    assert mounts["/certs"]["readOnly"] is True
    volumes = {v["name"]: v for v in spec["volumes"]}
    certs = volumes[mounts["/certs"]["name"]]["secret"]
    assert certs["secretName"] == "shardlease-webhook-tls"
    assert {i["key"] for i in certs["items"]} == {"tls.crt", "tls.key"}
    # A read-only root filesystem, with a scratch /tmp.
    assert "emptyDir" in volumes[mounts["/tmp"]["name"]]


def test_every_pod_and_container_runs_restricted(docs):
    pods = [d["spec"]["template"]["spec"] for d in docs
            if d["kind"] in ("Deployment", "StatefulSet", "DaemonSet", "Job")]
    assert pods
    for spec in pods:
        psc = spec["securityContext"]
        assert psc["runAsNonRoot"] is True
        assert psc["runAsUser"] == 65532
        assert psc["seccompProfile"] == {"type": "RuntimeDefault"}
        assert not spec.get("hostNetwork") and not spec.get("hostPID")
        for c in spec["containers"] + spec.get("initContainers", []):
            assert c["securityContext"].items() >= RESTRICTED_CONTAINER.items(), c["name"]
            assert c["resources"]["requests"] and c["resources"]["limits"], c["name"]
            assert c.get("livenessProbe") and c.get("readinessProbe"), c["name"]


def test_service_routes_443_to_the_webhook_port(docs):
    svc = one(docs, "Service", "shardlease")
    ports = {p["name"]: (p["port"], p["targetPort"]) for p in svc["spec"]["ports"]}
    assert ports == {"webhook": (443, "webhook"), "http": (8080, "http")}
    dep = one(docs, "Deployment", "shardlease")
    assert svc["spec"]["selector"].items() <= dep["spec"]["template"]["metadata"]["labels"].items()


def test_mutating_webhook_configuration(docs):
    mwc = one(docs, "MutatingWebhookConfiguration", "shardlease")
    (wh,) = mwc["webhooks"]
    assert wh["clientConfig"]["service"] == {
        "name": "shardlease", "namespace": "shardlease-system", "path": "/inject-agent",
        "port": 443}
    assert wh["rules"] == [{"apiGroups": [""], "apiVersions": ["v1"], "operations": ["CREATE"],
                            "resources": ["pods"], "scope": "Namespaced"}]
    assert wh["failurePolicy"] == "Ignore"
    assert wh["sideEffects"] == "None"
    assert wh["admissionReviewVersions"] == ["v1"]
    assert wh["timeoutSeconds"] == 5
    assert wh["reinvocationPolicy"] == "Never"
    exprs = wh["namespaceSelector"]["matchExpressions"]
    assert {"key": "kubernetes.io/metadata.name", "operator": "NotIn",
            "values": ["kube-system", "shardlease-system"]} in exprs
    assert {"key": "shardlease.io/webhook", "operator": "NotIn", "values": ["disabled"]} in exprs
    assert {"key": "shardlease.io/webhook", "operator": "NotIn", "values": ["disabled"]} in (
        wh["objectSelector"]["matchExpressions"])
    assert "cert-manager.io/inject-ca-from" not in (mwc["metadata"].get("annotations") or {})


def test_webhook_excludes_the_release_namespace_and_extra_ones(helm):
    docs = helm.template("--set", "webhook.excludeNamespaces={infra,kube-system}",
                         namespace="ops")
    (wh,) = one(docs, "MutatingWebhookConfiguration")["webhooks"]
    assert wh["clientConfig"]["service"]["namespace"] == "ops"
    (names,) = [e["values"] for e in wh["namespaceSelector"]["matchExpressions"]
                if e["key"] == "kubernetes.io/metadata.name"]
    assert names == ["kube-system", "ops", "infra"]
    crb = one(docs, "ClusterRoleBinding", OPERATOR_ROLE)
    assert crb["subjects"] == [{"kind": "ServiceAccount", "name": "shardlease",
                                "namespace": "ops"}]


def _openssl(*args: str, input: str | None = None) -> str:
    proc = subprocess.run(["openssl", *args], capture_output=True, text=True, input=input)
    assert proc.returncode == 0, f"openssl {' '.join(args)}: {proc.stdout}{proc.stderr}"
    return proc.stdout


def check_webhook_certificate(tmp_path: Path, ca_b64: str, crt_b64: str, key_b64: str,
                              service: str, namespace: str) -> None:
    """The serving certificate is signed by the CA bundle, is for the Service's
    DNS names, and matches its key."""
    ca, crt, key = (base64.b64decode(v).decode() for v in (ca_b64, crt_b64, key_b64))
    assert ca.startswith("-----BEGIN CERTIFICATE-----")
    (tmp_path / "ca.pem").write_text(ca)
    (tmp_path / "tls.crt").write_text(crt)
    (tmp_path / "tls.key").write_text(key)
    out = _openssl("verify", "-purpose", "sslserver", "-CAfile", str(tmp_path / "ca.pem"),
                   str(tmp_path / "tls.crt"))
    assert out.strip().endswith(": OK"), out
    sans = _openssl("x509", "-noout", "-ext", "subjectAltName", "-in", str(tmp_path / "tls.crt"))
    for name in (service, f"{service}.{namespace}", f"{service}.{namespace}.svc"):
        assert f"DNS:{name}," in sans + ",", sans
    assert (_openssl("x509", "-noout", "-pubkey", "-in", str(tmp_path / "tls.crt"))
            == _openssl("pkey", "-pubout", "-in", str(tmp_path / "tls.key")))
    ca_text = _openssl("x509", "-noout", "-text", "-in", str(tmp_path / "ca.pem"))
    assert "CA:TRUE" in ca_text


def test_self_signed_webhook_certificate(docs, tmp_path):
    secret = one(docs, "Secret", "shardlease-webhook-tls")
    assert secret["type"] == "kubernetes.io/tls"
    (wh,) = one(docs, "MutatingWebhookConfiguration")["webhooks"]
    assert wh["clientConfig"]["caBundle"] == secret["data"]["ca.crt"]
    check_webhook_certificate(tmp_path, secret["data"]["ca.crt"], secret["data"]["tls.crt"],
                              secret["data"]["tls.key"], "shardlease", "shardlease-system")


def test_cert_manager_mode(helm):
    docs = helm.template("--set", "webhook.certManager.enabled=true")
    assert not by_kind(docs, "Secret"), "cert-manager writes the Secret, not helm"
    # self-signed Issuer -> CA Certificate -> CA Issuer -> serving Certificate
    issuer = one(docs, "Issuer", "shardlease-selfsigned")
    assert issuer["spec"] == {"selfSigned": {}}
    ca = one(docs, "Certificate", "shardlease-ca")
    assert ca["spec"]["isCA"] is True
    assert ca["spec"]["issuerRef"]["name"] == "shardlease-selfsigned"
    ca_issuer = one(docs, "Issuer", "shardlease-ca")
    assert ca_issuer["spec"] == {"ca": {"secretName": ca["spec"]["secretName"]}}
    cert = one(docs, "Certificate", "shardlease-webhook")
    assert cert["spec"]["issuerRef"] == {"name": "shardlease-ca", "kind": "Issuer",
                                         "group": "cert-manager.io"}
    assert "isCA" not in cert["spec"]
    assert "shardlease.shardlease-system.svc" in cert["spec"]["dnsNames"]
    dep = one(docs, "Deployment", "shardlease")
    (certs,) = [v for v in dep["spec"]["template"]["spec"]["volumes"] if "secret" in v]
    assert certs["secret"]["secretName"] == cert["spec"]["secretName"]
    mwc = one(docs, "MutatingWebhookConfiguration", "shardlease")
    # The bundle is the CA: renewing the serving certificate leaves it alone.
    assert mwc["metadata"]["annotations"] == {
        "cert-manager.io/inject-ca-from": "shardlease-system/shardlease-ca"}
    (wh,) = mwc["webhooks"]
    assert "caBundle" not in wh["clientConfig"]


def test_cert_manager_mode_with_an_existing_issuer(helm):
    docs = helm.template("--set", "webhook.certManager.enabled=true",
                         "--set", "webhook.certManager.issuerRef.name=corp-ca",
                         "--set", "webhook.certManager.issuerRef.kind=ClusterIssuer")
    assert not by_kind(docs, "Issuer")
    assert [c["metadata"]["name"] for c in by_kind(docs, "Certificate")] == ["shardlease-webhook"]
    cert = one(docs, "Certificate", "shardlease-webhook")
    assert cert["spec"]["issuerRef"] == {"name": "corp-ca", "kind": "ClusterIssuer",
                                         "group": "cert-manager.io"}
    mwc = one(docs, "MutatingWebhookConfiguration", "shardlease")
    assert mwc["metadata"]["annotations"] == {
        "cert-manager.io/inject-ca-from": "shardlease-system/shardlease-webhook"}


@pytest.mark.parametrize(("args", "image", "policy"), [
    (["--set", "image.repository=registry.example/shardlease", "--set-string", "image.tag=1.2"],
     "registry.example/shardlease:1.2", "IfNotPresent"),
    (["--set", "image.digest=sha256:" + "b" * 64, "--set", "image.pullPolicy=Always"],
     "shardlease@sha256:" + "b" * 64, "Always"),
])
def test_image_values(helm, args, image, policy):
    dep = one(helm.template(*args), "Deployment")
    (c,) = dep["spec"]["template"]["spec"]["containers"]
    assert c["image"] == image
    assert c["imagePullPolicy"] == policy
    assert env_of(c)["SHARDLEASE_AGENT_IMAGE"] == image


def test_release_name_and_service_account_overrides(helm):
    docs = helm.template("--set", "serviceAccount.create=false",
                         "--set", "serviceAccount.name=ops-sa", release="sl")
    assert not by_kind(docs, "ServiceAccount")
    dep = one(docs, "Deployment", "sl-shardlease")
    assert dep["spec"]["template"]["spec"]["serviceAccountName"] == "ops-sa"
    crb = one(docs, "ClusterRoleBinding", OPERATOR_ROLE)
    assert crb["subjects"][0]["name"] == "ops-sa"
    (wh,) = one(docs, "MutatingWebhookConfiguration")["webhooks"]
    assert wh["clientConfig"]["service"]["name"] == "sl-shardlease"
    one(docs, "Service", "sl-shardlease")
    # Without a name there is nothing to bind: refused with a message.
    proc = helm.run("template", "x", str(CHART), "--set", "serviceAccount.create=false",
                    check=False)
    assert proc.returncode != 0
    assert "serviceAccount.name is required" in proc.stderr


# -- RBAC, as rendered -----------------------------------------------------------------------


@pytest.mark.parametrize(("role", "table"), [(OPERATOR_ROLE, OPERATOR_RULES),
                                             (AGENT_ROLE, AGENT_RULES)])
def test_cluster_role_grants_exactly_the_contract(docs, role, table):
    cr = one(docs, "ClusterRole", role)
    assert normalize(cr["rules"]) == expand(table)


def test_rbac_has_no_wildcards_secrets_or_other_roles(docs):
    rbac = [d for d in docs if d["apiVersion"].startswith("rbac.authorization.k8s.io/")]
    assert {d["kind"] for d in rbac} == {"ClusterRole", "ClusterRoleBinding", "Role",
                                         "RoleBinding"}
    # The one namespaced Role: the leader election Lease, in the release namespace.
    (role,) = by_kind(rbac, "Role")
    assert role["metadata"]["namespace"] == "shardlease-system"
    assert [r["resources"] for r in role["rules"]] == [["leases"]]
    for d in by_kind(rbac, "ClusterRole"):
        assert "aggregationRule" not in d
        for rule in d["rules"]:
            for key in ("apiGroups", "resources", "verbs"):
                assert "*" not in rule[key], (d["metadata"]["name"], rule)
            assert "secrets" not in rule["resources"]
            assert not {"escalate", "impersonate"} & set(rule["verbs"])
    # The agent's role is only ever bound per namespace (by the operator).
    (crb,) = by_kind(rbac, "ClusterRoleBinding")
    assert crb["roleRef"]["name"] == OPERATOR_ROLE


# -- NOTES -----------------------------------------------------------------------------------


def test_notes_tell_how_to_opt_in_and_see_owners():
    notes = (CHART / "templates" / "NOTES.txt").read_text()
    for text in (
        "kubectl annotate statefulset NAME shardlease.io/shards=64",
        "shardlease.io/store", "shardlease.io/lease-ttl", "shardlease.io/interval",
        "shardlease.io/margin", "shardlease.io/max-concurrency", "shardlease.io/host-url",
        "shardlease.io/inject",
        "kubectl get shardsets",
        "kubectl get shardset NAME -o jsonpath='{.status.owners}'",
        "kubectl get leases -l shardlease.io/cluster=NAME",
    ):
        assert text in notes, text


def test_agent_values_reach_the_operator_as_a_valid_agent_config(helm):
    from shardlease.k8s.inject import AgentConfig

    default = one(helm.template(), "Deployment")
    (c,) = default["spec"]["template"]["spec"]["containers"]
    config = AgentConfig.model_validate_json(env_of(c)["SHARDLEASE_AGENT_CONFIG"])
    assert config.image_pull_policy == "IfNotPresent"  # image.pullPolicy
    assert config.native_sidecar is None  # decided from the server version
    assert config.resources["requests"] == {"cpu": "20m", "memory": "64Mi"}

    dep = one(helm.template(
        "--set", "agent.imagePullPolicy=Never", "--set", "agent.nativeSidecar=false",
        "--set", "agent.resources.limits.cpu=1",
        "--set", "agent.envFrom[0].secretRef.name=s3-creds",
        "--set", "agent.env[0].name=AWS_REGION", "--set", "agent.env[0].value=eu-west-1",
        "--set", "imagePullSecrets[0].name=regcred"), "Deployment")
    (c,) = dep["spec"]["template"]["spec"]["containers"]
    config = AgentConfig.model_validate_json(env_of(c)["SHARDLEASE_AGENT_CONFIG"])
    assert config.image_pull_policy == "Never"
    assert config.native_sidecar is False
    assert config.resources["limits"] == {"memory": "256Mi", "cpu": "1"}
    assert config.env_from == [{"secretRef": {"name": "s3-creds"}}]
    assert config.env == [{"name": "AWS_REGION", "value": "eu-west-1"}]
    assert config.image_pull_secrets == ["regcred"]


def test_the_log_values_reach_the_operators_arguments_and_the_agents_config(helm):
    from shardlease.cli import build_parser
    from shardlease.k8s.inject import AgentConfig, inject

    def rendered(*args: str) -> tuple[list[str], AgentConfig]:
        (c,) = one(helm.template(*args), "Deployment")["spec"]["template"]["spec"]["containers"]
        return c["args"], AgentConfig.model_validate_json(env_of(c)["SHARDLEASE_AGENT_CONFIG"])

    args, config = rendered()
    assert (config.log_format, config.log_level) == ("text", "info")
    args, config = rendered("--set", "operator.logFormat=json", "--set", "operator.logLevel=debug",
                            "--set", "agent.logFormat=json", "--set", "agent.logLevel=warning")
    # What the operator's own parser reads from the Deployment's arguments.
    parsed = build_parser().parse_args(args)
    assert (parsed.log_format, parsed.log_level) == ("json", "debug")
    assert (config.log_format, config.log_level) == ("json", "warning")
    pod = {"metadata": {"name": "db-0"}, "spec": {"containers": [{"name": "app"}]}}
    (agent,) = inject(pod, "x", "db", config=config)["spec"]["initContainers"]
    parsed = build_parser().parse_args(agent["args"])
    assert (parsed.log_format, parsed.log_level) == ("json", "warning")
    # Values from an older chart (`helm upgrade --reuse-values`) have no log
    # keys: the defaults, never an empty --log-format= the operator refuses.
    args, config = rendered("--set", "operator.logFormat=null", "--set", "operator.logLevel=null",
                            "--set", "agent.logFormat=null", "--set", "agent.logLevel=null")
    assert args[-2:] == ["--log-format=text", "--log-level=info"]
    assert (config.log_format, config.log_level) == ("text", "info")


def test_a_wrong_agent_value_is_refused_by_the_schema(helm):
    proc = helm.run("template", "x", str(CHART), "--set", "agent.imagePullPolicy=Sometimes",
                    check=False)
    assert proc.returncode != 0
    assert "/agent/imagePullPolicy" in proc.stderr


def test_monitors_are_off_by_default_and_scrape_the_operator_and_every_agent(helm):
    assert not by_kind(helm.template(), "ServiceMonitor")
    assert not by_kind(helm.template(), "PodMonitor")
    docs = helm.template("--set", "metrics.serviceMonitor.enabled=true",
                         "--set", "metrics.podMonitor.enabled=true",
                         "--set", "metrics.podMonitor.labels.release=prom")
    sm = one(docs, "ServiceMonitor")
    svc = one(docs, "Service")
    assert sm["spec"]["selector"]["matchLabels"].items() <= svc["metadata"]["labels"].items()
    assert sm["spec"]["endpoints"] == [{"port": "http", "path": "/metrics", "interval": "30s"}]
    assert "http" in {p["name"] for p in svc["spec"]["ports"]}
    pm = one(docs, "PodMonitor")
    assert pm["metadata"]["labels"]["release"] == "prom"
    assert pm["spec"]["namespaceSelector"] == {"any": True}
    assert pm["spec"]["podMetricsEndpoints"][0]["port"] == "shardlease"
    # The label the PodMonitor selects is the one the webhook puts on agents.
    from shardlease.k8s.inject import AGENT_LABEL, agent_container, inject

    pod = inject({"metadata": {}, "spec": {"containers": [{"name": "app"}]}}, "img", "db")
    assert pm["spec"]["selector"]["matchLabels"] == {AGENT_LABEL: pod["metadata"]["labels"][
        AGENT_LABEL]}
    ports = agent_container("img", "db", native=True)["ports"]
    # The PodMonitor's port (TCP: /metrics), and the hints' (UDP, same number).
    assert [(p["name"], p["protocol"]) for p in ports] == [
        ("shardlease", "TCP"), ("shardlease-hint", "UDP")]
    assert pm["spec"]["podMetricsEndpoints"][0]["port"] == "shardlease"


def test_the_network_policy_is_off_by_default_and_opens_only_the_operators_ports(helm):
    assert not by_kind(helm.template(), "NetworkPolicy")
    docs = helm.template("--set", "networkPolicy.enabled=true")
    policy = one(docs, "NetworkPolicy")
    deployment = one(docs, "Deployment")
    pod = deployment["spec"]["template"]
    assert policy["spec"]["podSelector"]["matchLabels"].items() \
        <= pod["metadata"]["labels"].items()
    assert policy["spec"]["policyTypes"] == ["Ingress"]
    named = {p["name"]: p["containerPort"] for c in pod["spec"]["containers"]
             for p in c.get("ports", [])}
    rules = policy["spec"]["ingress"]
    # The webhook's port from anywhere (the API server), 8080 from anywhere by default.
    assert [[p["port"] for p in r["ports"]] for r in rules] == [["webhook"], ["http"]]
    assert {"webhook", "http"} <= named.keys() and "from" not in rules[0] \
        and "from" not in rules[1]
    peers = [{"namespaceSelector": {"matchLabels": {"name": "monitoring"}}}]
    docs = helm.template("--set", "networkPolicy.enabled=true", "--set-json",
                         f"networkPolicy.metricsFrom={json.dumps(peers)}")
    rules = one(docs, "NetworkPolicy")["spec"]["ingress"]
    assert "from" not in rules[0] and rules[1]["from"] == peers


def test_replicas_elect_a_leader_and_keep_one_through_disruptions(helm):
    docs = helm.template()
    dep = one(docs, "Deployment")
    (c,) = dep["spec"]["template"]["spec"]["containers"]
    assert "--leader-election" in c["args"]
    assert env_of(c)["POD_NAMESPACE"] == {"fieldRef": {"fieldPath": "metadata.namespace"}}
    pdb = one(docs, "PodDisruptionBudget")
    assert pdb["spec"]["minAvailable"] == 1
    assert pdb["spec"]["selector"] == dep["spec"]["selector"]
    role = one(docs, "Role", "shardlease-leader-election")
    assert role["metadata"]["namespace"] == "shardlease-system"
    assert role["rules"] == [{"apiGroups": ["coordination.k8s.io"], "resources": ["leases"],
                              "verbs": ["get", "create", "patch", "update"]}]
    rb = one(docs, "RoleBinding", "shardlease-leader-election")
    assert rb["subjects"][0]["name"] == dep["spec"]["template"]["spec"]["serviceAccountName"]
    assert not by_kind(helm.template("--set", "replicas=1"), "PodDisruptionBudget")
