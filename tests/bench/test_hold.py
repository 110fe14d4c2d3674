"""A failure of the network or at start-up holds the larger points of its series
(hpcllm.bench.hold): held points name the point, its class and its log, do not start
their engine, show as held in the summary, and a rerun of the failed point releases them."""

from __future__ import annotations

import html
import json
import os
import re
import time
from pathlib import Path

import pandas as pd
import pytest
from support import REPO, planned, run_snakemake

from hpcllm.bench import hold
from hpcllm.bench.summary import compact_table, hold_notes, summarize, write_compact
from hpcllm.bench.sweeps import point_id
from hpcllm.failures.classify import classify_text
from hpcllm.results_page import benchmark_sections
from hpcllm.training.campaign.status import format_status, sweep_status

ITERATION = (
    " [2026-02-06 20:55:01] iteration        1/       8 | consumed samples:          512 | "
    "elapsed time per iteration (ms): 1210.0 | throughput per GPU (TFLOP/s/GPU): 149.0 | "
    "global batch size:   512 | lm loss: 1.040000E+01 |\n"
)


def point(nodes: int, scaling: str = "strong", benchmark: str = "language", **kw) -> dict:
    p = {
        "benchmark": benchmark,
        "experiment": kw.get("experiment", "lang"),
        "model": kw.get("model", "gpt"),
        "scaling": scaling,
        "precision": kw.get("precision", "bf16"),
        "nodes": nodes,
        "min_nodes": kw.get("min_nodes", 1),
        "gpus": nodes * 4,
    }
    p["id"] = point_id(p["experiment"], p["model"], scaling, p["precision"], nodes)
    return p


def record(results: Path, p: dict, status: str, log: str = "") -> Path:
    """A finished run of ``p`` as the runner leaves it: run.json and run.log."""
    folder = results / p["id"]
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "run.log").write_text(log)
    (folder / "run.json").write_text(json.dumps({"id": p["id"], "status": status}))
    return folder


def job(results: Path, p: dict) -> dict | None:
    """What the point's bench job does first: held (its record), or None (it runs)."""
    folder = results / p["id"]
    return hold.hold_if_failed_below(p, folder / "run.log", folder / "run.json")


@pytest.fixture
def results(tmp_path) -> Path:
    return tmp_path / "results" / "bench" / "language"


def test_a_network_failure_of_the_2_node_point_holds_the_larger_points_of_its_series(results):
    record(results, point(1), "ok", ITERATION)
    failed = record(results, point(2), "nccl_error", ITERATION + "NCCL error in: x\n")
    for nodes in (4, 8):
        held = job(results, point(nodes))
        assert held["status"] == "held"
        assert held["held_by"] == point(2)["id"] and held["held_by_nodes"] == 2
        assert held["held_by_status"] == "nccl_error"
        assert held["held_by_log"] == str(failed / "run.log")
        on_disk = results / point(nodes)["id"]
        assert json.loads((on_disk / "run.json").read_text()) == held
        log = (on_disk / "run.log").read_text()
        assert "nccl_error" in log and str(failed / "run.log") in log
        assert f"--forcerun {failed / 'run.json'}" in log
    # the 8-node point names the failed point, not the held 4-node one
    assert (
        json.loads((results / point(8)["id"] / "run.json").read_text())["held_by"]
        == (point(2)["id"])
    )


@pytest.mark.parametrize("status", ["rendezvous_error", "time_limit", "error"])
def test_a_failure_before_the_first_iteration_holds(results, status):
    record(results, point(2), status, "torchrun: waiting for the rendezvous\n")
    assert job(results, point(4))["held_by_status"] == status


@pytest.mark.parametrize("status", ["time_limit", "error"])
def test_the_same_failure_after_training_began_holds_nothing(results, status):
    """A run that logged an iteration got past its start-up: its time limit or error
    says nothing of the larger points' start."""
    record(results, point(2), status, ITERATION)
    assert job(results, point(4)) is None


def test_a_vision_run_that_trained_a_batch_got_past_its_start_up(tmp_path):
    results = tmp_path / "vision"
    small, large = point(1, "weak", "vision"), point(2, "weak", "vision")
    record(results, small, "time_limit", '{"event": "batch", "epoch": 1, "time_s": 0.5}\n')
    assert job(results, large) is None
    record(results, small, "time_limit", '{"event": "start"}\n')
    assert job(results, large)["held_by"] == small["id"]


@pytest.mark.parametrize(
    "status",
    ["out_of_memory", "config_error", "missing_file", "node_failure", "cancelled", "preempted"],
)
def test_failures_of_the_point_or_the_moment_hold_nothing(results, status):
    """Out of memory at 1 node: the larger points may well fit; a refused configuration,
    a missing file, a lost node or a cancellation hold nothing either."""
    record(results, point(1), status, "")
    for nodes in (2, 4):
        assert job(results, point(nodes)) is None
        assert not (results / point(nodes)["id"]).exists()  # nothing written: it runs


def test_another_series_is_not_held(results):
    record(results, point(2), "nccl_error", "NCCL error\n")
    assert job(results, point(4, "weak")) is None
    assert job(results, point(4, precision="fp32")) is None
    assert job(results, point(4, model="other")) is None
    assert job(results, point(4, experiment="other")) is None
    assert job(results, point(1)) is None  # nor a smaller point of the same series


def test_a_rerun_of_the_failed_point_releases_the_points_it_held(results):
    failed = record(results, point(2), "nccl_error", "NCCL error\n")
    assert job(results, point(4)) and job(results, point(8))
    # the failed point's result removed (its folder deleted to rerun it): they run
    for f in failed.iterdir():
        f.unlink()
    assert job(results, point(4)) is None
    # or it reran and was measured; the 4-node point's own held record holds nothing
    record(results, point(2), "ok", ITERATION)
    assert job(results, point(8)) is None


def test_the_rule_runs_a_point_after_the_smaller_points_of_its_series(results):
    points = [point(n, s) for s in ("strong", "weak") for n in (4, 1, 2)]
    smaller = hold.smaller_points(points)
    assert smaller[point(4)["id"]] == [point(1)["id"], point(2)["id"]]
    assert smaller[point(1, "weak")["id"]] == []
    record(results, point(2), "nccl_error", "NCCL error\n")
    job(results, point(4))
    assert hold.held_by(results / point(4)["id"] / "run.json") == point(2)["id"]
    assert hold.held_by(results / point(2)["id"] / "run.json") is None
    assert hold.held_by(results / point(8)["id"] / "run.json") is None


def test_the_summary_shows_held_points_as_held_naming_class_and_log(tmp_path):
    results = tmp_path / "results" / "bench"
    language = results / "language"
    points = [point(n) for n in (1, 2, 4)]
    record(language, points[0], "ok", ITERATION)
    failed = record(language, points[1], "nccl_error", ITERATION + "NCCL error\n")
    job(language, points[2])
    df = summarize([{**p, "seq_length": 2048} for p in points], results)
    held = df[df["nodes"] == 4].iloc[0]
    assert held["status"] == "held"  # neither measured nor failed
    assert (held["held_by"], held["held_by_status"]) == (points[1]["id"], "nccl_error")
    assert held["held_by_log"] == str(failed / "run.log")
    assert pd.isna(held["efficiency"])
    table = compact_table(df)
    assert list(table["held by"].fillna("")) == ["", "", "2 nodes, nccl_error"]
    (note,) = hold_notes(df)
    assert points[2]["id"] in note and "nccl_error" in note and str(failed / "run.log") in note
    text = write_compact(df, tmp_path / "summary.txt")
    assert note in text and "held" in text.splitlines()[-2]
    (section, *_), _ = benchmark_sections(df, {})
    assert html.escape(note) in section


def test_hpcllm_status_lists_held_points_apart_from_failed_ones(tmp_path):
    language = tmp_path / "results" / "bench" / "language"
    points = {p["id"]: p for p in (point(n) for n in (1, 2, 4))}
    first, second, third = points
    record(language, points[first], "ok")
    record(language, points[second], "nccl_error", "NCCL error\n")
    job(language, points[third])
    sweeps = sweep_status(tmp_path, points, jobs=[])
    assert sweeps["lang"]["failed"] == {second: "nccl_error"}
    assert sweeps["lang"]["held"] == {third: second}
    assert f"held: {third} (by {second})" in format_status([], sweeps)


@pytest.mark.parametrize(
    "text",
    [
        "torch.distributed.elastic.rendezvous.api.RendezvousConnectionError: The connection "
        "to the C10d store has failed. See inner exception for details.",
        "torch.distributed.DistNetworkError: The client socket has timed out after 60000ms "
        "while trying to connect to (jwb0001i, 29517).",
        "RendezvousTimeoutError",
        "torch.distributed.DistStoreError: Timed out after 901 seconds waiting for clients. "
        "1/2 clients joined.",
        "The IPv6 network addresses of (jwb0001x, 29517) cannot be retrieved (gai error: -2 "
        "- Name or service not known).",
    ],
)
def test_processes_that_never_met_are_a_rendezvous_error(text):
    assert classify_text(f"Traceback (most recent call last):\n{text}\n") == "rendezvous_error"


# The 2-node point of the rehearsal's held sweep (tests/slurm/test_rehearsal_hold.py) as it
# logged its start-up, shortened: gloo found no interface ib0 on any rank; the task of n2
# exited first, srun terminated the step and so cancelled the task of n1.
GLOO_START_UP = (
    "Traceback (most recent call last):\n"
    '  File "/opt/Megatron-LM/pretrain_gpt.py", line 123, in main\n'
    '    dist.init_process_group("gloo")\n'
    "RuntimeError: [enforce fail at gloo/transport/tcp/device.cc:84] ifa != nullptr. Unable "
    "to find address for: ib0\n"
    "torch.distributed.elastic.multiprocessing.errors.ChildFailedError:\n"
    "  exitcode  : 1 (pid: 17184)\n"
    "srun: error: n2: task 1: Exited with exit code 1\n"
    "srun: launch/slurm: _step_signal: Terminating StepId=6003.0\n"
    "slurmstepd-n1: error: *** STEP 6003.0 ON n1 CANCELLED AT 2026-11-26T20:52:57 ***\n"
    "srun: error: n1: task 0: Terminated\n"
    "srun: Force Terminated StepId=6003.0\n"
)


def test_a_start_up_error_of_one_node_holds_though_srun_then_cancelled_the_step(results):
    """srun cancelled the step because a task failed: the cancellation (and the signal
    the other node's torchrun logs) is its doing, the task's unnamed error the cause. It
    was recorded as ``cancelled``, which holds nothing, and the 4-node point met the same
    failure in its turn."""
    assert classify_text(GLOO_START_UP) == "error"
    record(results, point(2), classify_text(GLOO_START_UP), GLOO_START_UP)
    assert job(results, point(4))["held_by_status"] == "error"
    srun_did = "srun: launch/slurm: _step_signal: Terminating StepId=6003.0\n"
    signalled = "[WARNING] Received 15 death signal, shutting down workers\n"
    after = GLOO_START_UP.replace(srun_did, srun_did + signalled)
    assert classify_text(after) == "error"
    # before srun ended the step, a signal or a cancellation is the cause, as without it
    assert classify_text(signalled + GLOO_START_UP) == "signal"
    step = "slurmstepd-n1: error: *** STEP 6003.0 ON n1 CANCELLED AT 2026-11-26T20:52:50 ***\n"
    assert classify_text(step + GLOO_START_UP) == "cancelled"
    assert classify_text(GLOO_START_UP.replace(srun_did, "")) == "cancelled"
    # the other node's agent, its peer gone, fails to close the rendezvous (a full run's
    # log, 2026-11-27): a consequence, not processes that never met
    shutdown = (
        "W1127 00:57:36.038000 7430 torch/distributed/elastic/rendezvous/dynamic_rendezvous"
        ".py:1298] The node 'localhost_7430_0' has failed to shutdown the rendezvous '3003' "
        "due to an error of type RendezvousConnectionError.\n"
    )
    assert classify_text(GLOO_START_UP.replace(srun_did, shutdown + srun_did)) == "error"


def test_a_rank_that_failed_first_keeps_its_own_class():
    """The other ranks lose their store connection when one fails: its cause wins."""
    lost = "torch.distributed.DistNetworkError: failed to recv, got 0 bytes"
    assert classify_text(f"RuntimeError: boom\n{lost}\n") == "error"
    assert classify_text(f"AssertionError: bad layout\n{lost}\n") == "config_error"
    assert classify_text("CUDA out of memory\nRendezvousConnectionError\n") == "out_of_memory"


TINY = "benchmarks:\n  experiments:\n    language_tiny: {data: mock, tokenizer: null}\n"


def finished(work: Path, pid: str, status: str, when: float) -> None:
    """A run of point ``pid`` as its job leaves it at time ``when``: record, log and
    Snakemake's timings file."""
    folder = work / "results/bench/language" / pid
    if status == "held":
        hold.hold_if_failed_below(POINTS[pid], folder / "run.log", folder / "run.json")
    else:
        record(folder.parent, POINTS[pid], status, "NCCL error\n" if status != "ok" else ITERATION)
    timings = work / f"results/timings/bench_language/{pid}.tsv"
    timings.parent.mkdir(parents=True, exist_ok=True)
    timings.write_text("s\n1.0\n")
    for path in (*folder.iterdir(), timings):
        os.utime(path, (when, when))


POINTS = {
    p["id"]: p
    for p in (
        point(n, s, experiment="language_tiny", model="tiny", precision="fp32")
        for s in ("strong", "weak")
        for n in (1, 2)
    )
}


@pytest.mark.workflow
def test_the_plan_reruns_a_held_point_with_the_point_that_held_it_and_nothing_else(workdir):
    """Through Snakemake's plans (dry runs) of the tiny local sweep: the strong 1-node
    point failed with an NCCL error and held the 2-node point; the weak series measured
    both points."""
    strong1, strong2, weak1, weak2 = POINTS
    now = time.time()  # after the job scripts' times: Snakemake reruns older outputs
    runs = ((strong1, "nccl_error"), (weak1, "ok"), (strong2, "held"), (weak2, "ok"))
    for i, (pid, status) in enumerate(runs):
        finished(workdir, pid, status, now + i)
    (workdir / "tiny.yaml").write_text(TINY)
    targets = [f"results/bench/language/{pid}/run.json" for pid in POINTS]

    def plan(*args: str) -> set[str]:
        """The points the plan runs (all by bench_language)."""
        proc = run_snakemake(workdir, *targets, "-n", *args, "--configfile", "tiny.yaml")
        out = proc.stdout + proc.stderr
        points = set(re.findall(r"wildcards: point=(\S+)", out))
        assert planned(out) == ({"bench_language": len(points)} if points else {}), out
        return points

    assert plan() == set()  # nothing reruns by itself, the held point neither
    # the failed point rerun: the point it held runs after it, the other series not
    assert plan("--forcerun", f"results/bench/language/{strong1}/run.json") == {strong1, strong2}
    # deleting a measured point's folder reruns that point alone, not the larger one
    for f in (workdir / "results/bench/language" / weak1).iterdir():
        f.unlink()
    assert plan() == {weak1}
    # deleting the failed point's folder to rerun it releases the held point too
    for f in (workdir / "results/bench/language" / strong1).iterdir():
        f.unlink()
    assert plan() == {weak1, strong1, strong2}


def gpu_point(nodes: int) -> dict:
    """A point of a GPU cluster (its nodes are Slurm nodes)."""
    return {**point(nodes), "gpu_model": "A100"}


def test_a_point_that_will_be_held_is_known_on_the_login_node_unless_its_holder_reruns(
    results,
):
    record(results, point(2), "nccl_error", "NCCL error\n")
    held = hold.submission_hold(point(4), results)
    assert (held["held_by"], held["held_by_status"]) == (point(2)["id"], "nccl_error")
    # the point that holds it runs first in this run: decided again at submission
    assert hold.submission_hold(point(4), results, lambda: {point(2)["id"]}) is None
    assert hold.submission_hold(point(4, "weak"), results) is None  # another series
    note = hold.held_job_note(point(4), held, 45, hold.HELD_JOB_MINUTES)
    assert note.startswith(
        f"benchmarks: {point(4)['id']} will be held ({point(2)['id']}, 2 nodes, failed "
        f"with nccl_error): its job asks for 1 node for {hold.HELD_JOB_MINUTES} min, not "
        "4 nodes for 45 min"
    )


def test_a_job_on_fewer_nodes_than_its_point_that_finds_no_hold_starts_no_engine(results):
    """Submitted as held on one node, then its holder was rerun: the job refuses."""
    with pytest.raises(RuntimeError, match=r"needs 4 nodes but its job has 1 node: it was"):
        hold.check_allocation(gpu_point(4), {"SLURM_JOB_NUM_NODES": "1"})
    hold.check_allocation(gpu_point(4), {"SLURM_JOB_NUM_NODES": "4"})
    hold.check_allocation(gpu_point(4), {})  # not a Slurm job
    hold.check_allocation(point(4), {"SLURM_JOB_NUM_NODES": "1"})  # processes, not nodes
    # through the job's own look at the records: nothing holds it, so it checks
    os.environ["SLURM_JOB_NUM_NODES"] = "1"
    try:
        with pytest.raises(RuntimeError, match="Its engine was not started"):
            job(results, gpu_point(4))
        record(results, point(2), "nccl_error", "NCCL error\n")
        assert job(results, gpu_point(4))["status"] == "held"  # held on its one node
    finally:
        del os.environ["SLURM_JOB_NUM_NODES"]


def test_what_held_points_save_is_counted_from_their_nodes_and_limits():
    points = [point(n) for n in (1, 2, 4, 8)] + [point(n, "weak") for n in (2, 4)]
    assert sorted(hold.first_failures(points)) == sorted([point(2)["id"], point(2, "weak")["id"]])
    minutes = {4: 30, 8: 60}
    saving = hold.held_saving(points, point(2)["id"], lambda p: minutes[p["nodes"]], 4)
    assert saving.held == (point(4)["id"], point(8)["id"])
    assert saving.full_limit_gpu_hours == (4 * 30 + 8 * 60) * 4 / 60  # 40
    assert saving.held_limit_gpu_hours == 2 * hold.HELD_JOB_MINUTES * 4 / 60
    assert (saving.gpu_hours_per_minute_full, saving.gpu_hours_per_minute_held) == (
        12 * 4 / 60,
        2 * 4 / 60,
    )
    assert saving.largest_nodes == 8


def test_the_docs_quote_what_the_held_points_benchmark_prints_for_juwels():
    """docs/benchmarks.md's figures for the JUWELS language sweep are computed
    (benchmarks/held_points_cost.py), not written by hand."""
    import importlib.util

    spec = importlib.util.spec_from_file_location(
        "held_points_cost", REPO / "benchmarks" / "held_points_cost.py"
    )
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    savings, cluster = module.sweep_savings(
        "juwels", {"language": "config/experiments/language.yaml"}
    )
    full = sum(s.full_limit_gpu_hours for s in savings)
    held = sum(s.held_limit_gpu_hours for s in savings)
    per_minute = sum(s.gpu_hours_per_minute_full for s in savings)
    largest = max(s.largest_nodes for s in savings)
    docs = " ".join((REPO / "docs" / "benchmarks.md").read_text().split())
    quoted = (
        f"{sum(len(s.held) for s in savings)} points held, {full:,.0f} GPU-hours at their "
        f"time limits on their nodes, {held:.0f} on one node each; {per_minute:.0f} "
        f"GPU-hours billed for each minute the held jobs live on their nodes, "
        f"{sum(s.gpu_hours_per_minute_held for s in savings):.1f} on one; the largest "
        f"held job {largest} nodes, {100 * largest / cluster.gpu_partition_nodes:.0f} % of "
        f"the Booster's {cluster.gpu_partition_nodes}"
    )
    assert quoted in docs, quoted


def held_sweep(gpus_per_node: int, cluster: str) -> str:
    """A tiny language series of 1 and 2 nodes on ``cluster`` (mock data; 8 heads: TP is
    the node's GPUs)."""
    import yaml

    tiny = {
        "preset": "tiny",
        "overrides": {"model": {"num_attention_heads": 8}},
        "gpus_per_replica": gpus_per_node,
        "strong_global_batch": 16,
        "weak_grad_accum": 2,
    }
    experiment = {
        "benchmark": "language",
        "engine": "megatron",
        "models": {"tiny": tiny},
        "scaling": ["strong"],
        "precision": ["bf16"],
        "seq_length": 64,
        "micro_batch": 1,
        "iterations": 3,
        "warmup_iterations": 1,
        "max_nodes": {cluster: 2},
    }
    return yaml.safe_dump({"benchmarks": {"experiments": {"hold_language": experiment}}})


@pytest.mark.workflow
@pytest.mark.parametrize("cluster", ["juwels", "lumi"])
def test_the_plan_of_a_cluster_profile_asks_one_node_for_a_point_that_will_be_held(
    workdir, cluster
):
    """Dry runs with the cluster's profile, the site checked (image, probe and canary
    made), after the 1-node point failed with an NCCL error: the 2-node point's job is
    planned on one node for the held job's minutes, priced so, and the plan says it;
    with the failed point rerun first, the point is planned on its two nodes."""
    from hpcllm.clusters import load_cluster

    gpus = load_cluster(cluster, REPO / "config" / "clusters").gpus_per_node
    (workdir / "sweep.yaml").write_text(held_sweep(gpus, cluster))
    env = {"HPCLLM_ACCOUNT": "myproject"}
    small, large = (point_id("hold_language", "tiny", "strong", "bf16", n) for n in (1, 2))
    summary = "results/bench/summary.csv"
    args = ("-n", "--profile", f"profiles/{cluster}", "--configfile", "sweep.yaml")

    def dry_run(*more: str) -> str:
        proc = run_snakemake(workdir, *args, *more, "--", summary, examples=False, env=env)
        return proc.stdout + proc.stderr

    # the site's checks done, in order: what the plan makes before the points
    out = dry_run()
    when = time.time() - 100
    for rule in ("build_container", "site_probe", "canary"):
        for path in re.findall(rf"rule {rule}:\n(?:.*\n)*?\s+output: (\S+)", out):
            target = workdir / path.rstrip(",")
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_text('{"status": "ok", "nodes": 2}\n')
            when += 10
            os.utime(target, (when, when))
    folder = workdir / "results/bench/language" / small
    folder.mkdir(parents=True)
    (folder / "run.log").write_text("NCCL error\n")
    (folder / "run.json").write_text(json.dumps({"id": small, "status": "nccl_error"}))
    timings = workdir / f"results/timings/bench_language/{small}.tsv"
    timings.parent.mkdir(parents=True)
    timings.write_text("s\n1.0\n")

    out = dry_run()
    assert planned(out) == {"bench_language": 1, "aggregate_benchmarks": 1}, out[-3000:]
    assert (
        f"{large} will be held ({small}, 1 node, failed with nccl_error): its job "
        f"asks for 1 node for {hold.HELD_JOB_MINUTES} min, not 2 nodes" in out
    ), out[-3000:]
    resources = re.search(rf"wildcards: point={re.escape(large)}\n\s+resources: (.*)", out)
    assert ", nodes=1, " in resources[1] and ", tasks=1, " in resources[1], resources[1]
    assert f", runtime={hold.HELD_JOB_MINUTES}," in resources[1] + ",", resources[1]
    priced = (
        hold.HELD_JOB_MINUTES
        / 60
        * load_cluster(cluster, REPO / "config" / "clusters").billed_gpus_per_node
    )
    assert f"bench_language: 1 job(s), 0.2 node-hours, {priced:.1f} GPU-hours" in out

    out = dry_run("--forcerun", f"results/bench/language/{small}/run.json")
    assert planned(out)["bench_language"] == 2, out[-3000:]
    assert "will be held" not in out
    resources = re.search(rf"wildcards: point={re.escape(large)}\n\s+resources: (.*)", out)
    assert ", nodes=2, " in resources[1] and ", tasks=2, " in resources[1], resources[1]
