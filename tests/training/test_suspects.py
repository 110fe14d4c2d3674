"""Suspect nodes: every node a hang or a straggler had excluded, and a node excluded
twice reported for the site's admins, in status and in the segment's record."""

from __future__ import annotations

import json
import time

from test_status import campaign

from hpcllm.training.campaign import suspects


def hang_attempt(attempt: int, job: str, host: str, phase: str, iteration: int, alive: bool):
    rank = {"rank": 1, "host": host, "pid": 7, "phase": phase, "iteration": iteration}
    hang = {"stopped": [] if alive else [{**rank, "silent_seconds": 9.0}],
            "waiting": [rank] if alive else [], "bound_seconds": 15, "phase": phase}  # fmt: skip
    now = time.time()
    return {"attempt": attempt, "job_id": job, "host": "n1", "start_iteration": 0,
            "started": now - 600, "reached_iteration": 0, "failure": "hang",
            "ended": now - 500, "hang": hang}  # fmt: skip


def straggler(host: str, factor: float, beyond: bool = True) -> dict:
    return {"segment": 0, "stragglers": {
        "median_compute_seconds": 0.01, "threshold": 1.2, "beyond": beyond, "ranks": 4,
        "slowest": {"rank": 3, "host": host, "compute_seconds": 0.01 * factor,
                    "factor": factor}}}  # fmt: skip


def write_campaign(work, stragglers: dict[int, dict], hangs: dict[int, list[dict]]):
    campaign(work, reached=12, segments_done=4)
    results = work / "results/train/tiny_local"
    logs = work / "logs/train_segment/tiny_local"
    for k, record in stragglers.items():
        (results / f"seg{k}.json").write_text(json.dumps({**record, "segment": k}))
    for k, entries in hangs.items():
        (logs / f"seg{k}.attempts.json").write_text(json.dumps(entries))
    return results, logs


def test_a_node_in_a_hang_and_then_a_straggler_is_reported_once_for_the_admins(tmp_path):
    from hpcllm.training.campaign import status

    results, logs = write_campaign(
        tmp_path,
        stragglers={1: straggler("n5", 1.1, beyond=False), 4: straggler("n2", 1.93)},
        hangs={2: [hang_attempt(1, "81", "n2", "save", 50, alive=True),
                   {**hang_attempt(2, "82", "n3", "step", 50, alive=False), "failure": None}],
               3: [hang_attempt(1, "90", "n3", "step", 61, alive=False)]},
    )  # fmt: skip
    found = suspects.events(results, logs)
    assert [(e.node, e.kind, e.segment) for e in found] == [
        ("n2", "hang", 2), ("n3", "hang", 3), ("n2", "straggler", 4)
    ]  # fmt: skip
    assert found[0].detail == "rank 1 in 'save' at iteration 50" and found[0].job_id == "81"
    assert suspects.admin_reports(found) == [
        "node n2 was excluded twice (hang in segment 2, straggler in segment 4): "
        "report it to the site's admins"
    ]
    out = status.campaign_status(tmp_path, profile="profiles/local", jobs=[])
    assert (
        "suspect nodes, each excluded from the job after it: n2 (hang in segment 2, rank 1 "
        "in 'save' at iteration 50); n3 (hang in segment 3, rank 1 in 'step' at iteration "
        "61); n2 (straggler in segment 4, 1.93 x the median)" in out
    ), out
    assert (
        "node n2 was excluded twice (hang in segment 2, straggler in segment 4): report it "
        "to the site's admins" in out
    ), out
    assert out.count("report it to the site's admins") == 1  # n3: once only


def test_three_events_say_three_times_and_one_event_reports_nothing(tmp_path):
    results, logs = write_campaign(
        tmp_path,
        stragglers={1: straggler("n7", 2.0), 3: straggler("n7", 1.5)},
        hangs={2: [hang_attempt(1, "5", "n7", "data", 43, alive=True)]},
    )
    found = suspects.events(results, logs)
    assert suspects.admin_reports(found) == [
        "node n7 was excluded 3 times (straggler in segment 1, hang in segment 2, "
        "straggler in segment 3): report it to the site's admins"
    ]
    assert suspects.admin_reports(found[:1]) == []
    assert suspects.suspects_line([]) is None


def test_the_record_being_written_replaces_its_segments_older_file(tmp_path):
    """A segment rerun: its new record (no straggler now) counts, not the old file."""
    results, logs = write_campaign(
        tmp_path, stragglers={1: straggler("n2", 1.9), 2: straggler("n2", 1.9)}, hangs={}
    )
    assert len(suspects.admin_reports(suspects.events(results, logs))) == 1
    assert suspects.admin_reports(suspects.events(results, logs, current={"segment": 2})) == []
    fresh = {**straggler("n2", 1.4), "segment": 3}
    assert suspects.admin_reports(suspects.events(results, logs, current=fresh)) == [
        "node n2 was excluded 3 times (straggler in segment 1, straggler in segment 2, "
        "straggler in segment 3): report it to the site's admins"
    ]


def test_the_results_page_shows_the_slowest_node_and_the_node_for_the_admins(tmp_path):
    """The page's status table says what `hpcllm status` says of stragglers and suspect
    nodes (issue 50: "Status and the results page show the slowest node")."""
    from support import REPO, tiny_local_prepared

    from hpcllm.results_page import experiment_section, experiment_view

    write_campaign(
        tmp_path,
        stragglers={1: straggler("n2", 1.93)},
        hangs={2: [hang_attempt(1, "81", "n2", "save", 50, alive=True)]},
    )
    prepared = tiny_local_prepared(tmp_path, REPO / "config" / "clusters")
    view = experiment_view(tmp_path, "tiny_local", prepared, None)
    assert view.status["slowest node"].startswith("segment 1: slowest node: n2 (rank 3)")
    assert view.status["suspect nodes"] == (
        "each excluded from the job after it: n2 (straggler in segment 1, 1.93 x the median); "
        "n2 (hang in segment 2, rank 1 in 'save' at iteration 50)"
    )
    admins = "node n2 was excluded twice (straggler in segment 1, hang in segment 2)"
    assert view.status["for the site's admins (1)"].startswith(admins)
    assert admins in experiment_section(view)
