"""Prometheus metrics of one scheduler instance (its own registry, so several can share a
process, as the tests do)."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

_FAST = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5)
_SLOW = (0.1, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600, 1800, 3600)


class Metrics:
    """Every metric, registered in its instance's own registry: timings, then counts, then
    levels (the order they are exposed in)."""

    registry: CollectorRegistry
    cycle_seconds: Histogram
    decision_seconds: Histogram
    gang_latency_seconds: Histogram
    binds: Counter
    reclaims: Counter
    torn_released: Counter
    pending_gangs: Gauge
    invalid_gangs: Gauge
    queue_entries: Gauge
    binds_in_flight: Gauge
    cached_pods: Gauge
    status_backlog: Gauge

    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        self._register_timings()
        self._register_counts()
        self._register_levels()

    def _register_timings(self) -> None:
        """How long cycles and decisions take, and how long gangs wait to be placed."""
        self.cycle_seconds = Histogram(
            "shoal_scheduler_cycle_duration_seconds",
            "Time of one scheduling cycle (snapshot, gangs, decision), by result.",
            ["result"],
            buckets=_FAST,
            registry=self.registry,
        )
        self.decision_seconds = Histogram(
            "shoal_scheduler_gang_decision_seconds",
            "Time to decide one gang on one snapshot (placement search only).",
            buckets=_FAST,
            registry=self.registry,
        )
        self.gang_latency_seconds = Histogram(
            "shoal_scheduler_gang_scheduling_latency_seconds",
            "From the gang's creation to the cycle that placed its minimum.",
            buckets=_SLOW,
            registry=self.registry,
        )

    def _register_counts(self) -> None:
        """What the scheduler did: bindings, pods reclaimed, torn gangs released."""
        self.binds = Counter(
            "shoal_scheduler_binds",
            "Pod bindings, by result.",
            ["result"],
            registry=self.registry,
        )
        self.reclaims = Counter(
            "shoal_scheduler_reclaims",
            "Pods asked to leave to make room for a gang's minimum.",
            registry=self.registry,
        )
        self.torn_released = Counter(
            "shoal_scheduler_torn_gangs_released",
            "Gangs left below their minimum past the grace whose bound members were evicted.",
            registry=self.registry,
        )

    def _register_levels(self) -> None:
        """What is waiting now: gangs, queue entries, bindings and status writes in flight."""
        self.pending_gangs = Gauge(
            "shoal_scheduler_pending_gangs",
            "Gangs with pending members.",
            registry=self.registry,
        )
        self.invalid_gangs = Gauge(
            "shoal_scheduler_invalid_gangs",
            "Gangs whose definition is wrong (see their Warning events).",
            registry=self.registry,
        )
        self.queue_entries = Gauge(
            "shoal_scheduler_queue_entries",
            "Gangs the queue remembers (attempts and backoff); pruned to the gangs that exist.",
            registry=self.registry,
        )
        self.binds_in_flight = Gauge(
            "shoal_scheduler_binds_in_flight",
            "Bindings sent and not yet answered.",
            registry=self.registry,
        )
        self.cached_pods = Gauge(
            "shoal_scheduler_cached_pods",
            "Pods in the scheduler's cache (every pod the informer sees, any scheduler).",
            registry=self.registry,
        )
        self.status_backlog = Gauge(
            "shoal_scheduler_status_backlog",
            "Status writes (conditions, Events, PodGroup status) waiting to be sent; capped.",
            registry=self.registry,
        )
