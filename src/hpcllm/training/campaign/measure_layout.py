"""The measuring job of ``layout: auto``: the best predicted layouts, timed on the site.

One Slurm job (one allocation) runs the experiment's engine once per candidate, at full
model size, with the experiment's data, through the very launch its segments use
(:func:`hpcllm.training.campaign.engine_process.segment_launch`), for ``warmup_iterations
+ iterations`` iterations without a checkpoint; each timed iteration's seconds (the
engine's own log lines, which the canary and the benchmarks parse) are kept. On fewer nodes
than the experiment's (:func:`hpcllm.training.plan.autolayout.measure_nodes`: at least two
where it spans nodes, DP across them, each candidate within the plan's memory check) DP
shrinks with the global batch, keeping each rank's micro batches.

The search (:func:`hpcllm.training.plan.autolayout.search`) launches again those the
noise does not separate from the fastest, up to ``rounds`` launches each. Every launch
has its own time-out (start-up, measured in this job once one ran, plus its iterations,
with the margin); a launch that would not fit the job's time left is not started. A
failed or timed-out candidate is recorded with its failure class and never chosen; the
others stand. What is measured is written after every launch (``progress.json`` in the
work folder; a rerun keeps it), the record (results/layout/<name>.json) at the end.
"""

from __future__ import annotations

import copy
import logging
import os
import shutil
import signal
import statistics
import time
from dataclasses import dataclass, replace
from pathlib import Path

from hpcllm.training.plan import autolayout
from hpcllm.training.plan.autolayout import Candidate

log = logging.getLogger(__name__)

# Flags of the segments' command line a measurement leaves out: it saves and loads nothing.
_CHECKPOINT_FLAGS = ("--save", "--load", "--save-interval")


def without_checkpoints(argv: list[str]) -> list[str]:
    out, skip = [], False
    for word in argv:
        if skip:
            skip = False
        elif word in _CHECKPOINT_FLAGS:
            skip = True
        else:
            out.append(word)
    return out


def candidate_experiment(prepared, c: Candidate, nodes: int) -> dict:
    """The experiment as the candidate runs it in the measuring job: its layout, on
    ``nodes`` nodes (the global batch scaled with them), one short segment, no evaluation,
    no learning-rate warm-up (throughput does not depend on the rate)."""
    exp = copy.deepcopy(autolayout.at_nodes(prepared.experiment, c, nodes))
    opts = autolayout.settings(exp["layout"])
    steps = opts["warmup_iterations"] + opts["iterations"]
    exp["optim"] = {**exp["optim"], "warmup_iters": 0}
    exp.update(
        segments=1,
        iterations_per_segment=steps,
        save_interval=steps,
        eval_interval=steps,
        eval_iters=0,
        log_interval=1,
    )
    return exp


def iteration_seconds(engine_log: str | os.PathLike, warmup: int) -> list[float]:
    """The logged per-iteration seconds after the first ``warmup``."""
    from hpcllm.bench.logparse import parse_megatron_log

    return [it.elapsed_s for it in parse_megatron_log(engine_log).iterations][warmup:]


def seconds_per_iteration(engine_log: str | os.PathLike, warmup: int) -> float | None:
    """The median of the logged per-iteration times after the first ``warmup``."""
    times = iteration_seconds(engine_log, warmup)
    return statistics.median(times) if times else None


@dataclass
class Launch:
    """One launch's outcome: the timed iterations' seconds, the seconds before the first
    iteration (start-up), and the failure class where it failed."""

    samples: list[float]
    startup_s: float | None
    failure: str | None


def launch_with_timeout(
    script_text: str, script_path: Path, engine_log: Path, env: dict[str, str],
    timeout_s: float | None, poll_s: float = 5.0,
) -> tuple[int, bool]:  # fmt: skip
    """Run a launch script (engine_process.run_launch) ended after ``timeout_s``: SIGTERM
    to the launch and every process below it, SIGKILL KILL_AFTER_S later; its exit
    status and whether it was timed out."""
    from hpcllm.training.campaign.engine_process import Signals, run_launch

    started = time.time()
    timed_out: list[float] = []
    with Signals() as signals:

        def watch() -> None:
            now = time.time()
            if timeout_s is None or now - started < timeout_s:
                return
            if not timed_out:
                signals.signal_child(signal.SIGTERM)
                timed_out.append(now)
            elif now - timed_out[0] > KILL_AFTER_S:
                signals.signal_child(signal.SIGKILL)

        rc = run_launch(script_text, script_path, engine_log, env, signals, watch, poll_s)
    return rc, bool(timed_out)


def run_candidate(
    name: str, prepared, c: Candidate, nodes: int, folder: Path, cluster, container=None,
    timeout_s: float | None = None,
) -> Launch:  # fmt: skip
    """Run the candidate's engine a few iterations, ended after ``timeout_s``."""
    from hpcllm.clusters import MEGATRON_IN_IMAGE
    from hpcllm.failures.classify import classify_log
    from hpcllm.launch import python_for
    from hpcllm.models.megatron_args import transformer_impl_for
    from hpcllm.models.planner import check_layout
    from hpcllm.training.campaign.engine_process import segment_launch
    from hpcllm.training.engines.command import engine_command
    from hpcllm.training.plan.experiment import Paths

    exp = candidate_experiment(prepared, c, nodes)
    lay = exp["layout"]
    layout = check_layout(name, exp, nodes * lay["procs_per_node"], lay["procs_per_node"])
    work = folder / c.name
    shutil.rmtree(work, ignore_errors=True)
    paths = Paths(
        save=str(work / "checkpoints"),
        record=str(work / "record.json"),
        engine_log=str(work / "engine.log"),
        data_cache=str(folder / "index-cache"),  # the candidates' global batch is the same
        tensorboard=str(work / "tensorboard"),
    )
    command = without_checkpoints(
        engine_command(
            exp, layout, prepared.blend, prepared.tokenizer_files, paths, 1, None,
            eod_token=prepared.eod_token, transformer_impl=transformer_impl_for(cluster),
            python=python_for(container), megatron_dir=cluster.megatron_dir or MEGATRON_IN_IMAGE,
        )
    )  # fmt: skip
    launch = segment_launch(exp, command, cluster, container)
    log.info("measuring %s of %s on %d node(s), time-out %s s", c.name, name, nodes, timeout_s)
    started = time.time()
    rc, timed_out = launch_with_timeout(
        launch.shell(), work / "launch.sh", Path(paths.engine_log),
        {**os.environ, "PYTHONUNBUFFERED": "1"}, timeout_s,
    )  # fmt: skip
    wall = time.time() - started
    warmup = autolayout.settings(exp["layout"])["warmup_iterations"]
    every = iteration_seconds(paths.engine_log, 0)
    samples = every[warmup:]
    log.info("%s: exit %d after %.0f s, %d timed iterations", c.name, rc, wall, len(samples))
    failure = None
    if timed_out:
        failure = f"timed out after {timeout_s:.0f} s"
    elif rc != 0 or not samples:
        failure = classify_log([paths.engine_log]) or f"exit {rc}"
    return Launch(samples, wall - sum(every) if every else None, failure)


def measure_layouts(name: str, prepared, record: str | os.PathLike, work, cluster,
                    container: str | None = None, limit_minutes: float | None = None,
                    canary_records: list[str] = ()) -> dict:  # fmt: skip
    """The measuring job: the plan's ``measure`` best candidates in this allocation
    (:func:`hpcllm.training.plan.autolayout.search`); writes and returns the record.
    ``limit_minutes``: the job's time limit (no launch starts that would not fit);
    ``canary_records``: the site's training canary, whose start-up is the first guess."""
    from hpcllm.work_time import MARGIN

    auto = prepared.auto
    if auto is None:
        raise ValueError(f"training.experiments.{name}: its layout is not auto")
    folder = Path(work)
    folder.mkdir(parents=True, exist_ok=True)
    started = time.time()
    lay = prepared.experiment["layout"]
    opts = autolayout.settings(lay)
    gpus = auto.nodes * lay["procs_per_node"]
    progress = folder / "progress.json"
    listed = kept_progress(progress, list(auto.candidates), auto.measure)
    planned_start = autolayout.start_seconds(list(canary_records))
    startups: list[float] = []  # this job's own launches'
    timed = auto.search_gpu_hours is not None  # seconds predicted: time-outs possible

    def launch_seconds(c: Candidate) -> float | None:
        if not timed:
            return None
        # the longest start-up of this job's launches, else the planned one
        start = max(startups) if startups else planned_start
        return MARGIN * autolayout.round_seconds(c, opts, start)

    def fits_in_time(c: Candidate) -> bool:
        need = launch_seconds(c)
        if limit_minutes is None or need is None:
            return True
        return time.time() + need < started + limit_minutes * 60 - RESERVE_S

    def time_once(c: Candidate) -> Candidate:
        done = run_candidate(
            name, prepared, c, auto.nodes, folder, cluster, container, launch_seconds(c)
        )
        if done.startup_s is not None:
            startups.append(done.startup_s)
        if done.failure is not None:
            return replace(c, measured_s=None, samples=(), status=f"failed ({done.failure})")
        samples = tuple(c.samples) + tuple(done.samples)
        return replace(c, samples=samples, measured_s=statistics.fmean(samples),
                       status=f"measured ({len(samples)} iterations)")  # fmt: skip

    def keep(now: list[Candidate]) -> None:
        autolayout.write_record(
            progress, name, now, auto.nodes, gpus, time.time() - started, auto.measure,
            partial=True,
        )  # fmt: skip

    listed, decision = autolayout.search(
        listed, auto.measure, time_once, opts["rounds"], keep, fits_in_time
    )
    out = autolayout.write_record(
        record, name, listed, auto.nodes, gpus, time.time() - started, auto.measure,
    )  # fmt: skip
    log.info("chose %s", decision.describe())
    return out


# Seconds the job keeps after its last launch (the record, the step's end).
RESERVE_S = 60
# Seconds a timed-out launch gets after its SIGTERM before it is killed.
KILL_AFTER_S = 60


def kept_progress(path: Path, listed: list[Candidate], measure: int) -> list[Candidate]:
    """The candidates with what an earlier attempt of this job measured (its
    progress.json, where its candidates are the same), so that a rerun keeps it."""
    import json

    fields = Candidate.__dataclass_fields__
    try:
        entries = json.loads(path.read_text())["candidates"]
        earlier = {Candidate(**{k: e[k] for k in fields if k in e}).name: e for e in entries}
    except (OSError, ValueError, KeyError, TypeError):
        return listed
    out = []
    for i, c in enumerate(listed):
        e = earlier.get(c.name)
        if i < measure and e and e.get("samples"):
            c = replace(c, samples=tuple(e["samples"]), measured_s=e["measured_s"],
                        status=e["status"])  # fmt: skip
        out.append(c)
    return out
