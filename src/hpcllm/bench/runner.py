"""Run one sweep point: launch its command, keep its log, record how it ended.

A benchmark run that fails (out of memory at too few nodes, a node that dies) is a
result, not a reason to stop the sweep: the run's record says how it failed, the bench
job itself succeeds, and the summary shows the point as failed. To run a failed point
again, force it (``snakemake --forcerun <its run.json>`` or delete its folder). A failure
of the network or at start-up holds the larger points of its series instead of letting
each of them meet it (:mod:`hpcllm.bench.hold`).
The log is written under a temporary name and renamed when the run ends.

Inside a container the commands run the image's Python, which has no ``hpcllm``
(envs/requirements.txt): the launch binds the checkout's ``src/`` that this process
imported ``hpcllm`` from (the planned checkout) and puts it on ``PYTHONPATH`` there.
"""

from __future__ import annotations

import json
import logging
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from hpcllm.atomic import atomic_paths
from hpcllm.failures.classify import classify_log
from hpcllm.launch import Launch, package_in_container, python_for

log = logging.getLogger(__name__)

# Seconds a run past its time limit gets between SIGTERM and SIGKILL (to its process group).
TERM_GRACE_S = 30.0


def run_launch(
    launch: Launch,
    point: dict,
    log_path: str | Path,
    record_path: str | Path,
    time_limit_s: float | None = None,
) -> dict:
    """Run ``launch`` (its shell script) with output into ``log_path``; write the record."""
    env = {**os.environ, "HPCLLM_RUN_ID": point["id"]}
    # torchrun and python of this environment first, also when snakemake was started
    # by its full path without the venv on PATH.
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"
    started = time.time()
    timed_out = False
    with atomic_paths(log_path, record_path) as (tmp_log, tmp_record):
        with open(tmp_log, "w") as out:
            proc = subprocess.Popen(
                ["bash", "-c", launch.shell()],
                stdout=out,
                stderr=subprocess.STDOUT,
                env=env,
                start_new_session=True,  # a time limit stops the whole process group
            )
            try:
                returncode = proc.wait(timeout=time_limit_s)
            except subprocess.TimeoutExpired:
                timed_out = True
                returncode = stop_process_group(proc, TERM_GRACE_S)
                out.write(f"\nhpcllm: stopped after the run's time limit of {time_limit_s:.0f} s\n")
        if timed_out:
            status = "time_limit"
        elif returncode == 0:
            status = "ok"
        else:
            status = classify_log([tmp_log]) or "error"
        record = {
            "id": point["id"],
            "status": status,
            "returncode": returncode,
            "wall_time_s": time.time() - started,
            "slurm_job_id": os.environ.get("SLURM_JOB_ID"),
            "command": launch.argv,
        }
        Path(tmp_record).write_text(json.dumps(record, indent=1) + "\n")
    log.info(
        "%s: %s (exit code %s) in %.1f s", point["id"], status, returncode, record["wall_time_s"]
    )
    return record


def stop_process_group(proc: subprocess.Popen, grace_s: float) -> int:
    """SIGTERM to ``proc``'s process group, SIGKILL to whatever of it is left after
    ``grace_s``; returns the leader's exit code once no member is left. Waiting for the
    leader alone is not enough: a member that handles SIGTERM slowly (torchrun forwarding
    it to workers that save) would outlive the run's time limit."""
    pgid = proc.pid  # started with start_new_session: the group is the leader's pid
    _signal_group(pgid, signal.SIGTERM)
    deadline = time.monotonic() + grace_s
    while time.monotonic() < deadline:
        if proc.poll() is not None and not _group_alive(pgid):
            return proc.returncode
        time.sleep(0.1)
    _signal_group(pgid, signal.SIGKILL)
    returncode = proc.wait()
    # SIGKILL cannot be caught: the members are gone as soon as the kernel has run them
    # (the bound only keeps an unreaped zombie from hanging the job).
    deadline = time.monotonic() + 30
    while _group_alive(pgid) and time.monotonic() < deadline:
        time.sleep(0.1)
    return returncode


def _signal_group(pgid: int, sig: int) -> None:
    try:
        os.killpg(pgid, sig)
    except ProcessLookupError:
        pass  # every member has ended already


def _group_alive(pgid: int) -> bool:
    """Whether a member of the group still runs (a zombie, ended but not yet reaped by
    its new parent, does not count)."""
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue  # ended while we looked
        if int(fields[2]) == pgid and fields[0] != "Z":  # state, ppid, pgrp
            return True
    return not Path("/proc/self/stat").exists()  # without /proc: killpg's answer


def launch_for(point: dict, cluster, command: list[str], container: str | None) -> Launch:
    """The launch of ``command`` on the point's nodes; without Slurm, its "nodes" are
    processes on this machine (see :mod:`hpcllm.bench.sweeps`). In a container the
    checkout's ``src/`` is bound and on ``PYTHONPATH``, for ``python -m hpcllm...``."""
    from hpcllm.launch import build_launch

    if cluster.uses_slurm:
        nodes, per_node = point["nodes"], point["procs_per_node"]
    else:
        nodes, per_node = 1, point["gpus"]
    binds, env = package_in_container(container)
    return build_launch(
        cluster,
        nodes=nodes,
        procs_per_node=per_node,
        command=command,
        container=container,
        binds=binds,
        env=env,
        rendezvous=point.get("engine") == "megatron",
    )


def run_vision_point(
    point: dict,
    lmdb: str,
    log_path: str,
    record_path: str,
    settings_path: str,
    cluster,
    container: str | None = None,
    time_limit_s: float | None = None,
    val_lmdb: str | None = None,
) -> dict:
    """Write the point's settings, run :mod:`hpcllm.bench.vision_train` on its nodes."""
    write_vision_settings(point, settings_path)
    launch = vision_launch(point, lmdb, settings_path, cluster, container, val_lmdb)
    return run_launch(launch, point, log_path, record_path, time_limit_s)


def write_vision_settings(point: dict, settings_path: str | Path) -> None:
    """The settings file :mod:`hpcllm.bench.vision_train` reads (also a held point's)."""
    settings = {**point, "model": point["model"], "precision": point["precision"]}
    with atomic_paths(settings_path) as (tmp,):
        Path(tmp).write_text(json.dumps(settings, indent=1) + "\n")


def vision_launch(
    point: dict,
    lmdb: str,
    settings_path: str,
    cluster,
    container: str | None = None,
    val_lmdb: str | None = None,
) -> Launch:
    """The launch of the point's vision training on its nodes, as its job runs it."""
    command = [
        python_for(container),
        "-m",
        "hpcllm.bench.vision_train",
        "--settings",
        str(Path(settings_path).resolve()),
        "--data",
        str(Path(lmdb).resolve()),
    ]
    if val_lmdb:
        command += ["--val-data", str(Path(val_lmdb).resolve())]
    if point.get("stage_in"):
        command += ["--local-storage", cluster.local_storage]
    return launch_for(point, cluster, command, container)
