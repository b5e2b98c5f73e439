"""Prometheus metrics of the node agent (one registry per agent, so tests can read it)."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

_SECONDS = (0.01, 0.05, 0.1, 0.25, 0.5, 1.0, 2.0, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0, 600.0)


class Metrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        r = self.registry
        self.metadata_reads = Counter(
            "shoal_agent_metadata_reads", "Successful metadata reads.", ["channel"], registry=r
        )
        self.metadata_errors = Counter(
            "shoal_agent_metadata_errors",
            "Failed metadata reads, by kind (unreachable, status, body, too-large, error).",
            ["channel", "kind"],
            registry=r,
        )
        self.notices = Counter(
            "shoal_agent_notices", "Notices detected.", ["source", "kind"], registry=r
        )
        self.withdrawn = Counter(
            "shoal_agent_notices_withdrawn", "Notices withdrawn by the cloud.", registry=r
        )
        self.lead = Histogram(
            "shoal_agent_notice_lead_seconds",
            "Time from detection to the notice's deadline.",
            buckets=_SECONDS,
            registry=r,
        )
        self.notify = Histogram(
            "shoal_agent_notify_seconds",
            "Time from detection to the workers being told over gRPC.",
            buckets=_SECONDS,
            registry=r,
        )
        self.ack = Histogram(
            "shoal_agent_time_to_ack_seconds",
            "Time from a pod's notice to its workers' acknowledgement.",
            buckets=_SECONDS,
            registry=r,
        )
        self.drain = Histogram(
            "shoal_agent_drain_seconds",
            "Time from detection to every pod of the node being out.",
            buckets=_SECONDS,
            registry=r,
        )
        self.actions = Counter(
            "shoal_agent_actions", "Actions carried out.", ["action", "result"], registry=r
        )
        self.active = Gauge("shoal_agent_active_notices", "Live notices.", registry=r)
        self.watchers = Gauge("shoal_agent_watchers", "Open worker notice watches.", registry=r)
        self.clock_offset = Gauge(
            "shoal_agent_clock_offset_seconds",
            "The reference's clock minus this node's, as measured from its answers' Date headers "
            "(apiserver, metadata).",
            ["reference"],
            registry=r,
        )
        self.clock_skew_warnings = Counter(
            "shoal_agent_clock_skew_warnings",
            "Warnings that this node's clock is off by more than the threshold.",
            ["reference"],
            registry=r,
        )
        self.socket_recreated = Counter(
            "shoal_agent_socket_recreated",
            "Times the notice socket was found removed (removed) or another file in its place "
            "(replaced), and served again.",
            ["reason"],
            registry=r,
        )
        self.progress_reports = Counter(
            "shoal_agent_progress_reports",
            "Progress reports taken from workers over the notice socket.",
            registry=r,
        )
        self.progress_writes = Counter(
            "shoal_agent_progress_writes",
            "Writes of a pod's shoal.dev/progress (at most one per pod per minute), by result: "
            "written, gone (the pod left), failed.",
            ["result"],
            registry=r,
        )
        self.socket_serving = Gauge(
            "shoal_agent_socket_serving",
            "1 while new workers can connect to the notice socket at its path, else 0.",
            registry=r,
        )
