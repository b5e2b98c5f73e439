"""The scheduler's HTTP endpoints over real HTTP: they answer GET, refuse every write with 405,
change nothing, and never show the credentials the scheduler holds."""

from __future__ import annotations

from pathlib import Path

import aiohttp
import pytest

from scheduler import health
from scheduler.metrics import Metrics
from tests import figures

pytestmark = pytest.mark.reliability

TOKEN = "sha256~s3cr3t-b34r3r-t0k3n-0f-th3-sch3dul3r"
KUBECONFIG = f"""apiVersion: v1
kind: Config
clusters:
- name: c
  cluster: {{server: "https://127.0.0.1:6443", certificate-authority-data: Q0EtREFUQQ==}}
users:
- name: shoal-scheduler
  user: {{token: "{TOKEN}", client-key-data: S0VZLURBVEE=}}
contexts:
- name: c
  context: {{cluster: c, user: shoal-scheduler}}
current-context: c
"""


async def test_endpoints_refuse_writes_change_nothing_and_show_no_secret(tmp_path: Path) -> None:
    # What the scheduler process holds: a kubeconfig with a token, in a file and in memory.
    (tmp_path / "kubeconfig").write_text(KUBECONFIG)
    metrics = Metrics()
    calls = {"healthy": 0, "ready": 0}

    def healthy() -> tuple[bool, str]:
        calls["healthy"] += 1
        return True, "ok"

    def ready() -> tuple[bool, str]:
        calls["ready"] += 1
        return False, "caches not synced: Pod"

    runner, port = await health.serve("127.0.0.1", 0, healthy, ready, metrics.registry)
    url = f"http://127.0.0.1:{port}"
    secrets = (TOKEN, "S0VZLURBVEE=", "Q0EtREFUQQ==", str(tmp_path))
    refused = 0
    try:
        async with aiohttp.ClientSession() as http:
            before = {}
            for path in ("/healthz", "/readyz", "/metrics"):
                async with http.get(url + path) as resp:
                    before[path] = (resp.status, await resp.text())
            assert before["/healthz"] == (200, "ok\n")
            assert before["/readyz"] == (503, "caches not synced: Pod\n")
            assert "shoal_scheduler" in before["/metrics"][1]
            probed = dict(calls)
            for path in ("/healthz", "/readyz", "/metrics", "/"):
                for method in ("POST", "PUT", "DELETE", "PATCH"):
                    async with http.request(
                        method, url + path, data=KUBECONFIG.encode(), headers={"X-Token": TOKEN}
                    ) as resp:
                        text = await resp.text()
                        assert resp.status == (405 if path != "/" else 404), (method, path)
                        assert not any(s in text for s in secrets)
                        refused += 1
            # A write reaches no probe and changes no figure.
            assert calls == probed
            for path in ("/healthz", "/readyz", "/metrics"):
                async with http.get(url + path) as resp:
                    text = await resp.text()
                    assert not any(s in text for s in secrets)
                    if path != "/metrics":
                        assert (resp.status, text) == before[path]
                    else:
                        assert text == before[path][1]
    finally:
        await runner.cleanup()
    figures.record("scheduler faults", "writes refused by the scheduler's endpoints", refused)
