"""The leader's fence: a replica writes only while it holds the Lease by its own clock, counted
from when its last successful renewal was sent, so a leader that was paused wakes up fenced."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from scheduler.k8s.client import FencedApi, NotLeader, Rest, TokenBucket
from scheduler.k8s.lease import LeaseFence, TimedLeaseLock, holds_lease, release_lease
from scheduler.k8s.status import ApiBinder
from scheduler.model import GangKey, NodeName
from scheduler.settings import SettingsError, resolve
from tests.unit.scheduler.builders import pod

LEASE, RENEW = 15.0, 10.0
MARGIN = LEASE - RENEW

times = st.floats(min_value=0, max_value=1e6, allow_nan=False)
spans = st.floats(min_value=0, max_value=1e4, allow_nan=False)


@given(times, spans)
def test_the_lease_is_held_until_the_margin_before_it_runs_out(
    renewed: float, since: float
) -> None:
    now = renewed + since
    assert holds_lease(renewed, LEASE, MARGIN, now) == (since < LEASE - MARGIN)


@given(times)
def test_a_replica_that_never_renewed_holds_nothing(now: float) -> None:
    assert not holds_lease(None, LEASE, MARGIN, now)


@given(times, spans, spans)
def test_once_lost_by_the_clock_the_lease_stays_lost_until_a_renewal(
    renewed: float, since: float, later: float
) -> None:
    if not holds_lease(renewed, LEASE, MARGIN, renewed + since):
        assert not holds_lease(renewed, LEASE, MARGIN, renewed + since + later)


class Clock:
    def __init__(self, now: float = 1000.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


class SlowLock:
    """A LeaseLock whose requests take ``takes`` seconds and answer ``answer``."""

    def __init__(self, clock: Clock, *, answer: bool = True, takes: float = 0.5) -> None:
        self.name, self.namespace, self.identity = "shoal", "kube-system", "me"
        self.clock = clock
        self.answer = answer
        self.takes = takes

    def get(self, name: str, namespace: str) -> tuple[bool, Any]:
        return True, None

    def update(self, name: str, namespace: str, record: Any) -> bool:
        self.clock.now += self.takes
        return self.answer

    create = update


def _record(holder: str) -> Any:
    return SimpleNamespace(holder_identity=holder)


def test_a_paused_leader_wakes_up_fenced_and_a_renewal_opens_the_fence_again() -> None:
    clock = Clock()
    fence = LeaseFence(LEASE, RENEW, clock)
    lock = TimedLeaseLock(SlowLock(clock, takes=0.5), clock, fence)
    assert fence.refusal() is not None  # never renewed
    assert lock.update("shoal", "kube-system", _record("me"))
    renewed = clock.now - 0.5  # the time the request was sent, not when it came back
    clock.now = renewed + RENEW - 0.01
    assert fence.refusal() is None
    clock.now = renewed + 25  # stopped for 25 s: the clock counted the pause
    why = fence.refusal()
    assert why is not None
    assert "25.0 s ago" in why
    assert lock.update("shoal", "kube-system", _record("me"))
    assert fence.refusal() is None


@pytest.mark.parametrize("method", ["create", "update"])
def test_only_a_write_that_made_this_replica_the_holder_counts_as_a_renewal(method: str) -> None:
    clock = Clock()
    fence = LeaseFence(LEASE, RENEW, clock)
    failing = TimedLeaseLock(SlowLock(clock, answer=False), clock, fence)
    assert not getattr(failing, method)("shoal", "kube-system", _record("me"))
    assert fence.refusal() is not None
    other = TimedLeaseLock(SlowLock(clock), clock, fence)
    assert getattr(other, method)("shoal", "kube-system", _record("someone-else"))
    assert fence.refusal() is not None
    assert getattr(other, method)("shoal", "kube-system", _record("me"))
    assert fence.refusal() is None


class Wire:
    """The client's REST layer: records what was sent."""

    def __init__(self) -> None:
        self.sent: list[tuple[str, str]] = []

    def request(self, method: str, url: str, **_: Any) -> Any:
        self.sent.append((method, url))
        return SimpleNamespace(
            status=201,
            reason="Created",
            headers={},
            read=lambda: b"{}",
            response=SimpleNamespace(release_conn=lambda: None),
        )


def test_a_fenced_client_sends_no_write_and_every_read_while_the_lease_is_not_held() -> None:
    wire = Wire()
    api = SimpleNamespace(
        configuration=SimpleNamespace(host="https://api.invalid"),
        update_params_for_auth=lambda *_: None,
        rest_client=wire,
    )
    why: list[str | None] = [None]
    rest = Rest(FencedApi(api, lambda: why[0]))
    rest.call("POST", "/api/v1/namespaces/ns/pods/a/binding", {})
    why[0] = "the Lease was last renewed 25.0 s ago"
    for method in ("POST", "PATCH", "PUT", "DELETE"):
        with pytest.raises(NotLeader, match=r"25\.0 s ago"):
            rest.call(method, "/api/v1/namespaces/ns/pods/b/binding", {})
    rest.get("/api/v1/namespaces/ns/pods/b")
    assert wire.sent == [
        ("POST", "https://api.invalid/api/v1/namespaces/ns/pods/a/binding"),
        ("GET", "https://api.invalid/api/v1/namespaces/ns/pods/b"),
    ]


def test_a_fenced_binder_binds_nothing_and_says_why() -> None:
    wire = Wire()
    api = SimpleNamespace(
        configuration=SimpleNamespace(host="https://api.invalid"),
        update_params_for_auth=lambda *_: None,
        rest_client=wire,
    )
    binder = ApiBinder(FencedApi(api, lambda: "this replica does not lead"), TokenBucket(0, 1))
    member = pod("a")
    error = binder.bind(member, NodeName("n1"))
    assert error == "not sent, not the leader: this replica does not lead"
    assert binder.evict(member) is not None
    assert binder.ask_to_leave(member, 100.0, GangKey("ns/g")) is not None
    assert wire.sent == []


def test_the_lease_timings_default_to_kube_schedulers() -> None:
    settings = resolve([], {})
    assert settings.leader_elect_lease_duration == 15
    assert settings.leader_elect_renew_deadline == 10.0
    assert settings.leader_elect_retry_period == 2.0


def test_the_lease_timings_are_flags_variables_and_config_keys(tmp_path: Path) -> None:
    conf = tmp_path / "scheduler.yaml"
    conf.write_text("leader-elect-lease-duration: 4\nleader-elect-renew-deadline: 3s\n")
    env = {"SHOAL_SCHEDULER_LEADER_ELECT_RETRY_PERIOD": "1500ms"}
    settings = resolve(["--config", str(conf)], env)
    assert settings.leader_elect_lease_duration == 4
    assert settings.leader_elect_renew_deadline == 3.0
    assert settings.leader_elect_retry_period == 1.5
    flagged = resolve(
        ["--leader-elect-lease-duration", "1m", "--leader-elect-renew-deadline", "40"]
    )
    assert flagged.leader_elect_lease_duration == 60


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (
            ["--leader-elect-renew-deadline", "15"],
            r"--leader-elect-renew-deadline \(15 s\) must be less than "
            r"--leader-elect-lease-duration \(default 15 s\)",
        ),
        (
            ["--leader-elect-lease-duration", "4", "--leader-elect-renew-deadline", "2"],
            r"--leader-elect-retry-period \(default 2 s\) times 1.2 must be less than "
            r"--leader-elect-renew-deadline \(2 s\)",
        ),
        (["--leader-elect-lease-duration", "4.5"], "expected whole seconds"),
        (["--leader-elect-retry-period", "0.5"], "expected a duration from 1 s"),
        (["--leader-elect-renew-deadline", "soon"], "--leader-elect-renew-deadline"),
    ],
)
def test_lease_timings_that_do_not_fit_together_are_refused_with_where_they_came_from(
    argv: list[str], message: str
) -> None:
    with pytest.raises(SettingsError, match=message):
        resolve(argv, {})


def test_a_wrong_timing_in_the_config_file_names_the_file(tmp_path: Path) -> None:
    conf = tmp_path / "scheduler.yaml"
    conf.write_text("leader-elect-renew-deadline: 20\n")
    with pytest.raises(SettingsError, match=f"{conf}: leader-elect-renew-deadline"):
        resolve(["--config", str(conf)], {})


class Leases:
    """A Lease held by ``holder``; ``replaced`` is what was written back."""

    def __init__(self, holder: str) -> None:
        self.lease = SimpleNamespace(
            spec=SimpleNamespace(
                holder_identity=holder,
                lease_duration_seconds=15,
                acquire_time=None,
                renew_time=None,
            )
        )
        self.replaced: list[Any] = []

    def read_namespaced_lease(self, name: str, namespace: str) -> Any:
        return self.lease

    def replace_namespaced_lease(self, name: str, namespace: str, body: Any) -> Any:
        self.replaced.append(body)
        return body


def test_a_stopping_leader_gives_the_lease_back_for_the_standby_to_take_at_once() -> None:
    leases = Leases("me")
    assert release_lease(leases, "shoal-scheduler", "ns", "me")
    (written,) = leases.replaced
    assert written.spec.holder_identity is None
    assert written.spec.lease_duration_seconds == 1
    assert written.spec.renew_time is not None


def test_a_lease_held_by_another_replica_is_not_touched() -> None:
    leases = Leases("the-other")
    assert not release_lease(leases, "shoal-scheduler", "ns", "me")
    assert leases.replaced == []


def test_a_closed_lock_neither_acquires_nor_renews() -> None:
    wire = SimpleNamespace(name="l", namespace="ns", identity="me", calls=[])
    wire.create = lambda *a: wire.calls.append("create") or True
    wire.update = lambda *a: wire.calls.append("update") or True
    lock = TimedLeaseLock(wire, Clock(), LeaseFence(15, 10, Clock()))
    lock.closed = True
    record = SimpleNamespace(holder_identity="me")
    assert not lock.create("l", "ns", record)
    assert not lock.update("l", "ns", record)
    assert wire.calls == []
