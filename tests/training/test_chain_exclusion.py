"""A chain job keeps its successor off the nodes its segment found suspect, as the
train_segment rule's slurm_extra does for Snakemake's jobs: the straggler its record
names (the next segment), the node of a hung rank (the retry). The successor was
submitted before the segment ran (or up front), so the job tells Slurm afterwards:
``scontrol update JobId=<successor> ExcNodeList=...`` (stand-in Slurm commands here)."""

from __future__ import annotations

import dataclasses
import json
import logging

import pytest
from test_chain import fake_slurm, three_segments

from hpcllm.training.campaign import attempts, chain
from hpcllm.training.campaign.segment import SegmentIncomplete


def chain_slurm(tmp_path, monkeypatch, excluded: str = "(null)", refuse: bool = False):
    """sbatch answering job 62; scontrol: job 61's ExcNodeList is ``excluded``, hostnames
    expanded one per line, updates logged (or refused); scancel logged."""
    calls = tmp_path / "calls"
    update = (
        'echo "scontrol $*" >> '
        + str(calls)
        + ("; echo 'Access/permission denied' >&2; exit 1" if refuse else "")
    )
    return fake_slurm(
        tmp_path,
        monkeypatch,
        sbatch=f'echo sbatch "$@" >> {calls}\necho 62',
        squeue="true",
        scancel=f'echo scancel "$@" >> {calls}',
        scontrol=(
            'case "$*" in\n'
            f'  "show job 61") echo "JobId=61 JobName=x ExcNodeList={excluded} NodeList=n1";;\n'
            '  "show hostnames n[2-3]") printf "n2\\nn3\\n";;\n'
            f"  update*) {update};;\n"
            "esac"
        ),
    )


def trains(campaign, reached: int, straggler: str | None = None, seen: dict | None = None):
    """A stand-in run_segment: commits ``reached`` and writes the segment's record (with
    ``straggler`` beyond the factor); keeps what it was called with in ``seen``."""

    def run_segment(name, prepared, segment, paths, cluster, **kw):
        if seen is not None:
            seen.update(kw, segment=segment)
        record = {"segment": segment}
        if straggler:
            record["stragglers"] = {"beyond": True, "threshold": 1.2, "ranks": 4,
                                    "median_compute_seconds": 0.1,
                                    "slowest": {"rank": 1, "host": straggler,
                                                "compute_seconds": 0.2, "factor": 2.0}}  # fmt: skip
        out = campaign.folder().parent.parent.parent / paths.record
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps(record))
        (campaign.folder().parent / "latest_checkpointed_iteration.txt").write_text(str(reached))
        return record

    return run_segment


def hangs(campaign, host: str):
    """A stand-in run_segment whose attempt the watchdog ended, its rank on ``host``
    stuck in its save while the others waited."""

    def run_segment(name, prepared, segment, paths, cluster, attempt=1, **kw):
        path = attempts.attempts_path(campaign.folder().parent.parent.parent / paths.engine_log)
        path.parent.mkdir(parents=True, exist_ok=True)
        entry = attempts.record_start(path, attempt, 4, environ={"SLURM_JOB_ID": "61"})
        hang = {"stopped": [], "phase": "save", "bound_seconds": 15, "quiet_seconds": 16,
                "waiting": [{"rank": 1, "host": host, "pid": 9, "phase": "save",
                             "iteration": 6}]}  # fmt: skip
        attempts.record_end(path, entry, 4, "hang", "hung", logged=6, hang=hang)
        raise SegmentIncomplete("segment 2 hung", "hang", hang)

    return run_segment


def updates(calls) -> list[str]:
    return [x for x in calls.read_text().splitlines() if x.startswith("scontrol update")]


def test_a_straggler_in_a_chain_jobs_segment_is_kept_off_its_successor(tmp_path, monkeypatch):
    """Segment 2 trained with n2 beyond the factor: job 61's successor (62, submitted
    before segment 2 ran) is told to avoid n2, with the campaign's own exclusion kept."""
    monkeypatch.chdir(tmp_path)
    calls = chain_slurm(tmp_path, monkeypatch)
    campaign = dataclasses.replace(
        three_segments(tmp_path, reached=4), sbatch=["-p", "batch", "--exclude=n7"]
    )
    chain.save(campaign)
    seen: dict = {}
    monkeypatch.setattr("hpcllm.training.campaign.segment.run_segment",
                        trains(campaign, 8, straggler="n2", seen=seen))  # fmt: skip
    assert chain.step(campaign.file(), environ={"SLURM_JOB_ID": "61"}) == 0
    assert seen["segment"] == 2 and seen["excluded"] is None  # job 61 was told none
    assert updates(calls) == ["scontrol update JobId=62 ExcNodeList=n7,n2"]
    assert chain.nodes_to_avoid(campaign, 3) == ["n7", "n2"]


def test_nothing_suspect_changes_no_job_and_the_last_segment_cancels_instead(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    calls = chain_slurm(tmp_path, monkeypatch)
    campaign = three_segments(tmp_path, reached=4)
    chain.save(campaign)
    monkeypatch.setattr("hpcllm.training.campaign.segment.run_segment", trains(campaign, 8))
    assert chain.step(campaign.file(), environ={"SLURM_JOB_ID": "61"}) == 0
    assert updates(calls) == []
    # the last segment with a straggler: the campaign is complete, the successor cancelled
    (tmp_path / "calls").unlink()
    monkeypatch.setattr("hpcllm.training.campaign.segment.run_segment",
                        trains(campaign, 12, straggler="n2"))  # fmt: skip
    assert chain.step(campaign.file(), environ={"SLURM_JOB_ID": "61"}) == 0
    assert updates(calls) == [] and "scancel 62" in calls.read_text()


def test_a_hang_in_a_chain_submitted_up_front_keeps_the_next_job_off_the_stuck_node(
    tmp_path, monkeypatch
):
    """Up front, job 61's next job (72) retries segment 2: it is told to avoid n3, where
    the rank stuck in its save ran; job 61 ends with status 0 so that 72 runs."""
    monkeypatch.chdir(tmp_path)
    calls = chain_slurm(tmp_path, monkeypatch)
    campaign = dataclasses.replace(
        three_segments(tmp_path, reached=4), up_front=True, chain_id="c1", started=1.0
    )
    chain.save(campaign)
    jobs = campaign.folder() / chain.JOBS
    jobs.write_text("".join(json.dumps({"job": j, "after": a, "chain": "c1"}) + "\n"
                            for j, a in (("61", None), ("72", "61"), ("73", "72"))))  # fmt: skip
    monkeypatch.setattr("hpcllm.training.campaign.segment.run_segment", hangs(campaign, "n3"))
    assert chain.step(campaign.file(), environ={"SLURM_JOB_ID": "61"}) == 0
    assert updates(calls) == ["scontrol update JobId=72 ExcNodeList=n3"]
    assert "sbatch" not in calls.read_text()  # up front: no job submits another


def test_a_refused_update_is_logged_and_the_chain_goes_on(tmp_path, monkeypatch, caplog):
    monkeypatch.chdir(tmp_path)
    calls = chain_slurm(tmp_path, monkeypatch, refuse=True)
    campaign = three_segments(tmp_path, reached=4)
    chain.save(campaign)
    monkeypatch.setattr("hpcllm.training.campaign.segment.run_segment",
                        trains(campaign, 8, straggler="n2"))  # fmt: skip
    with caplog.at_level(logging.WARNING):
        assert chain.step(campaign.file(), environ={"SLURM_JOB_ID": "61"}) == 0
    assert len(updates(calls)) == 1
    assert "job 62 (segment 3) could not be kept off n2: `scontrol update JobId=62 " \
        "ExcNodeList=n2` failed (Access/permission denied)" in caplog.text  # fmt: skip


@pytest.mark.parametrize("listed, expected", [("n[2-3]", ["n2", "n3"]), ("(null)", None)])
def test_a_chain_job_records_the_nodes_slurm_keeps_it_off(tmp_path, monkeypatch, listed, expected):
    """What the attempt records is Slurm's ExcNodeList of its own job, not a guess."""
    monkeypatch.chdir(tmp_path)
    chain_slurm(tmp_path, monkeypatch, excluded=listed)
    assert chain.own_exclusion("61") == expected
    assert chain.own_exclusion(None) is None
