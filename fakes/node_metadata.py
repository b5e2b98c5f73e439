"""The fake cloud metadata servers of :mod:`fakes.metadata`, listening on a given host address
instead of loopback: a real node's namespace sends ``169.254.169.254:80`` there
(``devcluster.realnode.route``), so an agent in a container on that node finds its cloud at the
documented address with the chart's defaults."""

from __future__ import annotations

import asyncio

from aiohttp import web

from fakes.metadata import AwsMetadata


class HostAwsMetadata(AwsMetadata):
    """:class:`AwsMetadata` on ``host`` (a free port)."""

    def __init__(self, host: str, **options: bool) -> None:
        super().__init__(**options)
        self.host = host

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    async def start(self) -> None:
        app = web.Application(middlewares=[self._middleware])
        self.routes(app)
        self._runner = web.AppRunner(app, access_log=None, shutdown_timeout=0.5)
        await self._runner.setup()
        site = web.TCPSite(self._runner, self.host, 0)
        await site.start()
        server = site._server
        assert isinstance(server, asyncio.Server)
        self.port = server.sockets[0].getsockname()[1]
