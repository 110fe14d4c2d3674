"""The cluster rehearsal holds a sweep back after a start-up failure of a multi-node point.

profiles/rehearsal (a GPU cluster profile's job geometry, launch script, environment and
container command lines; tests/slurm/test_rehearsal.py) through real sbatch on a test
Slurm cluster of its own with four nodes (the other Slurm tests' has two): one language series
of 2 and 4 nodes (tests/slurm/rehearsal_hold.yaml), the stand-in image and Megatron-LM of
the rehearsal (rehearsal_image.py, standins/).

The failure is real: the 2-node point's ranks are told to meet over a network interface
no node has (``GLOO_SOCKET_IFNAME``), and gloo fails at their start. It reaches the jobs
as a stale variable of the submitting shell would (sbatch passes the environment on), on
a site whose cluster file leaves gloo's interface unset (as lumi.yaml does): a copy of
config/clusters/rehearsal.yaml without its ``GLOO_SOCKET_IFNAME``. It comes after the
site's canary passed, as a change of a site does: a wrong interface written in the
cluster file itself runs the site probe again (its parameters are the cluster's facts)
and the canary after it, whose 2-node launch fails the same way and keeps every language
point from being submitted (as test_a_failed_canary_holds_the_gpu_jobs_back in
test_rehearsal.py shows for another cause); no point is held then, none having run.

Then, as docs/benchmarks.md ("Held points") says: the cause removed, the failed point is
rerun with ``--forcerun`` of its record, and the point it held runs after it.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import tempfile
from pathlib import Path

import pandas as pd
import pytest
import rehearsal_image
import slurmruns
import testcluster
import yaml
from support import EXAMPLES, hang_guard

from hpcllm.bench.hold import reached_training

pytestmark = [pytest.mark.slurm, pytest.mark.rehearsal]

HERE = Path(__file__).resolve().parent
CONFIG = HERE / "rehearsal_hold.yaml"
STANDINS = HERE / "standins"
SMALL = "hold_language.tiny.strong.bf16.n0002"
LARGE = "hold_language.tiny.strong.bf16.n0004"
CANARY = "results/preflight/rehearsal/canary/language_megatron.json"
SUMMARY = "results/bench/summary.csv"
# The interface of another site (JUWELS'), which no node of the test cluster has.
WRONG_INTERFACE = "ib0"
GLOO_LINE = "  GLOO_SOCKET_IFNAME: lo\n"
# profiles/rehearsal's set-resources runtime of bench_language (minutes)
PROFILE_RUNTIME = yaml.safe_load((slurmruns.REPO / "profiles/rehearsal/config.yaml").read_text())[
    "set-resources"
]["bench_language"]["runtime"]


def workdir_with_cluster_file(path: Path) -> Path:
    """A working directory whose config/clusters/rehearsal.yaml leaves gloo's interface
    to the job's environment (the rest of config/ is the checkout's)."""
    config = path / "config"
    clusters = config / "clusters"
    clusters.mkdir(parents=True)
    for entry in (slurmruns.REPO / "config").iterdir():
        if entry.name != "clusters":
            (config / entry.name).symlink_to(entry)
    for entry in (slurmruns.REPO / "config" / "clusters").iterdir():
        if entry.name != "rehearsal.yaml":
            (clusters / entry.name).symlink_to(entry)
    text = (slurmruns.REPO / "config" / "clusters" / "rehearsal.yaml").read_text()
    assert GLOO_LINE in text
    (clusters / "rehearsal.yaml").write_text(text.replace(GLOO_LINE, ""))
    return slurmruns.make_workdir(path)  # resources/, profiles/


def snakemake(work: Path, cluster, env: dict[str, str], *args: str, timeout: float) -> str:
    cmd = slurmruns.command(work, "rehearsal", "--configfile", str(CONFIG), *args)
    proc = subprocess.run(
        cmd, cwd=work, env=env, capture_output=True, text=True, timeout=timeout, check=False
    )
    output = proc.stdout + proc.stderr
    assert proc.returncode == 0, (
        f"{' '.join(cmd)} failed ({proc.returncode})\n--- output\n{output[-12000:]}\n"
        f"--- cluster\n{cluster.log_tail()}"
    )
    return output


def record(work: Path, point: str) -> dict:
    return json.loads((work / f"results/bench/language/{point}/run.json").read_text())


def run_log(work: Path, point: str) -> str:
    return (work / f"results/bench/language/{point}/run.log").read_text()


def execs_of(work: Path, job: str) -> list[dict]:
    """What the stand-in apptainer ran for the Slurm job ``job`` (one line per exec)."""
    lines = (work / "apptainer.jsonl").read_text().splitlines()
    return [e for e in map(json.loads, lines) if e["job"] == job]


def slurm_size(cluster, job: str) -> tuple[int, int]:
    """The nodes and the time limit (minutes) Slurm gave job ``job``."""
    out = cluster.run("squeue", "-h", "--states=all", "-j", job, "-o", "%D|%l").strip()
    nodes, limit = out.split("|")
    days, _, clock = limit.rpartition("-")  # [days-]hours:minutes:seconds
    hours, minutes, seconds = ([0, 0] + [int(x) for x in clock.split(":")])[-3:]
    return int(nodes), (int(days or 0) * 24 + hours) * 60 + minutes + (seconds > 0)


def status_output(work: Path, env: dict[str, str]) -> str:
    proc = subprocess.run(
        [str(Path(sys.executable).parent / "hpcllm"), "status", "-d", str(work),
         "--configfile", str(EXAMPLES), str(CONFIG), "--profile", "profiles/rehearsal"],
        capture_output=True, text=True, env=env, cwd=work, timeout=hang_guard(10),
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc.stdout


def test_a_start_up_failure_of_the_2_node_point_holds_its_4_node_point_through_sbatch(
    tmp_path,
):
    reason = testcluster.missing_requirements()
    if reason:
        pytest.skip(reason)
    if WRONG_INTERFACE in {name for _, name in socket.if_nameindex()}:
        pytest.skip(
            f"this host has an interface {WRONG_INTERFACE}: the failure needs one it has not"
        )
    image = rehearsal_image.python_env()
    work = workdir_with_cluster_file(tmp_path / "work")
    # A short folder: slurmstepd's socket, <root>/spool-n1/n1_<job>.<step>, must fit a
    # Unix socket path (107 bytes); under pytest's tmp_path the jobs fail at launch.
    with (
        tempfile.TemporaryDirectory(prefix="hpcllm-tc-") as root,
        testcluster.running(Path(root), nodes=testcluster.node_names(4)) as cluster,
    ):
        env = slurmruns.environment(cluster)
        env.pop("GLOO_SOCKET_IFNAME", None)
        env.update(
            PATH=f"{STANDINS}{os.pathsep}{env['PATH']}",  # the stand-in apptainer
            HPCLLM_REHEARSAL_IMAGE=str(image),
            HPCLLM_REHEARSAL_RECORD=str(work / "apptainer.jsonl"),
            SCRATCH=str(work / "scratch"),
        )
        # The site checked: its image built, probed, the language canary on 2 nodes
        # passed (quiet: ~40 s).
        snakemake(work, cluster, env, "--", CANARY, timeout=hang_guard(40))
        assert json.loads((work / CANARY).read_text())["nodes"] == 2

        # Later, from a shell with the other site's interface: the sweep (~30 s).
        broken = {**env, "GLOO_SOCKET_IFNAME": WRONG_INTERFACE}
        output = snakemake(work, cluster, broken, "--", SUMMARY, timeout=hang_guard(30))
        remote, _ = slurmruns.rule_headers(output)
        assert remote == {"bench_language": 2}, output[-3000:]  # no canary again
        states = {j["id"]: j for j in cluster.jobs()}
        failed, held = record(work, SMALL), record(work, LARGE)
        small_log = run_log(work, SMALL)
        small_folder = work / f"results/bench/language/{SMALL}"
        assert failed["status"] == "error", (failed, small_log[-3000:])
        assert f"Unable to find address for: {WRONG_INTERFACE}" in small_log, small_log[-3000:]
        assert not reached_training("language", small_folder / "run.log")  # no iteration
        # Its engine started on both nodes (in the image) and failed there.
        assert sorted(e["node"] for e in execs_of(work, failed["slurm_job_id"])) == ["n1", "n2"]
        # The 4-node point's job was decided held on the login node when it was
        # submitted (after the 2-node point's record): it asked Slurm for one node, not
        # its four (for the profile's runtime, which wins over the held job's
        # HELD_JOB_MINUTES as over any point's own), did not start its engine, and says
        # why: the 2-node point, its class, its log.
        job = held["slurm_job_id"]
        assert states[job]["state"] == "COMPLETED", states[job]
        assert slurm_size(cluster, job) == (1, PROFILE_RUNTIME), states[job]
        assert (
            f"{LARGE} will be held ({SMALL}, 2 nodes, failed with error): its job asks "
            f"for 1 node for {PROFILE_RUNTIME} min, not 4 nodes for {PROFILE_RUNTIME} min" in output
        ), output[-3000:]
        assert execs_of(work, job) == []
        assert held["status"] == "held", held
        assert (held["held_by"], held["held_by_nodes"], held["held_by_status"]) == (
            SMALL,
            2,
            "error",
        )
        assert Path(held["held_by_log"]) == Path("results/bench/language") / SMALL / "run.log"
        large_log = run_log(work, LARGE)
        assert f"{LARGE} is held, its engine was not started: {SMALL}" in large_log
        assert f"--forcerun {Path(held['held_by_log']).with_name('run.json')}" in large_log
        summary = pd.read_csv(work / SUMMARY).set_index("id")
        assert summary.loc[SMALL, "status"] == "error"
        assert summary.loc[LARGE, "status"] == "held"
        assert summary.loc[LARGE, "held_by"] == SMALL
        table = (work / "results/bench/summary.txt").read_text()
        assert "2 nodes, error" in table, table
        assert f"held: {LARGE} (by {SMALL})" in status_output(work, broken)

        # The cause removed, the failed point is rerun: the point it held runs after it,
        # nothing else (~60 s).
        output = snakemake(
            work,
            cluster,
            env,
            "--forcerun",
            f"results/bench/language/{SMALL}/run.json",
            "--",
            SUMMARY,
            timeout=hang_guard(60),
        )
        remote, _ = slurmruns.rule_headers(output)
        assert remote == {"bench_language": 2}, output[-3000:]
        states = {j["id"]: j for j in cluster.jobs()}
        for point, nodes in ((SMALL, "n[1-2]"), (LARGE, "n[1-4]")):
            again = record(work, point)
            assert again["status"] == "ok", (again, run_log(work, point)[-3000:])
            assert again["slurm_job_id"] not in (failed["slurm_job_id"], job)
            assert states[again["slurm_job_id"]]["nodes"] == nodes
        assert slurm_size(cluster, record(work, LARGE)["slurm_job_id"])[0] == 4
        assert "will be held" not in output  # its holder reran first, and passed
        assert "of 8 on node n4" in run_log(work, LARGE)
        summary = pd.read_csv(work / SUMMARY).set_index("id")
        assert set(summary["status"]) == {"ok"}, summary["status"]
        assert "held:" not in status_output(work, env)
