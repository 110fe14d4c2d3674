"""Hangs and stragglers through real sbatch (issue 50): a rank stuck in its save or its
data loading, and a slowed rank, on a test cluster of three nodes (two for the job, one
to move to), with the engine's test-only fault hook bound to node n2
(hpcllm.training.engines.fault_injection: the fault stays behind when a job excludes n2,
as a faulty node's would), and a rank frozen by SIGSTOP.

The experiment is test_training.py's ``tiny_2n`` (2 segments of 40 iterations on 2
nodes). Segment 1 is trained once for both hang scenarios (their faults come in segment
2); segment 2 trained after it without a fault is the reference the faulted campaigns
reproduce bit for bit (test_training.py's uninterrupted run would cost a whole campaign
on another cluster more). The
last test runs the straggler through a chain of our own jobs (training.chain).
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import re
import signal
import tempfile
import time
from pathlib import Path

import pytest
import slurmruns
import test_training
import testcluster
import torch
from support import EXAMPLES, hang_guard
from test_training import (
    CONFIG,
    EXPERIMENT,
    FINAL,
    SAVE,
    SEG1,
    WATCHDOG,
    chain_campaign,
    final_weights,
    index_cache,
    training_workdir,
    wait_for_engine,
    with_watchdog_facts,
)

from hpcllm.training.campaign import attempts
from hpcllm.training.engines.fault_injection import FAULT_ENV

# one worker for the module: its cluster, segment 1 and the reference are made once
pytestmark = [pytest.mark.slurm, pytest.mark.xdist_group("hangs")]

# test_training.py's tokenized text (made with the local profile: seconds once cached)
text_data = test_training.text_data

FAULTY = "n2"  # Slurm gives a 2-node job the first idle nodes: n1 and n2
LOGS = f"logs/train_segment/{EXPERIMENT}"
POLL = 5.0  # how often the segment asks its watchdog (engine_process.run_launch's poll_s)
# A rank slowed by 0.3 s per step against a tiny model's compute of a few hundredths: with
# two ranks the slower one is just under 2 x their median (the median of two is their
# mean: 1.89 x measured); without the sleep one rank would need 3 x the other's compute to
# pass 1.5 x (testcluster.yaml's own factor, 1000, stays for the hang scenarios).
STRAGGLER_FACTOR = 1.5


@pytest.fixture(scope="module")
def three_nodes():
    """A test cluster of three nodes, for this module's tests (a short folder for
    slurmstepd's sockets, as test_rehearsal_hold.py's)."""
    reason = testcluster.missing_requirements()
    if reason:
        pytest.skip(reason)
    with (
        tempfile.TemporaryDirectory(prefix="hpcllm-tc-") as root,
        testcluster.running(Path(root), nodes=testcluster.node_names(3)) as cluster,
    ):
        yield cluster


@pytest.fixture
def cluster3(three_nodes):
    three_nodes.restore()
    return three_nodes


def retries(work: Path) -> Path:
    path = work / "retries.yaml"
    path.write_text("training: {max_attempts: 2}\n")
    return path


@pytest.fixture(scope="module")
def segment_one(three_nodes, text_data, tmp_path_factory) -> Path:
    """tiny_2n's segment 1 trained on the three-node cluster, with the watchdog's small
    test facts: it measures the iteration and the save, so segment 2's bounds are the
    floor (15 s)."""
    three_nodes.restore()
    work = training_workdir(text_data, tmp_path_factory.mktemp("slurm-hang") / "work")
    with_watchdog_facts(work)
    slurmruns.run(work, three_nodes, "--configfile", str(CONFIG), str(retries(work)), "--",
                  SEG1, timeout=hang_guard(150))  # fmt: skip
    return work


@pytest.fixture(scope="module")
def reference(segment_one, three_nodes, tmp_path_factory) -> dict[str, torch.Tensor]:
    """The final weights of tiny_2n trained without a fault: segment_one's segment 1,
    then segment 2."""
    three_nodes.restore()
    work = training_workdir(segment_one, tmp_path_factory.mktemp("slurm-reference") / "work")
    slurmruns.run(work, three_nodes, "--configfile", str(CONFIG), str(retries(work)), "--",
                  FINAL, timeout=hang_guard(150))  # fmt: skip
    return final_weights(work)


def finish(work: Path, cluster, *args: str, fault: str, timeout: float) -> None:
    """Snakemake run to its end with the test fault ``fault`` in its jobs' environment
    (sbatch exports it); fails with its output."""
    proc = slurmruns.start(work, cluster, *args, log=work / "snakemake.out",
                           env={FAULT_ENV: fault})  # fmt: skip
    try:
        returncode = proc.wait(timeout=timeout)
    finally:
        if proc.poll() is None:
            proc.kill()
    output = (work / "snakemake.out").read_text()
    assert returncode == 0, output[-5000:] + cluster.log_tail()


def job_fields(cluster, job_id: str) -> dict[str, str]:
    """Slurm's own view of a job (scontrol: this cluster has no accounting database; its
    MinJobAge keeps a finished job listed)."""
    out = cluster.run("scontrol", "-o", "show", "job", job_id)
    return dict(re.findall(r"(\w+)=(\S*)", out))


def seconds(text: str) -> int:
    """Slurm's [days-]hours:minutes:seconds."""
    days, _, rest = text.rpartition("-")
    parts = [int(x) for x in rest.split(":")]
    while len(parts) < 3:
        parts.insert(0, 0)
    return int(days or 0) * 86400 + parts[0] * 3600 + parts[1] * 60 + parts[2]


def nodes_of(cluster, job: dict[str, str]) -> list[str]:
    return cluster.run("scontrol", "show", "hostnames", job["NodeList"]).split()


def ended_within_a_quarter(job: dict[str, str]) -> float:
    """The job's run time as a share of its time limit, asserted below a quarter."""
    share = seconds(job["RunTime"]) / seconds(job["TimeLimit"])
    assert share < 0.25, job
    return share


@pytest.mark.parametrize(
    "kind, phase, iteration",
    [("save", "save", 50), ("data", "data", 43)],
    ids=["stuck_save", "stuck_data_loader"],
)
def test_a_rank_stuck_in_its_save_or_data_ends_as_a_hang_and_the_retry_avoids_its_node(
    kind, phase, iteration, segment_one, reference, cluster3, tmp_path, capsys
):
    """Segment 2's ranks on n2 block forever in their save (at iteration 50, the first
    past 42) or their data loading (iteration 43); their heartbeat threads write on, so
    every rank is alive and the other waits for them. The watchdog ends the job at its
    bound (15 s), the attempt records ``hang`` naming the rank on n2 first and what it
    was doing, Slurm's retry job carries ``--exclude=n2`` (its ExcNodeList) and runs on
    n1 and n3, and the campaign ends bitwise equal to the uninterrupted one."""
    from hpcllm.training.campaign.status import campaign_status

    work = training_workdir(segment_one, tmp_path / "work")
    finish(work, cluster3, "--configfile", str(CONFIG), str(retries(work)), "--", FINAL,
           fault=f"{kind}:{FAULTY}:42", timeout=hang_guard(240))  # fmt: skip
    assert len(json.loads((work / LOGS / "seg1.attempts.json").read_text())) == 1  # not rerun
    first, second = json.loads((work / LOGS / "seg2.attempts.json").read_text())
    assert first["failure"] == "hang", first
    hang = first["hang"]
    suspect = attempts.suspect(hang)
    assert (suspect["host"], suspect["phase"], suspect["iteration"]) == (FAULTY, phase, iteration)
    assert hang["stopped"] == [] and not suspect["stopped"]  # alive: no progress only
    assert (
        f"on {FAULTY} (pid {suspect['pid']}, in '{phase}' at iteration {iteration}"
        in (first["message"])
    ), first["message"]
    assert hang["bound_seconds"] == 15
    assert 15 <= hang["quiet_seconds"] <= 15 + 2 * POLL, hang  # noticed within a poll
    # Slurm's view: the hung job ran on n2 and ended within a quarter of its limit; the
    # retry was submitted with --exclude=n2 and ran elsewhere
    hung = job_fields(cluster3, first["job_id"])
    retry = job_fields(cluster3, second["job_id"])
    assert FAULTY in nodes_of(cluster3, hung), hung
    assert retry["ExcNodeList"] == FAULTY and FAULTY not in nodes_of(cluster3, retry), retry
    assert second["failure"] is None and second["excluded"] == [FAULTY], second
    share = ended_within_a_quarter(hung)
    shown = campaign_status(work, [str(EXAMPLES), str(CONFIG)], "profiles/testcluster")
    assert (
        f"{FAULTY} (hang in segment 2, rank {suspect['rank']} in '{phase}' at iteration "
        f"{iteration})" in shown
    ), shown
    resumed = final_weights(work)
    assert all(torch.equal(resumed[k], reference[k]) for k in reference)
    with capsys.disabled():
        print(
            f"\nstuck {kind}: job {first['job_id']} ended after {seconds(hung['RunTime'])} s "
            f"of its {seconds(hung['TimeLimit'])} s limit ({share:.1%}); quiet "
            f"{hang['quiet_seconds']} s against the bound {hang['bound_seconds']} s"
        )


def test_a_frozen_rank_ends_its_segment_as_a_hang_and_the_retry_avoids_its_node(
    segment_one, reference, cluster3, tmp_path, capsys
):
    """Rank 1 of segment 2 SIGSTOPped once it trains (through real sbatch, srun and
    torchrun on two of the three nodes): the segment's watchdog ends the launch at its
    bound (segment 1 measured the iterations: the floor), the job fails as ``hang`` naming
    rank 1 and its node, Snakemake's second attempt runs with ``--exclude`` of that node
    (recorded in its attempt), resumes, and the campaign ends bitwise equal to the
    uninterrupted one."""
    work = training_workdir(segment_one, tmp_path / "work")
    hearts = work / f"{LOGS}/seg2.heartbeats"
    frozen: dict = {}
    proc = slurmruns.start(work, cluster3, "--configfile", str(CONFIG), str(retries(work)),
                           "--", FINAL, log=work / "snakemake.out")  # fmt: skip
    try:
        job_id = wait_for_engine(cluster3, proc, work, segment=2, timeout=hang_guard(180))
        deadline = time.monotonic() + hang_guard(30)
        while not frozen:
            assert time.monotonic() < deadline, list(hearts.glob("*"))
            with contextlib.suppress(OSError, ValueError):
                beat = json.loads((hearts / "rank1.json").read_text())
                if beat["phase"] in ("data", "step", "sync") and beat["iteration"] > 42:
                    os.kill(beat["pid"], signal.SIGSTOP)
                    frozen = {**beat, "at": time.monotonic()}
            time.sleep(0.05)
        # the bound (15 s), a check (5 s), SIGTERM to SIGKILL (10 s); then the retry
        returncode = proc.wait(timeout=hang_guard(120))
    finally:
        if proc.poll() is None:
            proc.kill()
        if frozen:
            with contextlib.suppress(ProcessLookupError):
                os.kill(frozen["pid"], signal.SIGKILL)
    assert returncode == 0, (work / "snakemake.out").read_text()[-5000:]
    first, second = json.loads((work / LOGS / "seg2.attempts.json").read_text())
    # the retry: asked to avoid the frozen rank's node, and Slurm ran it on the others
    hung, retry = job_fields(cluster3, job_id), job_fields(cluster3, second["job_id"])
    assert second["failure"] is None and second["excluded"] == [frozen["host"]], second
    assert frozen["host"] in nodes_of(cluster3, hung), hung
    assert retry["ExcNodeList"] == frozen["host"], retry
    assert frozen["host"] not in nodes_of(cluster3, retry), retry
    assert (first["job_id"], first["failure"]) == (job_id, "hang"), first
    stopped = first["hang"]["stopped"][0]
    assert (stopped["rank"], stopped["host"], stopped["pid"]) == (1, frozen["host"], frozen["pid"])
    assert frozen["host"] in ("n1", "n2", "n3")  # Slurm's node name, not the shared host's
    assert first["hang"]["bound_seconds"] == 15
    assert f"rank 1 on {frozen['host']}" in first["message"]
    share = ended_within_a_quarter(hung)
    resumed = final_weights(work)
    assert all(torch.equal(resumed[k], reference[k]) for k in reference)
    with capsys.disabled():
        print(
            f"\nfrozen rank: job {job_id} ended after {seconds(hung['RunTime'])} s of its "
            f"{seconds(hung['TimeLimit'])} s limit ({share:.1%})"
        )


def test_a_straggler_is_named_in_status_and_the_next_segment_avoids_its_node(
    reference, cluster3, text_data, tmp_path, capsys
):
    """Segment 1's rank on n2 sleeps 0.3 s in every step's compute: its record names n2
    as the slowest node beyond the cluster's factor, status names it with its factor, and
    segment 2's job carries ``--exclude=n2`` (Slurm's ExcNodeList) and runs on n1 and n3;
    the campaign ends as the uninterrupted one (the sleep changes no number)."""
    from hpcllm.training.campaign.status import campaign_status

    work = training_workdir(text_data, tmp_path / "work")
    with_watchdog_facts(work)
    facts = work / "config/clusters/testcluster.yaml"
    text = facts.read_text()
    assert "straggler_factor: 1000}" in WATCHDOG and WATCHDOG in text
    facts.write_text(
        text.replace("straggler_factor: 1000}", f"straggler_factor: {STRAGGLER_FACTOR}}}")
    )
    finish(work, cluster3, "--configfile", str(CONFIG), "--", FINAL,
           fault=f"slow:{FAULTY}:0:0.3", timeout=hang_guard(240))  # fmt: skip
    record = json.loads((work / SEG1).read_text())
    found = record["stragglers"]
    assert found["slowest"]["host"] == FAULTY and found["beyond"], found
    factor = found["slowest"]["factor"]
    assert factor > STRAGGLER_FACTOR, found
    first, second = (
        json.loads((work / LOGS / f"seg{k}.attempts.json").read_text())[-1] for k in (1, 2)
    )
    slowed = job_fields(cluster3, first["job_id"])
    following = job_fields(cluster3, second["job_id"])
    assert FAULTY in nodes_of(cluster3, slowed), slowed
    assert following["ExcNodeList"] == FAULTY, following
    assert FAULTY not in nodes_of(cluster3, following), following
    assert second["excluded"] == [FAULTY], second
    share = ended_within_a_quarter(slowed)
    shown = campaign_status(work, [str(EXAMPLES), str(CONFIG)], "profiles/testcluster")
    assert f"{FAULTY} (straggler in segment 1, {factor:.2f} x the median)" in shown, shown
    resumed = final_weights(work)
    assert all(torch.equal(resumed[k], reference[k]) for k in reference)
    with capsys.disabled():
        print(
            f"\nstraggler: job {first['job_id']} ran {seconds(slowed['RunTime'])} s of its "
            f"{seconds(slowed['TimeLimit'])} s limit ({share:.1%}); {FAULTY} at {factor:.2f} x "
            f"the median, excluded by job {second['job_id']}"
        )


def test_a_chain_job_keeps_its_successor_off_the_straggler_node(
    cluster3, text_data, tmp_path, monkeypatch, capsys
):
    """The campaign as a chain of our own jobs (training.chain), no Snakemake: segment
    1's rank on n2 slowed. Job 1 submitted its successor before it trained; once its
    record named n2 beyond the factor, it has Slurm keep the successor off n2 (scontrol
    update: the successor's ExcNodeList), which runs on n1 and n3 and records that."""
    from hpcllm.training.campaign import chain

    work = training_workdir(text_data, tmp_path / "work")
    index_cache(work)
    campaign = chain_campaign(work, cluster3, monkeypatch)
    facts = dataclasses.replace(campaign.cluster.watchdog, straggler_factor=STRAGGLER_FACTOR)
    campaign.cluster = dataclasses.replace(campaign.cluster, watchdog=facts)
    campaign.environment[FAULT_ENV] = f"slow:{FAULTY}:0:0.3"
    state, _ = chain.ensure(campaign)
    assert state == "submitted"
    deadline = time.monotonic() + hang_guard(150)  # 2 segments of 40 iterations
    while chain.next_segment(campaign) is not None or chain.chain_jobs(campaign.job_name()):
        assert time.monotonic() < deadline, cluster3.jobs()
        time.sleep(0.5)
    first, second, *_ = chain.submitted_jobs(work / SAVE)
    assert second["after"] == first["job"]
    found = json.loads((work / SEG1).read_text())["stragglers"]
    assert found["slowest"]["host"] == FAULTY and found["beyond"], found
    slowed, following = (job_fields(cluster3, j["job"]) for j in (first, second))
    assert FAULTY in nodes_of(cluster3, slowed), slowed
    assert following["ExcNodeList"] == FAULTY, following
    assert FAULTY not in nodes_of(cluster3, following), following
    (entry,) = json.loads((work / LOGS / "seg2.attempts.json").read_text())
    assert (entry["job_id"], entry["failure"], entry["excluded"]) == (second["job"], None, [FAULTY])
    assert chain.stopped(work / SAVE) is None
    with capsys.disabled():
        print(
            f"\nchain: job {first['job']} ran segment 1 on {slowed['NodeList']} ({FAULTY} at "
            f"{found['slowest']['factor']:.2f} x the median); job {second['job']} kept off "
            f"{following['ExcNodeList']}, ran on {following['NodeList']}"
        )
