"""The chart installed with the real helm on a real kube-apiserver (tests/k8s
control plane: no controller-manager, no kubelet, so no pod ever runs).

- every object of the chart is accepted by the API server;
- the webhook certificate survives `helm upgrade` (looked up, not regenerated);
- the operator's pod template passes the `restricted` Pod Security Standard;
- the webhook fails open while no operator serves it;
- RBAC: every call the operator and the agent make is allowed, as the
  ServiceAccounts themselves (impersonated), and calls beyond those are denied.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator
from dataclasses import dataclass

import pytest

from .conftest import CHART
from .contract import AGENT_ROLE, AGENT_RULES, OPERATOR_RULES, WEBHOOK_CONFIG
from .test_render import check_webhook_certificate

pytestmark = pytest.mark.slow

RELEASE, RELEASE_NS = "shardlease", "shardlease-system"
OPERATOR_SA = f"system:serviceaccount:{RELEASE_NS}:shardlease"


@dataclass(frozen=True)
class Cluster:
    app: str  # where an opted-in StatefulSet lives: the agent's RoleBinding is here
    other: str  # another application namespace, with no binding
    agent: str  # the app's ServiceAccount, as a user name
    install_output: str


def _uid() -> str:
    return uuid.uuid4().hex[:8]


@pytest.fixture(scope="module")
def cluster(helm, kubectl, kubeconfig) -> Iterator[Cluster]:
    # (With the optional NetworkPolicy: the API server validates it too.)
    out = helm.run("install", RELEASE, str(CHART), "--namespace", RELEASE_NS,
                   "--create-namespace", "--set", "networkPolicy.enabled=true",
                   kubeconfig=kubeconfig).stdout
    kubectl.run("wait", "--for=condition=Established", "--timeout=60s",
                "crd/shardsets.shardlease.io")
    app, other = f"app-{_uid()}", f"other-{_uid()}"
    for ns in (app, other):
        kubectl.run("create", "namespace", ns)
        kubectl.run("create", "serviceaccount", "web", "-n", ns)
    # The RoleBinding the operator makes for an opted-in StatefulSet, made as
    # the operator: it may bind the agent's ClusterRole.
    kubectl.run("create", "rolebinding", "shardlease-agent-web", "-n", app,
                f"--clusterrole={AGENT_ROLE}", f"--serviceaccount={app}:web",
                f"--as={OPERATOR_SA}")
    yield Cluster(app=app, other=other, agent=f"system:serviceaccount:{app}:web",
                  install_output=out)
    # Leave no webhook configuration or cluster roles behind for other tests
    # that might share this control plane (helm keeps the CRD, by design).
    helm.run("uninstall", RELEASE, "--namespace", RELEASE_NS, "--wait", kubeconfig=kubeconfig)
    for kind, name in (("mutatingwebhookconfiguration", WEBHOOK_CONFIG),
                       ("clusterrole", "shardlease-operator"),
                       ("clusterrolebinding", "shardlease-operator")):
        proc = kubectl.run("get", kind, name, check=False)
        assert proc.returncode != 0 and "NotFound" in proc.stderr, f"{kind} {name} left behind"
    # The agents' role outlives the release: running pods keep their leases.
    can = kubectl.run("auth", "can-i", "update", "leases", "-n", app,
                      f"--as=system:serviceaccount:{app}:web", check=False)
    assert can.stdout.strip() == "yes", (can.stdout, can.stderr)
    kubectl.run("delete", "clusterrole", AGENT_ROLE)


def test_install_prints_the_notes(cluster):
    assert "kubectl annotate statefulset NAME shardlease.io/shards=64" in cluster.install_output
    assert "kubectl get shardsets" in cluster.install_output


def test_installed_objects(cluster, kubectl):
    for kind, name, ns in [
        ("deployment", "shardlease", RELEASE_NS),
        ("service", "shardlease", RELEASE_NS),
        ("networkpolicy", "shardlease", RELEASE_NS),
        ("serviceaccount", "shardlease", RELEASE_NS),
        ("secret", "shardlease-webhook-tls", RELEASE_NS),
        ("clusterrole", "shardlease-operator", None),
        ("clusterrole", AGENT_ROLE, None),
        ("clusterrolebinding", "shardlease-operator", None),
        ("mutatingwebhookconfiguration", WEBHOOK_CONFIG, None),
        ("crd", "shardsets.shardlease.io", None),
    ]:
        kubectl.run("get", kind, name, *(["-n", ns] if ns else []))


def _webhook_tls(kubectl) -> tuple[dict, str]:
    secret = json.loads(kubectl.run("get", "secret", "shardlease-webhook-tls", "-n", RELEASE_NS,
                                    "-o", "json").stdout)
    mwc = json.loads(kubectl.run("get", "mutatingwebhookconfiguration", WEBHOOK_CONFIG,
                                 "-o", "json").stdout)
    return secret["data"], mwc["webhooks"][0]["clientConfig"]["caBundle"]


def test_upgrade_keeps_the_webhook_certificate(cluster, helm, kubectl, kubeconfig, tmp_path):
    before, bundle_before = _webhook_tls(kubectl)
    assert bundle_before == before["ca.crt"]
    check_webhook_certificate(tmp_path, before["ca.crt"], before["tls.crt"], before["tls.key"],
                              "shardlease", RELEASE_NS)
    for extra in ([], ["--set", "webhook.timeoutSeconds=7"]):
        helm.run("upgrade", RELEASE, str(CHART), "--namespace", RELEASE_NS, *extra,
                 kubeconfig=kubeconfig)
        after, bundle_after = _webhook_tls(kubectl)
        assert after == before, "helm upgrade regenerated the webhook certificate"
        assert bundle_after == bundle_before
    mwc = json.loads(kubectl.run("get", "mutatingwebhookconfiguration", WEBHOOK_CONFIG,
                                 "-o", "json").stdout)
    assert mwc["webhooks"][0]["timeoutSeconds"] == 7  # the upgrade did apply


def _operator_pod(kubectl) -> dict:
    dep = json.loads(kubectl.run("get", "deployment", "shardlease", "-n", RELEASE_NS,
                                 "-o", "json").stdout)
    template = dep["spec"]["template"]
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": f"operator-{_uid()}", "labels": template["metadata"]["labels"]},
            "spec": template["spec"]}


def test_certificate_volume_mode_is_owner_and_group_read_only(cluster, kubectl):
    # 0440 in the chart's YAML is octal: the API server must see 288, not 440.
    (volume,) = [v for v in _operator_pod(kubectl)["spec"]["volumes"] if "secret" in v]
    assert volume["secret"]["defaultMode"] == 0o440


def test_operator_pod_passes_the_restricted_pod_security_standard(cluster, kubectl):
    ns = f"restricted-{_uid()}"
    kubectl.run("create", "namespace", ns)
    kubectl.run("label", "namespace", ns, "pod-security.kubernetes.io/enforce=restricted",
                "pod-security.kubernetes.io/enforce-version=latest",
                "shardlease.io/webhook=disabled")
    pod = _operator_pod(kubectl)
    proc = kubectl.run("create", "--dry-run=server", "-n", ns, "-f", "-", "-o", "name",
                       input=json.dumps(pod), check=False)
    assert proc.returncode == 0, proc.stderr
    assert "violate" not in proc.stderr, proc.stderr
    # The admission check is live: the same pod without its security contexts is refused.
    del pod["spec"]["securityContext"]
    for c in pod["spec"]["containers"]:
        del c["securityContext"]
    proc = kubectl.run("create", "--dry-run=server", "-n", ns, "-f", "-", "-o", "name",
                       input=json.dumps(pod), check=False)
    assert proc.returncode != 0
    assert "violates PodSecurity" in proc.stderr, proc.stderr


def test_webhook_fails_open_while_no_operator_serves_it(cluster, kubectl):
    # No kubelet, no endpoints: the API server cannot reach the webhook and,
    # with failurePolicy Ignore, creates the pod untouched.
    pod = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "plain"},
           "spec": {"containers": [{"name": "app", "image": "busybox"}]}}
    out = kubectl.run("create", "-n", cluster.app, "-f", "-", "-o", "json",
                      input=json.dumps(pod), timeout=30).stdout
    created = json.loads(out)
    assert [c["name"] for c in created["spec"]["containers"]] == ["app"]


def test_the_webhook_receives_only_the_pods_of_statefulsets(cluster, kubectl):
    # With failurePolicy Fail and no operator to answer, a pod sent to the
    # webhook is refused: so a pod created is one the API server never sent.
    patch = json.dumps([{"op": "replace", "path": "/webhooks/0/failurePolicy", "value": "Fail"}])
    kubectl.run("patch", "mutatingwebhookconfiguration", WEBHOOK_CONFIG, "--type=json",
                "-p", patch)
    try:
        def pod(name: str, owner: str | None) -> str:
            meta: dict = {"name": name}
            if owner:
                meta["ownerReferences"] = [{"apiVersion": "apps/v1", "kind": owner,
                                            "name": "web", "uid": str(uuid.uuid4()),
                                            "controller": True}]
            return json.dumps({"apiVersion": "v1", "kind": "Pod", "metadata": meta,
                               "spec": {"containers": [{"name": "app", "image": "busybox"}]}})
        for name, owner in (("bare", None), ("of-a-replicaset", "ReplicaSet")):
            kubectl.run("create", "-n", cluster.app, "-f", "-", input=pod(name, owner),
                        timeout=30)
        sent = kubectl.run("create", "-n", cluster.app, "-f", "-", input=pod("web-0",
                           "StatefulSet"), timeout=30, check=False)
        assert sent.returncode != 0 and "inject-agent.shardlease.io" in sent.stderr, sent.stderr
    finally:
        patch = patch.replace('"Fail"', '"Ignore"')
        kubectl.run("patch", "mutatingwebhookconfiguration", WEBHOOK_CONFIG, "--type=json",
                    "-p", patch)


# -- RBAC ------------------------------------------------------------------------------------

# Where a check is made: the app namespace (agent's RoleBinding), another one,
# the release namespace, or all namespaces at once (a cluster-wide list/watch).
APP, OTHER, RELEASE_NS_, ALL = "app", "other", "release", "all"


@dataclass(frozen=True)
class Check:
    verb: str
    resource: str  # resource[.group][/name]
    where: str = APP
    subresource: str = ""

    def __str__(self) -> str:
        sub = f"/{self.subresource}" if self.subresource else ""
        return f"{self.verb}:{self.resource}{sub}@{self.where}"


def _needs(table, where: str) -> list[Check]:
    checks = []
    for group, resource, verbs, names in table:
        res, _, sub = resource.partition("/")
        qualified = f"{res}.{group}" if group else res
        for verb in verbs:
            for name in names or ("",):
                target = f"{qualified}/{name}" if name else qualified
                checks.append(Check(verb, target, where, sub))
    return checks


# Every call the operator makes, in any namespace, and cluster-wide reads.
OPERATOR_ALLOWED = (
    _needs(OPERATOR_RULES, APP)
    + _needs(OPERATOR_RULES, OTHER)
    + [Check(v, r, ALL) for v in ("list", "watch")
       for r in ("statefulsets.apps", "shardsets.shardlease.io",
                 "rolebindings.rbac.authorization.k8s.io")]
)
OPERATOR_DENIED = [
    Check("get", "secrets", RELEASE_NS_),  # not even its own webhook certificate
    Check("list", "secrets", ALL),
    Check("get", "secrets", APP),
    Check("get", "configmaps", APP),
    Check("watch", "pods", ALL),  # it lists a StatefulSet's pods, never watches them
    Check("delete", "pods", APP),
    Check("create", "pods", APP),
    Check("create", "pods", APP, "exec"),
    Check("patch", "statefulsets.apps", APP),
    Check("update", "statefulsets.apps", APP),
    Check("delete", "statefulsets.apps", APP),
    Check("update", "deployments.apps", RELEASE_NS_),
    Check("create", "leases.coordination.k8s.io", APP),
    Check("bind", "clusterroles.rbac.authorization.k8s.io/cluster-admin", ALL),
    Check("bind", "clusterroles.rbac.authorization.k8s.io/edit", ALL),
    Check("bind", "clusterroles.rbac.authorization.k8s.io", ALL),
    Check("escalate", "clusterroles.rbac.authorization.k8s.io", ALL),
    Check("create", "clusterroles.rbac.authorization.k8s.io", ALL),
    Check("create", "clusterrolebindings.rbac.authorization.k8s.io", ALL),
    Check("create", "roles.rbac.authorization.k8s.io", APP),
    Check("bind", "roles.rbac.authorization.k8s.io", APP),
    Check("impersonate", "serviceaccounts", APP),
    Check("create", "serviceaccounts", APP, "token"),
    Check("list", "namespaces", ALL),
    Check("list", "nodes", ALL),
    Check("list", "customresourcedefinitions.apiextensions.k8s.io", ALL),
    Check("patch", "mutatingwebhookconfigurations.admissionregistration.k8s.io", ALL),
]

# Every call the agent makes, in its own namespace only.
AGENT_ALLOWED = _needs(AGENT_RULES, APP)
AGENT_DENIED = [
    Check("list", "secrets", APP),
    Check("get", "secrets", APP),
    Check("get", "configmaps", APP),
    Check("delete", "pods", APP),
    Check("create", "pods", APP),
    Check("patch", "pods", APP),
    Check("patch", "pods", APP, "status"),
    Check("create", "pods", APP, "exec"),
    Check("create", "pods", APP, "eviction"),
    Check("create", "shardsets.shardlease.io", APP),
    Check("update", "shardsets.shardlease.io", APP),
    Check("patch", "shardsets.shardlease.io", APP),
    Check("delete", "shardsets.shardlease.io", APP),
    Check("list", "statefulsets.apps", APP),
    Check("patch", "statefulsets.apps", APP),
    Check("create", "rolebindings.rbac.authorization.k8s.io", APP),
    Check("create", "serviceaccounts", APP, "token"),
    # Nothing outside its namespace.
    Check("get", "leases.coordination.k8s.io", OTHER),
    Check("create", "leases.coordination.k8s.io", OTHER),
    Check("update", "leases.coordination.k8s.io", "kube-system"),
    Check("list", "leases.coordination.k8s.io", ALL),
    Check("list", "pods", OTHER),
    Check("list", "pods", ALL),
    Check("get", "shardsets.shardlease.io", OTHER),
    Check("patch", "shardsets.shardlease.io", OTHER, "status"),
    Check("create", "events", OTHER),
    Check("list", "namespaces", ALL),
    Check("list", "nodes", ALL),
]


def can_i(kubectl, cluster: Cluster, user: str, check: Check) -> bool:
    args = ["auth", "can-i", check.verb, check.resource, f"--as={user}"]
    if check.subresource:
        args.append(f"--subresource={check.subresource}")
    where = {APP: cluster.app, OTHER: cluster.other, RELEASE_NS_: RELEASE_NS}.get(
        check.where, check.where)
    args += ["--all-namespaces"] if where == ALL else ["-n", where]
    proc = kubectl.run(*args, check=False)
    answer = proc.stdout.strip()
    assert answer in ("yes", "no"), f"kubectl {' '.join(args)}: {proc.stdout}{proc.stderr}"
    return answer == "yes"


@pytest.mark.parametrize("check", OPERATOR_ALLOWED, ids=str)
def test_operator_may(cluster, kubectl, check):
    assert can_i(kubectl, cluster, OPERATOR_SA, check), f"operator cannot {check}"


@pytest.mark.parametrize("check", OPERATOR_DENIED, ids=str)
def test_operator_may_not(cluster, kubectl, check):
    assert not can_i(kubectl, cluster, OPERATOR_SA, check), f"operator can {check}"


@pytest.mark.parametrize("check", AGENT_ALLOWED, ids=str)
def test_agent_may(cluster, kubectl, check):
    assert can_i(kubectl, cluster, cluster.agent, check), f"agent cannot {check}"


@pytest.mark.parametrize("check", AGENT_DENIED, ids=str)
def test_agent_may_not(cluster, kubectl, check):
    assert not can_i(kubectl, cluster, cluster.agent, check), f"agent can {check}"


def test_an_unbound_service_account_gets_nothing_from_the_agent_role(cluster, kubectl):
    other_sa = f"system:serviceaccount:{cluster.other}:web"
    for check in _needs(AGENT_RULES, OTHER):
        assert not can_i(kubectl, cluster, other_sa, check), f"{other_sa} can {check}"


# Real calls, not only access reviews: the RBAC escalation check (binding a
# role) happens on the write itself.


# Not `edit`, `view` or `admin`: they are aggregated ClusterRoles, filled in by
# kube-controller-manager, which this control plane does not run; here they
# grant nothing, so binding them escalates nothing and RBAC allows it.
@pytest.mark.parametrize("role", ["cluster-admin", "system:controller:replicaset-controller",
                                  "system:kube-scheduler", "system:node"])
def test_operator_cannot_bind_any_other_role(cluster, kubectl, role):
    rules = json.loads(kubectl.run("get", "clusterrole", role, "-o", "json").stdout)["rules"]
    assert rules, f"{role} is empty here: binding it would prove nothing"
    proc = kubectl.run("create", "rolebinding", f"grab-{_uid()}", "-n", cluster.app,
                       f"--clusterrole={role}", f"--serviceaccount={cluster.app}:web",
                       f"--as={OPERATOR_SA}", check=False)
    assert proc.returncode != 0
    assert "forbidden" in proc.stderr.lower(), proc.stderr


def _shardset(name: str) -> str:
    return json.dumps({
        "apiVersion": "shardlease.io/v1alpha1", "kind": "ShardSet",
        "metadata": {"name": name},
        "spec": {"statefulSet": name, "shards": 4, "store": "kubernetes://x"}})


def test_real_calls_as_the_operator_and_the_agent(cluster, kubectl):
    app = cluster.app
    # The operator creates the ShardSet and writes a condition.
    kubectl.run("create", "-n", app, "-f", "-", f"--as={OPERATOR_SA}", input=_shardset("web"))
    status = {"status": {"conditions": [{"type": "Configured", "status": "True", "reason": "R",
                                         "message": "m",
                                         "lastTransitionTime": "2026-11-30T12:00:00Z"}]}}
    kubectl.run("patch", "shardset", "web", "-n", app, "--subresource=status", "--type=merge",
                "-p", json.dumps(status), f"--as={OPERATOR_SA}")
    # The agent reads it, publishes owners, and writes leases in its namespace...
    as_agent = f"--as={cluster.agent}"
    kubectl.run("get", "shardset", "web", "-n", app, as_agent)
    owners = {"status": {"owners": {"0": "web-0"}, "liveNodes": 1}}
    kubectl.run("patch", "shardset", "web", "-n", app, "--subresource=status", "--type=merge",
                "-p", json.dumps(owners), as_agent)
    lease = json.dumps({"apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
                        "metadata": {"name": "web-0", "labels": {"shardlease.io/cluster": "web"}},
                        "spec": {"holderIdentity": "web-0"}})
    kubectl.run("create", "-n", app, "-f", "-", as_agent, input=lease)
    kubectl.run("delete", "lease", "web-0", "-n", app, as_agent)
    # ...and nowhere else, and it cannot change the spec.
    proc = kubectl.run("create", "-n", cluster.other, "-f", "-", as_agent, input=lease,
                       check=False)
    assert proc.returncode != 0 and "forbidden" in proc.stderr.lower(), proc.stderr
    proc = kubectl.run("patch", "shardset", "web", "-n", app, "--type=merge",
                       "-p", '{"spec": {"shards": 8}}', as_agent, check=False)
    assert proc.returncode != 0 and "forbidden" in proc.stderr.lower(), proc.stderr
    got = json.loads(kubectl.run("get", "shardset", "web", "-n", app, "-o", "json").stdout)
    assert got["spec"]["shards"] == 4
    assert got["status"]["owners"] == {"0": "web-0"}
    # The secret the operator's pod mounts is out of reach of both.
    for user in (OPERATOR_SA, cluster.agent):
        proc = kubectl.run("get", "secret", "shardlease-webhook-tls", "-n", RELEASE_NS,
                           f"--as={user}", check=False)
        assert proc.returncode != 0 and "forbidden" in proc.stderr.lower(), proc.stderr
