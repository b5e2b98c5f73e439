"""``--provider auto``: the DMI vendor decides, else whichever metadata server answers."""

from __future__ import annotations

from pathlib import Path

import pytest

from fakes import metadata
from nodeagent.adapters.providers import select


@pytest.mark.parametrize(
    ("vendor", "cloud"),
    [
        ("Amazon EC2", "aws"),
        ("Google", "gcp"),
        ("Microsoft Corporation", "azure"),
        ("Alibaba Cloud", "alibaba"),
        ("Dell Inc.", None),
    ],
)
def test_dmi_vendor_names_the_cloud(tmp_path: Path, vendor: str, cloud: str | None) -> None:
    (tmp_path / "sys_vendor").write_text(vendor + "\n")
    assert select.from_dmi(tmp_path) == cloud


@pytest.mark.parametrize(
    "server",
    [
        metadata.AwsMetadata,
        metadata.GcpMetadata,
        metadata.AzureMetadata,
        metadata.AlibabaMetadata,
    ],
)
async def test_the_server_that_answers_its_own_protocol_is_chosen(
    tmp_path: Path, server: type[metadata.AwsMetadata]
) -> None:
    fake = server()
    await fake.start()
    try:
        found = await select.detect(fake.url, dmi_dir=tmp_path, probe_seconds=2.0)
    finally:
        await fake.close()
    expected = {
        metadata.AwsMetadata: "aws",
        metadata.GcpMetadata: "gcp",
        metadata.AzureMetadata: "azure",
        metadata.AlibabaMetadata: "alibaba",
    }[server]
    assert found == expected


async def test_nothing_answers_means_none(tmp_path: Path) -> None:
    assert await select.detect("http://127.0.0.1:9", dmi_dir=tmp_path, probe_seconds=0.5) == "none"


def test_unknown_provider_is_refused() -> None:
    with pytest.raises(ValueError, match="unknown provider"):
        select.build("openstack")
