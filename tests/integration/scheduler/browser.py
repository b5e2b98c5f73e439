"""Headless Chromium (Debian's package, ``make browser``) driven over the DevTools protocol:
open a page, evaluate JavaScript in it, take a screenshot.

A small client on aiohttp's websocket (aiohttp is already the scheduler's), on an event loop
of its own thread, so that the synchronous tests call it like any other helper and poll the
live page with ``eventually``.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import itertools
import json
import os
import signal
import subprocess
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import aiohttp

from devcluster import browser


class BrowserError(RuntimeError):
    pass


class Chromium:
    def __init__(self, binary: Path, *, width: int = 1400, height: int = 900) -> None:
        self._profile = tempfile.TemporaryDirectory(prefix="shoal-chromium-")
        self._log = Path(self._profile.name) / "chromium.log"
        with self._log.open("wb") as log:
            self._proc = subprocess.Popen(
                [
                    str(binary),
                    "--headless=new",
                    "--no-sandbox",  # root in a container: the sandbox needs namespaces
                    "--disable-gpu",
                    "--disable-dev-shm-usage",
                    "--no-first-run",
                    "--no-default-browser-check",
                    "--hide-scrollbars",
                    f"--window-size={width},{height}",
                    f"--user-data-dir={self._profile.name}",
                    "--remote-debugging-port=0",
                    "about:blank",
                ],
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,  # its helpers are stopped with it (close)
            )
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, daemon=True)
        self._thread.start()
        self._ids = itertools.count(1)
        self._session: aiohttp.ClientSession | None = None
        self._ws: aiohttp.ClientWebSocketResponse | None = None
        self._call(self._connect(self._port()))

    def _port(self) -> int:
        active = Path(self._profile.name) / "DevToolsActivePort"
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            if self._proc.poll() is not None:
                raise BrowserError(f"chromium exited: {self._log.read_text(errors='replace')}")
            if active.exists() and active.read_text().strip():
                return int(active.read_text().splitlines()[0])
            time.sleep(0.1)
        raise BrowserError("chromium did not open its DevTools port within 60 s")

    def _call(self, coro: Any, timeout: float = 60) -> Any:
        return asyncio.run_coroutine_threadsafe(coro, self._loop).result(timeout)

    async def _connect(self, port: int) -> None:
        self._session = aiohttp.ClientSession()
        async with self._session.get(f"http://127.0.0.1:{port}/json/list") as resp:
            targets = await resp.json()
        page = next(t for t in targets if t["type"] == "page")
        self._ws = await self._session.ws_connect(page["webSocketDebuggerUrl"], max_msg_size=0)

    async def _send(self, method: str, params: dict[str, Any]) -> dict[str, Any]:
        assert self._ws is not None
        ident = next(self._ids)
        await self._ws.send_str(json.dumps({"id": ident, "method": method, "params": params}))
        while True:
            message = json.loads((await self._ws.receive()).data)
            if message.get("id") != ident:
                continue  # an event, or an earlier call's late answer
            if "error" in message:
                raise BrowserError(f"{method}: {message['error']}")
            return message.get("result", {})  # type: ignore[no-any-return]

    def send(self, method: str, **params: Any) -> dict[str, Any]:
        return self._call(self._send(method, params))  # type: ignore[no-any-return]

    def open(self, url: str) -> None:
        """Navigate to ``url`` and return once the page has loaded."""
        self.send("Page.navigate", url=url)
        loaded = f"location.href === {json.dumps(url)} && document.readyState === 'complete'"
        deadline = time.monotonic() + 60
        while not self.evaluate(loaded):
            if time.monotonic() > deadline:
                raise BrowserError(f"{url} did not load within 60 s")
            time.sleep(0.1)

    def evaluate(self, expression: str) -> Any:
        result = self.send("Runtime.evaluate", expression=expression, returnByValue=True)
        if "exceptionDetails" in result:
            raise BrowserError(f"{expression}: {result['exceptionDetails']}")
        return result["result"].get("value")

    def screenshot(self, path: Path) -> Path:
        data = self.send("Page.captureScreenshot", format="png", captureBeyondViewport=True)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(base64.b64decode(data["data"]))
        return path

    def close(self) -> None:
        async def shut() -> None:
            if self._ws is not None:
                await self._ws.close()
            if self._session is not None:
                await self._session.close()

        try:
            self._call(shut(), timeout=10)
        finally:
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(timeout=10)
            self._loop.close()
            self._proc.terminate()
            try:
                self._proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self._proc.kill()
                self._proc.wait(timeout=10)
            # Chromium's helper processes outlive it for a moment and still write to the
            # profile: removing it under them failed with "Directory not empty" (a loaded run).
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self._proc.pid, signal.SIGKILL)
            self._profile.cleanup()


def binary() -> Path | str:
    """Chromium's path, or why there is none (the test is skipped with that reason)."""
    try:
        return browser.find()
    except browser.BrowserUnavailable as exc:
        return str(exc)
