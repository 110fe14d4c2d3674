"""Training segments on two Slurm nodes: the launch path, and faults that lose nothing.

One experiment, ``tiny_2n`` (tests/slurm/training.yaml): 2 segments on 2 nodes, one
process each (srun -> torchrun per node -> the torch engine, DDP over gloo). The
uninterrupted run is the reference the fault tests must reproduce bit for bit.
"""

from __future__ import annotations

import json
import shutil
import time
from pathlib import Path

import pytest
import slurmruns
import torch

pytestmark = pytest.mark.slurm

CONFIG = Path(__file__).with_name("training.yaml")
EXPERIMENT = "tiny_2n"
SAVE = f"checkpoints/{EXPERIMENT}"
FINAL = f"results/train/{EXPERIMENT}/seg2.json"
SEG1 = f"results/train/{EXPERIMENT}/seg1.json"


@pytest.fixture(scope="session")
def text_data(tmp_path_factory) -> Path:
    """The built-in config's tokenized data, made once with the local profile."""
    work = slurmruns.make_workdir(tmp_path_factory.mktemp("slurm-text") / "work")
    slurmruns.run(work, None, "--until", "merge_tokenized", profile="local")
    return work


def training_workdir(text_data: Path, path: Path) -> Path:
    """A copy of the text stage's working directory (data and Snakemake's records)."""
    shutil.copytree(
        text_data, path, symlinks=True, ignore=shutil.ignore_patterns("locks", "incomplete")
    )
    return path


def run_training(work: Path, cluster, *args: str, **kw):
    return slurmruns.run(work, cluster, "--configfile", str(CONFIG), *args, "--", FINAL, **kw)


def final_weights(work: Path) -> dict[str, torch.Tensor]:
    iteration = int((work / SAVE / "latest_checkpointed_iteration.txt").read_text())
    path = work / SAVE / f"iter_{iteration:07d}" / "mp_rank_00" / "model_optim_rng.pt"
    return torch.load(path, map_location="cpu", weights_only=False)["model"]


def engine_processes(cluster) -> dict[str, str]:
    """node -> RANK of every torch engine worker of this cluster running now."""
    found = {}
    for pid in cluster.processes():
        env = cluster.environ(pid)
        try:
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
        except OSError:  # gone meanwhile
            continue
        # torchrun's workers carry their RANK; torchrun itself (same argv tail) does not.
        if b"hpcllm.training.torch_engine" in cmdline and "RANK" in env:
            found[env.get("SLURMD_NODENAME", "?")] = env["RANK"]
    return found


@pytest.fixture(scope="session")
def uninterrupted(slurm_cluster, text_data, tmp_path_factory):
    """tiny_2n trained without interruption; while it runs, where its ranks run."""
    slurm_cluster.restore()
    work = training_workdir(text_data, tmp_path_factory.mktemp("slurm-train") / "work")
    proc = slurmruns.start(
        work, slurm_cluster, "--configfile", str(CONFIG), "--", FINAL, log=work / "snakemake.out"
    )
    ranks: dict[str, str] = {}
    while proc.poll() is None:
        ranks.update(engine_processes(slurm_cluster))
        time.sleep(0.2)
    output = (work / "snakemake.out").read_text()
    assert proc.returncode == 0, output[-5000:] + slurm_cluster.log_tail()
    return work, ranks, output


def test_two_node_segment_runs_a_rank_on_each_node_and_saves_once(uninterrupted, slurm_cluster):
    work, ranks, output = uninterrupted
    # One rank per node (the c10d rendezvous, not the node order, numbers them).
    assert sorted(ranks) == ["n1", "n2"] and sorted(ranks.values()) == ["0", "1"]
    segment_jobs = [  # this experiment's (other tests' jobs stay listed, MinJobAge)
        j
        for j in slurm_cluster.jobs()
        if j["comment"].startswith("rule_train_segment") and EXPERIMENT in j["comment"]
    ]
    assert segment_jobs
    assert {j["nodes"] for j in segment_jobs} == {"n[1-2]"}
    engine_log = (work / f"logs/train_segment/{EXPERIMENT}/seg1.engine.log").read_text()
    assert "world size 2" in engine_log
    # Rank 0 alone writes each checkpoint, once per save, with both ranks' RNG states.
    assert engine_log.count("successfully saved checkpoint from iteration") == 1
    assert sorted(p.name for p in (work / SAVE).glob("iter_*")) == [
        "iter_0000004",
        "iter_0000008",
    ]
    state = torch.load(
        work / SAVE / "iter_0000008/mp_rank_00/model_optim_rng.pt",
        map_location="cpu",
        weights_only=False,
    )
    assert len(state["rng_state"]) == 2
    assert [p.name for p in (work / SAVE / "iter_0000008").iterdir()] == ["mp_rank_00"]


def test_two_nodes_train_like_one_process_with_the_same_global_batch(
    uninterrupted, text_data, tmp_path
):
    """Gradients are averaged over both ranks: the weights match a 1-process run."""
    work, _, _ = uninterrupted
    single = training_workdir(text_data, tmp_path / "single")
    one_node = single / "one_node.yaml"
    one_node.write_text(
        "training: {experiments: {tiny_2n: {layout: {nodes: 1, procs_per_node: 1}}}}\n"
    )
    slurmruns.run(
        single, None, "--configfile", str(CONFIG), str(one_node), "--", FINAL, profile="local"
    )
    two, one = final_weights(work), final_weights(single)
    assert two.keys() == one.keys()
    for name in two:
        torch.testing.assert_close(two[name], one[name], rtol=1e-4, atol=1e-5, msg=name)


def wait_for_engine(cluster, proc, work: Path, segment: int, timeout: float = 240) -> str:
    """The Slurm job id of segment ``segment`` once its engine ranks run on both nodes."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        assert proc.poll() is None, (work / "snakemake.out").read_text()[-4000:]
        running = [
            j
            for j in cluster.jobs()
            if j["comment"] == f"rule_train_segment_wildcards_{EXPERIMENT}_{segment}"
            and j["state"] == "RUNNING"
        ]
        if running and len(engine_processes(cluster)) == 2:
            return running[0]["id"]
        time.sleep(0.2)
    raise TimeoutError(f"segment {segment} never ran: {cluster.jobs()}")


def assert_reported(output: str, job_id: str, segment: int) -> None:
    """Snakemake names the failed rule, the Slurm job id and its Slurm log."""
    assert "Error in rule train_segment" in output, output[-4000:]
    assert f"SLURM-job '{job_id}' failed" in output, output[-4000:]
    assert f"slurm_logs/rule_train_segment/{EXPERIMENT}_{segment}/{job_id}.log" in output


def test_scancel_of_a_running_segment_is_reported_and_the_rerun_resumes(
    uninterrupted, cluster, text_data, tmp_path
):
    work = training_workdir(text_data, tmp_path / "work")
    proc = slurmruns.start(
        work, cluster, "--configfile", str(CONFIG), "--", FINAL, log=work / "snakemake.out"
    )
    try:
        job_id = wait_for_engine(cluster, proc, work, segment=2)
        cluster.run("scancel", job_id)
        assert proc.wait(timeout=180) != 0
    finally:
        if proc.poll() is None:
            proc.kill()
    assert_reported((work / "snakemake.out").read_text(), job_id, segment=2)
    assert {j["id"]: j["state"] for j in cluster.jobs()}[job_id] == "CANCELLED"
    assert (work / SEG1).exists() and not (work / FINAL).exists()
    resumed_from = int((work / SAVE / "latest_checkpointed_iteration.txt").read_text())
    assert 4 <= resumed_from < 8

    run_training(work, cluster)
    record = json.loads((work / FINAL).read_text())
    assert record["resumed_from_iteration"] == resumed_from
    reference = final_weights(uninterrupted[0])
    resumed = final_weights(work)
    assert all(torch.equal(resumed[k], reference[k]) for k in reference)


def test_a_node_dying_mid_segment_fails_the_job_and_the_rerun_completes(
    uninterrupted, cluster, text_data, tmp_path
):
    work = training_workdir(text_data, tmp_path / "work")
    proc = slurmruns.start(
        work, cluster, "--configfile", str(CONFIG), "--", FINAL, log=work / "snakemake.out"
    )
    try:
        job_id = wait_for_engine(cluster, proc, work, segment=1)
        cluster.stop_node("n2")
        returncode = proc.wait(timeout=240)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert returncode != 0
    assert_reported((work / "snakemake.out").read_text(), job_id, segment=1)
    assert {j["id"]: j["state"] for j in cluster.jobs()}[job_id] in ("FAILED", "NODE_FAIL")
    assert not (work / SEG1).exists()

    cluster.restore()  # n2's slurmd is back: the node returns to service
    run_training(work, cluster)
    reference = final_weights(uninterrupted[0])
    rerun = final_weights(work)
    assert all(torch.equal(rerun[k], reference[k]) for k in reference)


def test_a_segment_longer_than_its_time_limit_saves_and_the_rerun_continues(
    cluster, text_data, tmp_path
):
    """Slurm's --signal (set by the rule) stops the engine before the time limit kills it.

    Slurm checks --signal on a timer of about 30 s: the signal window (100 s before the
    2-minute limit) spans several checks, so the signal always comes, and comes after
    the engine has started (about 10 s)."""
    work = training_workdir(text_data, tmp_path / "work")
    long_run = work / "long.yaml"  # far more iterations than fit into the time limit
    long_run.write_text(
        "training: {experiments: {tiny_2n: {iterations_per_segment: 100000, "
        "save_interval: 100000, time: {margin_seconds: 0, signal_seconds: 100}}}}\n"
    )
    args = (
        "--configfile",
        str(CONFIG),
        str(long_run),
        "--set-resources",
        "train_segment:runtime=2",
    )
    engine_log = work / f"logs/train_segment/{EXPERIMENT}/seg1.engine.log"
    stopped_at = []
    for _ in range(2):
        proc = slurmruns.run(work, cluster, *args, "--", SEG1, check=False, timeout=300)
        output = proc.stdout + proc.stderr
        assert proc.returncode != 0 and "Error in rule train_segment" in output
        assert not (work / SEG1).exists()
        log = engine_log.read_text()
        # The engine saw the signal, saved and stopped by itself, before the time limit.
        assert log.count("(signal) before 100000") == 1, log[-3000:]
        assert "DUE TO TIME LIMIT" not in log
        stopped_at.append(int((work / SAVE / "latest_checkpointed_iteration.txt").read_text()))
    first, second = stopped_at
    assert 0 < first < second
    assert f"iterations {first + 1}..100000" in engine_log.read_text()
