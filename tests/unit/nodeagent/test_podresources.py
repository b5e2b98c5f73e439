"""The PodResources client against a kubelet stand-in on a unix socket."""

from __future__ import annotations

from pathlib import Path

import pytest

from fakes.podresources import FakePodResources
from nodeagent.adapters.podresources import PodResourcesError, gpu_owners


async def test_gpu_owners_maps_device_ids_to_pods(tmp_path: Path) -> None:
    kubelet = FakePodResources(str(tmp_path / "kubelet.sock"))
    kubelet.pods = {"train/worker-0": ["GPU-a", "GPU-b"], "train/worker-1": ["GPU-c"]}
    await kubelet.start()
    try:
        owners = await gpu_owners(kubelet.socket_path)
    finally:
        await kubelet.close()
    assert owners == {
        "GPU-a": "train/worker-0",
        "GPU-b": "train/worker-0",
        "GPU-c": "train/worker-1",
    }


async def test_no_kubelet_socket_is_an_error_value_not_a_hang(tmp_path: Path) -> None:
    with pytest.raises(PodResourcesError):
        await gpu_owners(str(tmp_path / "absent.sock"), time_limit=2.0)
