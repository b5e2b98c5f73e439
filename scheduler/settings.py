"""Command-line settings: flags, their environment variables, and an optional YAML config file.

Precedence: flag, then environment variable, then config file, then default. Each option is
declared once in ``OPTIONS`` and appears in ``--help`` with its variable. A wrong value (in any
of the three places) is a :class:`SettingsError` naming the option and where it came from.
"""

from __future__ import annotations

import argparse
import math
import os
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from contracts import names


class SettingsError(ValueError):
    """A setting has a wrong value; the message names it and where it was given."""


@dataclass(frozen=True, slots=True)
class Option:
    name: str  # flag without dashes, e.g. "bind-workers"
    default: Any
    parse: Callable[[str], Any]
    help: str

    @property
    def env(self) -> str:
        return "SHOAL_SCHEDULER_" + self.name.upper().replace("-", "_")

    @property
    def attr(self) -> str:
        return self.name.replace("-", "_")


def _keys(text: str) -> tuple[str, ...]:
    return tuple(k.strip() for k in text.split(",") if k.strip())


def _bool(text: str) -> bool:
    lowered = text.strip().lower()
    if lowered in ("1", "true", "yes", "on"):
        return True
    if lowered in ("0", "false", "no", "off", ""):
        return False
    raise ValueError(f"expected true or false, got {text!r}")


def _whole(minimum: int, maximum: int) -> Callable[[str], int]:
    def parse(text: str) -> int:
        value = int(text)
        if not minimum <= value <= maximum:
            raise ValueError(f"expected a whole number from {minimum} to {maximum}, got {value}")
        return value

    return parse


def _number(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):
        raise ValueError(f"expected a finite number, got {text!r}")
    return value


def _seconds(text: str) -> float:
    value = _number(text)
    if not 0 <= value <= 7 * 24 * 3600:
        raise ValueError(f"expected seconds from 0 to one week, got {text!r}")
    return value


OPTIONS: tuple[Option, ...] = (
    Option("scheduler-name", names.SCHEDULER_NAME, str, "pods with this spec.schedulerName"),
    Option("qps", 200.0, _number, "client-side API rate limit, requests/s (<= 0: none)"),
    Option("burst", 400, _whole(1, 1_000_000), "client-side API burst"),
    Option("bind-workers", 16, _whole(1, 1024), "concurrent pods/binding requests"),
    Option(
        "topology-keys",
        names.DEFAULT_TOPOLOGY_KEYS,
        _keys,
        "node label keys of the cross-node topology, widest first, comma-separated",
    ),
    Option("http-host", "0.0.0.0", str, "address of /healthz, /readyz, /metrics"),  # noqa: S104
    Option(
        "http-port",
        10260,
        _whole(0, 65535),
        "port of /healthz, /readyz, /metrics (0: any free port)",
    ),
    Option("max-backoff", 10.0, _seconds, "longest wait, in seconds, before retrying a gang"),
    Option(
        "reclaim-grace",
        30.0,
        _seconds,
        "seconds between asking a reclaimed pod to leave (shoal.dev/leave-by) and evicting it",
    ),
    Option("reclaim", True, _bool, "reclaim surplus and lower-priority gangs for waiting gangs"),
    Option("leader-elect", False, _bool, "run for leadership on a Lease; standby otherwise"),
    Option("lease-namespace", "kube-system", str, "namespace of the leader-election Lease"),
    Option("lease-name", "", str, "name of the Lease (default: the scheduler name)"),
    Option("log-format", "auto", str, "json, console, or auto (console on a terminal)"),
)


@dataclass(frozen=True, slots=True)
class CliSettings:
    kubeconfig: str | None
    config: str | None
    values: Mapping[str, Any] = field(default_factory=dict)

    def __getattr__(self, attr: str) -> Any:
        try:
            return self.values[attr]
        except KeyError:
            raise AttributeError(attr) from None


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m scheduler",
        description="Shoal: a secondary Kubernetes scheduler for elastic GPU training gangs.",
        epilog="Precedence: flag, environment variable, config file (YAML, keys as the flags "
        "without dashes, e.g. bind-workers: 32), default.",
    )
    p.add_argument(
        "--kubeconfig",
        default=os.environ.get("KUBECONFIG"),
        help="kubeconfig file; in-cluster config when absent [env KUBECONFIG]",
    )
    p.add_argument(
        "--config",
        default=os.environ.get("SHOAL_SCHEDULER_CONFIG"),
        help="YAML file with any of the options below [env SHOAL_SCHEDULER_CONFIG]",
    )
    for option in OPTIONS:
        default = option.default
        shown = ",".join(default) if isinstance(default, tuple) else default
        p.add_argument(
            f"--{option.name}",
            dest=option.attr,
            default=None,
            help=f"{option.help} (default {shown}) [env {option.env}]",
        )
    return p


def resolve(argv: Sequence[str] | None = None, env: Mapping[str, str] | None = None) -> CliSettings:
    env = os.environ if env is None else env
    args = parser().parse_args(argv)
    file_values: dict[str, Any] = {}
    if args.config:
        try:
            loaded = yaml.safe_load(Path(args.config).read_text())
        except (OSError, yaml.YAMLError) as exc:
            raise SettingsError(f"--config {args.config}: {exc}") from exc
        if loaded is None:
            loaded = {}
        if not isinstance(loaded, dict):
            raise SettingsError(f"--config {args.config}: must be a mapping of option: value")
        known = {o.name for o in OPTIONS} | {o.attr for o in OPTIONS}
        for key in loaded:
            if key not in known:
                raise SettingsError(f"--config {args.config}: unknown option {key!r}")
        file_values = {str(k).replace("_", "-"): v for k, v in loaded.items()}
    values: dict[str, Any] = {}
    for option in OPTIONS:
        flag = getattr(args, option.attr)
        if flag is not None:
            raw, where = flag, f"--{option.name}"
        elif option.env in env:
            raw, where = env[option.env], f"env {option.env}"
        elif option.name in file_values:
            raw, where = file_values[option.name], f"{args.config}: {option.name}"
        else:
            values[option.attr] = option.default
            continue
        if isinstance(raw, list):
            raw = ",".join(str(x) for x in raw)
        try:
            values[option.attr] = option.parse(str(raw))
        except ValueError as exc:
            raise SettingsError(f"{where}: {exc}") from exc
    return CliSettings(kubeconfig=args.kubeconfig, config=args.config, values=values)
