"""Stragglers from heartbeats the test writes: the slowest rank against the median, its
factor, the verdict against the cluster's factor, the status line and the next segment's
exclusion."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from hpcllm.clusters import ClusterError, WatchdogFacts, load_cluster
from hpcllm.training.campaign import stragglers
from hpcllm.training.campaign.status import newest_straggler
from hpcllm.training.engines.heartbeat import Heartbeat, read_heartbeats

REPO = Path(__file__).resolve().parents[2]


def beats(*computes: float | None) -> dict[int, dict]:
    return {
        r: {"rank": r, "host": f"n{r // 2}", **({"compute_seconds": c} if c else {})}
        for r, c in enumerate(computes)
    }


def test_the_slowest_rank_is_named_against_the_median_with_its_factor():
    found = stragglers.assess(beats(1.0, 1.02, 0.98, 1.0, 1.5, 1.01, 0.99, 1.0), 1.2)
    assert found["median_compute_seconds"] == 1.0
    assert found["slowest"] == {"rank": 4, "host": "n2", "compute_seconds": 1.5, "factor": 1.5}
    assert found["beyond"] and found["ranks"] == 8
    line = stragglers.describe(found)
    assert line == (
        "slowest node: n2 (rank 4) computes 1.5 s per iteration, 1.50 x the median 1 s of 8 "
        "ranks (beyond 1.2: excluded from the next segment)"
    )


def test_healthy_spread_stays_within_the_factor():
    found = stragglers.assess(beats(1.0, 1.05, 0.97, 1.1), 1.2)
    assert not found["beyond"] and found["slowest"]["rank"] == 3
    assert "within 1.2" in stragglers.describe(found)
    assert stragglers.assess(beats(1.0), 1.2) is None  # one rank: nothing to compare
    assert stragglers.assess(beats(None, None), 1.2) is None  # none measured yet


def test_a_site_states_its_factor(tmp_path):
    assert WatchdogFacts().straggler_factor == 1.2
    text = (REPO / "config/clusters/local.yaml").read_text()
    (tmp_path / "s.yaml").write_text(text + "watchdog: {straggler_factor: 1.5}\n")
    assert load_cluster("s", tmp_path).watchdog.straggler_factor == 1.5
    (tmp_path / "t.yaml").write_text(text + "watchdog: {straggler_factor: 0.9}\n")
    with pytest.raises(ClusterError, match="straggler_factor"):  # below 1: every node
        load_cluster("t", tmp_path)


@pytest.mark.parametrize("beyond", [True, False])
def test_the_next_segment_excludes_a_straggler_beyond_the_factor(tmp_path, beyond):
    found = stragglers.assess(beats(1.0, 1.0, 1.0, 1.5 if beyond else 1.1), 1.2)
    record = tmp_path / "results/train/e/seg1.json"
    record.parent.mkdir(parents=True)
    record.write_text(json.dumps({"segment": 1, "stragglers": found}))
    assert stragglers.nodes_to_exclude(record) == (["n1"] if beyond else [])
    assert stragglers.nodes_to_exclude(tmp_path / "missing.json") == []
    line = newest_straggler(record.parent)
    assert line.startswith("segment 1: slowest node: n1 (rank 3)"), line


def test_the_heartbeat_carries_the_compute_time_through_phase_changes(tmp_path):
    beat = Heartbeat(tmp_path, 0, every=60, host="n0").start()
    try:
        beat.progress("step", 1)
        beat.compute(0.25)
        beat.progress("sync", 1)
        beat.progress("data", 2)  # later phases keep it
        assert read_heartbeats(tmp_path)[0]["compute_seconds"] == 0.25
    finally:
        beat.stop()


@pytest.mark.workflow
def test_the_next_segments_job_excludes_the_straggler_node(tmp_path):
    """Through the workflow: a dry run on JUWELS' profile plans segment 2 of an experiment
    whose segment 1 record names a straggler beyond the factor with ``--exclude`` of its
    node in the job's slurm_extra; segment 1's job (none before it) excludes nothing."""
    import os
    import re
    import stat

    from support import hang_guard, make_workdir, run_snakemake

    work = make_workdir(tmp_path / "w")
    found = stragglers.assess(
        {0: {"host": "jwb0001", "compute_seconds": 1.0}, 1: {"host": "jwb0002",
             "compute_seconds": 1.0}, 2: {"host": "jwb0007", "compute_seconds": 1.6}},
        1.2,
    )  # fmt: skip
    record = work / "results/train/opengptx_800m/seg1.json"
    record.parent.mkdir(parents=True)
    record.write_text(json.dumps({"segment": 1, "stragglers": found}))
    bin_dir = tmp_path / "noslurm"  # no Slurm here: every command fails as if not installed
    bin_dir.mkdir()
    for tool in ("sbatch", "srun", "squeue", "sinfo", "sacct", "sacctmgr", "scontrol"):
        (bin_dir / tool).write_text(f"#!/bin/sh\necho '{tool}: not installed' >&2\nexit 127\n")
        (bin_dir / tool).chmod(stat.S_IRWXU)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("HPCLLM_", "SLURM_"))}
    env.update(PATH=f"{bin_dir}:{env['PATH']}", HPCLLM_ACCOUNT="proj0042")
    args = ["-n", "--profile", "profiles/juwels", "--configfile",
            "config/experiments/opengptx_800m.yaml", str(REPO / "tests/data/opengptx_on_samples.yaml")]  # fmt: skip
    proc = run_snakemake(work, *args, env=env, timeout=hang_guard(30))
    out = proc.stdout + proc.stderr
    extras = {}
    for block in re.split(r"\n(?=\s*(?:local)?rule \w+:)", out):
        k = re.search(r"wildcards: experiment=opengptx_800m, k=(\d+)", block)
        extra = re.search(r"slurm_extra=(.*?)(?:, \w+=|$)", block, re.M)
        if block.lstrip().startswith("rule train_segment:") and k and extra:
            extras[int(k.group(1))] = extra.group(1)
    assert 1 in extras and 2 in extras, out[-3000:]
    assert "--exclude=jwb0007" in extras[2], extras[2]
    assert "--exclude" not in extras[1], extras[1]
