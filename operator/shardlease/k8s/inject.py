"""The agent sidecar the operator injects into the pods of opted-in StatefulSets.

Pure functions over pod bodies, so the webhook handler stays thin and the
shape of the injection is unit-tested without an API server.

On Kubernetes >= 1.29 the agent is a native sidecar: an init container with
`restartPolicy: Always` and a startup probe. The kubelet then starts it
before the application (the application's first opens find it serving) and
stops it only after the application exited on shutdown (so the agent can
still free leases after the application's preStop drain). On older servers
it is a regular container.
"""

from __future__ import annotations

import copy
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

from shardlease.k8s.drain import DRAIN_PATH
from shardlease.logs import DEFAULT_FORMAT, DEFAULT_LEVEL, LogFormat, LogLevel

AGENT = "shardlease-agent"
AGENT_PORT = 8470
INJECTED = "shardlease.io/injected"
AGENT_LABEL = "shardlease.io/agent"

#: Containers that are other meshes' or tools' sidecars: never given the drain
#: hook (their shutdown is theirs to manage), even when they run as regular
#: containers. `shardlease.io/drain-containers` names the app containers instead.
KNOWN_SIDECARS = frozenset({"istio-proxy", "linkerd-proxy", "envoy", "cloud-sql-proxy",
                            "vault-agent", "fluent-bit", "fluentd"})


class AgentConfig(BaseModel):
    """How the injected agent container looks: chart values (the operator's
    `SHARDLEASE_AGENT_CONFIG`), then per-StatefulSet annotations on top."""

    model_config = ConfigDict(populate_by_name=True, extra="forbid")

    image_pull_policy: Literal["Always", "IfNotPresent", "Never"] = Field(
        default="IfNotPresent", alias="imagePullPolicy")
    resources: dict[str, dict[str, str]] = Field(default_factory=lambda: {
        "requests": {"cpu": "20m", "memory": "64Mi"}, "limits": {"memory": "256Mi"}})
    env: list[dict[str, Any]] = Field(default_factory=list)
    env_from: list[dict[str, Any]] = Field(default_factory=list, alias="envFrom")
    #: Added to the pod's imagePullSecrets (names) when the agent image needs them.
    image_pull_secrets: list[str] = Field(default_factory=list, alias="imagePullSecrets")
    #: None: decided from the API server's version (>= 1.29).
    native_sidecar: bool | None = Field(default=None, alias="nativeSidecar")
    #: The agent's --log-format and --log-level (shardlease.logs).
    log_format: LogFormat = Field(default=DEFAULT_FORMAT, alias="logFormat")
    log_level: LogLevel = Field(default=DEFAULT_LEVEL, alias="logLevel")

    @field_validator("resources", mode="before")
    @classmethod
    def _quantities_as_strings(cls, v: Any) -> Any:
        # YAML (and `helm --set`) make `cpu: 1` a number; Kubernetes takes both.
        if isinstance(v, dict):
            return {section: {k: str(q) if isinstance(q, int | float) else q
                              for k, q in (amounts or {}).items()}
                    for section, amounts in v.items()}
        return v


def owner_statefulset(pod: dict[str, Any]) -> str | None:
    for ref in (pod.get("metadata") or {}).get("ownerReferences") or []:
        if ref.get("kind") == "StatefulSet" and ref.get("apiVersion", "").startswith("apps/"):
            return str(ref.get("name"))
    return None


def has_agent(pod: dict[str, Any]) -> bool:
    spec = pod.get("spec") or {}
    return any(c.get("name") == AGENT
               for c in (spec.get("containers") or []) + (spec.get("initContainers") or []))


def agent_image(pod: dict[str, Any]) -> str | None:
    """The image of the pod's agent container, or None if it has none."""
    spec = pod.get("spec") or {}
    for c in (spec.get("initContainers") or []) + (spec.get("containers") or []):
        if c.get("name") == AGENT:
            image = c.get("image")
            return image if isinstance(image, str) else ""
    return None


def outdated_agents(pods: list[dict[str, Any]], current: str) -> dict[str, str]:
    """pod name -> agent image, for the pods whose agent is not `current`
    (the image the operator injects now: they were created before an upgrade)."""
    out = {}
    for p in pods:
        image = agent_image(p)
        if image is not None and image != current:
            out[(p.get("metadata") or {}).get("name", "")] = image
    return dict(sorted(out.items()))


def native_sidecars_supported(major: str, minor: str) -> bool:
    """From /version's major and minor ("1", "29+" on some distributions)."""
    try:
        return (int(major), int(minor.rstrip("+"))) >= (1, 29)
    except ValueError:
        return False


def agent_container(image: str, shardset: str, *, native: bool,
                    config: AgentConfig | None = None) -> dict[str, Any]:
    config = config or AgentConfig()

    def field(path: str) -> dict[str, Any]:
        return {"valueFrom": {"fieldRef": {"fieldPath": path}}}

    env: list[dict[str, Any]] = [
        {"name": "POD_NAME", **field("metadata.name")},
        {"name": "POD_NAMESPACE", **field("metadata.namespace")},
        {"name": "POD_IP", **field("status.podIP")},
    ]
    env += [e for e in config.env if e.get("name") not in {x["name"] for x in env}]
    args = ["agent", "--shardset", shardset, "--port", str(AGENT_PORT)]
    # Only what differs from the agent's defaults: a default install injects
    # the container it always did, which an agent image older than these
    # options (SHARDLEASE_AGENT_IMAGE pinned) still starts.
    if config.log_format != DEFAULT_FORMAT:
        args += ["--log-format", config.log_format]
    if config.log_level != DEFAULT_LEVEL:
        args += ["--log-level", config.log_level]
    container: dict[str, Any] = {
        "name": AGENT,
        "image": image,
        "imagePullPolicy": config.image_pull_policy,
        "args": args,
        "env": env,
        # UDP on the same number: hints between agents (shardlease.hints)
        # when the store has no watch (S3).
        "ports": [{"name": "shardlease", "containerPort": AGENT_PORT, "protocol": "TCP"},
                  {"name": "shardlease-hint", "containerPort": AGENT_PORT, "protocol": "UDP"}],
        "livenessProbe": {"httpGet": {"path": "/healthz", "port": AGENT_PORT},
                          "periodSeconds": 10, "failureThreshold": 3},
        "readinessProbe": {"httpGet": {"path": "/readyz", "port": AGENT_PORT},
                           "periodSeconds": 5},
        "resources": copy.deepcopy(config.resources),
        # No runAsUser: the image's numeric USER applies, or whatever uid the
        # pod's securityContext or the platform (OpenShift) assigns.
        "securityContext": {
            "runAsNonRoot": True, "readOnlyRootFilesystem": True,
            "allowPrivilegeEscalation": False, "capabilities": {"drop": ["ALL"]},
            "seccompProfile": {"type": "RuntimeDefault"},
        },
    }
    if config.env_from:
        container["envFrom"] = copy.deepcopy(config.env_from)
    if native:
        container["restartPolicy"] = "Always"
        # The application starts only once this passes: the agent serves.
        container["startupProbe"] = {"httpGet": {"path": "/healthz", "port": AGENT_PORT},
                                     "periodSeconds": 1, "failureThreshold": 60}
    return container


def drain_hook() -> dict[str, Any]:
    """No header, no secret: a hook is plain text in the pod spec, so the
    agent trusts no request and asks the API server instead (k8s/drain.py)."""
    return {"httpGet": {"path": DRAIN_PATH, "port": AGENT_PORT}}


def inject(pod: dict[str, Any], image: str, shardset: str, *, native: bool = True,
           config: AgentConfig | None = None,
           drain_containers: list[str] | None = None) -> dict[str, Any]:
    """The pod with the agent added, or unchanged if it is already there.

    Each application container without a preStop hook gets one that calls the
    agent's /drain: the kubelet runs it before the
    application's SIGTERM, so the agent closes every shard (through the
    still-running application) and frees every lease before the application
    stops. Application containers are `drain_containers` if given, else every
    regular container that is not a known sidecar.
    """
    out = copy.deepcopy(pod)
    if has_agent(out):
        return out
    config = config or AgentConfig()
    spec = out.setdefault("spec", {})
    containers = spec.setdefault("containers", [])
    for c in containers:
        name = c.get("name")
        wanted = name in drain_containers if drain_containers is not None \
            else name not in KNOWN_SIDECARS
        if wanted:
            c.setdefault("lifecycle", {}).setdefault("preStop", drain_hook())
    agent = agent_container(image, shardset, native=native, config=config)
    if native:
        # Last of the init containers: other native sidecars (a mesh proxy)
        # start before it and stop after it.
        spec.setdefault("initContainers", []).append(agent)
    else:
        containers.append(agent)
    if config.image_pull_secrets:
        have = {s.get("name") for s in spec.get("imagePullSecrets") or []}
        spec["imagePullSecrets"] = (spec.get("imagePullSecrets") or []) + [
            {"name": n} for n in config.image_pull_secrets if n not in have]
    meta = out.setdefault("metadata", {})
    meta.setdefault("annotations", {})[INJECTED] = "true"
    # A label, so that a PodMonitor (the chart's metrics.podMonitor) can select
    # every agent in the cluster.
    meta.setdefault("labels", {})[AGENT_LABEL] = "true"
    return out
