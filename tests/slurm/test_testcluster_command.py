"""The test cluster by hand: `python tests/slurm/testcluster.py up|status|down`, run as a
user runs it (a separate process), used through the `export SLURM_CONF=...` line it prints."""

from __future__ import annotations

import os
import shlex
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import testcluster
from support import hang_guard

pytestmark = pytest.mark.slurm

SCRIPT = Path(__file__).with_name("testcluster.py")
# Hang guards, not speed checks: `up` takes about 2 s (both nodes idle) and `down` about
# 1 s, also at load 20 on 2 cores; a command may take up to `up`'s own 300 s wait for the
# nodes. A one-line batch job completes within about 1 s.
COMMAND_LIMIT = 600
JOB_LIMIT = hang_guard(1)


@pytest.fixture
def folder(tmp_path):
    reason = testcluster.missing_requirements()
    if reason:
        pytest.skip(reason)
    root = tmp_path / "cluster"
    yield root
    command("down", root)  # also after a failure: no daemon outlives the test


def command(action: str, root: Path) -> subprocess.CompletedProcess:
    """The command as a separate process; its messages (stderr) go to a file, as a pipe
    would be kept open by a daemon that did not close it."""
    log = root.parent / f"{action}.stderr"
    with open(log, "w") as err:
        proc = subprocess.run(
            [sys.executable, str(SCRIPT), action, "--dir", str(root)],
            stdout=subprocess.PIPE,
            stderr=err,
            text=True,
            timeout=COMMAND_LIMIT,
        )
    proc.stderr = log.read_text()
    return proc


def client_env(export_line: str) -> dict[str, str]:
    """A user's shell after running the printed line (and no other SLURM_* variable)."""
    words = shlex.split(export_line)
    assert words[0] == "export" and words[1].startswith("SLURM_CONF="), export_line
    env = {k: v for k, v in os.environ.items() if not k.startswith("SLURM_")}
    env["SLURM_CONF"] = words[1].removeprefix("SLURM_CONF=")
    return env


def client(env: dict[str, str], *cmd: str) -> str:
    return subprocess.run(
        cmd, env=env, capture_output=True, text=True, check=True, timeout=60
    ).stdout


def node_states(env: dict[str, str]) -> dict[str, str]:
    out = client(env, "sinfo", "-h", "-N", "-o", "%N %T")
    return dict(line.split() for line in out.splitlines())


def processes_with(entry: str) -> list[int]:
    return testcluster._pids_with_env(*entry.split("=", 1))


def test_up_status_down_by_hand(folder):
    status = command("status", folder)
    assert status.returncode == 3 and "not running" in status.stderr, status

    up = command("up", folder)
    assert up.returncode == 0, up.stderr
    conf = folder / "etc" / "slurm.conf"
    # stdout is the one line to eval, nothing else (the daemons print to stderr).
    assert up.stdout == f"export SLURM_CONF={shlex.quote(str(conf))}\n", up.stdout
    env = client_env(up.stdout)
    assert node_states(env) == {"n1": "idle", "n2": "idle"}
    cluster = testcluster.TestCluster.in_folder(folder)
    assert cluster is not None and cluster.controller_alive()
    daemons = processes_with(f"SLURM_CONF={conf}")
    assert len(daemons) >= 3, daemons  # slurmctld, slurmd n1 and n2
    munged = int((folder / "munged.pid").read_text())

    # A second `up` finds it running: same cluster, same line, nothing started twice.
    again = command("up", folder)
    assert again.returncode == 0 and again.stdout == up.stdout, again
    assert "already runs" in again.stderr
    assert testcluster.TestCluster.in_folder(folder).name == cluster.name
    assert sorted(processes_with(f"SLURM_CONF={conf}")) == sorted(daemons)

    # A batch job from that shell runs on a node and completes.
    job = client(
        env, "sbatch", "--parsable", "-o", str(folder.parent / "job.out"),
        "--wrap", "echo ran on $SLURMD_NODENAME",
    ).strip()  # fmt: skip
    deadline = time.monotonic() + JOB_LIMIT
    state = ""
    while time.monotonic() < deadline:
        state = client(env, "squeue", "-h", "--states=all", "-j", job, "-o", "%T").strip()
        if state == "COMPLETED":
            break
        time.sleep(0.3)
    assert state == "COMPLETED", state
    assert (folder.parent / "job.out").read_text().strip() in ("ran on n1", "ran on n2")

    status = command("status", folder)
    assert status.returncode == 0, status.stderr
    assert f"export SLURM_CONF={shlex.quote(str(conf))}" in status.stderr
    lines = status.stderr.splitlines()
    assert any(line.split()[:3] == ["n1", "batch*", "idle"] for line in lines if line), lines
    assert any(line.split()[:3] == ["n2", "batch*", "idle"] for line in lines if line), lines
    assert any(line.split()[:2] == [job, "COMPLETED"] for line in lines if line), lines

    # A process that merely has the cluster's SLURM_CONF (the user's shell, Snakemake) is
    # not the cluster's: `down` spares it.
    shell = subprocess.Popen(["sleep", "600"], env=env)
    try:
        down = command("down", folder)
        assert down.returncode == 0, down.stderr
        assert shell.poll() is None, "down killed a client of the cluster"
    finally:
        shell.send_signal(signal.SIGKILL)
        shell.wait()
    # Nothing of that cluster is left: no daemon, no job process, no munged.
    assert processes_with(f"SLURM_CONF={conf}") == []
    assert processes_with(f"SLURM_CLUSTER_NAME={cluster.name}") == []
    assert not testcluster._alive(munged)
    assert subprocess.run(["sinfo"], env=env, capture_output=True, timeout=60).returncode != 0

    # Both are idempotent: a second down has nothing to do; status says it is stopped.
    down = command("down", folder)
    assert down.returncode == 0 and "nothing to stop" in down.stderr, down
    status = command("status", folder)
    assert status.returncode == 3 and "not running" in status.stderr, status

    # The folder serves again: a new cluster with fresh state, both nodes idle.
    up = command("up", folder)
    assert up.returncode == 0, up.stderr
    assert testcluster.TestCluster.in_folder(folder).name != cluster.name
    assert node_states(client_env(up.stdout)) == {"n1": "idle", "n2": "idle"}
    assert command("down", folder).returncode == 0
    assert processes_with(f"SLURM_CONF={conf}") == []


def test_up_refuses_a_folder_that_holds_something_else(folder):
    folder.mkdir()
    (folder / "notes.txt").write_text("mine")
    up = command("up", folder)
    assert up.returncode == 1 and up.stdout == ""
    assert str(folder) in up.stderr and "--dir" in up.stderr, up.stderr
    assert (folder / "notes.txt").read_text() == "mine"
