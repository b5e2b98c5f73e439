"""``python -m shoal_worker wait | ack STEP``: the worker contract for any launcher.

``wait`` blocks until this pod is told to leave, prints the notice as one JSON line and exits 0
(exit 4 when the agent goes away first). ``ack STEP`` reports the checkpoint; exit 0 when the
agent accepted it, 3 when it refused (the pod is not under notice, or not on this node).
Exit 5 when the agent is busy (it holds as many watches as it allows): try again later.

The caller is the pod named by ``--namespace``/``--name``/``--uid`` (or ``POD_NAMESPACE``,
``POD_NAME``, ``POD_UID``); with none of them and ``SLURM_JOB_ID`` set, the Slurm job step this
runs in (``SLURM_JOB_ID``, ``SLURM_STEP_ID``, ``SLURMD_NODENAME``; docs/slurm.md).

When the agent's socket is absent and ``SHOAL_LEAVE_BY_FILE`` names the pod's
``shoal.dev/leave-by`` as a Downward API file, ``wait`` falls back to that file: it returns once
the file holds a time, with ``source`` ``leave-by-file`` (the kubelet refreshes the file up to
about a minute late; see :mod:`shoal_worker.leavefile`).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
from collections.abc import Sequence

import grpc

from shoal_worker import contract
from shoal_worker.leavefile import wait_leave_by
from shoal_worker.watcher import (
    AgentBusy,
    Identity,
    NoticeClient,
    NoticeRefused,
    PodIdentity,
    SlurmStep,
)

EXIT_REFUSED = 3
EXIT_AGENT_GONE = 4
EXIT_BUSY = 5


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m shoal_worker",
        description="Hear this pod's revocation notice from the Shoal node agent, and "
        "acknowledge the checkpoint.",
        epilog="Each flag can also be set through the environment variable shown with it.",
    )

    def env(flag: str, var: str, help_text: str, default: str | None = None) -> None:
        p.add_argument(flag, default=os.environ.get(var, default), help=f"{help_text} [env {var}]")

    env("--namespace", contract.POD_NAMESPACE_ENV, "this pod's namespace (Downward API)")
    env("--name", contract.POD_NAME_ENV, "this pod's name (Downward API)")
    env("--uid", contract.POD_UID_ENV, "this pod's metadata.uid (Downward API)")
    env("--socket", contract.SOCKET_ENV, "the agent's unix socket", contract.DEFAULT_SOCKET)
    env(
        "--leave-by-file",
        contract.LEAVE_BY_FILE_ENV,
        "the pod's shoal.dev/leave-by as a Downward API file: what 'wait' reads when the "
        "socket is absent (refreshed by the kubelet up to about a minute late)",
    )
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


async def _wait_file(path: str) -> int:
    leave_by = await wait_leave_by(path)
    print(
        json.dumps(
            {
                "event_id": "",
                "kind": "",
                "source": "leave-by-file",
                "reason": f"{path} holds a leave-by time",
                "leave_by": leave_by.isoformat(),
            }
        ),
        flush=True,
    )
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    p = parser()
    args = p.parse_args(argv)
    who: Identity
    named = [f for f in ("namespace", "name", "uid") if getattr(args, f)]
    if not named and os.environ.get(contract.SLURM_JOB_ID_ENV):
        # A Slurm job step names itself by what Slurm set in its environment.
        try:
            who = SlurmStep.from_env()
        except NoticeRefused as exc:
            p.error(str(exc))
    else:
        missing = [f for f in ("namespace", "name", "uid") if not getattr(args, f)]
        if missing:
            p.error("missing " + ", ".join(f"--{f}" for f in missing))
        who = PodIdentity(args.namespace, args.name, args.uid)
    client = NoticeClient(who, args.socket)
    if args.command == "wait" and args.leave_by_file and not os.path.exists(args.socket):
        print(f"no agent socket at {args.socket}: reading {args.leave_by_file}", file=sys.stderr)
        return asyncio.run(_wait_file(args.leave_by_file))
    try:
        if args.command == "wait":
            return asyncio.run(_wait(client))
        print(asyncio.run(client.acknowledge(args.step)))
        return 0
    except AgentBusy as exc:
        print(f"busy: {exc}", file=sys.stderr)
        return EXIT_BUSY
    except NoticeRefused as exc:
        print(f"refused: {exc}", file=sys.stderr)
        return EXIT_REFUSED
    except grpc.aio.AioRpcError as exc:
        print(f"agent unreachable at {args.socket}: {exc.details()}", file=sys.stderr)
        return EXIT_AGENT_GONE
