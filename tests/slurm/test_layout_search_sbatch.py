"""layout: auto through real sbatch: the measuring job's choice against an exhaustive one.

On the test cluster (tests/slurm/autolayout.yaml) the torch engine's layouts of one node
with 2 processes are the micro batches 8, 4, 2, 1. ``auto_pick`` measures the model's best
3 (the default) in one Slurm job, launching again (2 launches at most) those the noise
does not separate, and trains its segment with the choice; ``auto_all`` measures all 4
once each in another (the exhaustive measurement). The pick's measured time in the exhaustive table is
within 5 % of the fastest there (reported, not failed, where CPU noise puts it outside);
the plan prints the table before and after.
"""

from __future__ import annotations

import json
import shutil
import warnings
from pathlib import Path

import pytest
import slurmruns
from support import hang_guard, make_workdir

pytestmark = pytest.mark.slurm

CONFIG = Path(__file__).with_name("autolayout.yaml")


def table(record: dict) -> str:
    return (
        "\n".join(
            f"{c['tp']}/{c['pp']}/{c['dp']} micro {c['micro']}: {c['measured_s']} s/it ({c['status']})"
            for c in record["candidates"]
        )
        + f"\nchosen: micro {record['chosen']['micro']}"
    )


def test_auto_layout_chooses_by_measurement_through_sbatch(cluster, tmp_path):
    work = make_workdir(tmp_path / "work")
    slurmruns.run(work, None, "--until", "merge_tokenized", profile="local")
    targets = ("results/layout/auto_all.json", "results/train/auto_pick/seg1.json")
    planned = slurmruns.run(work, cluster, "--configfile", str(CONFIG), "-n", "--", *targets)
    out = planned.stdout + planned.stderr
    # before the measurement: the model's ranking, the best 3 to be measured
    assert "auto_pick: layout: auto, 4 layouts fit; the measuring job runs the best 3" in out
    assert "tp1-pp1-dp2-mb8-none" in out and "not measured yet" in out
    done = slurmruns.run(
        work, cluster, "--configfile", str(CONFIG), "--", *targets, timeout=hang_guard(240)
    )
    jobs = [j for j in cluster.jobs() if j["comment"].startswith("rule_measure_layout")]
    assert len(jobs) == 2, jobs  # one allocation per experiment's search
    pick = json.loads((work / "results/layout/auto_pick.json").read_text())
    full = json.loads((work / "results/layout/auto_all.json").read_text())
    assert [c["micro"] for c in pick["candidates"] if c["measured_s"]] == [8, 4, 2]
    assert sorted(c["micro"] for c in full["candidates"] if c["measured_s"]) == [1, 2, 4, 8]
    for record in (pick, full):  # the fastest measured is chosen, or one of its equals
        fastest = min((c for c in record["candidates"] if c["measured_s"]),
                      key=lambda c: c["measured_s"])  # fmt: skip
        if record["equal"]:  # within the noise: the least predicted memory among them
            equal = [c for c in record["candidates"] if c["status"].startswith("measured")
                     and f"mb{c['micro']}-" in " ".join(record["equal"])]  # fmt: skip
            assert fastest in equal and record["chosen"] in equal, record
            assert record["chosen"]["memory_gb"] == min(c["memory_gb"] for c in equal)
        else:
            assert record["chosen"]["micro"] == fastest["micro"]
        assert record["decision"] and record["gpu_hours"] > 0 and record["job_id"]
        # every timed iteration kept; the mean of them is the candidate's time
        for c in record["candidates"]:
            if c["measured_s"]:
                assert len(c["samples"]) % 6 == 0
                assert c["measured_s"] == pytest.approx(sum(c["samples"]) / len(c["samples"]))
    # The goal, against the exhaustive measurement (another job, minutes later): within
    # 5 %. CPU timings on a shared machine vary more than that between jobs (four runs:
    # micro batch 2, 4, 8, 8 fastest), so a miss is reported with both tables, not failed.
    times = {c["micro"]: c["measured_s"] for c in full["candidates"]}
    best = min(times.values())
    if times[pick["chosen"]["micro"]] > 1.05 * best:
        warnings.warn(
            f"layout: auto's pick is {times[pick['chosen']['micro']] / best - 1:.0%} slower "
            f"than the exhaustive best\npick:\n{table(pick)}\nexhaustive:\n{table(full)}",
            stacklevel=1,
        )
    # the segment trained with the choice (micro batch: a continuation-safe setting)
    settings = json.loads((work / "checkpoints/auto_pick/training_settings.json").read_text())
    assert settings["continuation"]["batch.micro"] == pick["chosen"]["micro"]
    launch = (work / "logs/train_segment/auto_pick/seg1.engine.sh").read_text()
    assert f"--micro-batch-size {pick['chosen']['micro']} " in launch, launch
    # the plan now prints the measured table and the search's cost; nothing left to run
    again = slurmruns.run(work, cluster, "--configfile", str(CONFIG), "-n", "--", *targets)
    out = again.stdout + again.stderr
    assert "Nothing to be done" in out, out[-3000:]
    chosen_row = next(line for line in out.splitlines() if line.rstrip().endswith("<-")
                      and "auto_pick" not in line)  # fmt: skip
    assert f"mb{pick['chosen']['micro']}-none" in chosen_row
    assert "search:" in out and "GPU-hours" in out
    print(f"pick:\n{table(pick)}\nexhaustive:\n{table(full)}\n{done.stdout[-200:]}")
    shutil.rmtree(work / "checkpoints", ignore_errors=True)
