"""The webhook as part of the scheduler process: start it, tend it, stop it.

``start`` loads or makes the serving certificate, starts the HTTPS server on the program's
asyncio loop and, with a made certificate, puts its CA into the configuration's ``caBundle``.
``tend`` (called every few seconds by the program) loads a rotated certificate file and, once a
minute, makes sure the CA is still in the bundle. The webhook shares nothing with the
scheduling loop: a slow or failing API server delays no admission answer.
"""

from __future__ import annotations

import asyncio
import datetime
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import structlog
from aiohttp import web

from scheduler.k8s.webhook_config import CaBundle, OwnerEvents
from scheduler.settings import CliSettings
from scheduler.webhook import certs, server
from scheduler.webhook.wiring import Layout

log = structlog.get_logger("scheduler.webhook")

#: Seconds between checks that this process's CA is still in the caBundle.
KEEP_INTERVAL = 60.0


@dataclass
class Webhook:
    runner: web.AppRunner
    port: int
    context: Any  # ssl.SSLContext
    files: certs.FilePair | None
    ca_pem: bytes | None
    bundle: CaBundle | None
    events: OwnerEvents
    kept_at: float = 0.0

    async def tend(self) -> None:
        """Load a rotated certificate; keep the CA in the bundle (at most once a minute)."""
        if self.files is not None:
            try:
                if self.files.load_if_changed(self.context):
                    log.info("webhook_certificate_loaded", cert=str(self.files.cert))
            except (OSError, ValueError) as exc:
                log.error("webhook_certificate_unreadable", error=str(exc))
        if self.bundle is None or self.ca_pem is None:
            return
        now = time.monotonic()
        if self.kept_at and now - self.kept_at < KEEP_INTERVAL:
            return
        self.kept_at = now
        await asyncio.get_running_loop().run_in_executor(None, self.bundle.keep, self.ca_pem)

    async def close(self) -> None:
        await self.runner.cleanup()
        self.events.close()


async def start(settings: CliSettings, api: Any) -> Webhook:
    """Serve the webhook; raises OSError when the port or certificate files cannot be used."""
    name = str(settings.scheduler_name)
    context = certs.server_context()
    files: certs.FilePair | None = None
    ca_pem: bytes | None = None
    if settings.webhook_cert:
        files = certs.FilePair(Path(settings.webhook_cert), Path(settings.webhook_key))
        files.load_if_changed(context)
    else:
        made = certs.make(tuple(settings.webhook_hosts), datetime.datetime.now(datetime.UTC))
        certs.load_made(context, made)
        ca_pem = made.ca_pem
    events = OwnerEvents(api, name)
    layout = Layout(notice_socket=str(settings.notice_socket))
    application = server.app(name, layout, events.report)
    runner, port = await server.serve(
        str(settings.webhook_host), int(settings.webhook_port), context, application
    )
    bundle = None
    if ca_pem is not None and settings.webhook_configuration:
        bundle = CaBundle(api, str(settings.webhook_configuration))
    log.info("webhook_serving", host=settings.webhook_host, port=port, path=server.PATH)
    webhook = Webhook(runner, port, context, files, ca_pem, bundle, events)
    await webhook.tend()
    return webhook
