"""GPU topology and health through the real pynvml, loading a fake libnvidia-ml.so.1 built from
C (``fakes/fake_nvml.c``). Each read runs in a fresh process, because the library
is found through ``LD_LIBRARY_PATH`` exactly as on a node."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from contracts import gputopology
from fakes import nvml as fake_nvml
from nodeagent.adapters.gpu.xid import GpuHealth, XidPolicy

READ = """
import json, os, sys
from contracts import gputopology
from nodeagent.adapters.gpu import nvml
try:
    nvml.init()
except nvml.NvmlUnavailable as exc:
    print(json.dumps({"unavailable": str(exc)}))
    sys.exit(0)
topology = nvml.topology({})
out = {"topology": gputopology.encode(topology)}
if os.environ.get("FAKE_NVML_XID_FILE"):
    watch = nvml.XidWatch()
    event = watch.wait(2000)
    out["xid"] = [event.index, event.xid] if event else None
print(json.dumps(out))
"""


@pytest.fixture(scope="module")
def libdir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    try:
        return fake_nvml.build(tmp_path_factory.mktemp("nvml"))
    except FileNotFoundError as exc:
        pytest.skip(str(exc))


def read(libdir: Path, layout: str, **env: str) -> dict[str, object]:
    result = subprocess.run(
        [sys.executable, "-c", READ],
        env={**os.environ, "LD_LIBRARY_PATH": str(libdir), "FAKE_NVML_LAYOUT": layout, **env},
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    doc = json.loads(result.stdout)
    assert isinstance(doc, dict)
    return doc


def topology_of(doc: dict[str, object]) -> gputopology.GpuTopology:
    text = doc["topology"]
    assert isinstance(text, str)
    return gputopology.decode(text)


def test_nvswitch_baseboard_is_one_island(libdir: Path) -> None:
    topology = topology_of(read(libdir, "nvswitch8"))
    assert [sorted(m) for m in topology.islands().values()] == [list(range(8))]
    assert {topology.links[0][j] for j in range(1, 8)} == {"NV18"}
    assert topology.product == "NVIDIA H100 80GB HBM3"
    assert [g.numa for g in topology.gpus] == [0, 0, 0, 0, 1, 1, 1, 1]


def test_two_nvlink_islands_of_four(libdir: Path) -> None:
    topology = topology_of(read(libdir, "islands2x4"))
    assert sorted(sorted(m) for m in topology.islands().values()) == [[0, 1, 2, 3], [4, 5, 6, 7]]
    assert topology.links[0][:4] == ("X", "NV4", "NV4", "NV4")
    assert topology.links[0][4:] == ("SYS", "SYS", "SYS", "SYS")
    assert topology.largest_free_island() == 4


def test_pcie_only_has_no_islands_beyond_single_gpus(libdir: Path) -> None:
    topology = topology_of(read(libdir, "pcie8"))
    assert len(topology.islands()) == 8
    assert topology.links[0] == ("X", "PIX", "NODE", "NODE", "SYS", "SYS", "SYS", "SYS")


def test_no_driver_is_a_state_not_a_crash(libdir: Path) -> None:
    doc = read(libdir, "nodriver")
    assert "Driver Not Loaded" in str(doc["unavailable"])


def test_no_library_is_a_state_not_a_crash(tmp_path: Path) -> None:
    doc = read(tmp_path, "nvswitch8")
    assert "unavailable" in doc


def test_xid_79_is_delivered_for_the_right_gpu(libdir: Path, tmp_path: Path) -> None:
    trigger = tmp_path / "xid"
    trigger.write_text("3 79\n")
    doc = read(libdir, "islands2x4", FAKE_NVML_XID_FILE=str(trigger))
    assert doc["xid"] == [3, 79]


def test_xid_policy_follows_the_catalog_and_is_sticky() -> None:
    health = GpuHealth()
    assert health.record(0, 13) is False  # an application's own fault: GPU still healthy
    assert health.by_index.get(0) == "healthy"
    assert health.record(1, 31337) is True
    assert health.by_index.get(1) == "degraded"
    assert health.record(1, 79) is True  # fallen off the bus
    assert health.by_index.get(1) == "failed"
    assert health.record(1, 13) is False  # does not heal by itself
    assert health.by_index.get(1) == "failed"
    custom = GpuHealth(XidPolicy(ignore=frozenset({79}), fatal=frozenset()))
    assert custom.record(2, 79) is False


async def test_nvml_failing_while_the_xid_watch_is_set_up_is_an_error_state_not_a_crash(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """NVML answered the topology read, then lost the GPUs before the XID events were
    registered: the raw pynvml error used to escape the monitor (a crash for the task guard)
    while its state still said ``ok``."""
    import asyncio

    import pynvml

    from contracts.gputopology import GpuTopology
    from nodeagent.adapters.gpu import monitor as gpu_monitor
    from nodeagent.adapters.gpu import nvml

    lost = {"now": True}
    starts: list[int] = []

    def init() -> None:
        starts.append(1)

    def count() -> int:
        raise pynvml.NVMLError(
            pynvml.NVML_ERROR_GPU_IS_LOST if lost["now"] else pynvml.NVML_ERROR_UNKNOWN
        )

    monkeypatch.setattr(nvml, "init", init)
    monkeypatch.setattr(nvml, "shutdown", lambda: None)
    monkeypatch.setattr(nvml, "topology", lambda health: gputopology.uniform(4, 2))
    monkeypatch.setattr(pynvml, "nvmlDeviceGetCount", count)
    published: list[GpuTopology] = []

    async def publish(topology: GpuTopology) -> None:
        published.append(topology)

    monitor = gpu_monitor.GpuMonitor(publish, error_retry=0.01)
    task = asyncio.create_task(monitor.run())
    try:
        for _ in range(500):
            if task.done() or monitor.state.startswith("error"):
                break
            await asyncio.sleep(0.01)
        assert not task.done(), task.exception() if task.done() else None
        assert monitor.state.startswith("error: NVML event registration")
        lost["now"] = False
        for _ in range(500):
            if len(starts) >= 3:
                break
            await asyncio.sleep(0.01)
        # Started over through its own retry, as for any NVML fault.
        assert len(starts) >= 3
        assert not task.done()
        assert published
    finally:
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
