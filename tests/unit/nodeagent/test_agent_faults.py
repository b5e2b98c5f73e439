"""The agent in a process of its own, with the kubelet's PodResources socket or NVML failing
under it: it keeps answering ``/healthz``, says in ``/readyz`` what is missing, and the
workers still hear their notice over the real notice socket. NVML is the real pynvml over the
fake ``libnvidia-ml.so.1`` (or over none at all), found through ``LD_LIBRARY_PATH``."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import sys
from collections.abc import AsyncIterator, Awaitable, Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any, TypeVar

import aiohttp
import grpc
import pytest
from shoal_worker.protocol import notices_pb2 as pb
from shoal_worker.protocol import rpc

from fakes import nvml as fake_nvml
from fakes.metadata import AwsMetadata
from fakes.podresources import FakePodResources
from tests import figures, waiting
from tests.unit.nodeagent.notice_socket import PODS, identity

pytestmark = pytest.mark.reliability

ROOT = Path(__file__).resolve().parents[3]
GPU0 = "GPU-fa4e0000-0000-4000-8000-000000000000"
T = TypeVar("T")


@pytest.fixture(scope="module")
def libdir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    try:
        return fake_nvml.build(tmp_path_factory.mktemp("nvml"))
    except FileNotFoundError as exc:
        pytest.skip(str(exc))


async def until(check: Callable[[], Awaitable[T | None]], what: str, seconds: float = 20) -> T:
    return await waiting.arrives(check, seconds=seconds, interval=0.05, what=what)


class Lone:
    """A running agent process and the cloud it watches."""

    def __init__(self, tmp: Path, metadata: AwsMetadata, proc: Any, port: int) -> None:
        self.tmp = tmp
        self.metadata = metadata
        self.proc = proc
        self.url = f"http://127.0.0.1:{port}"
        self.socket = str(tmp / "agent.sock")
        self.http = aiohttp.ClientSession()

    async def get(self, path: str) -> tuple[int, dict[str, Any]]:
        async with self.http.get(self.url + path, timeout=aiohttp.ClientTimeout(5)) as resp:
            body: dict[str, Any] = await resp.json()
            return resp.status, body

    async def readyz_until(self, field: str, test: Callable[[str], bool]) -> dict[str, Any]:
        async def check() -> dict[str, Any] | None:
            _, body = await self.get("/readyz")
            return body if test(str(body[field])) else None

        return await until(check, f"/readyz {field} changed")

    async def ready(self) -> dict[str, Any]:
        """``/readyz`` answers 200 (the first metadata read may take a moment)."""

        async def check() -> dict[str, Any] | None:
            status, body = await self.get("/readyz")
            return body if status == 200 and body["ok"] else None

        return await until(check, "/readyz said ready")

    async def workers_hear_a_notice(self) -> int:
        """Put a spot notice in the metadata; count the workers told over the notice socket."""
        async with grpc.aio.insecure_channel(f"unix:{self.socket}") as channel:
            stub = rpc.NoticesStub(channel)
            watches = [stub.Watch(pb.WatchRequest(pod=identity(*pod))) for pod in PODS]
            for watch in watches:  # each watch is open: the current state came first
                assert (await watch.read()).state in (pb.Notice.NONE, pb.Notice.WITHDRAWN)
            deadline = datetime.now(UTC).replace(microsecond=0) + timedelta(minutes=2)
            self.metadata.instance_action = {
                "action": "terminate",
                "time": deadline.strftime("%Y-%m-%dT%H:%M:%SZ"),
            }
            told = 0
            for watch in watches:
                update = await asyncio.wait_for(watch.read(), 20)
                assert update.state == pb.Notice.LEAVE
                # By the cloud's time at the latest (the provider may keep a safety margin).
                assert 0 < update.leave_by_unix_ms <= int(deadline.timestamp() * 1000)
                told += 1
                watch.cancel()
            return told

    async def alive(self) -> dict[str, Any]:
        status, live = await self.get("/healthz")
        assert status == 200, live
        assert self.proc.returncode is None
        _, report = await self.get("/status")
        assert report["task_crashes"] == {}, report["task_crashes"]
        return report


@contextlib.asynccontextmanager
async def lone_agent(tmp: Path, kubelet_socket: str, **env: str) -> AsyncIterator[Lone]:
    metadata = AwsMetadata()
    await metadata.start()
    log = (tmp / "agent.log").open("w")
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "tests.unit.nodeagent.lone_agent",
        metadata.url,
        str(tmp / "agent.sock"),
        kubelet_socket,
        cwd=ROOT,
        env={**os.environ, **env},
        stdout=asyncio.subprocess.PIPE,
        stderr=log,
    )
    lone = None
    try:
        assert proc.stdout is not None
        line = await asyncio.wait_for(proc.stdout.readline(), 60)
        assert line, (tmp / "agent.log").read_text()[-3000:]
        lone = Lone(tmp, metadata, proc, json.loads(line)["port"])
        yield lone
    finally:
        if lone is not None:
            await lone.http.close()
        if proc.returncode is None:
            proc.terminate()
            try:
                await asyncio.wait_for(proc.wait(), 15)
            except TimeoutError:
                proc.kill()
                await proc.wait()
        log.close()
        await metadata.close()


async def garbage_kubelet(path: str) -> asyncio.Server:
    """A socket that answers every connection with bytes that are not HTTP/2, then hangs up."""

    async def answer(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        writer.write(b"\x00\xffnot a kubelet\r\n" * 64)
        with contextlib.suppress(ConnectionError):
            await writer.drain()
        writer.close()

    return await asyncio.start_unix_server(answer, path)


@pytest.mark.parametrize("kubelet", ["missing", "vanishes", "garbage"])
async def test_the_agent_serves_and_notifies_whatever_the_kubelet_socket_does(
    tmp_path: Path, libdir: Path, kubelet: str
) -> None:
    path = str(tmp_path / "kubelet.sock")
    env = {"LD_LIBRARY_PATH": str(libdir), "FAKE_NVML_LAYOUT": "nvswitch8"}
    fake = FakePodResources(path)
    fake.pods = {"train/worker-0": [GPU0]}
    garbage = None
    if kubelet == "vanishes":
        await fake.start()
    elif kubelet == "garbage":
        garbage = await garbage_kubelet(path)
    try:
        async with lone_agent(tmp_path, path, **env) as lone:
            if kubelet == "vanishes":
                await lone.readyz_until("gpu_allocation", lambda s: s == "ok")
                _, report = await lone.get("/status")
                assert report["gpu"]["allocated"] == {"0": "train/worker-0"}
                await fake.close()
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(path)  # the kubelet's socket is gone
            body = await lone.readyz_until("gpu_allocation", lambda s: s.startswith("unknown"))
            if kubelet != "garbage":
                assert path in body["gpu_allocation"]
            # Degraded, not down: the GPUs are watched, the node is ready for notices.
            assert body["gpu"] == "ok"
            await lone.ready()
            await lone.alive()
            told = await lone.workers_hear_a_notice()
            await lone.alive()
    finally:
        await fake.close()
        if garbage is not None:
            garbage.close()
            await garbage.wait_closed()
    assert told == len(PODS)
    figures.record("agent faults", f"kubelet socket {kubelet}: workers notified", told)


async def test_without_libnvidia_ml_the_agent_reports_the_gpus_absent_and_serves(
    tmp_path: Path,
) -> None:
    nolib = tmp_path / "no-nvml"
    nolib.mkdir()
    async with lone_agent(
        tmp_path, str(tmp_path / "kubelet.sock"), LD_LIBRARY_PATH=str(nolib)
    ) as lone:
        body = await lone.readyz_until("gpu", lambda s: s.startswith("absent: NVML"))
        assert "NVML Shared Library Not Found" in body["gpu"] or "not found" in body["gpu"].lower()
        await lone.ready()
        await lone.alive()
        told = await lone.workers_hear_a_notice()
        await lone.alive()
    assert told == len(PODS)
    figures.record("agent faults", "no libnvidia-ml: workers notified", told)


async def test_nvml_failing_mid_run_is_reported_survived_and_recovered(
    tmp_path: Path, libdir: Path
) -> None:
    switch = tmp_path / "nvml-lost"
    env = {
        "LD_LIBRARY_PATH": str(libdir),
        "FAKE_NVML_LAYOUT": "islands2x4",
        "FAKE_NVML_FAIL_FILE": str(switch),
    }
    async with lone_agent(tmp_path, str(tmp_path / "kubelet.sock"), **env) as lone:
        await lone.readyz_until("gpu", lambda s: s == "ok")
        switch.touch()
        body = await lone.readyz_until("gpu", lambda s: "GPU is lost" in s)
        assert body["gpu"].startswith(("error: ", "absent: "))
        await lone.alive()
        told = await lone.workers_hear_a_notice()
        report = await lone.alive()
        assert "GPU is lost" in report["gpu"]["state"]
        switch.unlink()
        await lone.readyz_until("gpu", lambda s: s == "ok")
        report = await lone.alive()
        assert report["gpu"]["gpus"] == 8
        assert report["gpu"]["islands"] == [4, 4]
    assert told == len(PODS)
    figures.record("agent faults", "NVML lost mid-run: workers notified", told)
