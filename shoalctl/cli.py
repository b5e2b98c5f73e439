"""``kubectl shoal``: gangs, why a gang waits, and nodes, as Shoal's scheduler sees them.

Installed as ``kubectl-shoal`` (kubectl finds it on PATH as the ``shoal`` plugin) and
``kubectl_complete-shoal`` (kubectl asks it to complete ``kubectl shoal ...``); ``kubectl-shoal
completion bash`` prints a completion script for running it directly.
"""

from __future__ import annotations

import argparse
import itertools
import sys
import time
from collections.abc import Sequence
from typing import Any

from contracts import names
from shoalctl import render, views

COMMANDS = ("gangs", "why", "nodes", "completion")

BASH_COMPLETION = """\
_kubectl_shoal() {
    local IFS=$'\\n'
    COMPREPLY=($(kubectl_complete-shoal "${COMP_WORDS[@]:1:COMP_CWORD}" 2>/dev/null | grep -v '^:'))
}
complete -F _kubectl_shoal kubectl-shoal
"""


def _connection(parser: argparse.ArgumentParser, *, sub: bool) -> None:
    """The flags kubectl users put anywhere: before or after the subcommand."""
    default = argparse.SUPPRESS if sub else None
    parser.add_argument(
        "--kubeconfig",
        default=default,
        help="kubeconfig file (default: $KUBECONFIG, ~/.kube/config, in-cluster)",
    )
    parser.add_argument("--context", default=default, help="kubeconfig context to use")
    parser.add_argument(
        "--scheduler-name",
        default=argparse.SUPPRESS if sub else names.SCHEDULER_NAME,
        help=f"the scheduler whose gangs to show (default {names.SCHEDULER_NAME})",
    )


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="kubectl shoal",
        description="See gangs, decisions and nodes as Shoal's scheduler sees them (read-only).",
    )
    _connection(parser, sub=False)
    common = argparse.ArgumentParser(add_help=False)
    _connection(common, sub=True)
    sub = parser.add_subparsers(dest="command", required=True)
    gangs = sub.add_parser(
        "gangs", parents=[common], help="every gang: min/bound/max, phase, age, priority, reason"
    )
    _namespaced(gangs, all_namespaces=True)
    why = sub.add_parser("why", parents=[common], help="a gang's last decision, by gang or pod")
    why.add_argument("name", help="a gang, PodGroup or pod name")
    _namespaced(why, all_namespaces=False)
    nodes = sub.add_parser(
        "nodes", parents=[common], help="GPUs free per island, rack, zone, capacity, notices"
    )
    _output(nodes)
    completion = sub.add_parser("completion", help="print a shell completion script")
    completion.add_argument("shell", choices=["bash"])
    return parser


def _namespaced(parser: argparse.ArgumentParser, *, all_namespaces: bool) -> None:
    parser.add_argument("-n", "--namespace", help="namespace (default: the context's)")
    if all_namespaces:
        parser.add_argument("-A", "--all-namespaces", action="store_true", help="every namespace")
    _output(parser)


def _output(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "-o", "--output", choices=["table", "json", "yaml"], default="table", help="output format"
    )


def _run(args: argparse.Namespace) -> tuple[int, str]:
    from shoalctl import api

    reader = api.Reader(api.connect(args.kubeconfig, args.context))
    now = time.time()
    if args.command == "nodes":
        rows = views.nodes(reader.node_view(), now)
        text = (
            render.nodes_table(rows) if args.output == "table" else render.dump(rows, args.output)
        )
        return 0, text
    every = getattr(args, "all_namespaces", False)
    namespace = (
        None if every else args.namespace or api.default_namespace(args.kubeconfig, args.context)
    )
    cluster = reader.cluster(namespace)
    if args.command == "gangs":
        return 0, _gangs(cluster, args, namespace, now)
    assert namespace is not None
    found = views.why(cluster, args.scheduler_name, namespace, args.name, now)
    if found is None:
        return 1, (
            f"no gang or pod {args.name!r} for scheduler {args.scheduler_name} in namespace "
            f"{namespace}\n"
        )
    return 0, render.why_text(found) if args.output == "table" else render.dump(found, args.output)


def _gangs(
    cluster: views.Cluster, args: argparse.Namespace, namespace: str | None, now: float
) -> str:
    rows = views.gangs(cluster, args.scheduler_name, now)
    if args.output != "table":
        return render.dump(rows, args.output)
    if not rows:
        where = "any namespace" if namespace is None else f"namespace {namespace}"
        return (
            f"No gangs for scheduler {args.scheduler_name} in {where}: no pod there names "
            f"schedulerName: {args.scheduler_name}. Is Shoal installed, and do your pods ask "
            "for it (or pass --scheduler-name)?\n"
        )
    return render.gangs_table(rows, all_namespaces=namespace is None)


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    if args.command == "completion":
        sys.stdout.write(BASH_COMPLETION)
        return 0
    from shoalctl.api import ReadError

    try:
        code, text = _run(args)
    except ReadError as exc:
        sys.stderr.write(f"error: {exc}\n")
        return 1
    (sys.stdout if code == 0 else sys.stderr).write(text)
    return code


#: The flags that change which names completion offers, by their long name.
_SCOPE = {
    "-n": "namespace",
    "--namespace": "namespace",
    "--kubeconfig": "kubeconfig",
    "--context": "context",
    "--scheduler-name": "scheduler_name",
}


def candidates(words: Sequence[str], lister: Any = None) -> list[str]:
    """What may follow ``words`` (the last one being typed): a subcommand, or for ``why`` the
    names of gangs and pods, listed by ``lister(scope)`` with the namespace, kubeconfig,
    context and scheduler name given so far."""
    done, partial = list(words[:-1]), words[-1] if words else ""
    command = next((w for w in done if w in COMMANDS), None)
    if command is None:
        return [c for c in COMMANDS if c.startswith(partial)]
    if partial.startswith("-") or command != "why" or lister is None:
        return []
    scope = {_SCOPE[flag]: value for flag, value in itertools.pairwise(done) if flag in _SCOPE}
    return sorted(n for n in lister(scope) if n.startswith(partial))


def _names(scope: dict[str, str]) -> list[str]:
    from shoalctl import api

    kubeconfig, context = scope.get("kubeconfig"), scope.get("context")
    reader = api.Reader(api.connect(kubeconfig, context))
    namespace = scope.get("namespace") or api.default_namespace(kubeconfig, context)
    index = views.Index(
        reader.cluster(namespace, with_events=False),
        scope.get("scheduler_name") or names.SCHEDULER_NAME,
    )
    found = {views.display_name(g) for g in index.gangs}
    found.update(p.name for g in index.gangs for p in g.members)
    return sorted(found)


def complete_main(argv: Sequence[str] | None = None) -> int:
    """``kubectl_complete-shoal WORDS...``: one candidate a line, then kubectl's ``:4``
    (no file completion)."""
    words = list(sys.argv[1:] if argv is None else argv)
    try:
        found = candidates(words, _names)
    except Exception:  # completion must never print a traceback into the user's shell
        found = []
    sys.stdout.write("".join(f"{c}\n" for c in found) + ":4\n")
    return 0
