"""``python -m nodeagent.client wait | ack STEP``: the worker contract for any launcher.

``wait`` blocks until this pod is told to leave, prints the notice as one JSON line and exits 0
(exit 4 when the agent goes away first). ``ack STEP`` reports the checkpoint; exit 0 when the
agent accepted it, 3 when it refused (the pod is not under notice, or not on this node).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
from collections.abc import Sequence

import grpc

from nodeagent.client.watcher import DEFAULT_SOCKET, NoticeClient, NoticeRefused, PodIdentity

EXIT_REFUSED = 3
EXIT_AGENT_GONE = 4


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m nodeagent.client",
        description="Hear this pod's revocation notice from the Shoal node agent, and "
        "acknowledge the checkpoint.",
        epilog="Each flag can also be set through the environment variable shown with it.",
    )

    def env(flag: str, var: str, help_text: str, default: str | None = None) -> None:
        p.add_argument(flag, default=os.environ.get(var, default), help=f"{help_text} [env {var}]")

    env("--namespace", "POD_NAMESPACE", "this pod's namespace (Downward API)")
    env("--name", "POD_NAME", "this pod's name (Downward API)")
    env("--uid", "POD_UID", "this pod's metadata.uid (Downward API)")
    env("--socket", "SHOAL_SOCKET", "the agent's unix socket", DEFAULT_SOCKET)
    commands = p.add_subparsers(dest="command", required=True)
    commands.add_parser("wait", help="block until this pod is told to leave; print the notice")
    ack = commands.add_parser("ack", help="report that the checkpoint at STEP is done")
    ack.add_argument("step", type=int)
    return p


async def _wait(client: NoticeClient) -> int:
    async for notice in client.watch():
        if notice.leave:
            print(
                json.dumps(
                    {
                        "event_id": notice.event_id,
                        "kind": notice.kind,
                        "source": notice.source,
                        "reason": notice.reason,
                        "leave_by": notice.leave_by.isoformat() if notice.leave_by else None,
                    }
                ),
                flush=True,
            )
            return 0
    print("the agent closed the watch", file=sys.stderr)
    return EXIT_AGENT_GONE


def main(argv: Sequence[str] | None = None) -> int:
    p = parser()
    args = p.parse_args(argv)
    missing = [f for f in ("namespace", "name", "uid") if not getattr(args, f)]
    if missing:
        p.error("missing " + ", ".join(f"--{f}" for f in missing))
    client = NoticeClient(PodIdentity(args.namespace, args.name, args.uid), args.socket)
    try:
        if args.command == "wait":
            return asyncio.run(_wait(client))
        print(asyncio.run(client.acknowledge(args.step)))
        return 0
    except NoticeRefused as exc:
        print(f"refused: {exc}", file=sys.stderr)
        return EXIT_REFUSED
    except grpc.aio.AioRpcError as exc:
        print(f"agent unreachable at {args.socket}: {exc.details()}", file=sys.stderr)
        return EXIT_AGENT_GONE
