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
