"""``python -m nodeagent``: flags (each with an environment variable), logging, and the run."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from datetime import timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

import structlog

from common import logs
from common.leave import stop_asked, stop_on_signal
from common.values import parse_bool
from contracts.names import REVOKING_TAINT
from nodeagent.adapters import podresources
from nodeagent.adapters.gpu.monitor import GpuMonitor, GpuOptions
from nodeagent.adapters.gpu.xid import XidPolicy
from nodeagent.adapters.podcache import FILENAME, PodCache
from nodeagent.adapters.providers import select
from nodeagent.adapters.providers.base import Clock
from nodeagent.adapters.providers.kube import (
    DEFAULT_TAINTS,
    KubeEventProvider,
    KubePodProvider,
    KubeTaintProvider,
)
from nodeagent.adapters.webhook import Webhook
from nodeagent.core.events import PodKey
from nodeagent.core.ports import ClusterPort, Provider
from nodeagent.core.skew import APISERVER, METADATA
from nodeagent.core.store import Settings
from nodeagent.notify.peers import PeerRelay, StepGate
from nodeagent.notify.server import DEFAULT_SOCKET, SocketLimits, serve
from nodeagent.wiring import clock, health
from nodeagent.wiring.agent import Agent, AgentSettings, wall_clock

if TYPE_CHECKING:
    from nodeagent.adapters.k8s import Cluster

log = structlog.get_logger("nodeagent")

DEFAULT_STATE_DIR = "/var/lib/shoal-agent"
#: The termination lifecycle hook's default heartbeat timeout (seconds).
AWS_LIFECYCLE_LEAD = 3600.0


def _truthy(text: str) -> bool:
    try:
        return parse_bool(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


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


def _count(text: str) -> int:
    if not text.strip().isdecimal() or not 1 <= int(text) <= 1_000_000:
        raise argparse.ArgumentTypeError(f"expected a whole number from 1 to 1000000, got {text!r}")
    return int(text)


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
    from nodeagent.adapters.k8s import ConditionRule

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
    # ":9102" means every address, as in Go programs; the default is loopback only.
    return host or "0.0.0.0", int(port)  # noqa: S104 - asked for explicitly


class _Flags:
    """Adds flags to a parser, each with the environment variable that fills it in."""

    def __init__(self, parser: argparse.ArgumentParser) -> None:
        self.parser = parser

    @staticmethod
    def _help(text: str, env: str) -> str:
        return f"{text} [env {env}]" if text else f"[env {env}]"

    def add(
        self,
        flag: str,
        env: str,
        help_text: str,
        default: Any = None,
        kind: Callable[[str], Any] = str,
    ) -> None:
        value = os.environ.get(env)
        self.parser.add_argument(
            flag,
            default=value if value is not None else default,
            type=kind,
            help=self._help(help_text, env),
        )

    def choice(self, flag: str, env: str, help_text: str, default: str, choices: Any) -> None:
        self.parser.add_argument(
            flag,
            default=os.environ.get(env, default),
            choices=choices,
            help=self._help(help_text, env),
        )

    def switch(self, flag: str, env: str, help_text: str) -> None:
        """A flag that is on when given, or when ``env`` says true."""
        try:
            default = _truthy(os.environ.get(env, ""))
        except argparse.ArgumentTypeError as exc:
            self.parser.error(f"{env}: {exc}")
        self.parser.add_argument(
            flag, action="store_true", default=default, help=self._help(help_text, env)
        )


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m nodeagent",
        description="Shoal node agent: hears the cloud's revocation notices, tells the training "
        "workers on this node to checkpoint and leave before the deadline, then drains them.",
        epilog="Every flag can also be set through the environment variable shown with it; the "
        "flag wins over the variable.",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    flags = _Flags(p)
    _node_flags(flags)
    _socket_flags(flags)
    _endpoint_flags(flags)
    _timing_flags(flags)
    _gpu_flags(flags)
    _kube_flags(flags)
    _slurm_flags(flags)
    _log_flags(flags)
    return p


#: The platforms the agent runs on, and what its platform calls go through (docs/slurm.md).
KUBERNETES = "kubernetes"
SLURM = "slurm"
#: What the agent does with a Slurm job once its workers acknowledged or the margin came.
SLURM_ON_NOTICE = ("requeue", "shrink", "none")


def _node_flags(flags: _Flags) -> None:
    add = flags.add
    flags.choice(
        "--platform",
        "SHOAL_PLATFORM",
        "where the agent runs: kubernetes (a DaemonSet; taint, annotate, evict through the API "
        "server) or slurm (a service next to slurmd; drain, requeue through scontrol, no "
        "Kubernetes API; docs/slurm.md)",
        KUBERNETES,
        (KUBERNETES, SLURM),
    )
    add("--kubeconfig", "KUBECONFIG", "kubeconfig file; in-cluster config when not given")
    add("--node-name", "NODE_NAME", "this node's name (the Downward API's spec.nodeName)")
    flags.choice(
        "--provider",
        "SHOAL_PROVIDER",
        "which cloud's metadata to watch; auto: from DMI or whichever server answers",
        "auto",
        select.NAMES,
    )
    add(
        "--metadata-url",
        "SHOAL_METADATA_URL",
        "root URL of the metadata server (default: the cloud's link-local address)",
    )
    flags.switch(
        "--dry-run",
        "SHOAL_DRY_RUN",
        "do everything except writes: the API server validates each write without "
        "persisting it, the cloud is not acknowledged",
    )
    add("--socket", "SHOAL_SOCKET", "unix socket of the Notices gRPC service", DEFAULT_SOCKET)
    add(
        "--state-dir",
        "SHOAL_STATE_DIR",
        "folder (on the host, not shared with pods) where the agent keeps this node's pod list, so "
        "that after a restart it answers its workers while the API server is unreachable; empty "
        "to keep nothing",
        DEFAULT_STATE_DIR,
    )


def _socket_flags(flags: _Flags) -> None:
    add = flags.add
    limits = SocketLimits()
    add(
        "--max-watches",
        "SHOAL_MAX_WATCHES",
        "open watches on the notice socket, all pods together; more are refused with "
        "RESOURCE_EXHAUSTED (each costs about 40 KiB)",
        limits.watches,
        _count,
    )
    add(
        "--max-watches-per-pod",
        "SHOAL_MAX_WATCHES_PER_POD",
        "open watches of one pod; more are refused with RESOURCE_EXHAUSTED",
        limits.watches_per_pod,
        _count,
    )
    add(
        "--max-connections",
        "SHOAL_MAX_CONNECTIONS",
        "connections to the notice socket open at once; more are closed as soon as they are "
        "accepted (each costs about 20 KiB)",
        limits.connections,
        _count,
    )
    add(
        "--socket-streams",
        "SHOAL_SOCKET_STREAMS",
        "calls one connection to the notice socket may have open at once",
        limits.streams_per_connection,
        _count,
    )
    add(
        "--socket-idle-timeout",
        "SHOAL_SOCKET_IDLE_TIMEOUT",
        "seconds after which a connection to the notice socket with no call open is closed",
        limits.idle_seconds,
        _positive,
    )
    add(
        "--socket-keepalive",
        "SHOAL_SOCKET_KEEPALIVE",
        "seconds between pings to each connection; one that does not answer within 10 s is dropped",
        limits.keepalive_seconds,
        _positive,
    )
    add(
        "--watch-backlog",
        "SHOAL_WATCH_BACKLOG",
        "updates a watch may fall behind by before the agent ends it",
        limits.backlog,
        _count,
    )


def _endpoint_flags(flags: _Flags) -> None:
    flags.add(
        "--listen",
        "SHOAL_LISTEN",
        "HOST:PORT of the HTTP endpoints; loopback only by default, 0.0.0.0:9102 (as the "
        "DaemonSet sets) for the kubelet's probes and metrics scrapers on the pod network",
        "127.0.0.1:9102",
        _listen,
    )
    flags.switch(
        "--status-pods",
        "SHOAL_STATUS_PODS",
        "list the node's pods in /status to callers on the network too (by default only "
        "callers on loopback see them; others get a count)",
    )


def _timing_flags(flags: _Flags) -> None:
    add = flags.add
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
    add(
        "--clock-skew-warn",
        "SHOAL_CLOCK_SKEW_WARN",
        "seconds this node's clock may differ from the API server's (or the metadata server's) "
        "before the agent warns (log, ClockSkew Event on the node, metric); deadlines are always "
        "taken by the corrected clock",
        5.0,
        _positive,
    )


def _gpu_flags(flags: _Flags) -> None:
    add = flags.add
    flags.choice(
        "--gpu",
        "SHOAL_GPU",
        "auto: watch the GPUs through NVML when a driver is there (its absence is reported, "
        "not fatal) and publish shoal.dev/gpu-topology",
        "auto",
        ("auto", "off"),
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


def _kube_flags(flags: _Flags) -> None:
    add = flags.add
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
    add(
        "--aws-lifecycle-lead",
        "SHOAL_AWS_LIFECYCLE_LEAD",
        "seconds an EC2 Auto Scaling instance has left once its target lifecycle state is "
        "Terminated: the termination lifecycle hook's heartbeat timeout",
        AWS_LIFECYCLE_LEAD,
        _positive,
    )


def _slurm_flags(flags: _Flags) -> None:
    flags.choice(
        "--slurm-on-notice",
        "SHOAL_SLURM_ON_NOTICE",
        "with --platform slurm, what happens to a job on the node once its workers "
        "acknowledged (or the evict margin came): requeue it; shrink it off this node when it "
        "has other nodes and Slurm takes it (else requeue); none: leave it to Slurm",
        "requeue",
        SLURM_ON_NOTICE,
    )
    flags.add(
        "--scontrol",
        "SHOAL_SCONTROL",
        "with --platform slurm, the scontrol command the agent runs",
        "scontrol",
    )


def _log_flags(flags: _Flags) -> None:
    flags.choice(
        "--log-format",
        "SHOAL_LOG_FORMAT",
        "auto: JSON unless stderr is a terminal",
        "auto",
        ("auto", "json", "console"),
    )
    flags.choice(
        "--log-level", "SHOAL_LOG_LEVEL", "", "info", ("debug", "info", "warning", "error")
    )


def socket_limits(args: argparse.Namespace) -> SocketLimits:
    """The notice socket's bounds, from the flags."""
    return SocketLimits(
        watches=args.max_watches,
        watches_per_pod=args.max_watches_per_pod,
        connections=args.max_connections,
        streams_per_connection=args.socket_streams,
        idle_seconds=args.socket_idle_timeout,
        keepalive_seconds=args.socket_keepalive,
        backlog=args.watch_backlog,
    )


def providers(
    args: argparse.Namespace, cluster: Cluster, cloud: Provider, clock: Clock = wall_clock
) -> list[Provider]:
    """The cloud's provider, and the Kubernetes-side signals the flags ask for."""
    found: list[Provider] = [cloud]
    if args.kube_taints:
        found.append(
            KubeTaintProvider(
                feed=cluster.node_feed(),
                keys=args.kube_taints,
                lead=timedelta(seconds=args.kube_taint_lead),
                clock=clock,
            )
        )
    if args.kube_event_reasons:
        found.append(
            KubeEventProvider(
                feeds=[cluster.event_feed(r) for r in sorted(args.kube_event_reasons)],
                lead=timedelta(seconds=args.kube_pod_lead),
                clock=clock,
            )
        )
    if args.kube_pod_conditions:
        found.append(KubePodProvider(lead=timedelta(seconds=args.kube_pod_lead), clock=clock))
    return found


def gpu_options(args: argparse.Namespace) -> GpuOptions | None:
    """How to watch the GPUs (None with ``--gpu off``)."""
    if args.gpu != "auto":
        return None
    defaults = XidPolicy()
    socket_path = args.pod_resources_socket

    async def owners() -> dict[str, str]:
        return await podresources.gpu_owners(socket_path)

    return GpuOptions(
        policy=XidPolicy(
            ignore=defaults.ignore if args.xid_ignore is None else args.xid_ignore,
            fatal=defaults.fatal if args.xid_fatal is None else args.xid_fatal,
        ),
        owners=owners if socket_path else None,
        fault_lead=timedelta(seconds=args.gpu_fault_lead),
    )


def agent_settings(args: argparse.Namespace) -> AgentSettings:
    return AgentSettings(
        store=Settings(
            evict_margin=timedelta(seconds=args.evict_margin),
            delete_margin=timedelta(seconds=args.delete_margin),
            drain_lead=timedelta(seconds=args.drain_lead),
        )
    )


def build_agent(
    args: argparse.Namespace, cluster: Cluster, cloud: Provider, clock: Clock = wall_clock
) -> Agent:
    """The agent the flags describe, complete; taking deadlines by ``clock``."""
    pod_cache = None
    if args.state_dir:
        pod_cache = PodCache(Path(args.state_dir) / FILENAME, args.node_name)
    found = providers(args, cluster, cloud, clock)
    agent = Agent(
        cluster,
        found,
        node_name=args.node_name,
        settings=agent_settings(args),
        clock=clock,
        pod_cache=pod_cache,
        webhook=Webhook(args.webhook_url) if args.webhook_url else None,
        gpu=gpu_options(args),
        pod_feed=cluster.pod_feed(args.kube_pod_conditions),
    )
    # The pod signals are read from the pods the agent follows.
    for provider in found:
        if isinstance(provider, KubeEventProvider):
            provider.pod_of = agent.store.pod
        elif isinstance(provider, KubePodProvider):
            provider.pods = agent.store.pods
    return agent


class GpuJobs(Protocol):
    """The platform's answer to which job holds each GPU, by index (Slurm:
    :meth:`nodeagent.adapters.slurm.SlurmCluster.gpu_jobs`); blocking."""

    def gpu_jobs(self) -> dict[int, PodKey]: ...


class SlurmPort(ClusterPort, GpuJobs, Protocol):
    """What the Slurm agent's wiring needs of its platform adapter."""


def build_slurm_agent(
    args: argparse.Namespace, cluster: SlurmPort, cloud: Provider, clock: Clock = wall_clock
) -> Agent:
    """The agent on a Slurm node: the cloud's provider only (the Kubernetes-side signals have
    no Slurm counterpart), the jobs listed every few seconds (Slurm has no watch), and which
    job holds each GPU asked of Slurm instead of the kubelet."""
    pod_cache = None
    if args.state_dir:
        pod_cache = PodCache(Path(args.state_dir) / FILENAME, args.node_name)
    gpu = gpu_options(args)
    monitors: list[GpuMonitor] = []

    async def owners() -> dict[str, str]:
        """Each GPU's holder by uuid, as the GPU monitor wants it (Slurm names GPUs by index)."""
        held = await asyncio.to_thread(cluster.gpu_jobs)
        topology = monitors[0].topology if monitors else None
        if topology is None:
            return {}
        return {g.uuid: held[g.index] for g in topology.gpus if g.index in held}

    agent = Agent(
        cluster,
        [cloud],
        node_name=args.node_name,
        settings=agent_settings(args),
        clock=clock,
        pod_cache=pod_cache,
        webhook=Webhook(args.webhook_url) if args.webhook_url else None,
        gpu=None if gpu is None else replace(gpu, owners=owners),
    )
    if agent.gpu is not None:
        monitors.append(agent.gpu)
    return agent


@dataclass(slots=True)
class Platform:
    """The agent on its platform: how the clock's skew is reported on the node, what to close
    at the end, and (Slurm) the relay that knows each caller of the notice socket."""

    agent: Agent
    warn_node: Callable[[str, str], None]
    close: Callable[[], None]
    relay: PeerRelay | None = None


def kubernetes_platform(
    args: argparse.Namespace, cloud: Provider, clocks: clock.ClockCheck
) -> Platform:
    from nodeagent.adapters.k8s import Cluster

    cluster = Cluster.connect(
        args.kubeconfig,
        args.node_name,
        dry_run=args.dry_run,
        local=clocks.local,
        on_date=clocks.probe(APISERVER),
        wall=clocks.timestamp,
    )
    agent = build_agent(args, cluster, cloud, clocks.now)
    return Platform(agent, cluster.warn_node, cluster.close)


def slurm_platform(args: argparse.Namespace, cloud: Provider, clocks: clock.ClockCheck) -> Platform:
    """The agent next to slurmd: scontrol instead of the API server, and callers of the notice
    socket admitted by their job step (the Slurm adapter is imported only here)."""
    from nodeagent.adapters.slurm import OnNotice, SlurmCallers, SlurmCluster

    cluster = SlurmCluster(
        args.node_name,
        on_notice=OnNotice(args.slurm_on_notice),
        command=args.scontrol,
        state_dir=Path(args.state_dir) if args.state_dir else None,
        dry_run=args.dry_run,
    )
    agent = build_slurm_agent(args, cluster, cloud, clocks.now)
    relay = PeerRelay()
    agent.service.steps = StepGate(SlurmCallers(args.node_name, command=args.scontrol), relay)
    return Platform(agent, cluster.warn_node, cluster.close, relay)


def clock_check() -> clock.ClockCheck:
    """The agent's clock: the local one (shifted by the test hook ``SHOAL_TEST_CLOCK_OFFSET``
    when set, see :mod:`nodeagent.wiring.clock`), corrected by the measured offset."""
    shift = clock.injected_offset()
    if not shift:
        return clock.ClockCheck()
    log.warning("test_clock_offset", env=clock.TEST_OFFSET_ENV, seconds=shift)
    return clock.ClockCheck(lambda: time.time() + shift)


async def _until_signalled() -> None:
    stop = asyncio.Event()
    if stop_asked():
        log.info("stop_heard_while_starting")
    stop_on_signal(asyncio.get_running_loop(), stop.set)
    await stop.wait()


async def run(args: argparse.Namespace) -> int:
    provider_name = args.provider
    if provider_name == "auto":
        provider_name = await select.detect(args.metadata_url)
    clocks = clock_check()
    cloud = select.build(
        provider_name,
        metadata_url=args.metadata_url,
        interval=args.poll_interval,
        timeout=args.metadata_timeout,
        azure_vm_name=args.azure_vm_name,
        aws_lifecycle_lead=args.aws_lifecycle_lead,
        clock=clocks.now,
        local=clocks.local,
        on_date=clocks.probe(METADATA),
    )
    on = slurm_platform if args.platform == SLURM else kubernetes_platform
    platform = on(args, cloud, clocks)
    agent = platform.agent
    skew = clock.SkewWatch(
        clocks, agent.metrics, platform.warn_node, threshold=args.clock_skew_warn
    )
    grpc_server = await serve(
        agent.service,
        args.socket,
        socket_limits(args),
        metrics=agent.metrics,
        relay=platform.relay,
    )
    host, port = args.listen
    runner, bound = await health.serve(
        agent.reports, host, port, status_pods=args.status_pods, notice_socket=grpc_server
    )
    agent.start()
    agent.guard.run("clock", skew.run)
    log.info(
        "agent_started",
        node=args.node_name,
        platform=args.platform,
        provider=provider_name,
        dry_run=args.dry_run,
        socket=args.socket,
        http=f"{host}:{bound}",
    )
    await _until_signalled()
    log.info("agent_stopping", node=args.node_name)
    await agent.stop()
    await grpc_server.stop(1.0)
    await runner.cleanup()
    with contextlib.suppress(Exception):
        platform.close()
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    args = parser().parse_args(argv)
    if not args.node_name:
        parser().error("--node-name (or NODE_NAME) is required")
    logs.configure(args.log_format, args.log_level)
    if args.platform == SLURM:
        return asyncio.run(run(args))
    from nodeagent.adapters.k8s.transport import KubeconfigError

    try:
        return asyncio.run(run(args))
    except KubeconfigError as exc:
        # Names the file and the field, never a value (kubeconfigs hold tokens and keys).
        print(f"python -m nodeagent: {exc}", file=sys.stderr)
        return 2
