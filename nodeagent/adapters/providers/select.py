"""Choosing a provider: by name, ``none``, or ``auto`` (DMI vendor, else who answers)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import Final

import structlog

from nodeagent.adapters.providers import alibaba, aws, azure, gcp
from nodeagent.adapters.providers.base import (
    Clock,
    DateProbe,
    Http,
    HttpSettings,
    wall_clock,
)
from nodeagent.core.events import Notice
from nodeagent.core.ports import Provider, ProviderError, Sink

log = structlog.get_logger("nodeagent.adapters.providers")

NAMES: Final = ("aws", "gcp", "azure", "alibaba", "auto", "none")
#: DMI ``sys_vendor`` / ``board_vendor`` values of each cloud's VMs.
DMI_VENDORS: Final = {
    "Amazon EC2": "aws",
    "Google": "gcp",
    "Microsoft Corporation": "azure",
    "Alibaba Cloud": "alibaba",
}


@dataclass(slots=True)
class NoProvider:
    """``--provider none``: no cloud signals (GPU and Kubernetes-side notices only)."""

    name: str = "none"

    async def watch(self, sink: Sink) -> None:
        await asyncio.Event().wait()

    def stale_after(self) -> float:
        return float("inf")

    async def acknowledge(self, notice: Notice) -> None:
        """Nothing to acknowledge."""

    async def aclose(self) -> None:
        """Nothing to close."""


def build(
    name: str,
    *,
    metadata_url: str | None = None,
    interval: float = 1.0,
    timeout: float = 2.0,
    azure_vm_name: str | None = None,
    aws_lifecycle_lead: float | None = None,
    clock: Clock = wall_clock,
    local: Callable[[], float] = time.time,
    on_date: DateProbe | None = None,
) -> Provider:
    """The provider called ``name`` (not ``auto``). ``metadata_url`` is the server's root
    (``http://host:port``), for every cloud alike. ``clock`` is what deadlines are taken by
    (the corrected clock, :mod:`nodeagent.wiring.clock`); ``on_date`` is told of each answer's
    ``Date`` header, measured on the ``local`` clock."""

    def settings(default: str, suffix: str = "") -> HttpSettings:
        base = metadata_url.rstrip("/") + suffix if metadata_url else default
        return HttpSettings(base, interval=interval, timeout=timeout)

    cloud: aws.AwsProvider | gcp.GcpProvider | azure.AzureProvider | alibaba.AlibabaProvider
    if name == "aws":
        lead = (
            aws.LIFECYCLE_LEAD
            if aws_lifecycle_lead is None
            else timedelta(seconds=aws_lifecycle_lead)
        )
        cloud = aws.AwsProvider(settings=settings(aws.DEFAULT_URL), lifecycle_lead=lead)
    elif name == "gcp":
        cloud = gcp.GcpProvider(settings=settings(gcp.DEFAULT_URL, gcp.PATH))
    elif name == "azure":
        cloud = azure.AzureProvider(settings=settings(azure.DEFAULT_URL), vm_name=azure_vm_name)
    elif name == "alibaba":
        cloud = alibaba.AlibabaProvider(settings=settings(alibaba.DEFAULT_URL))
    elif name == "none":
        return NoProvider()
    else:
        raise ValueError(f"unknown provider {name!r}; choose one of {', '.join(NAMES)}")
    cloud.clock = clock
    cloud.http.local = local
    cloud.http.on_date = on_date
    return cloud


def from_dmi(dmi_dir: Path = Path("/sys/class/dmi/id")) -> str | None:
    """The cloud named by the machine's DMI vendor strings, if any."""
    for entry in ("sys_vendor", "board_vendor", "bios_vendor"):
        try:
            vendor = (dmi_dir / entry).read_text().strip()
        except OSError:
            continue
        for known, cloud in DMI_VENDORS.items():
            if vendor.startswith(known):
                return cloud
    return None


async def _answers(name: str, base: str, probe_seconds: float) -> bool:
    http = Http(HttpSettings(base, timeout=probe_seconds))
    try:
        if name == "gcp":
            resp = await http.request("GET", "/instance/preempted", headers=gcp.FLAVOR)
            return resp.headers.get("Metadata-Flavor") == "Google"
        if name == "azure":
            resp = await http.request("GET", azure.PATH, headers=azure.HEADERS, params=azure.API)
            return resp.status == 200 and '"Events"' in resp.body
        if name == "aws":
            resp = await http.request(
                "PUT", "/latest/api/token", headers={"X-aws-ec2-metadata-token-ttl-seconds": "60"}
            )
            return resp.status == 200 and bool(resp.body.strip())
        resp = await http.request(
            "PUT",
            "/latest/api/token",
            headers={"X-aliyun-ecs-metadata-token-ttl-seconds": "60"},
        )
        return resp.status == 200 and bool(resp.body.strip())
    except ProviderError:
        return False
    finally:
        await http.aclose()


async def detect(
    metadata_url: str | None = None,
    *,
    dmi_dir: Path = Path("/sys/class/dmi/id"),
    probe_seconds: float = 1.0,
) -> str:
    """``auto``: the DMI vendor when it names a cloud, else the first metadata server that
    answers its own protocol (all probed at once), else ``none``."""
    if metadata_url is None:
        found = from_dmi(dmi_dir)
        if found is not None:
            log.info("provider_detected", provider=found, by="dmi")
            return found
    bases = {
        "gcp": metadata_url.rstrip("/") + gcp.PATH if metadata_url else gcp.DEFAULT_URL,
        "azure": metadata_url or azure.DEFAULT_URL,
        "aws": metadata_url or aws.DEFAULT_URL,
        "alibaba": metadata_url or alibaba.DEFAULT_URL,
    }
    names = list(bases)
    answered = await asyncio.gather(*(_answers(n, bases[n], probe_seconds) for n in names))
    for name, ok in zip(names, answered, strict=True):
        if ok:
            log.info("provider_detected", provider=name, by="metadata")
            return name
    log.warning("provider_not_detected", provider="none")
    return "none"
