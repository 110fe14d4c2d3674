"""The chain's parts that need no Slurm: the sbatch options (the official plugin's own),
what `hpcllm status` shows of a chain, and `hpcllm cancel-training` without squeue. The
chain itself runs on the test cluster (tests/slurm/test_training.py)."""

from __future__ import annotations

import json
from types import SimpleNamespace

import pytest

from hpcllm import cli
from hpcllm.training import chain, status


def test_the_segment_jobs_sbatch_options_are_the_plugins_for_the_rules_resources():
    resources = {
        "nodes": 4,
        "tasks": 4,
        "tasks_per_gpu": 0,
        "mpi": "",
        "gres": "gpu:4",
        "cpus_per_task": 48,
        "mem_mb": 400000,
        "runtime": 240,
        "slurm_partition": "booster",
        "slurm_account": "opengptx",
        "constraint": "a100",
        "qos": "normal",
        "slurm_extra": "--ntasks-per-node=1 --signal=TERM@300 --threads-per-core=1",
    }
    settings = SimpleNamespace(requeue=False, no_requeue=True, qos=None, reservation=None)
    args = chain.sbatch_geometry(resources, threads=1, settings=settings)
    line = " ".join(args)
    for part in (
        "-A opengptx", "-p booster", "-t 240", "-C a100", "--qos=normal", "--mem 400000",
        "--nodes=4", "--no-requeue", "--cpus-per-task=48", "--gres=gpu:4",
        "--ntasks-per-node=1 --signal=TERM@300 --threads-per-core=1",
    ):  # fmt: skip
        assert part in line, line
    # tasks_per_gpu=0 switches --ntasks-per-gpu off, as for the rule's own job
    assert "--ntasks-per-gpu" not in line
    # the chain sets its own name, log, comment, working directory and command
    assert not {"--job-name", "--output", "--comment", "-D", "--wrap", "sbatch"} & set(args)


def test_a_job_submitting_its_successor_passes_on_no_slurm_job_variables():
    env = chain._clean_environment(
        {"PATH": "/bin", "SLURM_CONF": "/c", "SLURM_JOB_ID": "7", "SLURM_MEM_PER_NODE": "9",
         "SBATCH_PARTITION": "x", "SRUN_CPUS_PER_TASK": "2"}
    )  # fmt: skip
    assert env == {"PATH": "/bin", "SLURM_CONF": "/c"}


def test_status_lists_the_chain_and_names_where_it_stopped(tmp_path):
    save = tmp_path / "checkpoints" / "tiny_local"
    (save / "chain").mkdir(parents=True)
    (save / "iter_0000010").mkdir()
    (save / "latest_checkpointed_iteration.txt").write_text("10")
    name = chain.job_name_of(tmp_path, "tiny_local")
    jobs = [
        {"id": "41", "state": "RUNNING", "name": name, "dependency": "(null)", "comment": ""},
        {"id": "42", "state": "PENDING", "name": name, "dependency": "afterany:41(unfulfilled)",
         "comment": ""},
        {"id": "43", "state": "RUNNING", "name": "hpcllm-chain-tiny_local-00000000",
         "dependency": "", "comment": ""},  # another checkout's chain
    ]  # fmt: skip
    out = status.campaign_status(tmp_path, jobs=jobs)
    assert "jobs: 41 RUNNING chain seg2, 42 PENDING chain next (afterany:41(unfulfilled))" in out, (
        out
    )
    assert "43" not in out
    (save / "chain" / "stopped.json").write_text(
        json.dumps({"chain": "1", "segment": 2, "failure": "missing_file", "job_id": "42",
                    "message": "...", "time": 0})
    )  # fmt: skip
    out = status.campaign_status(tmp_path, jobs=[])
    assert "last failure: missing_file (job 42); the chain stopped at segment 2" in out, out


def test_cancel_training_without_squeue_says_so(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("PATH", str(tmp_path))  # no squeue, no scancel
    assert cli.main(["cancel-training", "tiny_local", "-d", str(tmp_path)]) == 1
    assert "not cancelled: squeue could not be run" in capsys.readouterr().err


def test_cancel_training_cancels_the_experiments_chain_only(tmp_path, monkeypatch, capsys):
    """With stand-in squeue and scancel (the real ones: tests/slurm/test_training.py)."""
    name = chain.job_name_of(tmp_path, "tiny_local")
    calls = tmp_path / "calls"
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "squeue").write_text(
        f'#!/bin/sh\necho "$@" >> {calls}\n'
        f"case \"$*\" in *{name}*) echo '51|RUNNING|(null)|None'; "
        "echo '52|PENDING|afterany:51|Dependency';; esac\n"
    )
    (bin_dir / "scancel").write_text(f'#!/bin/sh\necho scancel "$@" >> {calls}\n')
    for f in bin_dir.iterdir():
        f.chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}:/usr/bin:/bin")
    assert cli.main(["cancel-training", "tiny_local", "-d", str(tmp_path)]) == 0
    assert "cancelled the chain of tiny_local: job(s) 51, 52" in capsys.readouterr().out
    assert calls.read_text().splitlines()[-1] == "scancel 51 52"


@pytest.mark.parametrize("tracker,expected", [(None, 0), ("20", 20), ("junk", 0)])
def test_a_save_in_progress_is_not_committed(tmp_path, tracker, expected):
    (tmp_path / "iter_0000030").mkdir()  # being written: no tracker names it yet
    if tracker is not None:
        (tmp_path / "latest_checkpointed_iteration.txt").write_text(tracker)
    assert chain.committed_iteration(tmp_path) == expected
