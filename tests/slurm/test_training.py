"""Training segments on two Slurm nodes: the launch path, and faults that lose nothing.

One experiment, ``tiny_2n`` (tests/slurm/training.yaml): 2 segments of 40 iterations on
2 nodes, one process each (srun -> torchrun per node -> the torch engine, DDP over gloo).
The uninterrupted run is the reference the fault tests must reproduce bit for bit. The
fault tests interrupt a segment once it has trained its first iteration: far from its
end, wherever the interruption lands on a loaded machine. The tests that compare with a
reference run share it: each reference's tests form one xdist group (one worker makes it).
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import signal
import time
from pathlib import Path

import pytest
import slurmruns
import testcluster
import torch
from support import EXAMPLES, REPO, hang_guard

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


CURVE = f"results/train/{EXPERIMENT}/loss.png"
# The chain's 3-segment campaign: few iterations, so that a segment is mostly its start-up.
THREE = (
    "training: {experiments: {tiny_2n: {segments: 3, iterations_per_segment: 4, "
    "save_interval: 2, eval_interval: 4}}}\n"
)
FINAL3 = f"results/train/{EXPERIMENT}/seg3.json"


def three_segments(work: Path) -> Path:
    path = work / "three.yaml"
    path.write_text(THREE)
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
        if b"hpcllm.training.engines.torch_engine" in cmdline and "RANK" in env:
            found[env.get("SLURMD_NODENAME", "?")] = env["RANK"]
    return found


@pytest.fixture(scope="session")
def uninterrupted(slurm_cluster, text_data, tmp_path_factory):
    """tiny_2n trained without interruption; while it runs, where its ranks run."""
    slurm_cluster.restore()
    work = training_workdir(text_data, tmp_path_factory.mktemp("slurm-train") / "work")
    proc = slurmruns.start(
        work,
        slurm_cluster,
        "--configfile",
        str(CONFIG),
        "--",
        FINAL,
        CURVE,
        log=work / "snakemake.out",
    )
    ranks: dict[str, str] = {}
    while proc.poll() is None:
        ranks.update(engine_processes(slurm_cluster))
        time.sleep(0.2)
    output = (work / "snakemake.out").read_text()
    assert proc.returncode == 0, output[-5000:] + slurm_cluster.log_tail()
    return work, ranks, output


@pytest.fixture(scope="session")
def uninterrupted_three(slurm_cluster, text_data, tmp_path_factory) -> Path:
    """The chain's 3-segment campaign trained without a chain (one plugin job per
    segment) and without interruption: the chained runs' reference."""
    slurm_cluster.restore()
    work = training_workdir(text_data, tmp_path_factory.mktemp("slurm-train3") / "work")
    three = three_segments(work)
    slurmruns.run(work, slurm_cluster, "--configfile", str(CONFIG), str(three), "--", FINAL3)
    return work


@pytest.mark.xdist_group("tiny_2n")
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
    assert engine_log.count("successfully saved checkpoint from iteration") == 4
    assert sorted(p.name for p in (work / SAVE).glob("iter_*")) == [
        f"iter_{i:07d}" for i in range(10, 81, 10)
    ]
    state = torch.load(
        work / SAVE / "iter_0000080/mp_rank_00/model_optim_rng.pt",
        map_location="cpu",
        weights_only=False,
    )
    assert len(state["rng_state"]) == 2
    # one rank wrote the weights; the checksums of the committed folder beside them
    assert sorted(p.name for p in (work / SAVE / "iter_0000080").iterdir()) == [
        "hpcllm_checksums.json",
        "mp_rank_00",
    ]


@pytest.mark.xdist_group("tiny_2n")
def test_index_cache_is_built_by_a_cpu_job_and_segments_only_load_it(uninterrupted):
    """prepare_data_cache ran as its own Slurm job; no segment log shows an index build."""
    work, _, output = uninterrupted
    remote, _ = slurmruns.rule_headers(output)
    assert remote.get("prepare_data_cache") == 1 and remote.get("train_segment") == 2
    for k in (1, 2):
        log = (work / f"logs/train_segment/{EXPERIMENT}/seg{k}.engine.log").read_text()
        assert "Build and save" not in log
        assert (
            "Load the GPTDataset train indices" in log
            and "Load the GPTDataset valid indices" in log
        )
    cache = json.loads((work / f"data/index_cache/{EXPERIMENT}.json").read_text())
    assert cache["samples"] == {"train": 80 * 8, "valid": (80 // 20 + 1) * 8, "test": 0}


@pytest.mark.xdist_group("tiny_2n")
def test_validation_lines_tensorboard_scalars_and_loss_curve(uninterrupted):
    work, _, _ = uninterrupted
    text = "".join(
        (work / f"logs/train_segment/{EXPERIMENT}/seg{k}.engine.log").read_text() for k in (1, 2)
    )
    found = re.findall(
        r"validation loss at iteration (\d+) \| lm loss value: (\S+) \| lm loss PPL: (\S+) \|",
        text,
    )
    assert [int(i) for i, _, _ in found] == [20, 40, 60, 80]
    assert all(0 < float(v) < 20 for _, v, _ in found)
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    board = EventAccumulator(str(work / SAVE / "tensorboard"))
    board.Reload()
    tags = set(board.Tags()["scalars"])
    assert {
        "lm loss", "lm loss validation", "learning-rate", "grad-norm", "throughput",
        "tokens-per-second", "consumed-tokens",
    } <= tags, tags  # fmt: skip
    assert [e.step for e in board.Scalars("lm loss validation")] == [20, 40, 60, 80]
    assert board.Scalars("consumed-tokens")[-1].value == 80 * 8 * 64
    assert (work / f"results/train/{EXPERIMENT}/loss.png").stat().st_size > 10_000


@pytest.mark.xdist_group("tiny_2n")
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


def wait_for_engine(cluster, proc, work: Path, segment: int, timeout: float | None = None) -> str:
    """The Slurm job id of segment ``segment`` once its engine ranks run on both nodes
    and have trained the segment's first iteration (39 more to go)."""
    first = (segment - 1) * 40 + 1
    engine_log = work / f"logs/train_segment/{EXPERIMENT}/seg{segment}.engine.log"
    # segment 1 starts after the data and the index cache: ~60 s on a quiet machine
    deadline = time.monotonic() + (timeout or hang_guard(60))
    while time.monotonic() < deadline:
        assert proc.poll() is None, (work / "snakemake.out").read_text()[-4000:]
        running = [
            j
            for j in cluster.jobs()
            if j["comment"] == f"rule_train_segment_wildcards_{EXPERIMENT}_{segment}"
            and j["state"] == "RUNNING"
        ]
        trained = engine_log.exists() and f"iteration {first:8d}/" in engine_log.read_text()
        if running and trained and len(engine_processes(cluster)) == 2:
            return running[0]["id"]
        time.sleep(0.2)
    raise TimeoutError(f"segment {segment} never ran: {cluster.jobs()}")


def assert_reported(output: str, job_id: str, segment: int) -> None:
    """Snakemake names the failed rule, the Slurm job id and its Slurm log."""
    assert "Error in rule train_segment" in output, output[-4000:]
    assert f"SLURM-job '{job_id}' failed" in output, output[-4000:]
    assert f"slurm_logs/rule_train_segment/{EXPERIMENT}_{segment}/{job_id}.log" in output


@pytest.mark.xdist_group("tiny_2n")
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
        assert proc.wait(timeout=hang_guard(15)) != 0  # noticed: ~15 s quiet
    finally:
        if proc.poll() is None:
            proc.kill()
    assert_reported((work / "snakemake.out").read_text(), job_id, segment=2)
    assert {j["id"]: j["state"] for j in cluster.jobs()}[job_id] == "CANCELLED"
    assert (work / SEG1).exists() and not (work / FINAL).exists()
    resumed_from = int((work / SAVE / "latest_checkpointed_iteration.txt").read_text())
    assert 40 <= resumed_from < 80

    run_training(work, cluster)
    record = json.loads((work / FINAL).read_text())
    assert record["resumed_from_iteration"] == resumed_from
    reference = final_weights(uninterrupted[0])
    resumed = final_weights(work)
    assert all(torch.equal(resumed[k], reference[k]) for k in reference)


@pytest.mark.xdist_group("tiny_2n")
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
        returncode = proc.wait(timeout=hang_guard(30))  # node DOWN, job failed: ~30 s quiet
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


@pytest.mark.xdist_group("tiny_2n")
def test_a_signalled_segment_continues_by_itself_to_the_end(
    uninterrupted, cluster, text_data, tmp_path
):
    """SIGTERM to the segment's job steps (what Slurm's --signal and a preemption send)
    once it trains: the engine saves and stops, the job fails with class ``signal``, and
    Snakemake's second attempt (max_attempts 2) resumes it; the campaign ends in one
    Snakemake run, bitwise equal to the uninterrupted one."""
    work = training_workdir(text_data, tmp_path / "work")
    retries = work / "retries.yaml"
    retries.write_text("training: {max_attempts: 2}\n")
    proc = slurmruns.start(
        work,
        cluster,
        "--configfile",
        str(CONFIG),
        str(retries),
        "--",
        FINAL,
        log=work / "snakemake.out",
    )
    try:
        job_id = wait_for_engine(cluster, proc, work, segment=1)
        cluster.run("scancel", "--signal=TERM", job_id)
        # the signalled attempt and the resubmitted one to the end: ~60 s quiet
        assert proc.wait(timeout=hang_guard(60)) == 0, (work / "snakemake.out").read_text()[-5000:]
    finally:
        if proc.poll() is None:
            proc.kill()
    output = (work / "snakemake.out").read_text()
    assert "Trying to restart job" in output
    first, second = json.loads(
        (work / f"logs/train_segment/{EXPERIMENT}/seg1.attempts.json").read_text()
    )
    assert (first["job_id"], first["failure"]) == (job_id, "signal")
    assert 1 <= first["reached_iteration"] < 40
    assert second["job_id"] != job_id and second["failure"] is None
    assert second["start_iteration"] == first["reached_iteration"]
    resumed = final_weights(work)
    reference = final_weights(uninterrupted[0])
    assert all(torch.equal(resumed[k], reference[k]) for k in reference)


@pytest.mark.xdist_group("tiny_2n")
def test_a_restarted_controller_starts_no_second_writer(
    uninterrupted, cluster, text_data, tmp_path
):
    """The Snakemake controller killed mid-segment; its job runs on (held suspended here,
    so that it is surely still running). A restarted controller submits the segment
    again (the plugin does not reattach): that job finds the live job's lease and refuses,
    naming it. Once the first job has ended, the campaign completes, bitwise equal to an
    uninterrupted run, and every checkpoint was written once."""
    work = training_workdir(text_data, tmp_path / "work")
    proc = slurmruns.start(
        work, cluster, "--configfile", str(CONFIG), "--", FINAL, log=work / "snakemake.out"
    )
    orphan = wait_for_engine(cluster, proc, work, segment=1)
    proc.send_signal(signal.SIGKILL)  # the controller dies; its job does not
    proc.wait(timeout=hang_guard(1))  # SIGKILLed: at once
    cluster.run("scontrol", "suspend", orphan)
    slurmruns.run(work, cluster, "--configfile", str(CONFIG), "--unlock")
    try:
        second = run_training(work, cluster, check=False)
    finally:
        cluster.run("scontrol", "resume", orphan)
    out = second.stdout + second.stderr
    assert second.returncode != 0
    seg1_log = (work / f"logs/train_segment/{EXPERIMENT}/seg1.log").read_text()
    assert f"checkpoints/{EXPERIMENT} is being written by Slurm job {orphan}" in seg1_log, (
        out[-4000:] + seg1_log
    )
    assert f"scancel {orphan}" in seg1_log
    cluster.wait_job(
        lambda j: j["id"] == orphan and j["state"] not in ("RUNNING", "SUSPENDED", "COMPLETING"),
        timeout=hang_guard(30),  # the orphan resumed finishes its segment: ~30 s quiet
    )

    run_training(work, cluster)
    engine_log = (work / f"logs/train_segment/{EXPERIMENT}/seg1.engine.log").read_text()
    assert engine_log.count("==> ") == 1  # one launch of segment 1: the orphan's
    for iteration in range(10, 81, 10):
        saves = "".join(
            (work / f"logs/train_segment/{EXPERIMENT}/seg{k}.engine.log").read_text()
            for k in (1, 2)
        ).count(f"successfully saved checkpoint from iteration {iteration:7d}")
        assert saves == 1, iteration
    reference = final_weights(uninterrupted[0])
    rerun = final_weights(work)
    assert all(torch.equal(rerun[k], reference[k]) for k in reference)


def test_a_signal_during_start_up_or_training_ends_cleanly_and_attempts_follow(
    cluster, text_data, tmp_path
):
    """Slurm's --signal (set by the rule) before the time limit, into a segment far
    longer than the limit, with max_attempts 2. Slurm checks --signal every 30 s and sends
    it once the end is within signal_seconds + 30 s, to the job steps running then: with a
    3-minute limit and 100 s it lands 50-80 s after the start (a limit within 130 s of the
    start would let it land before the engine's step exists, and be lost). On a loaded
    machine that may still be during the engine's start-up. Either way the attempt ends
    cleanly (a complete checkpoint or none, never a half-written one), never by the time
    limit, and says which; an attempt that trained is followed by a second one by itself,
    one that did not stops the chain."""
    work = training_workdir(text_data, tmp_path / "work")
    long_run = work / "long.yaml"  # far more iterations than fit into the time limit
    long_run.write_text(  # (and far more passes over the samples than a real plan allows)
        "training: {max_attempts: 2, experiments: {tiny_2n: {iterations_per_segment: 100000, "
        "save_interval: 100000, data: {max_passes: 1.0e+9}, "
        "time: {margin_seconds: 0, signal_seconds: 100}}}}\n"
    )
    args = (
        "--configfile",
        str(CONFIG),
        str(long_run),
        "--set-resources",
        "train_segment:runtime=3",
    )
    proc = slurmruns.run(
        work, cluster, *args, "--", SEG1, check=False, timeout=hang_guard(200)
    )  # a 3-minute job
    output = proc.stdout + proc.stderr
    assert proc.returncode != 0 and "Error in rule train_segment" in output
    assert not (work / SEG1).exists()
    log = (work / f"logs/train_segment/{EXPERIMENT}/seg1.engine.log").read_text()
    assert "DUE TO TIME LIMIT" not in log
    entries = json.loads((work / f"logs/train_segment/{EXPERIMENT}/seg1.attempts.json").read_text())
    first = entries[0]
    assert first["failure"] == "signal", first
    assert not list((work / SAVE).glob("*.incomplete"))
    if first["reached_iteration"] > 0:  # it trained: the second attempt followed
        assert len(entries) == 2 and entries[1]["start_iteration"] == first["reached_iteration"]
        assert entries[1]["failure"] == "signal"
        assert entries[1]["reached_iteration"] >= first["reached_iteration"]
    else:  # the signal came during the start-up: said so, and no second attempt trained
        assert "before the engine started" in first["message"] or "start-up" in first["message"]
        assert len(entries) == 1
        assert (
            "added no iteration" in (work / f"logs/train_segment/{EXPERIMENT}/seg1.log").read_text()
        )


# ---- the chain: a campaign Slurm carries without a controller (hpcllm.training.campaign.chain)


def chain_campaign(
    work: Path, cluster, monkeypatch, *configs: Path, requeue: bool = False, **resources
):
    """tiny_2n's campaign as the workflow would make it on the test cluster: the prepared
    experiment, the cluster, and the segment job's sbatch options as the official plugin
    builds them from the rule's resources and the profile's (``requeue``: the plugin's
    setting of that name instead of its ``no_requeue``; ``resources``: others than the
    profile's)."""
    from types import SimpleNamespace

    from hpcllm.clusters import load_cluster
    from hpcllm.training.campaign.chain import Campaign, sbatch_geometry
    from hpcllm.training.campaign.status import load_config
    from hpcllm.training.plan.experiment import prepare_experiment

    monkeypatch.setenv("SLURM_CONF", cluster.env["SLURM_CONF"])
    monkeypatch.chdir(work)
    config = load_config(
        work, [str(EXAMPLES), str(CONFIG), *map(str, configs)], "profiles/testcluster"
    )
    slurm_cluster = load_cluster("testcluster")
    prepared = prepare_experiment(
        EXPERIMENT, config["training"]["experiments"][EXPERIMENT], config["text"], slurm_cluster
    )
    resources = {  # train_segment's resources with the test cluster profile's
        "nodes": 2,
        "tasks": 2,
        "tasks_per_gpu": 0,
        "mpi": "",
        "runtime": 30,
        "mem_mb": 4000,
        "slurm_partition": "batch",
        "slurm_extra": "--ntasks-per-node=1 --signal=USR2@30",
        **resources,
    }
    settings = SimpleNamespace(requeue=requeue, no_requeue=not requeue, qos=None, reservation=None)
    return Campaign(
        name=EXPERIMENT,
        prepared=prepared,
        cluster=slurm_cluster,
        workdir=str(work),
        container=None,
        sbatch=sbatch_geometry(resources, settings=settings),
        max_attempts=config["training"]["max_attempts"],
        environment={"PATH": slurmruns.environment(cluster)["PATH"]},
    )


@pytest.mark.parametrize(
    "limit,resources,fact",
    [
        # over the partition's time limit (5 min): a segment's limit sized past the site's
        ("PartitionTimeLimit", {"runtime": 30, "nodes": 1, "tasks": 1},
         "gpu_partition.max_minutes in config/clusters/testcluster.yaml"),
        # over its node limit (1): a 2-node job, as a 2-node canary behind a 1-node QOS
        ("PartitionNodeLimit", {"runtime": 2}, "devel_qos.nodes in "
                                               "config/clusters/testcluster.yaml"),
    ],
)  # fmt: skip
def test_a_chain_job_pending_on_a_limit_ends_the_wait_naming_it(
    cluster, tmp_path, monkeypatch, limit, resources, fact
):
    """A chain job that Slurm queues but will never start (over a limit of its partition,
    EnforcePartLimits=NO: testcluster.LIMITED_PARTITION, as behind a QOS's limit) does not
    keep the controller waiting: the wait ends with the reason, what it means and the
    cluster fact to change, and the job is cancelled."""
    import threading

    from hpcllm.training.campaign import chain

    work = slurmruns.make_workdir(tmp_path / "work")
    limited = {"slurm_partition": testcluster.LIMITED_PARTITION, **resources}
    campaign = chain_campaign(work, cluster, monkeypatch, **limited)
    ended: list[BaseException] = []

    def wait() -> None:
        try:
            chain.wait_for_segment(campaign, 1, poll_seconds=1)
        except BaseException as e:  # noqa: BLE001  (handed to the test)
            ended.append(e)

    waiting = threading.Thread(target=wait, daemon=True)
    waiting.start()
    waiting.join(timeout=hang_guard(60))  # the reason shows at Slurm's first pass: ~2 s
    assert ended, (cluster.jobs(), cluster.log_tail())
    stop = ended[0]
    assert isinstance(stop, chain.ChainStopped), stop
    job = chain.submitted_jobs(work / SAVE)[0]["job"]
    said = str(stop)
    assert f"the chain of {EXPERIMENT}: job {job} is PENDING for {limit}: " in said, said
    assert "which Slurm does not resolve by itself" in said and fact in said, said
    assert f"cancelled the chain's pending jobs {job}" in said, said
    states = {j["id"]: j["state"] for j in cluster.jobs()}
    assert states[job] == "CANCELLED", states
    assert not chain.chain_jobs(campaign.job_name())


def index_cache(work: Path, *configs: Path) -> None:
    slurmruns.run(
        work,
        None,
        "--configfile",
        str(CONFIG),
        *map(str, configs),
        "--until",
        "prepare_data_cache",
        profile="local",
    )


def chain_jobs_of(cluster, campaign) -> list[dict[str, str]]:
    return [j for j in cluster.jobs() if j["name"] == campaign.job_name()]


@pytest.mark.xdist_group("tiny_2n_three")
def test_a_chain_trains_every_segment_with_no_controller_alive(
    uninterrupted_three, cluster, text_data, tmp_path, monkeypatch
):
    """No Snakemake at all once the 3-segment chain is submitted: each chain job submits
    its successor first, trains the next segment, and the last one cancels its successor.
    Never more than two jobs of the chain in Slurm; bitwise equal to the same campaign
    trained without a chain. The workflow run afterwards (a controller started again once
    the campaign finished) submits no training job and draws the loss curve."""
    from hpcllm.training.campaign import chain

    work = training_workdir(text_data, tmp_path / "work")
    three = three_segments(work)
    index_cache(work, three)
    campaign = chain_campaign(work, cluster, monkeypatch, three)
    assert campaign.sbatch[:4] == ["-p", "batch", "-t", "30"], campaign.sbatch
    state, jobs = chain.ensure(campaign)
    assert state == "submitted" and len(jobs) == 1
    # Asked again while it runs (a controller reattaching): nothing is submitted.
    again, live = chain.ensure(chain.load(campaign.file()))
    assert again == "running" and [j["id"] for j in live] == [jobs[0]["id"]]
    most = 0
    deadline = time.monotonic() + hang_guard(120)  # 3 segments of 4 iterations: ~60 s quiet
    while chain.next_segment(campaign) is not None or chain.chain_jobs(campaign.job_name()):
        assert time.monotonic() < deadline, cluster.jobs()
        most = max(most, len(chain.chain_jobs(campaign.job_name())))
        time.sleep(0.5)
    assert most <= 2
    submitted = chain.submitted_jobs(work / SAVE)
    # seg1's, seg2's and seg3's jobs, and seg3's successor, cancelled when it completed
    assert len(submitted) == 4, submitted
    assert [s["after"] for s in submitted] == [None] + [s["job"] for s in submitted[:3]]
    states = {j["id"]: j["state"] for j in chain_jobs_of(cluster, campaign)}
    assert [states[s["job"]] for s in submitted] == ["COMPLETED"] * 3 + ["CANCELLED"]
    for k, s in zip((1, 2, 3), submitted):
        (entry,) = json.loads(
            (work / f"logs/train_segment/{EXPERIMENT}/seg{k}.attempts.json").read_text()
        )
        assert (entry["job_id"], entry["failure"]) == (s["job"], None)
        assert (
            json.loads((work / f"results/train/{EXPERIMENT}/seg{k}.json").read_text())[
                "last_iteration"
            ]
            == 4 * k
        )
    assert chain.stopped(work / SAVE) is None
    reference = final_weights(uninterrupted_three)
    chained = final_weights(work)
    assert all(torch.equal(chained[k], reference[k]) for k in reference)

    # The controller started again after the campaign: no training job, the loss curve.
    monkeypatch.undo()
    chain_on = work / "chained.yaml"
    chain_on.write_text("training: {chain: true}\n")
    rerun = slurmruns.run(
        work, cluster, "--configfile", str(CONFIG), str(three), str(chain_on), "--", FINAL3, CURVE
    )
    out = rerun.stdout + rerun.stderr
    remote, local = slurmruns.rule_headers(out)
    assert "train_segment" not in remote and local.get("plot_training") == 1, out[-4000:]
    assert chain.submitted_jobs(work / SAVE) == submitted  # no training job submitted
    assert (work / CURVE).stat().st_size > 10_000


def test_a_deterministic_failure_in_segment_2_stops_the_chain(
    cluster, text_data, tmp_path, monkeypatch
):
    """Three segments; segment 2's data file is removed after segment 1 committed (its job
    held until then): segment 2 fails for good (the data check's class), its job cancels
    its successor, and segment 3 never starts; the stop names the class and the job id."""
    from hpcllm.training.campaign import chain

    work = training_workdir(text_data, tmp_path / "work")
    short = three_segments(work)
    index_cache(work, short)
    campaign = chain_campaign(work, cluster, monkeypatch, short)
    _, (first,) = chain.ensure(campaign)
    second = cluster.wait_job(
        lambda j: j["name"] == campaign.job_name() and j["id"] != first["id"],
        timeout=hang_guard(60),  # job 1 starts and submits its successor: seconds quiet
    )["id"]
    cluster.run("scontrol", "hold", second)
    cluster.wait_job(
        lambda j: j["id"] == first["id"] and j["state"] == "COMPLETED",
        timeout=hang_guard(60),  # segment 1, 4 iterations: ~20 s quiet
    )
    assert (work / f"results/train/{EXPERIMENT}/seg1.json").exists()
    data_file = work / "data/tokenized/sample_bpe/fineweb_text_document.bin"
    shutil.copy2(data_file, tmp_path / data_file.name)  # restored (mtime too) for the rerun
    data_file.unlink()
    cluster.run("scontrol", "release", second)
    deadline = time.monotonic() + hang_guard(60)  # segment 2 refuses at its start
    while chain.chain_jobs(campaign.job_name()):
        assert time.monotonic() < deadline, cluster.jobs()
        time.sleep(0.5)
    stop = chain.stopped(work / SAVE)
    (entry,) = json.loads(
        (work / f"logs/train_segment/{EXPERIMENT}/seg2.attempts.json").read_text()
    )
    assert entry["job_id"] == second and entry["failure"] in ("missing_file", "config_error")
    assert stop is not None and (stop["segment"], stop["failure"], stop["job_id"]) == (
        2,
        entry["failure"],
        second,
    ), stop
    assert "fineweb_text_document" in stop["message"], stop
    submitted = [s["job"] for s in chain.submitted_jobs(work / SAVE)]
    assert submitted[:2] == [first["id"], second] and len(submitted) == 3
    third = submitted[2]
    states = {j["id"]: j for j in chain_jobs_of(cluster, campaign)}
    assert states[second]["state"] == "FAILED"
    # segment 3's job was cancelled while pending: it never ran on a node
    assert states[third]["state"] == "CANCELLED" and not states[third]["nodes"], states
    assert not (work / f"logs/train_segment/{EXPERIMENT}/seg3.attempts.json").exists()
    assert not (work / f"results/train/{EXPERIMENT}/seg2.json").exists()
    from hpcllm.training.campaign.status import campaign_status

    shown = campaign_status(work, [str(EXAMPLES), str(CONFIG), str(short)], "profiles/testcluster")
    failure = stop["failure"]
    assert f"last failure: {failure} (job {second}); the chain stopped at segment 2" in shown, shown
    assert "fix the cause, then `hpcllm retry-training tiny_2n`" in shown, shown

    # The workflow run again (training.chain, through the plugin) names the stop and does
    # not submit a new chain: another would repeat it. The data file is back, so that
    # Snakemake does not remake the text stage; the chain cannot know the cause is gone.
    shutil.copy2(tmp_path / data_file.name, data_file)
    chained = work / "chained.yaml"
    chained.write_text("training: {chain: true}\n")
    args = ("--configfile", str(CONFIG), str(short), str(chained), "--", FINAL3)
    again = slurmruns.run(work, cluster, *args, check=False)
    out = again.stdout + again.stderr
    assert again.returncode != 0, out[-4000:]
    assert (
        f"the chain of tiny_2n stopped at segment 2: {failure} in Slurm job {second}" in out
        and "Not submitted again" in out
        and "hpcllm retry-training tiny_2n" in out
    ), out[-4000:]
    assert [s["job"] for s in chain.submitted_jobs(work / SAVE)] == submitted
    assert not chain.chain_jobs(campaign.job_name())
    # The cause fixed, `hpcllm retry-training` clears the stop: the next run submits the
    # chain anew (a new attempt budget) and finishes segments 2 and 3.
    assert "cleared: the chain of tiny_2n stopped at segment 2" in hpcllm(
        work, cluster, "retry-training", EXPERIMENT
    )
    resumed = slurmruns.run(work, cluster, *args)
    out = resumed.stdout + resumed.stderr
    assert "train_segment" not in slurmruns.rule_headers(out)[0], out[-4000:]
    new_chain = chain.submitted_jobs(work / SAVE)[3:]
    assert new_chain[0]["after"] is None, new_chain  # the new chain's first job, then its own
    assert f"submitted the chain of tiny_2n: job {new_chain[0]['job']};" in out, out[-4000:]
    assert chain.committed_iteration(work / SAVE) == 12
    assert chain.stopped(work / SAVE) is None


def test_a_requeued_chain_job_submits_no_second_successor(
    cluster, text_data, tmp_path, monkeypatch
):
    """Slurm runs a requeued job again under the same id (after a node failure, by
    default on LUMI), so its step runs twice. Two segments, the jobs requeueable: job 1
    trains segment 1 (its successor held meanwhile) and is requeued with `scontrol
    requeue` once it completed. Run again, it submits no second successor (the one it
    submitted is in Slurm) and trains segment 2; the successor, released as soon as job 1
    is requeued, waits for it (`singleton`) instead of running beside it into the lease,
    and is cancelled once the campaign is complete: no fork, no stop."""
    from hpcllm.training.campaign import chain

    work = training_workdir(text_data, tmp_path / "work")
    two = work / "two.yaml"
    two.write_text(THREE.replace("segments: 3", "segments: 2"))
    index_cache(work, two)
    campaign = chain_campaign(work, cluster, monkeypatch, two, requeue=True)
    assert "--requeue" in campaign.sbatch, campaign.sbatch
    _, (first,) = chain.ensure(campaign)
    first = first["id"]
    second = cluster.wait_job(
        lambda j: j["name"] == campaign.job_name() and j["id"] != first,
        timeout=hang_guard(60),  # job 1 starts and submits its successor: seconds quiet
    )["id"]
    cluster.run("scontrol", "hold", second)
    cluster.wait_job(
        lambda j: j["id"] == first and j["state"] == "COMPLETED",
        timeout=hang_guard(60),  # segment 1, 4 iterations: ~20 s quiet
    )
    assert chain.committed_iteration(work / SAVE) == 4
    cluster.run("scontrol", "requeue", first)
    # Slurm delays a requeued job's start by 2 minutes; a few seconds do here (in the
    # second it ended, its nodes still refuse it: "Job credential revoked")
    cluster.run("scontrol", "update", f"JobId={first}", "StartTime=now+3")
    cluster.run("scontrol", "release", second)
    deadline = time.monotonic() + hang_guard(90)  # segment 2: ~20 s quiet
    while chain.chain_jobs(campaign.job_name()):
        assert time.monotonic() < deadline, cluster.jobs()
        time.sleep(0.5)
    log = (work / f"logs/train_segment/{EXPERIMENT}/chain/{first}.log").read_text()
    assert f"job {first} runs again (Slurm restart 1): its successor, job {second}" in log, log
    submitted = chain.submitted_jobs(work / SAVE)
    assert [(s["job"], s["after"]) for s in submitted] == [(first, None), (second, first)]
    states = {j["id"]: j for j in chain_jobs_of(cluster, campaign)}
    assert states[first]["state"] == "COMPLETED", states
    # the successor never ran beside the requeued job: cancelled while pending
    assert states[second]["state"] == "CANCELLED" and not states[second]["nodes"], states
    assert chain.stopped(work / SAVE) is None
    assert chain.committed_iteration(work / SAVE) == 8
    (entry,) = json.loads(
        (work / f"logs/train_segment/{EXPERIMENT}/seg2.attempts.json").read_text()
    )
    assert (entry["job_id"], entry["failure"]) == (first, None)

    # Two heads of the chain all the same (e.g. a job killed between sbatch and its entry
    # in jobs.jsonl): submitted to begin in ten minutes, the later one let begin first
    # waits for the earlier. (Not SBATCH_HOLD: in one CI run of 3 the first of the two
    # submissions was not held and had ended before the test could release it.)
    campaign.sbatch = [*campaign.sbatch, "--begin=now+600"]
    one, two = chain.submit(campaign), chain.submit(campaign)
    cluster.run("scontrol", "update", f"JobId={two}", "StartTime=now")
    deadline = time.monotonic() + hang_guard(30)  # until Slurm decided about it
    while (now := cluster.run("squeue", "-h", "-t", "all", "-j", two, "-o", "%T|%r").strip()) in (
        "PENDING|None",
        "PENDING|Priority",
        "PENDING|BeginTime",
    ):
        assert time.monotonic() < deadline, now
        time.sleep(0.3)
    assert now == "PENDING|Dependency", now  # singleton: not beside job `one`
    assert cluster.run("squeue", "-h", "-j", one, "-o", "%T").strip() == "PENDING"
    cluster.run("scontrol", "update", f"JobId={one}", "StartTime=now")
    deadline = time.monotonic() + hang_guard(60)  # both find the campaign complete
    while chain.chain_jobs(campaign.job_name()):
        assert time.monotonic() < deadline, cluster.jobs()
        time.sleep(0.5)
    times = dict(
        line.split("|", 1)
        for line in cluster.run(
            "squeue", "-h", "-t", "all", "-j", f"{one},{two}", "-o", "%i|%S|%e"
        ).splitlines()
    )
    assert times[two].split("|")[0] >= times[one].split("|")[1], times


def hpcllm(work: Path, cluster, *args: str) -> str:
    """An `hpcllm` command as a user runs it next to the campaign (real squeue)."""
    import subprocess
    import sys

    proc = subprocess.run(
        [sys.executable, "-m", "hpcllm", *args],
        cwd=work, env=slurmruns.environment(cluster), capture_output=True, text=True,
        timeout=hang_guard(60),
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    return proc.stdout


def hpcllm_status(work: Path, cluster, *configfiles: str) -> str:
    """`hpcllm status` with the config files the runs had (the examples first, as
    slurmruns adds them to every run)."""
    files = (str(EXAMPLES), *configfiles)
    return hpcllm(
        work, cluster, "status", "--profile", "profiles/testcluster", "--configfile", *files
    )


def assert_three_segments_as_without_a_chain(work: Path, reference: Path) -> None:
    """Each segment's record of its 4 iterations, the weights bitwise those of
    ``reference`` (the same campaign, one plugin job per segment)."""
    for k in (1, 2, 3):
        record = json.loads((work / f"results/train/{EXPERIMENT}/seg{k}.json").read_text())
        assert record["last_iteration"] == 4 * k
    expected, weights = final_weights(reference), final_weights(work)
    assert all(torch.equal(weights[k], expected[k]) for k in expected)


def kill_the_controller_in_segment_1(work: Path, cluster, args, env=None) -> None:
    """Start the workflow with ``args``; once segment 1 has trained its first iteration,
    SIGKILL the controller and its waiting script (as at a logout)."""
    proc = slurmruns.start(work, cluster, *args, log=work / "snakemake.out", env=env)
    engine_log = work / f"logs/train_segment/{EXPERIMENT}/seg1.engine.log"
    deadline = time.monotonic() + hang_guard(90)  # data cache, then segment 1: ~60 s quiet
    while not (engine_log.exists() and f"iteration {1:8d}/" in engine_log.read_text()):
        assert proc.poll() is None, (work / "snakemake.out").read_text()[-4000:]
        assert time.monotonic() < deadline, cluster.jobs()
        time.sleep(0.2)
    proc.send_signal(signal.SIGKILL)
    proc.wait(timeout=hang_guard(1))
    for pid in cluster.processes():
        with contextlib.suppress(OSError):
            if b"train_segment_chain" in Path(f"/proc/{pid}/cmdline").read_bytes():
                os.kill(pid, signal.SIGKILL)


@pytest.mark.xdist_group("tiny_2n_three")
def test_a_chained_campaign_outlives_its_controller_and_the_rerun_reattaches(
    uninterrupted_three, cluster, text_data, tmp_path
):
    """training.chain, 3 segments: the controller (SIGKILLed once segment 1 trains, its
    waiting script with it) is gone; Slurm's chain trains segments 1 and 2. Started again
    while the chain still runs (segment 3's job held pending, so that it still does on a
    slow machine), the same command submits no training job: it says what it found
    (segments 1-2 committed, segment 3's job pending), waits for segment 3 and draws the
    loss curve. Bitwise equal to the same campaign trained without a chain."""
    from hpcllm.training.campaign import chain

    work = training_workdir(text_data, tmp_path / "work")
    chained = work / "chained.yaml"
    chained.write_text("training: {chain: true}\n")
    configs = (str(CONFIG), str(three_segments(work)), str(chained))
    args = ("--configfile", *configs, "--", FINAL3, CURVE)
    kill_the_controller_in_segment_1(work, cluster, args)
    output = (work / "snakemake.out").read_text()
    assert (
        "submitted the chain of tiny_2n"
        in (work / f"logs/train_segment/{EXPERIMENT}/seg1.log").read_text()
    ), output[-4000:]
    name = chain.job_name_of(work, EXPERIMENT)

    def chain_jobs() -> list[dict[str, str]]:  # ended ones too (MinJobAge), by id
        return sorted((j for j in cluster.jobs() if j["name"] == name), key=lambda j: int(j["id"]))

    # Segment 2's job submits segment 3's when it starts: hold that one.
    deadline = time.monotonic() + hang_guard(120)  # segment 1, segment 2's start: ~40 s quiet
    while len(chain_jobs()) < 3:
        assert time.monotonic() < deadline, cluster.jobs()
        time.sleep(0.3)
    third = chain_jobs()[2]["id"]
    cluster.run("scontrol", "hold", third)
    first, second = (j["id"] for j in chain_jobs()[:2])
    cluster.wait_job(
        lambda j: j["id"] == second and j["state"] not in chain.LIVE_STATES,
        timeout=hang_guard(60),  # segment 2, 4 iterations: ~20 s quiet
    )
    assert chain.committed_iteration(work / SAVE) == 8  # two segments, no controller
    shown = hpcllm_status(work, cluster, *configs)
    (work / "status_while_chained.txt").write_text(shown)  # docs/training.md shows one
    assert f"jobs: {third} PENDING chain next" in shown, shown

    slurmruns.run(work, cluster, "--configfile", *configs, "--unlock")
    restarted = slurmruns.start(work, cluster, *args, log=work / "restarted.out")
    said = re.compile(
        r"the chain of tiny_2n is in Slurm, segments 1-2 of 3 committed \(checkpoint "
        rf"iteration 8 of 12\); jobs: {third} PENDING.*; waiting for segment 3"
    )
    deadline = time.monotonic() + hang_guard(60)  # Snakemake's start, 3 local jobs
    while not said.search((work / "restarted.out").read_text()):
        assert restarted.poll() is None, (work / "restarted.out").read_text()[-4000:]
        assert time.monotonic() < deadline, (work / "restarted.out").read_text()[-4000:]
        time.sleep(0.5)
    cluster.run("scontrol", "release", third)
    restarted.wait(timeout=hang_guard(60))  # segment 3, then the loss curve: ~30 s quiet
    out = (work / "restarted.out").read_text()
    assert restarted.returncode == 0, out[-4000:]
    remote, local = slurmruns.rule_headers(out)
    assert "train_segment" not in remote and local.get("plot_training") == 1, out[-4000:]
    assert "segment 1 is done, segments 1-2 of 3 committed" in out, out[-4000:]
    submitted = chain.submitted_jobs(work / SAVE)
    # One chain, submitted by the first controller; every later job by its predecessor:
    # seg1, seg2, seg3, and seg3's successor (cancelled when the campaign completed).
    assert [s["job"] for s in submitted] == [first, second, third, submitted[3]["job"]]
    assert [s["after"] for s in submitted] == [None, first, second, third], submitted
    assert chain.committed_iteration(work / SAVE) == 12
    assert chain.stopped(work / SAVE) is None
    assert [j["state"] for j in chain_jobs()] == ["COMPLETED"] * 3 + ["CANCELLED"]
    assert (work / CURVE).stat().st_size > 10_000
    assert_three_segments_as_without_a_chain(work, uninterrupted_three)


def refusing_slurm(work: Path, cluster) -> tuple[Path, Path]:
    """sbatch, scancel and scontrol (but its `show`) that refuse inside a Slurm job, as a
    site whose compute nodes may not submit: each refusal is logged. Outside a job (the
    login node) they are the test cluster's. The folder to put first on PATH, the log."""
    folder, log = work / "refusing-bin", work / "refused.log"
    folder.mkdir()
    path = slurmruns.environment(cluster)["PATH"]
    for name in ("sbatch", "scancel", "scontrol"):
        real = shutil.which(name, path=path)
        allowed = '[ "$1" = show ] || ' if name == "scontrol" else ""
        (folder / name).write_text(
            "#!/bin/sh\n"
            f'if [ -n "$SLURM_JOB_ID" ] && ! {{ {allowed}false; }}; then\n'
            f'  echo "{name} $* (in job $SLURM_JOB_ID)" >> {log}\n'
            f'  echo "{name}: error: Access/permission denied" >&2\n'
            "  exit 1\n"
            "fi\n"
            f'exec {real} "$@"\n'
        )
        (folder / name).chmod(0o755)
    return folder, log


def up_front_site(text_data, tmp_path, cluster, max_attempts: int):
    """A working directory of 3 chained segments on a site whose compute nodes may not
    call Slurm (its cluster file says so; sbatch, scancel, scontrol refuse in jobs): the
    folder, the environment, the refusals' log, the config files."""
    work = training_workdir(text_data, tmp_path / "work")
    (work / "config").unlink()
    shutil.copytree(slurmruns.REPO / "config", work / "config")
    facts = work / "config/clusters/testcluster.yaml"
    facts.write_text(facts.read_text() + "slurm_from_compute_nodes: false\n")
    refusing, refused = refusing_slurm(work, cluster)
    env = {"PATH": f"{refusing}{os.pathsep}{slurmruns.environment(cluster)['PATH']}"}
    chained = work / "chained.yaml"
    chained.write_text(f"training: {{chain: true, max_attempts: {max_attempts}}}\n")
    return work, env, refused, (str(CONFIG), str(three_segments(work)), str(chained))


@pytest.mark.xdist_group("tiny_2n_three")
def test_where_compute_nodes_may_not_submit_the_chain_is_submitted_up_front(
    uninterrupted_three, cluster, text_data, tmp_path, monkeypatch
):
    """A site that refuses sbatch, scancel and scontrol requeue in jobs (its cluster file
    says so; elsewhere the site probe's record does), training.chain on, 3 segments,
    max_attempts 3: the login node submits the whole chain at once, 5 jobs (3 segments, 2
    retries), each after the one before. The controller SIGKILLed once segment 1 trains:
    Slurm trains segments 2 and 3, no job calls what the site refuses, and the two spare
    jobs end within seconds. The same command run again submits nothing, writes the
    records and draws the loss curve. Bitwise equal to the campaign without a chain."""
    from hpcllm.training.campaign import chain

    work, env, refused, configs = up_front_site(text_data, tmp_path, cluster, max_attempts=3)
    args = ("--configfile", *configs, "--", FINAL3, CURVE)
    kill_the_controller_in_segment_1(work, cluster, args, env=env)
    said = (work / f"logs/train_segment/{EXPERIMENT}/seg1.log").read_text()
    submitted = chain.submitted_jobs(work / SAVE)
    ids = [s["job"] for s in submitted]
    assert len(ids) == 5, submitted
    assert f"submitted the chain of tiny_2n: jobs {ids[0]}-{ids[-1]} up front" in said, said
    assert [s["after"] for s in submitted] == [None, *ids[:4]]
    name = chain.job_name_of(work, EXPERIMENT)
    monkeypatch.setenv("SLURM_CONF", cluster.env["SLURM_CONF"])  # for chain_jobs here
    deadline = time.monotonic() + hang_guard(180)  # 2 segments, 2 spares: ~60 s quiet
    while chain.chain_jobs(name):
        assert time.monotonic() < deadline, cluster.jobs()
        time.sleep(0.5)
    assert chain.committed_iteration(work / SAVE) == 12  # with no controller alive
    assert not refused.exists(), refused.read_text()  # no job asked what the site refuses
    jobs = {j["id"]: j for j in cluster.jobs() if j["name"] == name}
    # The first spare finds the campaign complete and ends the chain (exit 3); Slurm
    # cancels the second, which never starts.
    states = [jobs[i]["state"] for i in ids]
    assert states == ["COMPLETED"] * 3 + ["FAILED", "CANCELLED"], jobs
    log = (work / f"logs/train_segment/{EXPERIMENT}/chain/{ids[3]}.log").read_text()
    assert "every segment is committed; nothing to train" in log, log
    assert "this job ends the chain with exit status 3" in log, log
    assert "run_segment" not in log and "successor" not in log, log
    assert not (work / f"logs/train_segment/{EXPERIMENT}/chain/{ids[4]}.log").exists()

    slurmruns.run(work, cluster, "--configfile", *configs, "--unlock")
    rerun = slurmruns.start(work, cluster, *args, log=work / "rerun.out", env=env)
    rerun.wait(timeout=hang_guard(90))  # 3 local jobs and the loss curve: ~20 s quiet
    out = (work / "rerun.out").read_text()
    assert rerun.returncode == 0, out[-4000:]
    remote, local = slurmruns.rule_headers(out)
    assert "train_segment" not in remote and local.get("plot_training") == 1, out[-4000:]
    assert chain.submitted_jobs(work / SAVE) == submitted  # nothing submitted
    assert_three_segments_as_without_a_chain(work, uninterrupted_three)


def test_a_plain_scancel_of_an_up_front_chain_leaves_nothing_to_start(
    cluster, text_data, tmp_path, monkeypatch
):
    """Compute nodes may not call Slurm (as above), 3 segments, max_attempts 2: 4 jobs up
    front. With the controller gone, the user's plain `scancel` of the running job (in
    segment 1) ends the chain: Slurm cancels the three pending jobs, none starts on a
    node, and no job called what the site refuses."""
    from hpcllm.training.campaign import chain

    work, env, refused, configs = up_front_site(text_data, tmp_path, cluster, max_attempts=2)
    kill_the_controller_in_segment_1(work, cluster, ("--configfile", *configs, "--", FINAL3), env)
    ids = [s["job"] for s in chain.submitted_jobs(work / SAVE)]
    assert len(ids) == 4, ids
    cluster.run("scancel", ids[0])
    name = chain.job_name_of(work, EXPERIMENT)
    monkeypatch.setenv("SLURM_CONF", cluster.env["SLURM_CONF"])  # for chain_jobs here
    deadline = time.monotonic() + hang_guard(60)  # the cancel and KillWait: ~5 s quiet
    while chain.chain_jobs(name):
        assert time.monotonic() < deadline, cluster.jobs()
        time.sleep(0.5)
    jobs = {j["id"]: j for j in cluster.jobs() if j["name"] == name}
    assert [jobs[i]["state"] for i in ids] == ["CANCELLED"] * 4, jobs
    logs = work / f"logs/train_segment/{EXPERIMENT}/chain"
    assert sorted(p.name for p in logs.glob("*.log")) == [f"{ids[0]}.log"]  # none started
    assert not refused.exists(), refused.read_text()


# ---- the calendar: predictions against a queue that really waits


def occupy_both_nodes(cluster, seconds: int) -> str:
    """A job of another user's kind: both nodes, whole, for ``seconds`` (its time limit 1
    min: what ``squeue --start`` counts with); first in the queue (``scontrol top``: before
    the chain's pending job, submitted earlier)."""
    job = cluster.run(
        "sbatch", "--parsable", "-N2", "--exclusive", "-t", "1", "-J", "occupier",
        "-o", "/dev/null", "--wrap", f"sleep {seconds}",
    ).strip().split(";")[0]  # fmt: skip
    cluster.run("scontrol", "top", job, check=False)
    return job


@pytest.mark.xdist_group("tiny_2n_calendar")
def test_the_calendar_predicts_a_chain_whose_jobs_wait_behind_other_jobs(
    cluster, text_data, tmp_path, monkeypatch, capsys
):
    """The chain's 3 segments on nodes that other jobs occupy: 20 s before segment 1's job,
    40 s between segment 2's and segment 3's. Each job records its Slurm times and (from
    segment 2 on) its prediction; the prediction counts the waits measured so far, status
    shows the finish while segment 3's job waits, and the page sets each prediction
    against the end. The errors are printed (docs/measurements/training.md)."""
    from hpcllm.training.campaign import chain
    from hpcllm.training.campaign.status import campaign_status

    work = training_workdir(text_data, tmp_path / "work")
    three = three_segments(work)
    index_cache(work, three)
    campaign = chain_campaign(work, cluster, monkeypatch, three)
    first = occupy_both_nodes(cluster, 20)
    cluster.wait_job(lambda j: j["id"] == first and j["state"] == "RUNNING", hang_guard(30))
    chain.ensure(campaign)
    deadline = time.monotonic() + hang_guard(240)  # ~130 s quiet
    second, shown = None, []  # (when, the status line) while segment 3's job waits
    polls, polled = [], 0.0  # (when, the calendar's line) every 3 s throughout
    files = [str(EXAMPLES), str(CONFIG), str(three)]
    while chain.next_segment(campaign) is not None or chain.chain_jobs(campaign.job_name()):
        assert time.monotonic() < deadline, cluster.jobs()
        if time.monotonic() - polled > 3:
            polled = time.monotonic()
            out = campaign_status(work, files, "profiles/testcluster").splitlines()
            polls += [(time.time(), x.strip()) for x in out if x.startswith("    ") and (
                "expected to finish" in x or "(no date)" in x)]  # fmt: skip
        states = {j["id"]: j["state"] for j in cluster.jobs()}
        submitted = [s["job"] for s in chain.submitted_jobs(work / SAVE)]
        if second is None and len(submitted) >= 2 and states.get(submitted[1]) == "RUNNING":
            second = occupy_both_nodes(cluster, 40)  # segment 3's job waits behind it
        if (
            chain.next_segment(campaign) == 3
            and states.get(second) == "RUNNING"
            and len(submitted) >= 3
            and states.get(submitted[2]) == "PENDING"
        ):
            status = campaign_status(work, [str(EXAMPLES), str(CONFIG), str(three)],
                                     "profiles/testcluster")  # fmt: skip
            shown += [
                (time.time(), x.strip()) for x in status.splitlines() if "expected to finish" in x
            ]
        time.sleep(0.5)
    records = [
        json.loads((work / f"results/train/{EXPERIMENT}/seg{k}.json").read_text())
        for k in (1, 2, 3)
    ]
    timing = [r["timing"] for r in records]
    # every job knows when Slurm started it, and the first and third waited behind others
    from hpcllm.training.campaign.calendar import measured, prediction_rows

    waits = [m.wait_seconds for m in measured(records)]
    assert waits[0] >= 10 and waits[2] >= 20, waits
    assert timing[0]["prediction"] is None  # nothing measured yet
    for k in (1, 2):
        p = timing[k]["prediction"]
        # the waits measured up to its job's start, its own included (and the queue the
        # job read from its node)
        assert p["wait"]["source"].startswith(f"measured over {k + 1} jobs"), p
        assert p["segment_end"] > p["made_at"] and p["campaign_end"] >= p["segment_end"]
        assert "not read" not in p["line"], p
    p2 = timing[1]["prediction"]
    # segment 2's job read the partition's queue as status does: segment 3's job (its
    # pending successor, waiting for it) from the queue, or squeue --start's time
    assert re.search(
        r"queue: the next job (waits .+? by the queue now: \d+ other jobs? on batch's 2 "
        r"nodes|at squeue --start's time)",
        p2["line"],
    ), p2["line"]
    if "squeue --start" not in p2["line"]:
        # segment 3's job still to start: its high end after the longest measured wait
        assert p2["campaign_high"] - p2["segment_end"] >= p2["wait"]["high"] > 0, p2
    # every prediction is kept (one line per job that predicted)
    kept = (work / SAVE / "chain/predictions.jsonl").read_text().splitlines()
    assert [json.loads(x)["segment"] for x in kept] == [2, 3]
    # status while segment 3's job waited: the finish, with a queue wait (squeue --start's
    # once the scheduler's backfill pass gave the job a start time; before, from the
    # partition's queue: the occupier running on both nodes, read by squeue and sinfo; none
    # in a poll between the occupier's end and the job's start)
    assert shown, "status was never taken while segment 3's job waited"
    for _, line in shown:
        assert re.search(
            r"(queue: the next job at squeue --start's time|queue: the next job waits \d+ s "
            r"\(\d+ s to \d+ s\) by the queue now: \d+ other jobs? on batch's 2 nodes)",
            line,
        ), line
        assert "80 % interval: " in line, line
    assert any(
        re.search(r"squeue --start's time|by the queue now: [1-9] other job", line)
        for _, line in shown
    ), shown  # the occupier seen while the job waited behind it
    # status throughout: a chain always has a job in Slurm, never stalled; every date has
    # its 80 % interval around it. Calibration (benchmarks/forecast_calibration.py, the
    # long version): the share of the actual end inside the interval, printed
    import importlib.util

    spec = importlib.util.spec_from_file_location(
        "forecast_calibration", REPO / "benchmarks" / "forecast_calibration.py"
    )
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    assert polls and not [x for _, x in polls if "(no date)" in x], polls
    dated = [(at, bench.parse_prediction(x)) for at, x in polls]
    dated = [(at, p) for at, p in dated if p and at < timing[2]["ended"]]
    assert dated, polls
    for _, (finish, low, high) in dated:
        assert low <= finish <= high, polls
    calibration = bench.summary([{"segments": 3, "actual_end": timing[2]["ended"],
                                  "polls": [{"at": at, "prediction": p, "stalled_window": False}
                                            for at, p in dated]}])["all"]  # fmt: skip
    rows = prediction_rows(records)
    assert [r["segment"] for r in rows] == [2, 3]
    assert all(r["campaign_actual"] == timing[2]["ended"] for r in rows)
    with capsys.disabled():
        print(f"\ncalendar on the test cluster: waits {[round(w, 1) for w in waits]} s")
        for r in rows:
            print(
                f"  segment {r['segment']}: segment end error {r['segment_error_s']:+.1f} s, "
                f"campaign end error {r['campaign_error_s']:+.1f} s "
                f"(predicted {r['campaign_predicted'] - r['made_at']:.1f} s ahead)"
            )
        c = calibration
        print(
            f"  status every 3 s: {c['predictions']} dates, {c['coverage']:.0%} with the "
            f"actual end inside the 80 % interval, error median {c['median_error']:.1%}, p90 "
            f"{c['p90_error']:.1%} of the time left"
        )
        for taken, line in (shown[0], shown[-1]):
            at = time.mktime(time.strptime(line.split(": ", 1)[1][:19], "%Y-%m-%d %H:%M:%S"))
            print(
                f"  status {timing[2]['ended'] - taken:.0f} s before the end: error "
                f"{at - timing[2]['ended']:+.1f} s: {line}"
            )


# The hang watchdog's facts for the frozen-rank test: a 15 s floor (an iteration of the
# tiny model takes well under a second), heartbeats every 2 s (silent after 6 s), a
# start-up bound of 3 minutes for a loaded machine.
WATCHDOG = (
    "watchdog: {floor_seconds: 15, ceiling_seconds: 180, heartbeat_seconds: 2, "
    "straggler_factor: 1000}\n"  # as testcluster.yaml: its nodes share one host
)
OWN_WATCHDOG = "watchdog: {straggler_factor: 1000}\n"  # testcluster.yaml's, replaced


def with_watchdog_facts(work: Path) -> None:
    """The working directory's own config/ (a copy), its test cluster file with WATCHDOG."""
    link = work / "config"
    target = link.resolve()
    link.unlink()
    shutil.copytree(target, link, symlinks=True)
    facts = link / "clusters" / "testcluster.yaml"
    text = facts.read_text()
    assert OWN_WATCHDOG in text, f"{facts}: its watchdog line changed; update this test"
    facts.write_text(text.replace(OWN_WATCHDOG, WATCHDOG))
