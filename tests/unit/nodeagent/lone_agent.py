"""``python -m tests.unit.nodeagent.lone_agent METADATA_URL SOCKET KUBELET_SOCKET``: the agent
with its GPU monitor, in a process of its own (NVML is found through ``LD_LIBRARY_PATH``, as on
a node), the API server side in memory. Prints ``{"port": N}`` once its endpoints answer, then
runs until terminated. Fast retries, so faults and recoveries show within a second. The notice
socket's limits come from the agent's own environment variables (``SHOAL_MAX_WATCHES``...)."""

from __future__ import annotations

import asyncio
import json
import signal
import sys

import structlog

from nodeagent.adapters import podresources
from nodeagent.adapters.gpu.monitor import GpuOptions
from nodeagent.adapters.providers import HttpSettings
from nodeagent.adapters.providers.aws import AwsProvider
from nodeagent.notify.server import serve
from nodeagent.wiring import cli, health
from nodeagent.wiring.agent import Agent
from tests.unit.nodeagent.notice_socket import Cluster


async def main(metadata_url: str, socket_path: str, kubelet_socket: str) -> None:
    provider = AwsProvider(settings=HttpSettings(metadata_url, interval=0.05, timeout=0.5))

    async def owners() -> dict[str, str]:
        return await podresources.gpu_owners(kubelet_socket, time_limit=0.5)

    gpu = GpuOptions(owners=owners, owners_every=0.1, absent_retry=0.2, error_retry=0.2)
    agent = Agent(Cluster(), [provider], node_name="gpu-0", gpu=gpu)
    limits = cli.socket_limits(cli.parser().parse_args(["--node-name", "gpu-0"]))
    grpc_server = await serve(agent.service, socket_path, limits)
    runner, port = await health.serve(agent.reports, "127.0.0.1", 0)
    agent.start()
    print(json.dumps({"port": port}), flush=True)
    stop = asyncio.Event()
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, stop.set)
    await stop.wait()
    await agent.stop()
    await grpc_server.stop(0)
    await runner.cleanup()


if __name__ == "__main__":
    # The log goes to stderr (the test's agent.log): stdout is a pipe the test stops reading
    # after the first line, and a full pipe would stop the agent at its next log line.
    structlog.configure(logger_factory=structlog.PrintLoggerFactory(sys.stderr))
    asyncio.run(main(*sys.argv[1:4]))
