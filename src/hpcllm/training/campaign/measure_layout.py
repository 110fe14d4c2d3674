"""The measuring job of ``layout: auto``: the best predicted layouts, timed on the site.

One Slurm job (one allocation) runs the experiment's engine once per candidate, at full
model size, with the experiment's data, through the very launch its segments use
(:func:`hpcllm.training.campaign.engine_process.segment_launch`), for ``warmup_iterations
+ iterations`` iterations without a checkpoint; the seconds per iteration are the median
of the engine's own per-iteration times after the warm-up (the log lines the canary and
the benchmarks parse). On fewer nodes than the experiment's (one where the model fits on
one, :func:`hpcllm.training.plan.autolayout.measure_nodes`) DP shrinks with the global
batch, keeping each rank's micro batches: the per-iteration time of the full size, less
the all-reduce across the other nodes. A candidate that fails (out of memory: the model
was wrong) is recorded as failed and never chosen. The record (results/layout/<name>.json)
names the fastest.
"""

from __future__ import annotations

import copy
import logging
import os
import shutil
import statistics
import time
from dataclasses import replace
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
    exp = copy.deepcopy(autolayout.with_layout(prepared.experiment, c))
    opts = autolayout.settings(exp["layout"])
    steps = opts["warmup_iterations"] + opts["iterations"]
    full_nodes = exp["layout"]["nodes"]
    exp["layout"]["nodes"] = nodes
    exp["batch"]["global"] = autolayout.scaled_global_batch(
        exp["batch"]["global"], full_nodes, nodes
    )
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


def seconds_per_iteration(engine_log: str | os.PathLike, warmup: int) -> float | None:
    """The median of the logged per-iteration times after the first ``warmup``."""
    from hpcllm.bench.logparse import parse_megatron_log

    times = [it.elapsed_s for it in parse_megatron_log(engine_log).iterations]
    times = times[warmup:]
    return statistics.median(times) if times else None


def measure_candidate(
    name: str, prepared, c: Candidate, nodes: int, folder: Path, cluster, container=None
) -> Candidate:
    """Run the candidate's engine a few iterations; the candidate with its time."""
    from hpcllm.clusters import MEGATRON_IN_IMAGE
    from hpcllm.launch import python_for
    from hpcllm.models.megatron_args import transformer_impl_for
    from hpcllm.models.planner import check_layout
    from hpcllm.training.campaign.engine_process import run_launch, segment_launch
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
    log.info("measuring %s of %s on %d node(s)", c.name, name, nodes)
    started = time.time()
    rc = run_launch(
        launch.shell(), work / "launch.sh", Path(paths.engine_log),
        {**os.environ, "PYTHONUNBUFFERED": "1"},
    )  # fmt: skip
    warmup = autolayout.settings(exp["layout"])["warmup_iterations"]
    seconds = seconds_per_iteration(paths.engine_log, warmup)
    log.info("%s: exit %d after %.0f s, %s s/iteration", c.name, rc, time.time() - started, seconds)
    if rc != 0 or seconds is None:
        return replace(c, measured_s=None, status=f"failed (exit {rc}, {paths.engine_log})")
    return replace(c, measured_s=seconds, status="measured")


def measure_layouts(name: str, prepared, record: str | os.PathLike, work, cluster,
                    container: str | None = None) -> dict:  # fmt: skip
    """The measuring job: the plan's ``measure`` best candidates, one after another in
    this allocation; writes and returns the record (the fastest chosen)."""
    auto = prepared.auto
    if auto is None:
        raise ValueError(f"training.experiments.{name}: its layout is not auto")
    folder = Path(work)
    folder.mkdir(parents=True, exist_ok=True)
    started = time.time()
    lay = prepared.experiment["layout"]
    listed = list(auto.candidates)
    for i, c in enumerate(listed[: auto.measure]):
        listed[i] = measure_candidate(name, prepared, c, auto.nodes, folder, cluster, container)
    out = autolayout.write_record(
        record, name, listed, auto.nodes, auto.nodes * lay["procs_per_node"],
        time.time() - started, auto.measure,
    )  # fmt: skip
    log.info("chose %s for %s", autolayout.fastest(listed).name, name)
    return out
