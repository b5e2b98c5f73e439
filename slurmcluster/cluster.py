"""Start and stop a Slurm cluster: slurmctld and N slurmd nodes, each a host of its own.

Layout (one run folder, one ``tag`` from its path, as the devcluster's real nodes have):

- a host bridge ``shb<tag>`` with ``10.<octet>.0.1/24`` (``devcluster.realnode.network_for``
  picks an octet no other interface here uses); every other address is inside a network
  namespace this module creates, and no namespace has a default route, so nothing leaves the
  machine;
- the controller: namespace ``ssc<tag>``, address ``.2``, host name ``slurmctl``, ``slurmctld``;
- node *i*: namespace ``ssn<tag><i>``, address ``.10+i``, host name ``sn<i>`` (its own UTS
  namespace, so ``hostname`` in a job says the node), ``slurmd -N sn<i>`` with its own spool
  (``/run/ssl<tag>/sn<i>``: the steps' Unix sockets are there, and a socket's path is short),
  pid and log files;
- one ``munged`` on the host with its key and socket in ``/run/ssl<tag>/`` (a Unix socket is
  reached from every network namespace); ``AuthInfo`` names the socket.

Every daemon runs in the foreground under util-linux's ``setpriv --pdeathsig`` when the caller
asks for ``die_with_parent`` (test sessions), as ``devcluster/process.py`` starts components.
Slurm's configuration needs nothing of the machine: ``proctrack/linuxproc``, ``task/none``, no
cgroup plugin (no cgroup.conf is read), no accounting, root as SlurmUser.

State machine: ``up`` records the layout in ``state.json`` (in the run folder and in the
machine's registry, ``/run/shoal-slurmcluster/<tag>.json``) before it makes anything, and every
daemon as it starts, so :func:`down` (also on a failed ``up``) finds all of it. ``down`` kills
every process in the cluster's namespaces (slurmstepd and the jobs outlive slurmd's process
group), the daemons, deletes the namespaces (their veth pairs go with them), the bridge and
``/run/ssl<tag>/``, and removes the record. A cluster whose owner and daemons are all gone (a killed
test session) is torn down by the next ``up`` on the machine.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import secrets
import shutil
import signal
import subprocess
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Final

from devcluster import process, realnode
from devcluster.process import Proc

Say = Callable[[str], None]

STATE: Final = "state.json"
CONF: Final = "slurm.conf"
CONTROLLER: Final = "slurmctl"
PARTITION: Final = "shoal"
CTLD_PORT: Final = 6817
SLURMD_PORT: Final = 6818
#: Each node's size as Slurm sees it (``SlurmdParameters=config_overrides``: whatever the
#: machine has).
NODE_CPUS: Final = 2
NODE_MEMORY_MB: Final = 1024
#: How long a job step credential lives, and so how long a requeued batch job waits before it
#: may start again (Slurm's default is 120 s).
CRED_EXPIRE_S: Final = 20
#: The machine's record of the clusters it runs, and the locks around starting them.
REGISTRY: Final = Path("/run/shoal-slurmcluster")


class SlurmClusterError(Exception):
    """A cluster did not start or did not stop; the message names the log to read."""


def _say(message: str) -> None:
    print(message, flush=True)


def default_run_dir() -> Path:
    return Path.home() / ".cache" / "shoal" / "run" / "slurm"


def in_host(netns: str, hostname: str, argv: Sequence[str]) -> list[str]:
    """``argv`` as run on a host of the cluster: in network namespace ``netns`` with a UTS
    namespace of its own named ``hostname``. Every program in the chain execs the next, so the
    pid (and a death signal set before) is the program's."""
    return [
        "nsenter", f"--net=/run/netns/{netns}", "--",
        "unshare", "--uts", "--",
        "sh", "-c", 'hostname "$0" && exec "$@"', hostname, *argv,
    ]  # fmt: skip


@dataclass(frozen=True, slots=True)
class Node:
    """One slurmd host. ``exec`` runs a command there, as a program on that node would run."""

    name: str
    index: int
    ip: str
    netns: str
    folder: str
    spool: str
    conf: str
    log: str

    def command(self, argv: Sequence[str]) -> list[str]:
        """The full command line that runs ``argv`` on this node with ``SLURM_CONF`` set (for
        ``subprocess.Popen`` when the caller wants a long-running process)."""
        return in_host(self.netns, self.name, ["env", f"SLURM_CONF={self.conf}", *argv])

    def exec(
        self,
        argv: Sequence[str],
        *,
        timeout: float = 60.0,
        cwd: str | Path | None = None,
        env: Mapping[str, str] | None = None,
        input: str | None = None,
    ) -> subprocess.CompletedProcess[str]:
        """Run ``argv`` on this node and wait: its network namespace, its host name,
        ``SLURM_CONF`` set; output captured as text; never raises on a non-zero exit."""
        return subprocess.run(
            self.command(argv),
            capture_output=True,
            text=True,
            timeout=timeout,
            cwd=cwd or Path(self.conf).parent / "work",
            env={**os.environ, **(env or {})},
            input=input,
            check=False,
        )


@dataclass(frozen=True, slots=True)
class Cluster:
    """A started cluster: its configuration, controller and nodes. ``run`` is a client on the
    host (``scontrol``, ``sbatch``, ``srun``...), which reaches every host over the bridge."""

    run_dir: str
    tag: str
    octet: int
    controller_ip: str
    controller_netns: str
    socket_dir: str
    nodes: tuple[Node, ...]

    @property
    def conf(self) -> Path:
        """The ``slurm.conf`` every daemon and client reads (``SLURM_CONF``)."""
        return Path(self.run_dir) / CONF

    @property
    def work_dir(self) -> Path:
        """The working folder ``run`` and ``Node.exec`` use unless told another (job output
        and ``scontrol``'s resize scripts land there)."""
        return Path(self.run_dir) / "work"

    @property
    def bridge(self) -> str:
        return realnode.Network(tag=self.tag, octet=self.octet).bridge

    @property
    def host_ip(self) -> str:
        """The host's address on the bridge (what the nodes see a host client come from)."""
        return realnode.Network(tag=self.tag, octet=self.octet).host_ip

    @property
    def munge_socket(self) -> Path:
        return Path(self.socket_dir) / "munge.socket"

    @property
    def netns(self) -> tuple[str, ...]:
        return (self.controller_netns, *(n.netns for n in self.nodes))

    def env(self) -> dict[str, str]:
        """This process's environment with ``SLURM_CONF`` set, for a client on the host."""
        return {**os.environ, "SLURM_CONF": str(self.conf)}

    def node(self, name: str) -> Node:
        for node in self.nodes:
            if node.name == name:
                return node
        raise KeyError(f"no node {name} in the cluster of {self.run_dir}")

    def run(
        self,
        argv: Sequence[str],
        *,
        timeout: float = 60.0,
        cwd: str | Path | None = None,
        input: str | None = None,
    ) -> subprocess.CompletedProcess[str]:
        """Run a Slurm client on the host and wait; output captured; never raises on a
        non-zero exit."""
        return subprocess.run(
            list(argv),
            capture_output=True,
            text=True,
            timeout=timeout,
            cwd=cwd or self.work_dir,
            env=self.env(),
            input=input,
            check=False,
        )

    def to_json(self) -> dict[str, Any]:
        raw = asdict(self)
        raw["nodes"] = [asdict(n) for n in self.nodes]
        return raw

    @staticmethod
    def from_json(raw: Mapping[str, Any]) -> Cluster:
        fields = dict(raw)
        fields["nodes"] = tuple(Node(**n) for n in raw["nodes"])
        return Cluster(**fields)

    @staticmethod
    def load(run_dir: Path) -> Cluster:
        """The cluster ``up`` started in ``run_dir``; :class:`SlurmClusterError` when none."""
        try:
            raw = json.loads((run_dir / STATE).read_text())
        except FileNotFoundError:
            raise SlurmClusterError(f"no Slurm cluster runs from {run_dir}") from None
        return Cluster.from_json(raw["cluster"])


# --------------------------------------------------------------------------------------------
# Configuration


def layout(run_dir: Path, nodes: int) -> Cluster:
    network = realnode.network_for(run_dir)
    tag = network.tag
    conf = str(run_dir / CONF)
    return Cluster(
        run_dir=str(run_dir),
        tag=tag,
        octet=network.octet,
        controller_ip=f"10.{network.octet}.0.2",
        controller_netns=f"ssc{tag}",
        # Unix sockets live here (munged's; slurmd's and each step's in the node's spool): a
        # socket's path has a 108-byte limit a deep run folder can pass.
        socket_dir=f"/run/ssl{tag}",
        nodes=tuple(
            Node(
                name=f"sn{i}",
                index=i,
                ip=network.node_ip(i),
                netns=f"ssn{tag}{i}",
                folder=str(run_dir / "nodes" / f"sn{i}"),
                spool=f"/run/ssl{tag}/sn{i}",
                conf=conf,
                log=str(run_dir / "logs" / f"slurmd-sn{i}.log"),
            )
            for i in range(nodes)
        ),
    )


def slurm_conf(cluster: Cluster, extra: Sequence[str] = ()) -> str:
    """The cluster's ``slurm.conf``; ``extra`` lines go before the node and partition lines."""
    run = Path(cluster.run_dir)
    lines = [
        "ClusterName=shoal",
        f"SlurmctldHost={CONTROLLER}({cluster.controller_ip})",
        f"SlurmctldPort={CTLD_PORT}",
        f"SlurmdPort={SLURMD_PORT}",
        "SlurmUser=root",
        "SlurmdUser=root",
        "AuthType=auth/munge",
        "CredType=cred/munge",
        f"AuthInfo=socket={cluster.munge_socket},cred_expire={CRED_EXPIRE_S}",
        f"StateSaveLocation={run / 'ctld' / 'state'}",
        f"SlurmctldPidFile={run / 'ctld' / 'slurmctld.pid'}",
        f"SlurmctldLogFile={run / 'logs' / 'slurmctld.log'}",
        f"SlurmdSpoolDir={cluster.socket_dir}/%n",
        f"SlurmdPidFile={run / 'nodes' / '%n' / 'slurmd.pid'}",
        f"SlurmdLogFile={run / 'logs' / 'slurmd-%n.log'}",
        "SlurmctldDebug=info",
        "SlurmdDebug=info",
        # Nothing here needs systemd or cgroup delegation: processes are tracked through /proc.
        "ProctrackType=proctrack/linuxproc",
        "TaskPlugin=task/none",
        "JobAcctGatherType=jobacct_gather/none",
        "AccountingStorageType=accounting_storage/none",
        "JobCompType=jobcomp/none",
        "MpiDefault=none",
        "SwitchType=switch/none",
        "SelectType=select/cons_tres",
        "SelectTypeParameters=CR_Core",
        "SlurmdParameters=config_overrides",
        "ReturnToService=2",
        "JobRequeue=1",
        # The scheduler looks at pending jobs every 2 s (a requeued job waits out its begin time
        # and nothing else wakes the scheduler then).
        "SchedulerParameters=sched_interval=2,bf_interval=5",
        "KillWait=5",
        "MinJobAge=600",
        "MessageTimeout=20",
        "SlurmdTimeout=60",
        "InactiveLimit=0",
        *extra,
    ]
    for node in cluster.nodes:
        lines.append(
            f"NodeName={node.name} NodeAddr={node.ip} NodeHostname={node.name} "
            f"CPUs={NODE_CPUS} RealMemory={NODE_MEMORY_MB} State=UNKNOWN"
        )
    lines.append(f"PartitionName={PARTITION} Nodes=ALL Default=YES MaxTime=INFINITE State=UP")
    return "\n".join(lines) + "\n"


# --------------------------------------------------------------------------------------------
# Up


def up(
    run_dir: Path,
    *,
    nodes: int = 3,
    die_with_parent: bool = False,
    extra_conf: Sequence[str] = (),
    timeout: float = 90.0,
    say: Say = _say,
) -> Cluster:
    """Start a cluster of ``nodes`` slurmd hosts from ``run_dir`` and wait until every node is
    idle. Everything is torn down again when it fails on the way."""
    run_dir = run_dir.resolve()
    REGISTRY.mkdir(mode=0o700, exist_ok=True)
    with _locked(REGISTRY / "setup.lock"):
        _sweep(say)
        if (run_dir / STATE).exists():
            raise SlurmClusterError(f"a Slurm cluster already runs from {run_dir}: `down` first")
        cluster = layout(run_dir, nodes)
        for old in ("logs", "ctld", "nodes"):  # an earlier cluster's, stopped
            shutil.rmtree(run_dir / old, ignore_errors=True)
        for sub in ("logs", "work", "ctld/state"):
            (run_dir / sub).mkdir(parents=True, exist_ok=True)
        procs: list[Proc] = []
        _record(cluster, procs)
        try:
            _start(cluster, procs, die_with_parent=die_with_parent, extra=extra_conf, say=say)
            _wait_ready(cluster, procs, timeout)
        except BaseException:
            _teardown(cluster, procs, say)
            _forget(cluster)
            raise
    say(f"slurmcluster: {nodes} nodes up; SLURM_CONF={cluster.conf}")
    return cluster


def _start(
    cluster: Cluster,
    procs: list[Proc],
    *,
    die_with_parent: bool,
    extra: Sequence[str],
    say: Say,
) -> None:
    run = Path(cluster.run_dir)
    logs = run / "logs"
    cluster.conf.write_text(slurm_conf(cluster, extra))

    munge = Path(cluster.socket_dir)
    shutil.rmtree(munge, ignore_errors=True)
    munge.mkdir(mode=0o700)
    key = munge / "munge.key"
    key.write_bytes(secrets.token_bytes(1024))
    key.chmod(0o600)

    def spawn(name: str, argv: list[str]) -> Proc:
        proc, _ = process.spawn(name, argv, logs / f"{name}.out", die_with_parent=die_with_parent)
        procs.append(proc)
        _record(cluster, procs)
        return proc

    munged = spawn(
        "munged",
        [
            _program("munged"), "--foreground", "--force",
            f"--socket={cluster.munge_socket}", f"--key-file={key}",
            f"--pid-file={munge / 'munged.pid'}", f"--seed-file={munge / 'munged.seed'}",
            f"--log-file={logs / 'munged.log'}",
        ],
    )  # fmt: skip
    _wait_for("munged's socket", cluster.munge_socket.exists, 30, munged)

    network = realnode.Network(tag=cluster.tag, octet=cluster.octet)
    realnode.create_bridge(network)
    _add_host(cluster, cluster.controller_netns, cluster.controller_ip, "c")
    for node in cluster.nodes:
        _add_host(cluster, node.netns, node.ip, str(node.index))
        Path(node.folder).mkdir(parents=True, exist_ok=True)
        Path(node.spool).mkdir(mode=0o700)

    say(f"slurmcluster: starting slurmctld at {cluster.controller_ip}")
    conf = str(cluster.conf)
    spawn(
        "slurmctld",
        in_host(
            cluster.controller_netns,
            CONTROLLER,
            [_program("slurmctld"), "-D", "-f", conf],
        ),
    )
    for node in cluster.nodes:
        spawn(
            f"slurmd-{node.name}",
            node.command([_program("slurmd"), "-D", "-N", node.name, "-f", conf]),
        )


def _add_host(cluster: Cluster, netns: str, ip: str, suffix: str) -> None:
    """A network namespace joined to the bridge by a veth pair, ``ip/24`` on its ``eth0``."""
    host_end, inner = f"ssv{cluster.tag}{suffix}", f"ssp{cluster.tag}{suffix}"
    _ip(["netns", "add", netns])
    _ip(["link", "add", host_end, "type", "veth", "peer", "name", inner])
    _ip(["link", "set", host_end, "master", cluster.bridge, "up"])
    _ip(["link", "set", inner, "netns", netns])
    for argv in (
        ["link", "set", inner, "name", "eth0"],
        ["addr", "add", f"{ip}/24", "dev", "eth0"],
        ["link", "set", "eth0", "up"],
        ["link", "set", "lo", "up"],
    ):
        _ip(["-n", netns, *argv])


def _ip(argv: Sequence[str], *, check: bool = True) -> None:
    done = subprocess.run(["ip", *argv], capture_output=True, text=True, check=False, timeout=60)
    if check and done.returncode != 0:
        raise SlurmClusterError(f"$ ip {' '.join(argv)}\n{done.stderr.strip()}")


def _program(name: str) -> str:
    found = shutil.which(name, path=f"{os.environ.get('PATH', '')}:/usr/sbin:/sbin")
    if found is None:
        raise SlurmClusterError(f"{name} is not installed: run `make slurm` as root")
    return found


def _wait_for(what: str, check: Callable[[], bool], timeout: float, *procs: Proc) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if check():
            return
        for proc in procs:
            if not process.alive(proc):
                raise SlurmClusterError(
                    f"{proc.name} exited while waiting for {what}; see {proc.log} and the "
                    f"Slurm logs beside it"
                )
        time.sleep(0.2)
    raise SlurmClusterError(
        f"timed out after {timeout:.0f} s waiting for {what}; see the logs "
        f"in {Path(procs[0].log).parent if procs else 'the run folder'}"
    )


def node_states(cluster: Cluster) -> dict[str, str]:
    """Each node's state as ``sinfo`` reports it (``idle``, ``alloc``, ``drain``...); empty
    when the controller does not answer."""
    done = cluster.run(["sinfo", "--noheader", "--Node", "--format=%N %t"], timeout=30)
    if done.returncode != 0:
        return {}
    states = {}
    for line in done.stdout.splitlines():
        name, _, state = line.strip().partition(" ")
        states[name] = state.strip()
    return states


def _wait_ready(cluster: Cluster, procs: list[Proc], timeout: float) -> None:
    def pinged() -> bool:
        done = cluster.run(["scontrol", "ping"], timeout=30)
        return done.returncode == 0 and "UP" in done.stdout

    _wait_for("slurmctld to answer `scontrol ping`", pinged, timeout, *procs)
    names = {n.name for n in cluster.nodes}

    def idle() -> bool:
        states = node_states(cluster)
        return set(states) == names and all(s == "idle" for s in states.values())

    _wait_for("every node to be idle", idle, timeout, *procs)


# --------------------------------------------------------------------------------------------
# Down


def down(run_dir: Path, *, say: Say = _say) -> list[str]:
    """Stop the cluster started from ``run_dir`` and remove what it made; returns what could not
    be removed (empty when all is gone). Logs stay in ``<run>/logs/``."""
    run_dir = run_dir.resolve()
    try:
        raw = json.loads((run_dir / STATE).read_text())
    except FileNotFoundError:
        raise SlurmClusterError(f"no Slurm cluster runs from {run_dir}") from None
    cluster = Cluster.from_json(raw["cluster"])
    procs = [Proc.from_json(p) for p in raw["procs"]]
    left = _teardown(cluster, procs, say)
    _forget(cluster)
    say("slurmcluster: down" + (f"; left behind: {', '.join(left)}" if left else ""))
    return left


def _teardown(cluster: Cluster, procs: Sequence[Proc], say: Say) -> list[str]:
    daemons = [p for p in procs if p.name != "munged"]
    for proc in reversed(daemons):
        process.stop(proc, grace=5)
    left = []
    for netns in cluster.netns:
        if not _kill_netns(netns):
            left.append(f"processes in {netns}")
        _ip(["netns", "del", netns], check=False)
        if Path(f"/run/netns/{netns}").exists():
            left.append(f"network namespace {netns}")
    realnode.delete_bridge(realnode.Network(tag=cluster.tag, octet=cluster.octet))
    for proc in procs:
        if proc.name == "munged":
            process.stop(proc, grace=5)
    left += [p.name for p in procs if process.alive(p)]
    shutil.rmtree(cluster.socket_dir, ignore_errors=True)
    if left:
        say(f"slurmcluster: could not remove {', '.join(left)}")
    return left


def in_netns(netns: str) -> list[int]:
    """The processes whose network namespace is ``netns`` (``ip netns`` names it)."""
    try:
        target = os.stat(f"/run/netns/{netns}")
    except FileNotFoundError:
        return []
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            ns = os.stat(entry / "ns" / "net")
        except OSError:
            continue
        if (ns.st_ino, ns.st_dev) == (target.st_ino, target.st_dev):
            found.append(int(entry.name))
    return found


def _kill_netns(netns: str) -> bool:
    """SIGKILL every process in ``netns`` until none is left; False when some stay."""
    for _attempt in range(100):
        pids = in_netns(netns)
        if not pids:
            return True
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
            with contextlib.suppress(ChildProcessError):
                os.waitpid(pid, os.WNOHANG)
        time.sleep(0.05)
    return not in_netns(netns)


# --------------------------------------------------------------------------------------------
# The machine's record of its clusters


def _record(cluster: Cluster, procs: Sequence[Proc]) -> None:
    raw = {
        "cluster": cluster.to_json(),
        "procs": [p.to_json() for p in procs],
        "owner": {"pid": os.getpid(), "start_ticks": _ticks(os.getpid())},
    }
    text = json.dumps(raw, indent=2)
    for path in (Path(cluster.run_dir) / STATE, REGISTRY / f"{cluster.tag}.json"):
        partial = path.with_suffix(".partial")
        partial.write_text(text)
        partial.replace(path)


def _forget(cluster: Cluster) -> None:
    (Path(cluster.run_dir) / STATE).unlink(missing_ok=True)
    (REGISTRY / f"{cluster.tag}.json").unlink(missing_ok=True)


def _ticks(pid: int) -> int:
    text = Path(f"/proc/{pid}/stat").read_text()
    return int(text[text.rindex(")") + 2 :].split()[19])


def _sweep(say: Say) -> None:
    """Tear down every recorded cluster whose owner and daemons have all exited (a test session
    killed before ``down``: its slurmstepds, jobs and namespaces would stay)."""
    for path in sorted(REGISTRY.glob("*.json")):
        try:
            raw = json.loads(path.read_text())
            cluster = Cluster.from_json(raw["cluster"])
            procs = [Proc.from_json(p) for p in raw["procs"]]
            owner = Proc(
                name="owner",
                pid=raw["owner"]["pid"],
                start_ticks=raw["owner"]["start_ticks"],
                log="",
            )
        except (OSError, ValueError, KeyError, TypeError):
            path.unlink(missing_ok=True)
            continue
        if process.alive(owner) or any(process.alive(p) for p in procs):
            continue
        say(f"slurmcluster: removing the cluster {cluster.run_dir} left behind")
        _teardown(cluster, procs, say)
        _forget(cluster)


@contextlib.contextmanager
def _locked(path: Path, timeout: float = 600.0) -> Iterator[None]:
    with path.open("w") as lock:
        deadline = time.monotonic() + timeout
        while True:
            try:
                fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() > deadline:
                    raise SlurmClusterError(
                        f"{path} stayed locked for {timeout:.0f} s (another Slurm cluster)"
                    ) from None
                time.sleep(0.5)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


#: How long :func:`one_at_a_time` waits for the slot: another run's whole Slurm folder, which
#: took about 20 minutes beside that run (8 minutes quiet). It was 480 s, and a run beside
#: another gave up while the other's cluster still held the slot.
SLOT_WAIT: Final = 1800.0


@contextlib.contextmanager
def one_at_a_time(timeout: float = SLOT_WAIT) -> Iterator[None]:
    """Hold the machine's Slurm test slot: test sessions (xdist workers, several runs of the
    suite) take turns running a cluster, so a loaded machine never carries two. Released when
    the block ends or the process dies."""
    REGISTRY.mkdir(mode=0o700, exist_ok=True)
    with _locked(REGISTRY / "slot.lock", timeout):
        yield
