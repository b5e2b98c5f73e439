"""The webhook's API writes: its CA in the MutatingWebhookConfiguration, Events for owners.

``CaBundle.keep`` puts this process's CA certificate into the ``caBundle`` of every webhook in
the named configuration. Each replica makes its own CA at start-up, so the bundle holds several:
this one is added and the newest few others are kept (``KEEP``), so that replicas that run side
by side are all trusted while CAs of replicas long gone fall out. The write is an update with
the read's resourceVersion (a conflict with another replica is read again and retried), and the
program calls ``keep`` again from time to time, which puts its CA back if it fell out.

``OwnerEvents`` tells the owner of a pod (a Job, a PyTorchJob's controller) that its pods' wiring
request could not be followed: the pod does not exist yet when the webhook answers, and the
warning in the answer goes to whoever created the pod — a controller, for most training pods.
One Event per owner and message every ``interval`` seconds, sent off the request path.

``PodEvents`` tells the pod itself, once it exists: the scheduler's pod informer hands it each
new pod, and a pod that carries ``shoal.dev/wiring-warning`` (the webhook's record of what it
could not follow) gets one Warning Event with that text, naming the pod's uid so that
``kubectl describe pod`` shows it — a bare pod, a gang member, a controller's pod alike. The
Event's name is the pod's name and uid, so replicas that all see the pod write it once.
"""

from __future__ import annotations

import base64
import re
import threading
import time
from collections.abc import Mapping
from concurrent.futures import ThreadPoolExecutor
from typing import Any
from urllib.parse import quote

import structlog
from kubernetes import client
from kubernetes.client.exceptions import ApiException
from urllib3.exceptions import HTTPError

from common.kubeevents import EventSource, event_body
from contracts import names
from scheduler.k8s.client import ApiError, Rest

log = structlog.get_logger("scheduler.webhook")

KEEP = 4
#: Seconds one read or write of the configuration may take (a shutdown waits for it).
REQUEST_TIMEOUT = 10
_PEM = re.compile(rb"-----BEGIN CERTIFICATE-----.+?-----END CERTIFICATE-----\n?", re.S)
REASON = "ShoalWiringIgnored"


def merged_bundle(bundle: bytes, ca_pem: bytes, keep: int = KEEP) -> bytes:
    """``bundle`` with ``ca_pem`` last and at most ``keep - 1`` of the others (the newest)."""
    ours = ca_pem.strip() + b"\n"
    others = [c.strip() + b"\n" for c in _PEM.findall(bundle) if c.strip() + b"\n" != ours]
    return b"".join([*others[-(keep - 1) :], ours] if keep > 1 else [ours])


class CaBundle:
    """Keeps one CA certificate in a MutatingWebhookConfiguration's ``caBundle``."""

    def __init__(self, api: Any, name: str, *, attempts: int = 5) -> None:
        self._api = client.AdmissionregistrationV1Api(api)
        self._name = name
        self._attempts = attempts

    def keep(self, ca_pem: bytes) -> bool:
        """True when every webhook of the configuration trusts ``ca_pem`` (after a write if
        one was needed); False, logged, when the configuration is missing or cannot be read
        or written (the webhook then goes uncalled: failurePolicy Ignore)."""
        for _ in range(self._attempts):
            try:
                return self._keep_once(ca_pem)
            except ApiException as exc:
                if exc.status == 409:
                    continue
                log.warning(
                    "webhook_ca_bundle_not_kept",
                    configuration=self._name,
                    status=exc.status,
                    reason=exc.reason,
                )
                return False
            except (HTTPError, OSError) as exc:
                log.warning("webhook_ca_bundle_not_kept", configuration=self._name, reason=str(exc))
                return False
        log.warning("webhook_ca_bundle_not_kept", configuration=self._name, reason="conflicts")
        return False

    def _keep_once(self, ca_pem: bytes) -> bool:
        config = self._api.read_mutating_webhook_configuration(
            self._name, _request_timeout=REQUEST_TIMEOUT
        )
        changed = False
        for webhook in config.webhooks or []:
            current = base64.b64decode(webhook.client_config.ca_bundle or "")
            if ca_pem.strip() in current:
                continue
            merged = merged_bundle(current, ca_pem)
            webhook.client_config.ca_bundle = base64.b64encode(merged).decode()
            changed = True
        if changed:
            self._api.replace_mutating_webhook_configuration(
                self._name, config, _request_timeout=REQUEST_TIMEOUT
            )
            log.info("webhook_ca_bundle_kept", configuration=self._name)
        return True


class OwnerEvents:
    """Warning Events on the controller of pods whose wiring request was not followed."""

    def __init__(self, api: Any, component: str, *, interval: float = 60.0) -> None:
        self._rest = Rest(api, timeout=10)
        self._by = EventSource(component, component)
        self._interval = interval
        self._sent: dict[tuple[str, str], float] = {}
        self._lock = threading.Lock()
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="webhook-events")

    def report(self, namespace: str, pod: Mapping[str, Any], warnings: tuple[str, ...]) -> None:
        """Queue one Event on the pod's controller, unless that owner heard it lately."""
        owner = _controller(pod)
        if owner is None:
            return  # a pod without a controller: its creator saw the warning itself
        message = "; ".join(warnings)
        key, now = (owner["uid"], message), time.monotonic()
        with self._lock:
            if now - self._sent.get(key, -self._interval) < self._interval:
                return
            if len(self._sent) > 1000:
                self._sent.clear()
            self._sent[key] = now
        self._pool.submit(self._send, namespace, owner, message)

    def _send(self, namespace: str, owner: dict[str, str], message: str) -> None:
        involved = {**owner, "namespace": namespace}
        body = event_body(involved, "Warning", REASON, message, by=self._by, now=time.time())
        try:
            self._rest.call("POST", f"/api/v1/namespaces/{quote(namespace, safe='')}/events", body)
        except (ApiError, HTTPError, OSError) as exc:
            log.warning("webhook_event_failed", owner=owner["name"], error=str(exc))

    def close(self) -> None:
        self._pool.shutdown(wait=True, cancel_futures=True)


class PodEvents:
    """A Warning Event on each new pod the webhook admitted without part of its request."""

    def __init__(self, api: Any, component: str) -> None:
        self._rest = Rest(api, timeout=10)
        self._by = EventSource(component, component)
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="wiring-events")

    def pod_added(
        self, namespace: str, name: str, uid: str, annotations: Mapping[str, str]
    ) -> None:
        """Queue the Event for a pod just created, if the webhook left a warning on it."""
        warning = annotations.get(names.WIRING_WARNING_ANNOTATION)
        if not warning or not uid:
            return
        self._pool.submit(self._send, namespace, name, uid, warning)

    def _send(self, namespace: str, name: str, uid: str, warning: str) -> None:
        involved = {"apiVersion": "v1", "kind": "Pod", "name": name, "uid": uid}
        involved["namespace"] = namespace
        message = f"created without part of its wiring: {warning}"
        body = event_body(involved, "Warning", REASON, message, by=self._by, now=time.time())
        del body["metadata"]["generateName"]
        body["metadata"]["name"] = f"{name[:200].rstrip('-.')}.{uid}.wiring"
        try:
            self._rest.call("POST", f"/api/v1/namespaces/{quote(namespace, safe='')}/events", body)
        except ApiError as exc:
            if exc.status != 409:  # another replica wrote it
                log.warning("wiring_event_failed", pod=name, namespace=namespace, error=str(exc))
        except (HTTPError, OSError) as exc:
            log.warning("wiring_event_failed", pod=name, namespace=namespace, error=str(exc))

    def close(self) -> None:
        self._pool.shutdown(wait=True, cancel_futures=True)


def _controller(pod: Mapping[str, Any]) -> dict[str, str] | None:
    meta = pod.get("metadata")
    refs = meta.get("ownerReferences") if isinstance(meta, Mapping) else None
    for ref in refs if isinstance(refs, list) else []:
        if isinstance(ref, Mapping) and ref.get("controller") and ref.get("uid"):
            return {k: str(ref.get(k, "")) for k in ("apiVersion", "kind", "name", "uid")}
    return None
