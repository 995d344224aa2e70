"""`shardlease agent` and `shardlease operator`: argument parsing and start-up."""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import sys
from collections.abc import Callable
from pathlib import Path
from urllib.parse import urlsplit

from shardlease.errors import ConfigError
from shardlease.logs import add_log_options, setup_logging


def add_parsers(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    agent = sub.add_parser(
        "agent", help="the per-pod controller (runs as a sidecar or beside the app)",
        description="Run the placement loop for one pod of a ShardSet's StatefulSet.")
    agent.add_argument("--shardset", required=True, help="ShardSet name (the StatefulSet's)")
    agent.add_argument("--namespace", default=os.environ.get("POD_NAMESPACE"),
                       help="namespace (default $POD_NAMESPACE)")
    agent.add_argument("--name", default=os.environ.get("POD_NAME"),
                       help="this pod's name (default $POD_NAME)")
    agent.add_argument("--port", type=int, default=8470,
                       help="HTTP port for /healthz, /readyz, /metrics, /lookup, /drain")
    agent.add_argument("--host-url", help="override the ShardSet's host URL")
    agent.add_argument("--kubeconfig", help="kubeconfig (default: in-cluster or $KUBECONFIG)")
    add_log_options(agent)
    agent.set_defaults(func=_guarded(run_agent, _agent_context))

    op = sub.add_parser(
        "operator", help="the cluster operator (opt-in by annotation, sidecar injection)",
        description="Create ShardSets for annotated StatefulSets and inject the agent.")
    op.add_argument("--namespace", action="append", dest="namespaces", default=[],
                    help="watch only this namespace (repeatable; default: all)")
    op.add_argument("--agent-image", default=os.environ.get("SHARDLEASE_AGENT_IMAGE"),
                    help="image of the injected agent (default $SHARDLEASE_AGENT_IMAGE)")
    op.add_argument("--agent-config", default=os.environ.get("SHARDLEASE_AGENT_CONFIG"),
                    help="JSON of the injected agent's settings: imagePullPolicy, resources, "
                         "env, envFrom, imagePullSecrets, nativeSidecar "
                         "(default $SHARDLEASE_AGENT_CONFIG; the chart's `agent` values)")
    op.add_argument("--webhook-port", type=int, default=9443)
    op.add_argument("--webhook-addr", default="0.0.0.0")
    op.add_argument("--webhook-cert-dir", default=os.environ.get("SHARDLEASE_WEBHOOK_CERT_DIR"),
                    help="directory with tls.crt and tls.key (no webhook without it)")
    op.add_argument("--leader-election", action="store_true",
                    help="reconcile only while holding the Lease shardlease-operator, so that "
                         "several replicas can serve the webhook")
    op.add_argument("--leader-election-namespace", default=os.environ.get("POD_NAMESPACE"),
                    help="namespace of that Lease (default $POD_NAMESPACE)")
    op.add_argument("--http", default="0.0.0.0:8080",
                    help="ADDRESS:PORT of /healthz, /readyz and /metrics ('' to disable)")
    # The older spelling (kopf's liveness URL): only its address and port count now.
    op.add_argument("--liveness", dest="http_url", help=argparse.SUPPRESS)
    op.add_argument("--kubeconfig", help="kubeconfig (default: in-cluster or $KUBECONFIG)")
    add_log_options(op)
    op.set_defaults(func=_guarded(run_operator, lambda _: {}))


def _agent_context(args: argparse.Namespace) -> dict[str, str]:
    """The fields of every JSON record of an agent: it serves one pod of one ShardSet."""
    context = {"shardset": args.shardset}
    if args.name:
        context["pod"] = args.name
    return context


def _guarded(command: Callable[[argparse.Namespace], int],
             context: Callable[[argparse.Namespace], dict[str, str]]
             ) -> Callable[[argparse.Namespace], int]:
    """Logging set up, and a wrong option reported in one line (exit 2), no traceback."""
    def run(args: argparse.Namespace) -> int:
        setup_logging(args.log_format, args.log_level, context=context(args))
        try:
            return command(args)
        except ConfigError as e:
            print(f"shardlease {args.command}: {e}", file=sys.stderr)
            return 2
        except KeyboardInterrupt:
            return 130
    return run


def run_agent(args: argparse.Namespace) -> int:
    from shardlease.k8s.agent import Agent
    from shardlease.kubeapi import small_tls_reads

    if not args.namespace or not args.name:
        raise ConfigError("the agent needs --namespace and --name "
                          "(or POD_NAMESPACE and POD_NAME from the downward API)")
    if args.kubeconfig:
        os.environ["KUBECONFIG"] = args.kubeconfig
    agent = Agent(namespace=args.namespace, shardset=args.shardset, pod_name=args.name,
                  port=args.port, host_url=args.host_url, kubeconfig=args.kubeconfig)
    small_tls_reads()
    asyncio.run(agent.run())
    return 0


def run_operator(args: argparse.Namespace) -> int:
    import kopf
    from pydantic import ValidationError

    from shardlease.k8s.inject import AgentConfig
    from shardlease.k8s.operator import Operator

    if not args.agent_image:
        raise ConfigError("the operator needs --agent-image (or SHARDLEASE_AGENT_IMAGE): "
                          "the image of the sidecar it injects")
    if args.kubeconfig:
        os.environ["KUBECONFIG"] = args.kubeconfig
    try:
        agent_config = AgentConfig.model_validate_json(args.agent_config or "{}")
    except ValidationError as e:
        problems = "; ".join(f"{'.'.join(map(str, err['loc'])) or 'the value'}: {err['msg']}"
                             for err in e.errors())
        raise ConfigError(f"--agent-config (SHARDLEASE_AGENT_CONFIG): {problems}") from None
    webhook = None
    if args.webhook_cert_dir:
        cert, key = Path(args.webhook_cert_dir, "tls.crt"), Path(args.webhook_cert_dir, "tls.key")
        for f in (cert, key):
            if not f.is_file():
                raise ConfigError(f"webhook certificate file {f} does not exist")
        webhook = kopf.WebhookServer(addr=args.webhook_addr, port=args.webhook_port,
                                     certfile=str(cert), pkeyfile=str(key))
    else:
        logging.getLogger("shardlease").warning(
            "no --webhook-cert-dir: the sidecar injection webhook is not served")
    http = args.http if args.http_url is None else \
        (urlsplit(args.http_url).netloc if args.http_url else "")
    address = None
    if http:
        host, _, port = http.rpartition(":")
        if not port.isdigit() or not 0 < int(port) < 65536:
            raise ConfigError(f"--http must be ADDRESS:PORT, not {http!r}")
        address = (host or "0.0.0.0", int(port))
    election = None
    if args.leader_election:
        if not args.leader_election_namespace:
            raise ConfigError("--leader-election needs --leader-election-namespace "
                              "(or POD_NAMESPACE)")
        election = (args.leader_election_namespace, "shardlease-operator")
    op = Operator(agent_image=args.agent_image, webhook=webhook, kubeconfig=args.kubeconfig,
                  namespaces=args.namespaces, agent_config=agent_config, http=address,
                  leader_election=election)
    asyncio.run(op.run())
    return 0


def main(argv: list[str] | None = None) -> int:
    """`python -m shardlease.k8s.commands agent|operator` (the same as `shardlease ...`)."""
    parser = argparse.ArgumentParser(prog="shardlease")
    add_parsers(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(argv)
    code: int = args.func(args)
    return code


if __name__ == "__main__":
    raise SystemExit(main())
