"""How far `hpcllm status`'s finish date can be trusted: calibration on the test cluster.

Starts the two-node test cluster (tests/slurm/testcluster.py), makes the Slurm tests'
text data and index cache once, then runs scenarios of tiny_2n's chain campaign
(hpcllm.training.campaign.chain; 2 nodes, 1,500 iterations per segment: on a quiet host
about 60-75 s of iterations and 15 s of start-up and save, so that the iterations weigh
most, as in a cluster's segments of hours) while a generator
submits other users' jobs: 1 or 2 nodes, whole, for a random 5-45 s under a 1 min limit
(they end well before it, as real users' jobs do: what ``squeue --start`` is late about).
Status (hpcllm.training.campaign.status.campaign_status, squeue and scontrol asked as a
user's call does) is polled every few seconds throughout; every line with a date is a
prediction, set against the campaign's actual end (its last segment's record).

Scenarios:
- ``load``: the background jobs only;
- ``slowdown``: from segment 3 on, CPU burners on this host slow the segments (a speed
  that changes partway);
- ``restart``: segment 3's job is cancelled while it waits (the chain ends after segment
  2, as when its controller stops), and submitted anew 60 s later: status must say
  stalled, without a date, in between.

Prints, per scenario and over all: predictions, the share of actual ends inside the
stated 80 % interval, the median and 90th percentile of the absolute error as a share of
the time left (and the signed median, + where the end came later than predicted, and the
interval's median width, both as shares of the time left), before any segment's record and once one has run, and by segments done;
and how many polls showed a date while the campaign was stalled (must be 0).
``--report FILE``: the same from a saved ``--out`` file. ``--short``: the ``load``
scenario with 3 segments (the suite's version: tests/slurm/test_training.py).

Usage: python benchmarks/forecast_calibration.py [--scenarios load,slowdown,restart]
       [--segments 4] [--iterations 1500] [--seed 1] [--out results.json]
"""

from __future__ import annotations

import argparse
import json
import os
import random
import re
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from datetime import datetime
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests" / "slurm"))
sys.path.insert(0, str(REPO / "tests"))

POLL_S = 4.0
RESTART_GAP_S = 60.0


class _Patch:
    """The two monkeypatch calls test_training.chain_campaign makes, for a script."""

    def setenv(self, key: str, value: str) -> None:
        os.environ[key] = value

    def chdir(self, path) -> None:
        os.chdir(path)


def parse_prediction(line: str) -> tuple[float, float, float] | None:
    """(finish, low, high) of a status line with a date, None for one without."""
    m = re.search(
        r"expected to finish: (\d{4}-\d\d-\d\d \d\d:\d\d(?::\d\d)?) \S+ \(80 % interval: "
        r"(.+?) to (.+?)\)",
        line,
    )
    if not m:
        return None
    text = m.group(1)
    fmt = "%Y-%m-%d %H:%M:%S" if text.count(":") == 2 else "%Y-%m-%d %H:%M"
    central = datetime.strptime(text, fmt)

    def bound(b: str) -> float:
        day = central.day
        if " " in b:  # "21st 12:01:28": another day of the month
            word, b = b.split(" ", 1)
            day = int(re.sub(r"\D", "", word))
        clock = [int(x) for x in b.split(":")] + [0]
        return central.replace(day=day, hour=clock[0], minute=clock[1], second=clock[2]).timestamp()

    return central.timestamp(), bound(m.group(2)), bound(m.group(3))


class Background:
    """Other users' jobs: whole nodes, random sizes, ending before their 1 min limit."""

    def __init__(self, cluster, rng: random.Random) -> None:
        self.cluster, self.rng = cluster, rng
        self.stop = threading.Event()
        self.submitted = 0
        self.thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self.stop.wait(self.rng.uniform(8, 30)):
            pending = [
                j for j in self.cluster.jobs() if j["name"] == "other" and j["state"] == "PENDING"
            ]
            if len(pending) >= 2:  # a queue that drains: the campaign gets its turn
                continue
            nodes, seconds = self.rng.choice((1, 2)), self.rng.randint(5, 45)
            self.cluster.run(
                "sbatch", "--parsable", f"-N{nodes}", "--exclusive", "-t", "1", "-J", "other",
                "-o", "/dev/null", "--wrap", f"sleep {seconds}", check=False,
            )  # fmt: skip
            self.submitted += 1

    def __enter__(self) -> Background:
        self.thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.stop.set()
        self.thread.join(timeout=60)


def burners(count: int) -> list[subprocess.Popen]:
    return [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(count)]


def run_scenario(name, cluster, text_data, root, segments, iterations, rng) -> dict:
    import test_training as tt

    from hpcllm.training.campaign import chain
    from hpcllm.training.campaign.status import campaign_status

    work = tt.training_workdir(text_data, root / name)
    config = work / "campaign.yaml"
    config.write_text(
        f"training: {{experiments: {{tiny_2n: {{segments: {segments}, iterations_per_segment: "
        f"{iterations}, save_interval: {iterations // 2}, eval_interval: {iterations}}}}}}}\n"
    )
    tt.index_cache(work, config)
    campaign = tt.chain_campaign(work, cluster, _Patch(), config)
    files = [str(tt.EXAMPLES), str(tt.CONFIG), str(config)]
    polls: list[dict] = []  # {at, done, line, prediction}
    burning: list[subprocess.Popen] = []
    cancelled_at = resubmitted = None
    started = time.time()
    deadline = time.monotonic() + 60 * (8 + 3 * segments)  # hang guard
    with Background(cluster, rng) as background:
        chain.ensure(campaign)
        while True:
            assert time.monotonic() < deadline, f"{name}: hang guard: {cluster.jobs()}"
            nxt = chain.next_segment(campaign)
            live = chain.chain_jobs(campaign.job_name())
            if nxt is None and not live:
                break
            if name == "slowdown" and nxt is not None and nxt >= 3 and not burning:
                burning = burners(2)
            if name == "restart" and cancelled_at is None and nxt == 3:
                pending = [j["id"] for j in live if j["state"] == "PENDING"]
                if pending:
                    chain.cancel(pending)
                    cancelled_at = time.time()
            if cancelled_at and resubmitted is None and time.time() > cancelled_at + 60:
                if not chain.chain_jobs(campaign.job_name()):
                    chain.ensure(campaign)
                    resubmitted = time.time()
            t = time.time()
            out = campaign_status(work, files, "profiles/testcluster")
            line = next(
                (x.strip() for x in out.splitlines() if "expected to finish" in x or
                 "stalled (no date)" in x or "stopped (no date)" in x), "",
            )  # fmt: skip
            polls.append(
                {"at": t, "next": nxt, "line": line, "prediction": parse_prediction(line),
                 "stalled_window": bool(cancelled_at and resubmitted is None and not live)}
            )  # fmt: skip
            time.sleep(POLL_S)
        submitted_other = background.submitted
    for p in burning:
        p.kill()
        p.wait()
    last = work / f"results/train/tiny_2n/seg{segments}.json"
    if not last.is_file():
        raise SystemExit(f"{name}: no record of the last segment ({cluster.jobs()})")
    actual = json.loads(last.read_text())["timing"]["ended"]
    return {
        "scenario": name,
        "segments": segments,
        "iterations_per_segment": iterations,
        "started": started,
        "actual_end": actual,
        "other_jobs": submitted_other,
        "polls": polls,
    }


def summary(runs: list[dict]) -> dict:
    """Coverage and errors over every prediction of ``runs``: all, before any segment's
    record (rates and start-up not yet measured by a whole segment) and after, and by the
    segments recorded when it was made."""
    rows = []
    dated_while_stalled = 0
    for r in runs:
        for p in r["polls"]:
            if p["stalled_window"] and p["prediction"]:
                dated_while_stalled += 1
            if not p["prediction"] or p["at"] >= r["actual_end"]:
                continue
            finish, low, high = p["prediction"]
            left = r["actual_end"] - p["at"]
            done = r["segments"] if p.get("next") is None else p["next"] - 1
            rows.append(
                {
                    "inside": low - 1 <= r["actual_end"] <= high + 1,  # whole seconds shown
                    "error": abs(finish - r["actual_end"]) / left,
                    # signed: positive where the end came later than predicted
                    "late": (r["actual_end"] - finish) / left,
                    "width": (high - low) / left,
                    "done": done,
                }
            )

    def figures(subset):
        if not subset:
            return {"predictions": 0}
        errors = sorted(x["error"] for x in subset)
        return {
            "predictions": len(subset),
            "coverage": sum(x["inside"] for x in subset) / len(subset),
            "median_error": statistics.median(errors),
            "p90_error": errors[min(len(errors) - 1, int(0.9 * len(errors)))],
            "median_late": statistics.median(x["late"] for x in subset),
            "median_width": statistics.median(x["width"] for x in subset),
        }

    return {
        "all": figures(rows),
        "before_a_segment_record": figures([x for x in rows if x["done"] == 0]),
        "after_one": figures([x for x in rows if x["done"] >= 1]),
        "by_segments_done": {
            k: figures([x for x in rows if x["done"] == k])
            for k in sorted({x["done"] for x in rows})
        },
        "dated_while_stalled": dated_while_stalled,
    }


def show(name: str, s: dict) -> str:
    def one(f):
        if not f["predictions"]:
            return "no predictions"
        return (
            f"{f['predictions']} predictions, {f['coverage']:.0%} inside the 80 % interval, "
            f"error median {f['median_error']:.1%} / p90 {f['p90_error']:.1%} of the time left"
            + (
                f" (signed median {f['median_late']:+.1%}: + late; interval width median "
                f"{f['median_width']:.0%})"
                if "median_width" in f
                else ""
            )
        )

    lines = [
        f"{name}: {one(s['all'])}",
        f"  before any segment's record: {one(s['before_a_segment_record'])}",
        f"  once one segment has run: {one(s['after_one'])}",
    ]
    lines += [f"    {k} segment(s) done: {one(f)}" for k, f in s["by_segments_done"].items()]
    lines.append(f"  dates shown while stalled: {s['dated_while_stalled']}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--scenarios",
        default="load,slowdown,restart",
        help="comma-separated: load, slowdown, restart",
    )
    parser.add_argument("--segments", type=int, default=4, help="segments per campaign")
    parser.add_argument(
        "--iterations", type=int, default=1500, help="iterations per segment (runs 1-6: 12)"
    )
    parser.add_argument("--seed", type=int, default=1, help="the background jobs' random seed")
    parser.add_argument(
        "--short", action="store_true", help="the load scenario with 3 segments (the suite's)"
    )
    parser.add_argument("--out", type=Path, help="write every prediction and the summary here")
    parser.add_argument("--report", type=Path, help="print the summary of a saved --out file")
    args = parser.parse_args(argv)
    if args.report:
        runs = json.loads(args.report.read_text())["runs"]
        for r in runs:
            print(show(r["scenario"], summary([r])))
        print(show("all scenarios", summary(runs)))
        return 0
    if args.short:
        args.scenarios, args.segments = "load", 3
    import slurmruns
    import testcluster

    reason = testcluster.missing_requirements()
    if reason:
        print(f"skipped: {reason}")
        return 0
    rng = random.Random(args.seed)
    root = Path(tempfile.mkdtemp(prefix="forecast-calibration-"))
    here = Path.cwd()
    runs = []
    with testcluster.running(root / "slurm") as cluster:
        text_data = slurmruns.make_workdir(root / "text")
        slurmruns.run(text_data, None, "--until", "merge_tokenized", profile="local")
        for name in args.scenarios.split(","):
            cluster.restore()
            runs.append(
                run_scenario(name, cluster, text_data, root, args.segments, args.iterations, rng)
            )
            os.chdir(here)
            print(show(name, summary(runs[-1:])), flush=True)
            if args.out:  # after each scenario: a run cut short keeps what it measured
                args.out.write_text(json.dumps({"runs": runs, "summary": summary(runs)}))
    load = os.getloadavg()[0]
    print(show("all scenarios", summary(runs)))
    print(f"load average at the end: {load:.1f} on {os.cpu_count()} cores")
    if args.out:
        args.out.write_text(json.dumps({"runs": runs, "summary": summary(runs)}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
