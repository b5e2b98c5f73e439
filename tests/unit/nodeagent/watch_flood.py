"""``python -m tests.unit.nodeagent.watch_flood SOCKET COUNT NAMESPACE NAME UID``: a runaway
worker. Opens COUNT watches of one pod on the notice socket, each on a connection of its own (the
most each costs the agent), and leaves the accepted ones open without reading. Prints one JSON
line once every watch was answered: how many were accepted and, per status code, how many were
refused with a sample detail. Then holds everything until terminated, so that the connections
close when the process goes, as a crashed worker's do."""

from __future__ import annotations

import asyncio
import json
import signal
import sys
from collections import Counter
from typing import Any

import grpc
from shoal_worker.protocol import notices_pb2 as pb
from shoal_worker.protocol import rpc

#: One connection per channel: channels with equal arguments otherwise share one.
OWN_CONNECTION = (("grpc.use_local_subchannel_pool", 1),)


#: Seconds each watch may take to be answered. All of them start at once, and this process's
#: own gRPC poller opens the connections one by one: on a loaded machine the last of 3,000 once
#: waited more than 60 s (NO_ANSWER) although the agent refused or accepted every one it got,
#: and beside another test run 6 waited more than 180 s.
ANSWER_SECONDS = 360


async def answer(call: Any) -> tuple[str, str]:
    try:
        await asyncio.wait_for(call.read(), ANSWER_SECONDS)
    except grpc.aio.AioRpcError as exc:
        return exc.code().name, str(exc.details())
    except TimeoutError:
        return "NO_ANSWER", ""
    return "ACCEPTED", ""


async def main(socket_path: str, count: int, namespace: str, name: str, uid: str) -> None:
    request = pb.WatchRequest(pod=pb.PodIdentity(namespace=namespace, name=name, uid=uid))
    channels = [
        grpc.aio.insecure_channel(f"unix:{socket_path}", options=OWN_CONNECTION)
        for _ in range(count)
    ]
    calls = [rpc.NoticesStub(channel).Watch(request) for channel in channels]
    answers = await asyncio.gather(*(answer(call) for call in calls))
    codes = Counter(code for code, _ in answers)
    details = {code: detail for code, detail in answers if detail}
    report = {"accepted": codes.pop("ACCEPTED", 0), "refused": dict(codes), "details": details}
    print(json.dumps(report), flush=True)
    stop = asyncio.Event()
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, stop.set)
    await stop.wait()


if __name__ == "__main__":
    socket_path, count, namespace, name, uid = sys.argv[1:6]
    asyncio.run(main(socket_path, int(count), namespace, name, uid))
