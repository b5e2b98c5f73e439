"""``python -m nodeagent``: flags (each with an environment variable), logging, and the run."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
import os
import signal
import sys
from collections.abc import Callable, Sequence
from datetime import timedelta
from typing import Any

import structlog

from contracts.names import REVOKING_TAINT
from nodeagent import health, podresources
from nodeagent.agent import Agent, AgentSettings
from nodeagent.events import PodKey, PodUid
from nodeagent.gpu.xid import XidPolicy
from nodeagent.notify.server import DEFAULT_SOCKET, serve
from nodeagent.providers import Provider, select
from nodeagent.providers.kube import DEFAULT_TAINTS, KubePodProvider, KubeTaintProvider
from nodeagent.store import Settings
from nodeagent.webhook import Webhook

log = structlog.get_logger("nodeagent")


def _truthy(text: str) -> bool:
    value = text.strip().lower()
    if value in ("1", "true", "yes", "on"):
        return True
    if value in ("", "0", "false", "no", "off"):
        return False
    raise argparse.ArgumentTypeError(f"expected true or false, got {text!r}")


MAX_SECONDS = 7 * 24 * 3600.0


def _positive(text: str) -> float:
    try:
        value = float(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(f"expected a number of seconds, got {text!r}") from exc
    # Finite and at most a week: every value here becomes a timedelta or a sleep.
    if not 0 < value <= MAX_SECONDS:
        raise argparse.ArgumentTypeError(
            f"expected a number of seconds above 0 and at most {MAX_SECONDS:g}, got {text!r}"
        )
    return value


def _xids(text: str) -> frozenset[int]:
    try:
        return frozenset(int(part) for part in text.split(",") if part.strip())
    except ValueError as exc:
        raise argparse.ArgumentTypeError(f"expected XID numbers like 48,79; got {text!r}") from exc


def _taint_keys(text: str) -> frozenset[str]:
    keys = frozenset(part.strip() for part in text.split(",") if part.strip())
    if REVOKING_TAINT in keys:
        raise argparse.ArgumentTypeError(f"{REVOKING_TAINT} is the agent's own taint")
    return keys


def _conditions(text: str) -> frozenset[Any]:
    from nodeagent.k8s import ConditionRule

    try:
        return frozenset(ConditionRule.parse(p) for p in text.split(",") if p.strip())
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from exc


def _reasons(text: str) -> frozenset[str]:
    return frozenset(part.strip() for part in text.split(",") if part.strip())


def _listen(text: str) -> tuple[str, int]:
    host, sep, port = text.rpartition(":")
    if not sep or not port.isdecimal() or int(port) > 65535:
        raise argparse.ArgumentTypeError(f"expected HOST:PORT, got {text!r}")
    return host or "0.0.0.0", int(port)  # noqa: S104 - a DaemonSet's probe port


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m nodeagent",
        description="Shoal node agent: hears the cloud's revocation notices, tells the training "
        "workers on this node to checkpoint and leave before the deadline, then drains them.",
        epilog="Every flag can also be set through the environment variable shown with it; the "
        "flag wins over the variable.",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )

    def add(
        flag: str, env: str, help_text: str, default: Any = None, kind: Callable[[str], Any] = str
    ) -> None:
        value = os.environ.get(env)
        p.add_argument(
            flag,
            default=value if value is not None else default,
            type=kind,
            help=f"{help_text} [env {env}]",
        )

    add("--kubeconfig", "KUBECONFIG", "kubeconfig file; in-cluster config when not given")
    add("--node-name", "NODE_NAME", "this node's name (the Downward API's spec.nodeName)")
    p.add_argument(
        "--provider",
        default=os.environ.get("SHOAL_PROVIDER", "auto"),
        choices=select.NAMES,
        help="which cloud's metadata to watch; auto: from DMI or whichever server answers "
        "[env SHOAL_PROVIDER]",
    )
    add(
        "--metadata-url",
        "SHOAL_METADATA_URL",
        "root URL of the metadata server (default: the cloud's link-local address)",
    )
    try:
        dry_default = _truthy(os.environ.get("SHOAL_DRY_RUN", ""))
    except argparse.ArgumentTypeError as exc:
        p.error(f"SHOAL_DRY_RUN: {exc}")
    p.add_argument(
        "--dry-run",
        action="store_true",
        default=dry_default,
        help="do everything except writes: the API server validates each write without "
        "persisting it, the cloud is not acknowledged [env SHOAL_DRY_RUN]",
    )
    add("--socket", "SHOAL_SOCKET", "unix socket of the Notices gRPC service", DEFAULT_SOCKET)
    add("--listen", "SHOAL_LISTEN", "HOST:PORT of the HTTP endpoints", "0.0.0.0:9102", _listen)
    add("--poll-interval", "SHOAL_POLL_INTERVAL", "seconds between metadata reads", 1.0, _positive)
    add("--metadata-timeout", "SHOAL_METADATA_TIMEOUT", "seconds per metadata read", 2.0, _positive)
    add(
        "--evict-margin",
        "SHOAL_EVICT_MARGIN",
        "seconds before the deadline when workers that have not acknowledged are evicted",
        15.0,
        _positive,
    )
    add(
        "--delete-margin",
        "SHOAL_DELETE_MARGIN",
        "seconds before the deadline when pods still there are deleted (last resort)",
        5.0,
        _positive,
    )
    add(
        "--drain-lead",
        "SHOAL_DRAIN_LEAD",
        "pods that are not training workers are not evicted earlier than this before the deadline",
        600.0,
        _positive,
    )
    p.add_argument(
        "--gpu",
        default=os.environ.get("SHOAL_GPU", "auto"),
        choices=("auto", "off"),
        help="auto: watch the GPUs through NVML when a driver is there (its absence is reported, "
        "not fatal) and publish shoal.dev/gpu-topology [env SHOAL_GPU]",
    )
    add(
        "--xid-fatal",
        "SHOAL_XID_FATAL",
        "comma-separated XIDs that mark a GPU failed (default: NVIDIA's reset/replace XIDs)",
        None,
        _xids,
    )
    add(
        "--xid-ignore",
        "SHOAL_XID_IGNORE",
        "comma-separated XIDs that leave a GPU healthy (default: application errors "
        "13, 31, 43, 45, 68, 109)",
        None,
        _xids,
    )
    add(
        "--gpu-fault-lead",
        "SHOAL_GPU_FAULT_LEAD",
        "seconds the pods holding a failed GPU get to leave",
        30.0,
        _positive,
    )
    add(
        "--pod-resources-socket",
        "SHOAL_POD_RESOURCES_SOCKET",
        "the kubelet's PodResources socket (which GPU serves which pod); empty to skip",
        podresources.DEFAULT_SOCKET,
    )
    add(
        "--kube-taints",
        "SHOAL_KUBE_TAINTS",
        "comma-separated node taint keys that announce the node's removal (autoscalers, "
        "Karpenter, platform handlers); empty to ignore taints",
        ",".join(DEFAULT_TAINTS),
        _taint_keys,
    )
    add(
        "--kube-taint-lead",
        "SHOAL_KUBE_TAINT_LEAD",
        "seconds the workers get after such a taint appears",
        120.0,
        _positive,
    )
    add(
        "--webhook-url",
        "SHOAL_WEBHOOK_URL",
        "POST a JSON message here when a notice arrives and when the node has drained",
    )
    add(
        "--kube-pod-conditions",
        "SHOAL_KUBE_POD_CONDITIONS",
        "comma-separated pod conditions (Type=Status or Type=Status:Reason) that warn a pod of "
        "its removal; the pod gets a notice of its own",
        "",
        _conditions,
    )
    add(
        "--kube-event-reasons",
        "SHOAL_KUBE_EVENT_REASONS",
        "comma-separated Event reasons on a pod that warn it of its removal (e.g. a platform's "
        "pre-release event)",
        "",
        _reasons,
    )
    add(
        "--kube-pod-lead",
        "SHOAL_KUBE_POD_LEAD",
        "seconds a warned pod gets to leave",
        300.0,
        _positive,
    )
    add("--azure-vm-name", "SHOAL_AZURE_VM_NAME", "this VM's name in Azure scheduled events")
    p.add_argument(
        "--log-format",
        default=os.environ.get("SHOAL_LOG_FORMAT", "auto"),
        choices=("auto", "json", "console"),
        help="auto: JSON unless stderr is a terminal [env SHOAL_LOG_FORMAT]",
    )
    p.add_argument(
        "--log-level",
        default=os.environ.get("SHOAL_LOG_LEVEL", "info"),
        choices=("debug", "info", "warning", "error"),
        help="[env SHOAL_LOG_LEVEL]",
    )
    return p


def configure_logging(fmt: str, level: str) -> None:
    console = fmt == "console" or (fmt == "auto" and sys.stderr.isatty())
    renderer: Any = (
        structlog.dev.ConsoleRenderer() if console else structlog.processors.JSONRenderer()
    )
    structlog.configure(
        processors=[
            structlog.contextvars.merge_contextvars,
            structlog.processors.add_log_level,
            structlog.processors.TimeStamper(fmt="iso", utc=True),
            structlog.processors.format_exc_info,
            renderer,
        ],
        wrapper_class=structlog.make_filtering_bound_logger(
            logging.getLevelNamesMapping()[level.upper()]
        ),
        logger_factory=structlog.PrintLoggerFactory(file=sys.stderr),
        cache_logger_on_first_use=True,
    )


async def run(args: argparse.Namespace) -> int:
    from nodeagent.k8s import Cluster

    provider_name = args.provider
    if provider_name == "auto":
        provider_name = await select.detect(args.metadata_url)
    provider = select.build(
        provider_name,
        metadata_url=args.metadata_url,
        interval=args.poll_interval,
        timeout=args.metadata_timeout,
        azure_vm_name=args.azure_vm_name,
    )
    cluster = Cluster.connect(args.kubeconfig, args.node_name, dry_run=args.dry_run)
    settings = AgentSettings(
        store=Settings(
            evict_margin=timedelta(seconds=args.evict_margin),
            delete_margin=timedelta(seconds=args.delete_margin),
            drain_lead=timedelta(seconds=args.drain_lead),
        )
    )
    providers: list[Provider] = [provider]
    if args.kube_taints:
        providers.append(
            KubeTaintProvider(
                read_taints=cluster.node_taints,
                keys=args.kube_taints,
                lead=timedelta(seconds=args.kube_taint_lead),
            )
        )
    if args.kube_pod_conditions or args.kube_event_reasons:
        conditions, reasons = args.kube_pod_conditions, args.kube_event_reasons

        def signals() -> list[tuple[PodKey, PodUid, str]]:
            found = cluster.pod_signals(conditions, reasons)
            return [(s.key, s.uid, s.what) for s in found]

        providers.append(
            KubePodProvider(read_signals=signals, lead=timedelta(seconds=args.kube_pod_lead))
        )
    agent = Agent(cluster, providers, node_name=args.node_name, settings=settings)
    if args.webhook_url:
        agent.webhook = Webhook(args.webhook_url)
    if args.gpu == "auto":
        defaults = XidPolicy()
        socket_path = args.pod_resources_socket

        async def owners() -> dict[str, str]:
            return await podresources.gpu_owners(socket_path)

        agent.watch_gpus(
            XidPolicy(
                ignore=defaults.ignore if args.xid_ignore is None else args.xid_ignore,
                fatal=defaults.fatal if args.xid_fatal is None else args.xid_fatal,
            ),
            owners if socket_path else None,
            timedelta(seconds=args.gpu_fault_lead),
        )
    grpc_server = await serve(agent.service, args.socket)
    host, port = args.listen
    runner, bound = await health.serve(agent, host, port)
    agent.start()
    log.info(
        "agent_started",
        node=args.node_name,
        provider=provider_name,
        dry_run=args.dry_run,
        socket=args.socket,
        http=f"{host}:{bound}",
    )
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    await stop.wait()
    log.info("agent_stopping", node=args.node_name)
    await agent.stop()
    await grpc_server.stop(1.0)
    await runner.cleanup()
    with contextlib.suppress(Exception):
        cluster.close()
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    args = parser().parse_args(argv)
    if not args.node_name:
        parser().error("--node-name (or NODE_NAME) is required")
    configure_logging(args.log_format, args.log_level)
    return asyncio.run(run(args))
