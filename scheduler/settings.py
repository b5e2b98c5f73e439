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

from common.values import parse_bool
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


def _class_seconds(text: str) -> tuple[tuple[str, float], ...]:
    """``high=300,urgent=60``: PriorityClass names with seconds (0 to a day) each."""
    pairs: list[tuple[str, float]] = []
    for item in _keys(text):
        name, sep, seconds = item.partition("=")
        if not sep or not name.strip():
            raise ValueError(f"expected NAME=SECONDS, got {item!r}")
        value = _number(seconds)
        if not 0 <= value <= 86400:
            raise ValueError(f"{name.strip()}: expected seconds from 0 to a day, got {seconds!r}")
        pairs.append((name.strip(), value))
    return tuple(pairs)


def _duration(text: str) -> float:
    """Seconds, as a number or with a unit as kube-scheduler's flags take them: ``15``, ``15s``,
    ``1500ms``, ``1m``."""
    text = text.strip()
    for unit, scale in (("ms", 0.001), ("s", 1.0), ("m", 60.0)):
        if text.endswith(unit):
            return _number(text[: -len(unit)]) * scale
    return _number(text)


def _election_seconds(text: str) -> float:
    """A leader-election period: at least one second (the official client's elector refuses
    less), at most a day."""
    value = _duration(text)
    if not 1 <= value <= 24 * 3600:
        raise ValueError(f"expected a duration from 1 s to one day, got {text!r}")
    return value


def _lease_seconds(text: str) -> int:
    """The lease duration: whole seconds (the Lease stores an integer)."""
    value = _election_seconds(text)
    if value != int(value):
        raise ValueError(f"expected whole seconds (a Lease counts in seconds), got {text!r}")
    return int(value)


#: The client's elector retries at most this much later than the retry period (client-go's
#: JitterFactor): a renew deadline must leave room for more than one try.
ELECTION_JITTER = 1.2


def _address(text: str) -> str:
    """``HOST:PORT``, ``:PORT`` or ``PORT`` (loopback), ``[IPv6]:PORT``; "" is off."""
    text = text.strip()
    if not text:
        return ""
    host, _, port = text.rpartition(":")
    host = host.strip("[]") or "127.0.0.1"
    if not port.isdigit() or not 0 <= int(port) <= 65535:
        raise ValueError(f"expected HOST:PORT or PORT with a port from 0 to 65535, got {text!r}")
    return f"{host}:{int(port)}"


def split_address(address: str) -> tuple[str, int]:
    """The host and port of a value ``_address`` accepted."""
    host, _, port = address.rpartition(":")
    return host, int(port)


def _absolute(text: str) -> str:
    if not text.startswith("/"):
        raise ValueError(f"expected an absolute path, got {text!r}")
    return text


# The admission webhook that wires pods for notices and checkpoints (README "Automatic wiring").
WEBHOOK_OPTIONS: tuple[Option, ...] = (
    Option("webhook", False, parse_bool, "serve the mutating admission webhook (HTTPS /mutate)"),
    Option("webhook-host", "127.0.0.1", str, "address of the webhook (the Deployment: 0.0.0.0)"),
    Option("webhook-port", 9443, _whole(0, 65535), "port of the webhook (0: any free port)"),
    Option(
        "webhook-cert",
        "",
        str,
        "serving certificate file (PEM, reloaded when it changes); none: made at start-up, "
        "with its CA put into --webhook-configuration's caBundle",
    ),
    Option("webhook-key", "", str, "the key of --webhook-cert (PEM)"),
    Option(
        "webhook-hosts",
        ("shoal-scheduler-webhook.shoal-system.svc",),
        _keys,
        "DNS names and IP addresses of a made certificate, comma-separated",
    ),
    Option(
        "webhook-configuration",
        "shoal-scheduler",
        str,
        "MutatingWebhookConfiguration whose caBundle a made certificate's CA is kept in "
        "('' : none)",
    ),
    Option(
        "notice-socket",
        "/run/shoal/agent.sock",
        _absolute,
        "the node agent's --socket, wired into pods (its folder is mounted from the host)",
    ),
)

# Risk-aware placement: revocation rates per capacity pool (scheduler/placement/risk.py).
CAPACITY_RISK_OPTIONS: tuple[Option, ...] = (
    Option(
        "capacity-risk",
        True,
        parse_bool,
        "learn how often each capacity pool (instance type, zone, spot) is revoked and place "
        "each gang's minimum on the lowest-risk capacity that holds it",
    ),
    Option(
        "capacity-risk-configmap",
        "",
        str,
        "ConfigMap in --lease-namespace that keeps the learned counts (key counts.json) and "
        "may hold the operator's table of rates (key seed.yaml); default: "
        "<scheduler name>-capacity-risk",
    ),
    Option(
        "capacity-risk-seed",
        "",
        str,
        "file with the operator's table of revocation rates: a YAML or JSON list of "
        "{instanceType, zone, capacityType (spot|on-demand, default spot), revocationsPerHour}",
    ),
    Option(
        "capacity-risk-write-interval",
        60.0,
        _seconds,
        "the leader writes the learned counts at most once per this many seconds",
    ),
    Option(
        "capacity-risk-window",
        7 * 24 * 3600.0,
        _seconds,
        "seconds after which a revocation or an hour of exposure weighs 1/e of a new one",
    ),
)

OPTIONS: tuple[Option, ...] = (
    Option("scheduler-name", names.SCHEDULER_NAME, str, "pods with this spec.schedulerName"),
    Option("qps", 200.0, _number, "client-side API rate limit, requests/s (<= 0: none)"),
    Option("burst", 400, _whole(1, 1_000_000), "client-side API burst"),
    Option("bind-workers", 64, _whole(1, 1024), "concurrent pods/binding requests"),
    Option(
        "topology-keys",
        names.DEFAULT_TOPOLOGY_KEYS,
        _keys,
        "node label keys of the cross-node topology, widest first, comma-separated",
    ),
    Option(
        "http-host",
        "127.0.0.1",
        str,
        "address of /healthz, /readyz, /metrics; loopback only unless set (the Deployment "
        "sets 0.0.0.0 for the kubelet's probes)",
    ),
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
    Option(
        "reclaim-restart-seconds",
        60.0,
        _seconds,
        "what restarting a reclaimed member costs, in seconds of its GPUs, added to the work "
        "since its last checkpoint (shoal.dev/progress) when reclaim ranks victims by loss",
    ),
    Option(
        "reclaim-patience",
        (),
        _class_seconds,
        "PriorityClass=seconds pairs, comma-separated: a gang of that class (that sets no "
        "shoal.dev/reclaim-patience) lets its reclaim wait that long for its victims' next "
        "checkpoint",
    ),
    Option(
        "early-warning-wait",
        600.0,
        _seconds,
        "longest a surplus member of a node with an early warning (cordon, "
        "karpenter.sh/disrupted, rebalance recommendation) waits for its next checkpoint "
        "before it is asked to leave",
    ),
    Option(
        "torn-grace",
        60.0,
        _seconds,
        "seconds a gang may stay below its minimum with members bound, waiting for the missing "
        "ones, before its bound members are evicted",
    ),
    Option(
        "stall-timeout",
        60.0,
        _seconds,
        "/healthz fails when no scheduling cycle has completed for this many seconds",
    ),
    Option(
        "reclaim", True, parse_bool, "reclaim surplus and lower-priority gangs for waiting gangs"
    ),
    Option(
        "arrived-shapes",
        True,
        parse_bool,
        "count the pod shapes and gang sizes that arrive (each count halving every hour) in what "
        "a placement costs, beside the node shapes' shares; false: the node shapes' only",
    ),
    Option("leader-elect", False, parse_bool, "run for leadership on a Lease; standby otherwise"),
    Option("lease-namespace", "kube-system", str, "namespace of the leader-election Lease"),
    Option("lease-name", "", str, "name of the Lease (default: the scheduler name)"),
    Option(
        "leader-elect-lease-duration",
        15,
        _lease_seconds,
        "seconds (whole) a standby waits, from the last renewal of the Lease it saw, before it "
        "takes over (kube-scheduler's flag of that name)",
    ),
    Option(
        "leader-elect-renew-deadline",
        10.0,
        _election_seconds,
        "seconds the leader keeps writing after its last renewal of the Lease and keeps trying "
        "to renew it before it gives up and exits; less than the lease duration",
    ),
    Option(
        "leader-elect-retry-period",
        2.0,
        _election_seconds,
        "seconds between tries to take or renew the Lease; the renew deadline must exceed "
        f"{ELECTION_JITTER} times it",
    ),
    Option("log-format", "auto", str, "json, console, or auto (console on a terminal)"),
    Option(
        "web-view",
        "",
        _address,
        "serve the read-only live web view at HOST:PORT (PORT alone: on 127.0.0.1; '' : off; "
        "docs/web-view.md)",
    ),
    *CAPACITY_RISK_OPTIONS,
    *WEBHOOK_OPTIONS,
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
    """Every option from the first place that gives it — flag, environment, config file — or
    its default; the first wrong value, in ``OPTIONS`` order, is a :class:`SettingsError`."""
    env = os.environ if env is None else env
    args = parser().parse_args(argv)
    file_values = _config_file(args.config) if args.config else {}
    values = {
        option.attr: _value(option, getattr(args, option.attr), env, file_values, args.config)
        for option in OPTIONS
    }
    _check_pair(args, env, file_values, values)
    _check_election(args, env, file_values, values)
    return CliSettings(kubeconfig=args.kubeconfig, config=args.config, values=values)


def _check_pair(
    args: argparse.Namespace, env: Mapping[str, str], file_values: Mapping[str, Any], values: Any
) -> None:
    """``--webhook-cert`` and ``--webhook-key`` come together; the message says where the one
    given was given."""
    if bool(values["webhook_cert"]) == bool(values["webhook_key"]):
        return
    given = "webhook-cert" if values["webhook_cert"] else "webhook-key"
    option = next(o for o in OPTIONS if o.name == given)
    where = _given(option, getattr(args, option.attr), env, file_values, args.config)
    place = where[1] if where is not None else f"--{given}"
    raise SettingsError(
        f"{place}: --webhook-cert and --webhook-key are given together or not at all"
    )


def _check_election(
    args: argparse.Namespace, env: Mapping[str, str], file_values: Mapping[str, Any], values: Any
) -> None:
    """The Lease's timings fit together as kube-scheduler requires: retry period x 1.2 < renew
    deadline < lease duration (the difference is the leader's safety margin,
    ``scheduler/k8s/lease.py``); the message says where each value was given."""

    def shown(name: str) -> str:
        option = next(o for o in OPTIONS if o.name == name)
        where = _given(option, getattr(args, option.attr), env, file_values, args.config)
        if where is None:
            return f"--{name} (default {values[option.attr]:g} s)"
        return f"{where[1]} ({values[option.attr]:g} s)"

    lease = values["leader_elect_lease_duration"]
    renew = values["leader_elect_renew_deadline"]
    retry = values["leader_elect_retry_period"]
    if not renew < lease:
        raise SettingsError(
            f"{shown('leader-elect-renew-deadline')} must be less than "
            f"{shown('leader-elect-lease-duration')}: the leader stops writing at the renew "
            "deadline, before a standby may take the Lease"
        )
    if not retry * ELECTION_JITTER < renew:
        raise SettingsError(
            f"{shown('leader-elect-retry-period')} times {ELECTION_JITTER} must be less than "
            f"{shown('leader-elect-renew-deadline')}: the leader must be able to try to renew "
            "more than once before its deadline"
        )


def _config_file(path: str) -> dict[str, Any]:
    """The config file's options by flag name (``bind_workers`` is read as ``bind-workers``);
    an unreadable file, one that is not a mapping, or an unknown option is refused."""
    try:
        loaded = yaml.safe_load(Path(path).read_text())
    except (OSError, yaml.YAMLError) as exc:
        raise SettingsError(f"--config {path}: {exc}") from exc
    if loaded is None:
        loaded = {}
    if not isinstance(loaded, dict):
        raise SettingsError(f"--config {path}: must be a mapping of option: value")
    known = {o.name for o in OPTIONS} | {o.attr for o in OPTIONS}
    for key in loaded:
        if key not in known:
            raise SettingsError(f"--config {path}: unknown option {key!r}")
    return {str(k).replace("_", "-"): v for k, v in loaded.items()}


def _value(
    option: Option,
    flag: str | None,
    env: Mapping[str, str],
    file_values: Mapping[str, Any],
    config: str | None,
) -> Any:
    """One option's value, parsed from where it was given first, else its default."""
    given = _given(option, flag, env, file_values, config)
    if given is None:
        return option.default
    raw, where = given
    if isinstance(raw, list):
        raw = ",".join(str(x) for x in raw)
    try:
        return option.parse(str(raw))
    except ValueError as exc:
        raise SettingsError(f"{where}: {exc}") from exc


def _given(
    option: Option,
    flag: str | None,
    env: Mapping[str, str],
    file_values: Mapping[str, Any],
    config: str | None,
) -> tuple[Any, str] | None:
    """The raw value and where it came from, by precedence; ``None`` when nowhere gives it."""
    if flag is not None:
        return flag, f"--{option.name}"
    if option.env in env:
        return env[option.env], f"env {option.env}"
    if option.name in file_values:
        return file_values[option.name], f"{config}: {option.name}"
    return None
