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
from support import planned, run_snakemake

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
