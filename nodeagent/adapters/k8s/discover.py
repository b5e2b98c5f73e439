"""Horovod elastic host discovery that drops hosts under notice before they die.

``horovodrun --host-discovery-script`` re-runs a script every second and reads ``host:slots``
lines. A host that disappears from the list is handled without rolling back (no lost steps),
a host that dies is not; so this lists the job's worker pods that are Running and Ready, minus
every pod with ``shoal.dev/leave-by`` (told to leave by the agent or by the scheduler's shrink)
and every pod on a node tainted ``shoal.dev/revoking``.

    python -m nodeagent.client.discover --namespace NS \\
        --selector training.kubeflow.org/job-name=bert --slots 8 [--format '{name}.{subdomain}']
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence
from typing import Any

from kubernetes import client, config

from common import kubeconfig
from contracts import names


def _ready(pod: Any) -> bool:
    if pod.status.phase != "Running" or pod.metadata.deletion_timestamp is not None:
        return False
    return any(c.type == "Ready" and c.status == "True" for c in pod.status.conditions or [])


def hosts(core: Any, namespace: str, selector: str, slots: int, fmt: str) -> list[str]:
    """``host:slots`` lines for the pods that can keep training."""
    revoking = {
        node.metadata.name
        for node in core.list_node().items
        if any(t.key == names.REVOKING_TAINT for t in node.spec.taints or [])
    }
    lines = []
    pods = core.list_namespaced_pod(namespace, label_selector=selector).items
    for pod in sorted(pods, key=lambda p: p.metadata.name):
        annotations = pod.metadata.annotations or {}
        if not _ready(pod) or names.LEAVE_BY_ANNOTATION in annotations:
            continue
        if pod.spec.node_name in revoking:
            continue
        host = fmt.format(
            name=pod.metadata.name,
            namespace=namespace,
            ip=pod.status.pod_ip or "",
            subdomain=pod.spec.subdomain or "",
            node=pod.spec.node_name or "",
        )
        lines.append(f"{host}:{slots}")
    return lines


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="python -m nodeagent.client.discover",
        description="Print host:slots for the job's pods that are not under notice.",
        epilog="Each flag can also be set through the environment variable shown with it.",
    )

    def env(flag: str, var: str, help_text: str, default: str | None = None) -> None:
        p.add_argument(flag, default=os.environ.get(var, default), help=f"{help_text} [env {var}]")

    env("--kubeconfig", "KUBECONFIG", "kubeconfig file; in-cluster config when not given")
    env("--namespace", "POD_NAMESPACE", "the job's namespace")
    env("--selector", "SHOAL_DISCOVER_SELECTOR", "label selector of the job's worker pods")
    env("--slots", "SHOAL_DISCOVER_SLOTS", "slots (GPUs) per host", "1")
    env(
        "--format",
        "SHOAL_DISCOVER_FORMAT",
        "host name format: {name} {namespace} {ip} {subdomain} {node}",
        "{ip}",
    )
    args = p.parse_args(argv)
    if not args.namespace or not args.selector:
        p.error("--namespace and --selector are required")
    if not str(args.slots).isdecimal() or int(args.slots) < 1:
        p.error(f"--slots: expected a positive integer, got {args.slots!r}")
    try:
        api = kubeconfig.official_client(kubeconfig.load(args.kubeconfig), client, config)
    except kubeconfig.KubeconfigError as exc:
        # Names the file and the field, never a value (kubeconfigs hold tokens and keys).
        print(f"{p.prog}: {exc}", file=sys.stderr)
        return 2
    with api:
        for line in hosts(
            client.CoreV1Api(api), args.namespace, args.selector, int(args.slots), args.format
        ):
            print(line)
    return 0


if __name__ == "__main__":
    sys.exit(main())
