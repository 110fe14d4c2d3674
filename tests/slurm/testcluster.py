"""A real Slurm cluster on this host for the tests: munge, slurmctld and two slurmd nodes
(``start(..., nodes=node_names(4))`` for a test that needs more).

Also a command to start, inspect and stop it by hand (root; docs/slurm-tests.md):

    eval "$(python tests/slurm/testcluster.py up)"   # prints: export SLURM_CONF=...
    sinfo; snakemake --profile profiles/testcluster; squeue
    python tests/slurm/testcluster.py status
    python tests/slurm/testcluster.py down

Everything lives in one temporary directory: its own munge key and socket, its own
slurm.conf (on free ports), state, spool and logs. Clients find it through ``SLURM_CONF``,
which ``TestCluster.env`` sets; jobs inherit it, so a system-wide Slurm (if any) is left
alone. Only root can run it (slurmd starts jobs as their user).

Each node advertises ``GPUS_PER_NODE`` GPUs as a generic resource, backed by fake device
files (character devices like /dev/null, made with mknod): slurmd drops file-less GPUs,
and with ``TaskPlugin=task/none`` nothing is constrained, so a job asking for
``--gres=gpu:N`` gets ``CUDA_VISIBLE_DEVICES`` set as on a GPU cluster. Jobs that ask
for no GPUs run as before.
"""

from __future__ import annotations

import contextlib
import os
import shlex
import shutil
import signal
import socket
import stat
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

NODES = ("n1", "n2")  # the nodes of a cluster unless its start names others (node_names)
PARTITION = "batch"
# A second partition over the same nodes, never the default, whose limits a job exceeds on
# purpose: with EnforcePartLimits=NO (Slurm's default) such a job is queued but never
# started, PENDING for PartitionNodeLimit or PartitionTimeLimit, as behind a site's QOS
# limit (there is no QOS without slurmdbd). tests/slurm/test_training.py uses it.
LIMITED_PARTITION = "limited"
LIMITED_MAX_NODES = 1
LIMITED_MAX_MINUTES = 5
# Declared per node; the two nodes share this host's cores (config_overrides lets the
# declaration exceed the hardware), so two 4-thread jobs fit on one node.
NODE_CPUS = 8
NODE_MEMORY_MB = 20000
# GPUs per node (fake device files, see above): the cluster rehearsal's whole-node jobs
# ask for all of them (config/clusters/rehearsal.yaml says the same number).
GPUS_PER_NODE = 2
HOSTS_COMMENT = "  # hpcllm test Slurm cluster (tests/slurm)"
BINARIES = (
    "munged",
    "munge",
    "slurmctld",
    "slurmd",
    "sbatch",
    "srun",
    "squeue",
    "scontrol",
    "unshare",
)
NODE_VARIABLE = "HPCLLM_TEST_NODE"  # in the environment of a node's slurmd and slurmstepds
DEFAULT_CONF_DIR = "/etc/slurm"  # where Slurm's clients look without SLURM_CONF
# The time limits below guard against hangs, not speed: a client command takes well under
# a second and nodes come up within ~5 s on a quiet machine; the limits are 20x and more,
# since a loaded machine (load 10-17 on 2 cores) was seen to slow steps ~8x.
# The first line of every slurm.conf written here: marks a folder the command may reuse.
CONF_MARKER = "# hpcllm test Slurm cluster (tests/slurm/testcluster.py)"
DAEMONS = ("slurmctld", "slurmd", "slurmstepd")
# Where the command keeps a cluster started by hand (--dir changes it).
DEFAULT_DIR = Path("~/.cache/hpcllm/testcluster")


def missing_requirements() -> str | None:
    """Why the test cluster cannot start here, or None when it can."""
    missing = [b for b in BINARIES if shutil.which(b) is None]
    if missing:
        return (
            f"the Slurm tests need slurm-wlm and munge ({', '.join(missing)} not found); "
            "install them with `sudo bash scripts/install-system-deps.sh`"
        )
    if not os.path.isdir(DEFAULT_CONF_DIR):
        return f"{DEFAULT_CONF_DIR} does not exist: is slurm-wlm installed?"
    if os.geteuid() != 0:
        return (
            "the Slurm tests start a real cluster (slurmd) and must run as root: "
            "`sudo .venv/bin/pytest -m slurm` (see docs/slurm-tests.md)"
        )
    return None


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def node_names(count: int) -> tuple[str, ...]:
    """The names of a cluster of ``count`` nodes: n1, n2, ..."""
    return tuple(f"n{i}" for i in range(1, count + 1))


def ensure_node_names_resolve(nodes: tuple[str, ...] = NODES) -> None:
    """torchrun's rendezvous connects to a node by name: n1, n2 (, ...) must resolve.
    The names that do not are added to /etc/hosts, as this host's address."""
    missing = []
    for node in nodes:
        try:
            socket.gethostbyname(node)
        except OSError:
            missing.append(node)
    if not missing:
        return
    with open("/etc/hosts", "a") as f:
        f.write("127.0.0.1 " + " ".join(missing) + HOSTS_COMMENT + "\n")
    for node in nodes:
        socket.gethostbyname(node)  # fails loudly if /etc/hosts is not used


def make_gpu_devices(root: Path) -> list[Path]:
    """Fake GPU device files (the /dev/null device, 1:3) for gres.conf."""
    folder = root / "dev"
    folder.mkdir(exist_ok=True)
    devices = []
    for i in range(GPUS_PER_NODE):
        device = folder / f"nvidia{i}"
        if not device.exists():
            os.mknod(device, 0o666 | stat.S_IFCHR, os.makedev(1, 3))
        devices.append(device)
    return devices


def gres_conf(root: Path, nodes: tuple[str, ...] = NODES) -> str:
    """The GPUs of every node, read by slurmd from slurm.conf's folder."""
    files = f"{root}/dev/nvidia[0-{GPUS_PER_NODE - 1}]"
    return f"NodeName={','.join(nodes)} Name=gpu File={files}\n"


def first_job_id(ctld_port: int) -> int:
    """One of 14 blocks of 1000 job ids, below the 15000 ids after which hpcllm.launch's
    job ports repeat. The clusters of a parallel test run (pytest-xdist's workers gw0,
    gw1, ...) each take their worker's block, so no two share one; a cluster started by
    hand takes the block its (free, so random) controller port picks."""
    worker = os.environ.get("PYTEST_XDIST_WORKER", "")
    block = int(worker[2:]) if worker[2:].isdigit() else ctld_port
    return 1000 * (1 + block % 14)


def slurm_conf(root: Path, name: str, ctld_port: int, node_ports: dict[str, int]) -> str:
    """The cluster's slurm.conf; its nodes are those of ``node_ports``."""
    host = socket.gethostname().split(".")[0]
    lines = [
        CONF_MARKER,
        f"ClusterName={name}",
        f"SlurmctldHost={host}",
        f"SlurmctldPort={ctld_port}",
        # Job ids of their own for each test cluster on this host: a job's rendezvous port
        # comes from its id (hpcllm.launch.JOB_PORT_SHELL), and two clusters counting from
        # 1 would give their concurrent jobs the same port.
        f"FirstJobId={first_job_id(ctld_port)}",
        "AuthType=auth/munge",
        "CredType=cred/munge",
        f"AuthInfo=socket={root}/munge.socket",
        "SlurmUser=root",
        "SlurmdUser=root",
        "MpiDefault=none",
        "ProctrackType=proctrack/linuxproc",
        "TaskPlugin=task/none",
        "SelectType=select/cons_tres",
        "SelectTypeParameters=CR_Core",
        "AccountingStorageType=accounting_storage/none",
        "JobAcctGatherType=jobacct_gather/none",
        "JobCompType=jobcomp/none",
        "GresTypes=gpu",
        "SlurmdParameters=config_overrides",
        f"StateSaveLocation={root}/state",
        f"SlurmdSpoolDir={root}/spool-%n",
        f"SlurmctldPidFile={root}/slurmctld.pid",
        f"SlurmdPidFile={root}/slurmd-%n.pid",
        f"SlurmctldLogFile={root}/slurmctld.log",
        f"SlurmdLogFile={root}/slurmd-%n.log",
        # Finished jobs stay visible to squeue this long: the Slurm plugin's squeue status
        # mode needs them until its next poll (and it falls back to sacct below 3x its
        # initial interval).
        "MinJobAge=3600",
        # A node whose slurmd was stopped is DOWN within seconds, and back when it returns.
        "SlurmdTimeout=10",
        "ReturnToService=2",
        "KillWait=5",
        "MessageTimeout=5",
        "InactiveLimit=0",
        # Jobs over a partition's limits are queued, never started (LIMITED_PARTITION).
        "EnforcePartLimits=NO",
    ]
    for node in node_ports:
        lines.append(
            f"NodeName={node} NodeHostname={host} NodeAddr=127.0.0.1 Port={node_ports[node]} "
            f"CPUs={NODE_CPUS} RealMemory={NODE_MEMORY_MB} Gres=gpu:{GPUS_PER_NODE} "
            "State=UNKNOWN"
        )
    lines.append(
        f"PartitionName={PARTITION} Nodes={','.join(node_ports)} Default=YES MaxTime=INFINITE "
        "State=UP"
    )
    lines.append(
        f"PartitionName={LIMITED_PARTITION} Nodes={','.join(node_ports)} Default=NO "
        f"MaxNodes={LIMITED_MAX_NODES} MaxTime={LIMITED_MAX_MINUTES} State=UP"
    )
    return "\n".join(lines) + "\n"


@dataclass
class TestCluster:
    root: Path
    conf: Path
    name: str
    nodes: tuple[str, ...] = NODES
    partition: str = PARTITION
    _stopped: bool = field(default=False, repr=False)

    __test__ = False  # not a pytest test class

    @classmethod
    def in_folder(cls, root: Path) -> TestCluster | None:
        """The cluster that ``start`` set up in ``root`` (running or not), or None."""
        conf = root / "etc" / "slurm.conf"
        try:
            text = conf.read_text()
        except FileNotFoundError:
            return None
        if not text.startswith(CONF_MARKER):
            return None
        names = [
            line.split("=", 1)[1] for line in text.splitlines() if line.startswith("ClusterName=")
        ]
        nodes = tuple(
            line.split()[0].removeprefix("NodeName=")
            for line in text.splitlines()
            if line.startswith("NodeName=")
        )
        return cls(root=root, conf=conf, name=names[0], nodes=nodes or NODES) if names else None

    @property
    def env(self) -> dict[str, str]:
        """The environment for Slurm clients (and Snakemake) that talk to this cluster."""
        return {**os.environ, "SLURM_CONF": str(self.conf)}

    def run(self, *cmd: str, check: bool = True, timeout: float = 120) -> str:
        proc = subprocess.run(
            cmd, env=self.env, capture_output=True, text=True, timeout=timeout, check=False
        )
        if check and proc.returncode != 0:
            raise RuntimeError(
                f"{' '.join(cmd)} failed ({proc.returncode}): {proc.stderr.strip()}\n"
                f"{self.log_tail()}"
            )
        return proc.stdout

    def log_tail(self, lines: int = 15) -> str:
        out = []
        for log in sorted(self.root.glob("slurm*.log")):
            tail = log.read_text(errors="replace").splitlines()[-lines:]
            out.append(f"--- {log.name}\n" + "\n".join(tail))
        return "\n".join(out)

    # Nodes ---------------------------------------------------------------------------
    def node_states(self) -> dict[str, str]:
        out = self.run("sinfo", "-h", "-N", "-o", "%N %T")
        return dict(line.split() for line in out.splitlines() if line.strip())

    def wait_nodes(self, state: str = "idle", nodes=None, timeout: float = 300) -> None:
        """Wait until every node in ``nodes`` is in ``state`` (as sinfo spells it)."""
        nodes = tuple(nodes or self.nodes)
        deadline = time.monotonic() + timeout
        states: dict[str, str] = {}
        while time.monotonic() < deadline:
            states = self.node_states()
            if all(states.get(n, "").rstrip("*~#") == state for n in nodes):
                return
            time.sleep(0.5)
        raise TimeoutError(
            f"nodes {nodes} not {state} after {timeout}s: {states}\n{self.log_tail()}"
        )

    def start_node(self, node: str) -> None:
        """Start a node's slurmd in its own mount namespace where /etc/slurm is ours.

        The Slurm plugin's job step drops every SLURM_* variable, SLURM_CONF included,
        before its inner ``srun``: that srun reads the default /etc/slurm/slurm.conf. The
        namespace shows it this cluster's file there (jobs inherit it) without touching
        the host's /etc/slurm.
        """
        mount = f"mount --bind {shlex.quote(str(self.conf.parent))} {DEFAULT_CONF_DIR}"
        slurmd = shlex.join(["slurmd", "-f", str(self.conf), "-N", node])
        subprocess.run(
            [
                "unshare",
                "--mount",
                "--propagation",
                "private",
                "sh",
                "-c",
                f"{mount} && exec {slurmd}",
            ],
            env={**self.env, NODE_VARIABLE: node},  # marks its slurmstepds too, see stop_node
            check=True,
        )

    def node_alive(self, node: str) -> bool:
        pid = _read_pid(self.root / f"slurmd-{node}.pid")
        return pid is not None and _alive(pid)

    def restore(self, timeout: float = 300) -> None:
        """No job left, every slurmd running, every node idle (after a test broke one)."""
        self.cancel_all()
        for node in self.nodes:
            if not self.node_alive(node):
                self.start_node(node)
        for node, state in self.node_states().items():
            if state.rstrip("*~#") in ("down", "drained", "draining", "fail"):
                self.run("scontrol", "update", f"nodename={node}", "state=resume", check=False)
        self.wait_nodes("idle", timeout=timeout)

    def stop_node(self, node: str) -> None:
        """Kill a node as a crash would: its slurmd, slurmstepds and job processes, SIGKILL."""
        daemons = _pids_with_env(NODE_VARIABLE, node, also=("SLURM_CONF", str(self.conf)))
        tasks = _pids_with_env("SLURMD_NODENAME", node, also=("SLURM_CLUSTER_NAME", self.name))
        for pid in daemons + tasks:
            _kill(pid, signal.SIGKILL)
        _wait_gone(daemons + tasks, 10)
        with contextlib.suppress(FileNotFoundError):
            (self.root / f"slurmd-{node}.pid").unlink()

    def processes(self, clients: bool = True) -> list[int]:
        """Processes of this cluster: daemons, and everything its jobs started.

        With ``clients`` also every other process that has this cluster's ``SLURM_CONF``
        (Snakemake, sbatch and srun started by the tests); without, those are spared: by
        hand they include the user's own shells and Snakemake.
        """
        with_conf = _pids_with_env("SLURM_CONF", str(self.conf))
        if not clients:
            with_conf = [pid for pid in with_conf if _command_name(pid) in DAEMONS]
        return sorted(set(with_conf) | set(_pids_with_env("SLURM_CLUSTER_NAME", self.name)))

    def controller_alive(self) -> bool:
        """Whether this cluster's slurmctld runs (its pid file names a live slurmctld of ours)."""
        pid = _read_pid(self.root / "slurmctld.pid")
        return pid is not None and _alive(pid) and self._ours(pid)

    def _ours(self, pid: int) -> bool:
        """Whether ``pid`` is a daemon this cluster started (not a reused process id)."""
        if f"SLURM_CONF={self.conf}" in _cmdline_and_env(pid):
            return True  # slurmctld, slurmd, slurmstepd
        return f"--socket={self.root}/munge.socket" in _cmdline_and_env(pid)  # munged

    @staticmethod
    def environ(pid: int) -> dict[str, str]:
        try:
            raw = Path(f"/proc/{pid}/environ").read_bytes()
        except OSError:
            return {}
        return dict(e.decode(errors="replace").partition("=")[::2] for e in raw.split(b"\0") if e)

    # Jobs ----------------------------------------------------------------------------
    def jobs(self) -> list[dict[str, str]]:
        """Every job the controller still knows: id, state, name, comment, nodes, cpus."""
        out = self.run("squeue", "-h", "--states=all", "-o", "%i|%T|%j|%k|%N|%C")
        keys = ("id", "state", "name", "comment", "nodes", "cpus")
        return [dict(zip(keys, line.split("|"))) for line in out.splitlines() if line.strip()]

    def wait_job(self, predicate, timeout: float = 600, interval: float = 0.3) -> dict[str, str]:
        """The first job for which ``predicate(job)`` is true, polling squeue."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            for job in self.jobs():
                if predicate(job):
                    return job
            time.sleep(interval)
        raise TimeoutError(f"no matching job after {timeout}s: {self.jobs()}")

    def cancel_all(self, timeout: float = 120) -> None:
        active = [j["id"] for j in self.jobs() if j["state"] in _ACTIVE]
        if active:
            self.run("scancel", *active, check=False)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline and any(j["state"] in _ACTIVE for j in self.jobs()):
            time.sleep(0.5)

    # Shutdown ------------------------------------------------------------------------
    def stop(self, clients: bool = True) -> None:
        """Stop everything this cluster started, leaving no process behind.

        ``clients``: also kill the other processes that use this cluster (see processes).
        """
        if self._stopped:
            return
        self._stopped = True
        if self.controller_alive():
            with contextlib.suppress(Exception):
                self.cancel_all()
            with contextlib.suppress(Exception):
                self.run("scontrol", "shutdown", check=False, timeout=10)
        # Pid files outlive a killed daemon: only a live process of this cluster counts.
        daemons = [
            pid
            for pid in (_read_pid(p) for p in self.root.glob("slurm*.pid"))
            if pid is not None and self._ours(pid)
        ]
        _wait_gone(daemons, 15)
        # Whatever this cluster started and still runs (daemons, job steps) ends here.
        for pid in daemons + self.processes(clients):
            _kill(pid, signal.SIGKILL)
        munged = _read_pid(self.root / "munged.pid")
        if munged and self._ours(munged):
            _kill(munged, signal.SIGTERM)
            if not _wait_gone([munged], 10):
                _kill(munged, signal.SIGKILL)
        _wait_gone(self.processes(clients), 10)

    def munged_alive(self) -> bool:
        pid = _read_pid(self.root / "munged.pid")
        return pid is not None and _alive(pid) and self._ours(pid)


_ACTIVE = {"PENDING", "RUNNING", "CONFIGURING", "COMPLETING", "SUSPENDED", "REQUEUED"}


def start(root: Path, timeout: float = 300, nodes: tuple[str, ...] = NODES) -> TestCluster:
    """Start munge, slurmctld and the slurmd of every node under ``root``; wait for idle.

    ``nodes``: their names (``node_names(4)`` for four). ``root`` must be short (a
    folder under /tmp): slurmstepd's socket, ``<root>/spool-n1/n1_<job>.<step>``, must
    fit a Unix socket path (107 bytes)."""
    root.mkdir(parents=True, exist_ok=True)
    root.chmod(0o711)  # munged refuses a socket directory others may write to
    ensure_node_names_resolve(nodes)
    conf = root / "etc" / "slurm.conf"  # etc/ is mounted over /etc/slurm for the nodes
    conf.parent.mkdir(exist_ok=True)
    # Names this session's jobs' processes (environ); a cluster of other nodes beside
    # the session's (in the same process) gets a name of its own.
    name = f"hpcllmtest{os.getpid()}"
    if nodes != NODES:
        name += f"x{len(nodes)}"
    conf.write_text(slurm_conf(root, name, free_port(), {n: free_port() for n in nodes}))
    make_gpu_devices(root)
    (conf.parent / "gres.conf").write_text(gres_conf(root, nodes))
    for sub in ("state", *(f"spool-{n}" for n in nodes)):
        (root / sub).mkdir(exist_ok=True)
    cluster = TestCluster(root=root, conf=conf, name=name, nodes=nodes)
    try:
        key = root / "munge.key"
        key.write_bytes(os.urandom(1024))
        key.chmod(0o400)
        subprocess.run(
            [
                "munged",
                "--force",  # as root, with a private key and socket
                f"--socket={root}/munge.socket",
                f"--key-file={key}",
                f"--log-file={root}/munged.log",
                f"--pid-file={root}/munged.pid",
                f"--seed-file={root}/munged.seed",
            ],
            check=True,
        )
        subprocess.run(["slurmctld", "-f", str(conf)], env=cluster.env, check=True)
        for node in nodes:
            cluster.start_node(node)
        cluster.wait_nodes("idle", timeout=timeout)
    except BaseException:
        cluster.stop()
        raise
    return cluster


def _read_pid(path: Path) -> int | None:
    with contextlib.suppress(FileNotFoundError, ValueError):
        return int(path.read_text().split()[0])
    return None


def _kill(pid: int, sig: int) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, sig)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    with contextlib.suppress(OSError):  # a zombie counts as gone
        if Path(f"/proc/{pid}/stat").read_text().split(") ")[-1].startswith("Z"):
            return False
    return True


def _wait_gone(pids: list[int], timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if not any(_alive(p) for p in pids):
            return True
        time.sleep(0.2)
    return False


def _command_name(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/comm").read_text().strip()
    except OSError:
        return ""


def _cmdline_and_env(pid: int) -> list[str]:
    """A process's arguments and environment entries (empty when it is gone)."""
    found = []
    for part in ("cmdline", "environ"):
        try:
            raw = Path(f"/proc/{pid}/{part}").read_bytes()
        except OSError:
            continue
        found += [e.decode(errors="replace") for e in raw.split(b"\0") if e]
    return found


def _pids_with_env(name: str, value: str, also: tuple[str, str] | None = None) -> list[int]:
    """Processes whose environment has ``name=value`` (and ``also``, if given)."""
    wanted = [f"{name}={value}".encode()]
    if also:
        wanted.append(f"{also[0]}={also[1]}".encode())
    found = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit() or int(proc.name) == os.getpid():
            continue
        try:
            env = (proc / "environ").read_bytes().split(b"\0")
        except OSError:
            continue
        if all(w in env for w in wanted):
            found.append(int(proc.name))
    return found


@contextlib.contextmanager
def running(root: Path, nodes: tuple[str, ...] = NODES) -> Iterator[TestCluster]:
    cluster = start(root, nodes=nodes)
    try:
        yield cluster
    finally:
        cluster.stop()


# The command: the same cluster started by hand, kept in a folder until `down` -----------
def _say(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def _export_line(cluster: TestCluster) -> str:
    return f"export SLURM_CONF={shlex.quote(str(cluster.conf))}"


def _show(cluster: TestCluster) -> None:
    """Nodes and jobs as sinfo and squeue print them (to stderr, as every message)."""
    _say(cluster.run("sinfo", "-N", "-o", "%N %P %T %G").rstrip())
    _say(cluster.run("squeue", "--states=all", "-o", "%.8i %.10T %.20j %.8M %N").rstrip())


def command_up(root: Path, timeout: float) -> int:
    why = missing_requirements()
    if why:
        _say(f"cannot start the test cluster: {why}")
        return 1
    old = TestCluster.in_folder(root)
    if old is not None and old.controller_alive():
        _say(f"the test cluster {old.name} already runs in {root}:")
        _show(old)
        print(_export_line(old), flush=True)
        return 0
    if old is not None:
        old.stop(clients=False)  # whatever a crashed or half-stopped run left
        shutil.rmtree(root)  # a fresh state: slurmctld refuses another cluster's state
    elif root.exists() and any(root.iterdir()):
        _say(
            f"{root} exists and holds no test cluster ({root}/etc/slurm.conf without the "
            f"line {CONF_MARKER!r}): choose an empty or new folder with --dir"
        )
        return 1
    _say(f"starting munged, slurmctld and slurmd {', '.join(NODES)} in {root} ...")
    try:
        cluster = start(root, timeout=timeout)
    except (OSError, subprocess.CalledProcessError, TimeoutError, RuntimeError) as e:
        _say(f"the test cluster did not start: {e}\n(logs in {root})")
        return 1
    _say(f"the test cluster {cluster.name} runs (logs in {root}):")
    _show(cluster)
    _say(
        "Clients (sinfo, sbatch, snakemake --profile profiles/testcluster) need the line "
        f'below in their shell (`eval "$({_self(root, "up")})"` runs it); '
        f"`{_self(root, 'down')}` stops it."
    )
    print(_export_line(cluster), flush=True)
    return 0


def _self(root: Path, action: str) -> str:
    """This command as the user would type it (from the checkout, relative)."""
    here = Path(__file__).resolve()
    with contextlib.suppress(ValueError):
        here = here.relative_to(Path.cwd().resolve())
    words = ["python", str(here), action]
    if root != DEFAULT_DIR.expanduser().resolve():
        words += ["--dir", str(root)]
    return shlex.join(words)


def command_status(root: Path) -> int:
    cluster = TestCluster.in_folder(root)
    if cluster is None:
        _say(f"not running: no test cluster in {root}")
        return 3
    if cluster.controller_alive():
        _say(f"the test cluster {cluster.name} runs in {root}; clients need:")
        _say(_export_line(cluster))
        _show(cluster)
        return 0
    left = cluster.processes(clients=False)
    if cluster.munged_alive() or left:
        _say(
            f"not running: the controller of {cluster.name} in {root} is stopped, but "
            f"processes remain (munged: {cluster.munged_alive()}, Slurm: {left}); "
            "`down` stops them"
        )
    else:
        _say(f"not running: the test cluster {cluster.name} in {root} is stopped")
    return 3


def command_down(root: Path) -> int:
    cluster = TestCluster.in_folder(root)
    if cluster is None:
        _say(f"nothing to stop: no test cluster in {root}")
        return 0
    if not (cluster.controller_alive() or cluster.munged_alive() or cluster.processes(False)):
        _say(f"nothing to stop: the test cluster {cluster.name} in {root} is stopped")
        return 0
    cluster.stop(clients=False)
    left = cluster.processes(clients=False)
    if left or cluster.munged_alive():
        _say(f"processes of {cluster.name} still run: {left} (munged: {cluster.munged_alive()})")
        return 1
    _say(f"the test cluster {cluster.name} is stopped: no job, no daemon left (logs in {root})")
    return 0


def main(argv: list[str] | None = None) -> int:
    import argparse

    parser = argparse.ArgumentParser(
        prog="python tests/slurm/testcluster.py",
        description=(
            "Start, inspect or stop the project's two-node test Slurm cluster (n1, n2 on "
            "this host) by hand. Needs root, slurm-wlm and munge "
            "(scripts/install-system-deps.sh). See docs/slurm-tests.md."
        ),
    )
    parser.add_argument(
        "action",
        choices=("up", "status", "down"),
        help="up: start it and print the `export SLURM_CONF=...` line (the only stdout); "
        "status: nodes and jobs (exit status 3 when not running); "
        "down: cancel the jobs and stop every daemon it started",
    )
    parser.add_argument(
        "--dir",
        type=Path,
        default=DEFAULT_DIR,
        help=f"the cluster's folder: config, state, logs (default: {DEFAULT_DIR})",
    )
    parser.add_argument(
        "--timeout",
        type=float,
        default=300,
        help="up: seconds to wait for both nodes to be idle (default: 300; it takes a few "
        "seconds on a quiet machine)",
    )
    args = parser.parse_args(argv)
    root = args.dir.expanduser().resolve()
    if args.action == "up":
        return command_up(root, args.timeout)
    if args.action == "status":
        return command_status(root)
    return command_down(root)


if __name__ == "__main__":
    sys.exit(main())
