"""The capacity-risk ledger (:mod:`scheduler.placement.risk`) kept in a ConfigMap.

The ConfigMap (``--capacity-risk-configmap``, in ``--lease-namespace``) holds two keys:
``counts.json``, the learned counts (the ledger's document), which the scheduler writes; and
``seed.yaml``, which the operator may write: a table of revocation rates per pool (the same
format as the ``--capacity-risk-seed`` file; the file wins for a pool both name).

A scheduler reads the ConfigMap when it starts and again when it becomes the leader; only the
leader writes, at most once per ``interval`` seconds and only when the counts changed since its
last write (:class:`RiskKeeper`), so the API cost is bounded whatever happens on the nodes; and
not before there is something to keep (a revocation counted, or an operator's table): a cluster
that never sees a notice gets no ConfigMap.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Callable, Mapping
from typing import Any, Final

import structlog
import yaml
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from scheduler.placement.risk import Pool, RiskLedger, seed_rows

log = structlog.get_logger("scheduler.risk")

COUNTS_KEY: Final = "counts.json"
SEED_KEY: Final = "seed.yaml"


def read_seed(text: str, where: str) -> dict[Pool, float]:
    """The operator's table in ``text`` (YAML or JSON); ``ValueError`` naming ``where``."""
    try:
        rows = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise ValueError(f"{where}: not YAML: {exc}") from exc
    try:
        return seed_rows(rows or [])
    except ValueError as exc:
        raise ValueError(f"{where}: {exc}") from exc


class RiskStore:
    """Reads and writes the ConfigMap."""

    def __init__(self, api: Any, namespace: str, name: str) -> None:
        self._core = client.CoreV1Api(api)
        self.namespace = namespace
        self.name = name

    def read(self) -> Mapping[str, str]:
        """The ConfigMap's data; empty when there is none yet."""
        try:
            found = self._core.read_namespaced_config_map(self.name, self.namespace)
        except ApiException as exc:
            if exc.status == 404:
                return {}
            raise
        return dict(found.data or {})

    def write(self, document: Mapping[str, Any]) -> None:
        """Put ``document`` under ``counts.json`` (the other keys are left as they are)."""
        body = {"data": {COUNTS_KEY: json.dumps(document, sort_keys=True)}}
        try:
            self._core.patch_namespaced_config_map(self.name, self.namespace, body)
        except ApiException as exc:
            if exc.status != 404:
                raise
            created = {"metadata": {"name": self.name, "namespace": self.namespace}, **body}
            self._core.create_namespaced_config_map(self.namespace, created)


def restore(ledger: RiskLedger, data: Mapping[str, str], seed: Mapping[Pool, float]) -> None:
    """Give ``ledger`` the counts and the operator's table of ``data`` (a ConfigMap's), the
    ``seed`` file's table over the ConfigMap's. A bad key is logged and skipped."""
    priors: dict[Pool, float] = {}
    if SEED_KEY in data:
        try:
            priors.update(read_seed(data[SEED_KEY], f"ConfigMap key {SEED_KEY}"))
        except ValueError as exc:
            log.warning("capacity_risk_seed_ignored", reason=str(exc))
    priors.update(seed)
    ledger.priors = priors
    if COUNTS_KEY in data:
        try:
            ledger.restore(json.loads(data[COUNTS_KEY]))
        except (ValueError, KeyError, TypeError) as exc:
            log.warning("capacity_risk_counts_ignored", reason=str(exc))


class RiskKeeper:
    """The thread that writes the ledger while this replica may write, at a bounded rate."""

    def __init__(
        self,
        store: RiskStore,
        ledger: RiskLedger,
        *,
        seed: Mapping[Pool, float],
        interval: float,
        may_write: Callable[[], bool],
    ) -> None:
        self._store = store
        self._ledger = ledger
        self._seed = dict(seed)
        self._interval = max(interval, 0.5)
        self._may_write = may_write
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="capacity-risk", daemon=True)
        self._written: float | None = None
        self._leading = False
        self._ticks = 0
        #: Writes made (for the log and tests of the budget).
        self.writes = 0

    def load(self) -> None:
        """Read the ConfigMap into the ledger (at start, and on becoming the leader)."""
        try:
            restore(self._ledger, self._store.read(), self._seed)
        except ApiException as exc:
            log.warning("capacity_risk_read_failed", status=exc.status, reason=exc.reason)
        else:
            log.info("capacity_risk_loaded", pools=len(self._ledger.counts))

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        """Stop the thread, then write what is new once more (while still leading)."""
        self._stop.set()
        self._thread.join(timeout=5)
        try:
            self.tick()
        except Exception as exc:  # stopping: logged, nothing else to do
            log.warning("capacity_risk_write_failed", error=f"{type(exc).__name__}: {exc}")

    def _run(self) -> None:
        while not self._stop.wait(self._interval):
            try:
                self.tick()
            except Exception as exc:  # logged; the next tick tries again
                log.warning("capacity_risk_write_failed", error=f"{type(exc).__name__}: {exc}")

    def tick(self) -> bool:
        """Write once if this replica may and the counts moved since the last write."""
        self._ticks += 1
        if not self._may_write():
            self._leading = False
            return False
        if not self._leading:
            self._leading = True
            if self._ticks > 1:  # leading since the start's read: another leader may have written
                self.load()
        last = self._ledger.last
        if last is None or last == self._written or not self._ledger.worth_keeping():
            return False
        self._store.write(self._ledger.document())
        self._written = last
        self.writes += 1
        return True
