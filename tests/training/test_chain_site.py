"""Whether a campaign runs as a chain, and how its jobs are submitted (hpcllm.training.
chain_site): the site probe's answer, else the cluster fact; the plan's line for each case.
The chain submitted up front runs on the test cluster (tests/slurm/test_training.py)."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

import pytest

from hpcllm.clusters import load_cluster
from hpcllm.training.campaign.chain_site import (
    SiteAnswer,
    chained,
    plan_note,
    probe_record_path,
    site_answer,
    up_front,
)

ROOT = Path(__file__).resolve().parents[2] / "config" / "clusters"


def test_the_probe_record_is_where_the_preflight_rule_writes_it():
    juwels = load_cluster("juwels", root=ROOT)
    assert probe_record_path(juwels, "containers/megatron-nvidia.sif") == (
        "results/preflight/juwels/probe/megatron-nvidia.json"
    )
    assert probe_record_path(juwels, None) == "results/preflight/juwels/probe/bare.json"


def test_the_probes_answer_wins_over_the_cluster_fact(tmp_path):
    record = tmp_path / "probe.json"
    cluster = SimpleNamespace(slurm_from_compute_nodes=True, path="config/clusters/x.yaml")
    assert site_answer(cluster, record) == SiteAnswer(True, "config/clusters/x.yaml: "
                                                      "slurm_from_compute_nodes")  # fmt: skip
    record.write_text(json.dumps({"slurm_from_compute_node": False, "job_id": "12",
                                  "date": "2026-11-26T01:00:00Z"}))  # fmt: skip
    answer = site_answer(cluster, record)
    assert answer.allowed is False
    assert answer.source == f"the site probe, job 12 of 2026-11-26T01:00:00Z ({record})"
    # a record of before the question (no answer in it) and a damaged one: the fact
    record.write_text(json.dumps({"job_id": "9"}))
    assert site_answer(cluster, record).allowed is True
    record.write_text("{")
    assert site_answer(cluster, record).allowed is True
    assert site_answer(SimpleNamespace(), record).allowed is None


def test_no_site_file_here_claims_to_know():
    """No site document we have says whether compute nodes may call sbatch: every cluster
    file leaves the fact unset, so the probe decides."""
    from hpcllm.clusters import known_clusters

    names = known_clusters(ROOT)
    assert "juwels" in names and "lumi" in names, names
    assert [
        n for n in names if load_cluster(n, root=ROOT).slurm_from_compute_nodes is not None
    ] == []


YES, NO, UNKNOWN = SiteAnswer(True, "probe"), SiteAnswer(False, "probe"), SiteAnswer(None, "?")


@pytest.mark.parametrize(
    "setting,answer,probed,is_chained,is_up_front,words",
    [
        (None, YES, True, True, False, "a chain of Slurm jobs by default, each submitting"),
        (None, NO, True, True, True, "submitted up front from the login node by default "
                                     "(compute nodes may not call sbatch: probe); "
                                     "training.chain: false submits one job per segment"),
        # a site's first run: the probe of this run answers before the first segment
        (None, UNKNOWN, True, True, False, "runs as a chain of Slurm jobs by default, in "
                                           "Slurm without the login node. Whether compute "
                                           "nodes may call sbatch is not known yet: the site "
                                           "probe, run before the first segment, finds out"),
        # no probe (no GPUs) and no fact: nothing tells how to submit the chain
        (None, UNKNOWN, False, False, False, "one Slurm job per segment (training.chain "
                                             "unset): whether compute nodes may call sbatch "
                                             "is not known (the cluster file sets no "
                                             "slurm_from_compute_nodes"),
        (None, YES, False, True, False, "by default, each submitting its successor"),
        (None, NO, False, True, True, "up front from the login node by default"),
        (True, YES, True, True, False, "runs as a chain of Slurm jobs, each submitting"),
        (True, NO, True, True, True, "submitted up front from the login node (compute nodes "
                                     "may not"),
        (True, UNKNOWN, False, True, False, "the site probe, run before the first segment, "
                                            "finds out"),
        (False, YES, True, False, False, "one Slurm job per segment (training.chain: false)"),
        (False, UNKNOWN, True, False, False, "one Slurm job per segment (training.chain: false)"),
    ],
)  # fmt: skip
def test_chain_or_not_and_how(setting, answer, probed, is_chained, is_up_front, words):
    assert chained(setting, answer, probed) is is_chained
    assert up_front(answer) is is_up_front
    assert words in plan_note(setting, answer, probed)
