"""The HTTPS endpoint the API server calls: ``POST /mutate`` with an AdmissionReview (v1).

Every answer allows the pod: the wiring is an addition, never a condition of admission. A pod
for another scheduler, or one already wired, gets no patch; a bad checkpoint request gets its
warnings (``kubectl`` prints them) and the ``on_warning`` callback (an Event for the pod's
owner). A body that is not an AdmissionReview is a 400; the API server then applies the
configuration's ``failurePolicy`` (Ignore in the manifests: the pod is created unwired).
"""

from __future__ import annotations

import base64
import json
import ssl
from collections.abc import Callable, Mapping
from typing import Any

import structlog
from aiohttp import web

from scheduler.webhook.wiring import Layout, wire

log = structlog.get_logger("scheduler.webhook")

#: Told about a pod admitted with warnings: (its namespace, the pod as submitted, the warnings).
WarningSink = Callable[[str, Mapping[str, Any], tuple[str, ...]], None]

PATH = "/mutate"


class NotAReview(ValueError):
    """The request body is not an AdmissionReview v1 with a request."""


def answer(
    review: Any, scheduler_name: str, layout: Layout
) -> tuple[dict[str, Any], tuple[str, ...]]:
    """The AdmissionReview that answers ``review``, and the warnings it carries."""
    if not isinstance(review, dict) or review.get("apiVersion") != "admission.k8s.io/v1":
        raise NotAReview("expected an admission.k8s.io/v1 AdmissionReview")
    request = review.get("request")
    if not isinstance(request, dict) or not isinstance(request.get("uid"), str):
        raise NotAReview("the AdmissionReview has no request uid")
    pod = request.get("object")
    wiring = wire(pod if isinstance(pod, dict) else {}, scheduler_name, layout)
    response: dict[str, Any] = {"uid": request["uid"], "allowed": True}
    if wiring.ops:
        patch = json.dumps([op.as_json() for op in wiring.ops]).encode()
        response["patchType"] = "JSONPatch"
        response["patch"] = base64.b64encode(patch).decode()
    if wiring.warnings:
        response["warnings"] = list(wiring.warnings)
    body = {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "response": response}
    return body, wiring.warnings


def app(scheduler_name: str, layout: Layout, on_warning: WarningSink) -> web.Application:
    async def mutate(request: web.Request) -> web.Response:
        try:
            review = await request.json()
            body, warnings = answer(review, scheduler_name, layout)
        except (ValueError, NotAReview) as exc:
            log.warning("webhook_bad_request", error=str(exc))
            return web.Response(status=400, text=f"{exc}\n")
        if warnings:
            pod = review["request"].get("object") or {}
            meta = pod.get("metadata") or {}
            namespace = str(review["request"].get("namespace") or meta.get("namespace") or "")
            log.warning(
                "pod_wiring_warning",
                pod=meta.get("name") or meta.get("generateName", ""),
                namespace=namespace,
                warning="; ".join(warnings),
            )
            on_warning(namespace, pod, warnings)
        return web.json_response(body)

    application = web.Application(client_max_size=4 * 1024 * 1024)
    application.router.add_post(PATH, mutate)
    return application


async def serve(
    host: str, port: int, context: ssl.SSLContext, application: web.Application
) -> tuple[web.AppRunner, int]:
    """Start serving HTTPS; returns the runner (``cleanup()`` stops it) and the bound port."""
    # On the way out, a request in flight gets 5 s, well inside the pod's grace (aiohttp's own
    # default, 60 s, would outlast it).
    runner = web.AppRunner(application, access_log=None, shutdown_timeout=5.0)
    await runner.setup()
    site = web.TCPSite(runner, host, port, ssl_context=context)
    await site.start()
    addresses = runner.addresses
    bound = int(addresses[0][1]) if addresses else port
    return runner, bound
