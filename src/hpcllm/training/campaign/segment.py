"""One segment of a chained training run, as the ``train_segment`` rule runs it.

Segment k of K trains from the newest checkpoint to iteration ``k x iterations_per_segment``
(or until its job's time is nearly used up), launched through ``hpcllm.launch`` (srun ->
torchrun per node -> the engine on a cluster; the bare process or torchrun --standalone
here). It is complete only when the checkpoint reached its target: then, and only then,
its result record is written. A segment that stopped early fails with its failure class
(:mod:`hpcllm.failures.classify`); Snakemake's next attempt (the rule's ``retries``)
continues it from the newest checkpoint while attempts fail for a transient reason and
make progress (:mod:`hpcllm.training.campaign.attempts`). While it runs, the segment holds its
checkpoint folder's lease (:mod:`hpcllm.training.checkpoints.lease`): one writer per folder.
"""

from __future__ import annotations

import logging
import os
import re
import shutil
import subprocess
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from hpcllm.failures.classify import (
    classify_text,
    killed_by_sigkill,
    oom_kill_count,
    slurm_step_state,
)
from hpcllm.models import megatron_resiliency
from hpcllm.models.megatron_args import exit_duration_minutes, transformer_impl_for
from hpcllm.progress import Progress
from hpcllm.training.campaign import (
    attempts,
    calendar,
    records,
    signal_lead,
    stragglers,
    suspects,
    watchdog,
)
from hpcllm.training.campaign.chain_site import probe_record_path
from hpcllm.training.campaign.engine_process import Signals, run_launch, segment_launch
from hpcllm.training.checkpoints import lease
from hpcllm.training.checkpoints import tracker as checkpoints
from hpcllm.training.checkpoints.checksums import check_checksums, record_checksums, record_fields
from hpcllm.training.checkpoints.retention import retention
from hpcllm.training.engines import megatron_stragglers
from hpcllm.training.engines.command import engine_command
from hpcllm.training.engines.heartbeat import read_heartbeats
from hpcllm.training.engines.log_lines import parse_log_lines
from hpcllm.training.plan import settings as tracked
from hpcllm.training.plan.data import data_digest
from hpcllm.training.plan.data_checks import check_segment_data
from hpcllm.training.plan.experiment import Paths, Prepared, target_iteration
from hpcllm.training.plan.reshard import layout_settings

log = logging.getLogger(__name__)


class SegmentIncomplete(RuntimeError):
    """The engine stopped before the segment's target iteration (time, signal, failure);
    ``hang``: what the watchdog saw where it ended a hung launch."""

    def __init__(self, message: str, failure: str, hang: dict[str, Any] | None = None):
        super().__init__(message)
        self.failure = failure
        self.hang = hang


class SegmentRefused(RuntimeError):
    """This attempt does not run: the previous one failed for good, or made no progress."""


def remaining_job_seconds(environ=os.environ) -> float | None:
    """Seconds left in this Slurm job (None outside Slurm or without a limit)."""
    end = environ.get("SLURM_JOB_END_TIME")
    if end and end.isdigit():
        return int(end) - time.time()
    job = environ.get("SLURM_JOB_ID")
    if not job:
        return None
    try:
        left = subprocess.run(
            ["squeue", "-h", "-j", job, "-o", "%L"], capture_output=True, text=True, timeout=30
        ).stdout.strip()
    except (OSError, subprocess.TimeoutExpired):
        return None
    return parse_slurm_time(left)


def parse_slurm_time(text: str) -> float | None:
    """Slurm's ``[D-]HH:MM:SS`` / ``MM:SS`` as seconds; None for UNLIMITED or junk."""
    m = re.fullmatch(r"(?:(\d+)-)?(?:(\d+):)?(\d+):(\d+)", text.strip())
    if not m:
        return None
    days, hours, minutes, seconds = (int(g) if g else 0 for g in m.groups())
    return ((days * 24 + hours) * 60 + minutes) * 60 + seconds


def exit_duration(experiment: dict[str, Any], left: float | None) -> float | None:
    """The engine's ``--exit-duration-in-mins`` for a job with ``left`` seconds to run."""
    if left is None:
        return None
    margin = experiment["time"]["margin_seconds"]
    if left <= margin:
        # The segment could only save at once and stop, job after job: say so instead.
        raise ValueError(
            f"the job has {left:.0f} s left but the experiment's time.margin_seconds is "
            f"{margin}: give train_segment a longer runtime (profile set-resources) or "
            "lower time.margin_seconds"
        )
    if experiment["engine"] == "megatron":
        return exit_duration_minutes(left, margin)
    return max(0.0, (left - margin) / 60)


# slurmctld checks --signal every 30 s (PERIODIC_TIMEOUT) and sends it as soon as the
# job's end is within signal_seconds + 30 s; the signal goes to the job steps running then.
SLURM_SIGNAL_PERIOD = 30


def warn_early_signal(experiment: dict[str, Any], left: float | None) -> float | None:
    """Warn when Slurm may send the --signal before the engine's job step exists.

    A signal sent then reaches no step and is lost, and the segment runs into its
    time limit, saving only on the final SIGTERM (KillWait seconds)."""
    signal_at = experiment["time"]["signal_seconds"] + SLURM_SIGNAL_PERIOD
    if left is not None and left <= signal_at:
        log.warning(
            "the job has %.0f s left and time.signal_seconds is %d: Slurm may send the "
            "signal before the engine starts, and it would be lost; give train_segment a "
            "runtime well above %d s or lower time.signal_seconds",
            left,
            experiment["time"]["signal_seconds"],
            signal_at,
        )
    return left


def time_lead(experiment: dict[str, Any], save: str | None = None) -> float:
    """Seconds before its job's end from which a segment stops for time: the engine exits
    ``margin_seconds`` before it, Slurm's --signal comes up to its lead + 30 s before it
    (``time.signal_seconds``, or more where a save measured in ``save`` needs it)."""
    limits = experiment.get("time") or {}
    lead = limits.get("signal_seconds") or 0
    if save is not None and lead:
        lead = signal_lead.lead_seconds(experiment, signal_lead.measured(save))
    return max(limits.get("margin_seconds") or 0, lead + SLURM_SIGNAL_PERIOD)


def iteration_progress(what: str, engine_log: Path, start: int, stop: int) -> Callable[[], None]:
    """Reads the iterations the engine logged since now; a progress line (iterations of
    this segment, rate, ETA) at the progress interval."""
    progress = Progress(what, stop - start, "iterations")
    offset = engine_log.stat().st_size if engine_log.exists() else 0

    def update() -> None:
        nonlocal offset
        with open(engine_log, "rb") as f:
            f.seek(offset)
            data = f.read()
        complete = data[: data.rfind(b"\n") + 1]  # a line still being written waits
        offset += len(complete)
        rows = parse_log_lines(complete.decode("utf-8", errors="replace"))
        if rows:
            progress.update(rows[-1]["iteration"] - start)

    return update


def both(*calls: Callable[[], None]) -> Callable[[], None]:
    def call() -> None:
        for c in calls:
            c()

    return call


def run_segment(
    name: str,
    prepared: Prepared,
    segment: int,
    paths: Paths,
    cluster,
    container: str | None = None,
    attempt: int = 1,
    excluded: list[str] | None = None,
) -> dict[str, Any]:
    """Train segment ``segment`` of ``name``; write and return its result record.

    Attempt ``attempt`` (Snakemake's) first checks that it may run at all, then takes the
    checkpoint folder's lease, records itself, trains, and records how it ended.
    ``excluded``: the nodes its Slurm job was asked to avoid (after a hang), recorded.
    """
    record_file = attempts.attempts_path(paths.engine_log)
    start_iteration = checkpoints.latest_iteration(paths.save) or 0
    why = attempts.refusal(
        attempts.load(record_file),
        attempt,
        start_iteration,
        engine_log=paths.engine_log,
        save=paths.save,
    )
    if why:
        raise SegmentRefused(f"segment {segment} of {name}, attempt {attempt} not run: {why}")
    with Signals() as signals, lease.held(paths.save, on_takeover=_log_takeover) as holder:
        log.info("lease on %s: %s", paths.save, holder.describe())
        start_iteration = checkpoints.latest_iteration(paths.save) or 0
        log_offset = _size(paths.engine_log)
        left = remaining_job_seconds()
        deadline = time.time() + left if left is not None else None
        entry = attempts.record_start(
            record_file,
            attempt,
            start_iteration,
            log_offset=log_offset,
            deadline=deadline,
            time_lead=time_lead(prepared.experiment, paths.save) if deadline is not None else None,
            excluded=excluded,
        )

        def end(
            failure: str | None, message: str = "", reached: int | None = None, hang=None
        ) -> None:
            if reached is None:
                reached = checkpoints.latest_iteration(paths.save) or 0
            logged = attempts.logged_iteration(paths.engine_log, log_offset)
            attempts.record_end(record_file, entry, reached, failure, message, logged, hang)

        try:
            record = _train_segment(
                name, prepared, segment, paths, cluster, container, signals, deadline
            )
        except SegmentIncomplete as e:
            end(e.failure, str(e), hang=e.hang)
            if signals.interrupted:  # Ctrl-C: the engine has stopped; end as Ctrl-C ends
                raise KeyboardInterrupt from None
            raise
        except Exception as e:
            failure = classify_text(f"{type(e).__name__}: {e}") or "error"
            end(failure, f"{type(e).__name__}: {e}")
            raise
        end(None, reached=record["last_iteration"])
    return record


def _size(path: str | os.PathLike) -> int:
    try:
        return os.stat(path).st_size
    except FileNotFoundError:
        return 0


def _log_takeover(stale: lease.Holder) -> None:
    log.warning("took over the stale lease of %s (no longer running)", stale.describe())


def _train_segment(
    name: str,
    prepared: Prepared,
    segment: int,
    paths: Paths,
    cluster,
    container: str | None,
    signals: Signals,
    deadline: float | None = None,
) -> dict[str, Any]:
    """Train to the segment's target; ``deadline``: when the job's time ends (None: no
    limit)."""
    from hpcllm.clusters import MEGATRON_IN_IMAGE
    from hpcllm.launch import python_for

    experiment, layout = prepared.experiment, prepared.layout
    stop = target_iteration(experiment, segment)
    start_iteration = checkpoints.latest_iteration(paths.save) or 0
    # Before anything else: never resume (or report as done) a checkpoint trained with
    # other weight-determining settings.
    saves_with = layout_settings(prepared, transformer_impl_for(cluster))
    tracked.check_checkpoint_settings(
        name,
        paths.save,
        tracked.weight_settings(prepared, transformer_impl_for(cluster)),
        tracked.continuation_settings(prepared),
        has_checkpoint=start_iteration > 0,
        layout=saves_with,
    )
    check_checksums(paths.save)
    check_segment_data(prepared)
    if start_iteration >= stop:
        # A rerun (forced, or after Snakemake deleted the record) keeps the segment's history.
        record = records.settled(name, prepared, segment, paths, start_iteration)
        log.warning(
            "segment %d of %s done: nothing to train, %s already holds iteration %d "
            "(this segment's target: %d)",
            segment,
            name,
            paths.save,
            start_iteration,
            stop,
        )
        return record
    started = time.time()
    engine_log = Path(paths.engine_log)
    log_offset = engine_log.stat().st_size if engine_log.exists() else 0
    # when the campaign will finish, as this job sees it at its start (hpcllm.training
    # .campaign.calendar): kept in the record, history for the results page
    timing = calendar.job_timing(experiment, segment, start_iteration, paths, name)
    # Megatron's straggler detector where the site probe found the image able to run it
    straggler_log = straggler_log_on(experiment, cluster, container)
    if signals.received is None:
        command = engine_command(
            experiment,
            layout,
            prepared.blend,
            prepared.tokenizer_files,
            paths,
            segment,
            exit_duration(experiment, warn_early_signal(experiment, _left(deadline))),
            eod_token=prepared.eod_token,
            transformer_impl=transformer_impl_for(cluster),
            python=python_for(container),
            megatron_dir=cluster.megatron_dir or MEGATRON_IN_IMAGE,
            straggler_log=straggler_log,
        )
        # the hang watchdog: its bound from the measured times, the ranks' heartbeats
        dog, heartbeats = watchdog.for_segment(
            experiment, cluster.watchdog, paths.save, engine_log, layout.gpus
        )
        launch = segment_launch(experiment, command, cluster, container, heartbeats)
        log.info("segment %d of %s: iterations %d..%d", segment, name, start_iteration + 1, stop)
        if deadline is not None:  # a Slurm job: its --signal (the rule's slurm_extra)
            note = signal_lead.lead_note(experiment, signal_lead.measured(paths.save), name)
            (log.warning if note.startswith("Warning") else log.info)("%s", note)
        script = engine_log.with_suffix(".sh")
        env = {**os.environ, "PYTHONUNBUFFERED": "1"}
        oom_before = oom_kill_count()
        rc = run_launch(
            launch.shell(),
            script,
            engine_log,
            env,
            signals,
            while_running=both(
                iteration_progress(
                    f"segment {segment} of {name}", engine_log, start_iteration, stop
                ),
                retention(experiment, paths.save),
                lambda: record_checksums(paths.save),
            ),
            watchdog=dog.check,
        )
        log.info("engine exited with %d", rc)
        if dog.stall is not None:
            log.warning("watchdog: %s", dog.stall.describe())
            with open(engine_log, "a") as out:  # the hang's cause, in the log it ends
                out.write(f"\n==> {time.strftime('%Y-%m-%d %H:%M:%S')} {watchdog.LOG_MARK}: "
                          f"{dog.stall.describe()}\n")  # fmt: skip
        record_checksums(paths.save)
        retention(experiment, paths.save)()
        oom_after = oom_kill_count()
        oom_kills = (oom_after or 0) - (oom_before or 0) if oom_before is not None else 0
    else:
        rc, oom_kills, dog = None, 0, None
    reached = checkpoints.latest_iteration(paths.save) or 0
    if rc is not None and reached > start_iteration:  # its newest checkpoint is this run's
        tracked.record_saved_layout(paths.save, saves_with)
    if reached < stop:
        text = engine_log.read_text(errors="replace")[log_offset:] if engine_log.exists() else ""
        state = None
        if killed_by_sigkill(rc, text) and not oom_kills:
            state = slurm_step_state(os.environ.get("SLURM_JOB_ID"))
        failure = segment_failure(text, signals.received, rc, oom_kills, state)
        stall = dog.stall if dog is not None else None
        if stall is not None:  # the watchdog ended it: what it saw is the cause
            failure = "hang"
        when = "early"
        if not text:
            when = "before the engine started"
        elif not parse_log_lines(text):
            when = "during the engine's start-up"
        broken = checkpoint_problem(text, paths.save)
        if failure == "disk_full":
            after = checkpoint_disk_full(paths.save)
        elif broken:
            after = (
                f"the checkpoint could not be loaded: {broken} Another attempt would fail "
                "the same way; fix or remove that checkpoint (docs/training.md)"
            )
        else:
            after = (
                f"the next attempt or a rerun continues from the newest checkpoint in "
                f"{paths.save} (iteration {reached})"
            )
        if stall is not None:
            after = f"the watchdog ended it: {stall.describe()}; {after}"
        raise SegmentIncomplete(
            f"segment {segment} of {name} stopped at iteration {reached} of {stop} {when} "
            f"({failure}; see {paths.engine_log}); {after}",
            failure,
            stall.as_record() if stall is not None else None,
        )
    engine_text = engine_log.read_text()
    lines = [r for r in parse_log_lines(engine_text) if r["iteration"] <= stop]
    last = lines[-1] if lines else {}
    record = {
        "experiment": name,
        "engine": experiment["engine"],
        "segment": segment,
        "segments": experiment["segments"],
        # the segment's first iteration, or earlier where the checkpoint was (a changed
        # iterations_per_segment, a checkpoint pointed back): this job trained from there
        "first_iteration": min(target_iteration(experiment, segment - 1), start_iteration) + 1,
        "last_iteration": stop,
        "resumed_from_iteration": start_iteration,
        "consumed_samples": stop * layout.global_batch,
        "lm_loss": last.get("lm loss"),
        "seconds": round(time.time() - started, 3),
        "gpus": layout.gpus,
        "checkpoint": str(checkpoints.iteration_dir(paths.save, reached)),
        # the data it trained on (hpcllm.training.plan.data.data_digest): the results page
        # says when a model is older than the data now there
        "data_digest": data_digest(prepared.blend.prefixes),
        **calendar.job_timing_end(timing, engine_log, log_offset, stop),
        # the longest save of its attempts, its checkpoint's size, an iteration's time:
        # the next segment job's --signal lead (hpcllm.training.campaign.signal_lead)
        **signal_lead.measure(engine_text, checkpoints.iteration_dir(paths.save, reached)),
        # a copy of its checksums kept apart from the folder: `hpcllm accept-checkpoint`
        # checks the files against it once the folder's manifest is lost or broken
        **record_fields(checkpoints.iteration_dir(paths.save, reached)),
    }
    # The GPUs' energy where the engine logged it (hpcllm.bench.energy), and its tokens.
    from hpcllm.bench.energy import log_energy

    energy = log_energy(lines, layout.gpus, layout.global_batch,
                        experiment["model"]["seq_length"], experiment.get("log_interval", 1))  # fmt: skip
    if energy:
        record["energy_j"], record["energy_tokens"] = round(energy[0], 3), energy[1]
    # the slowest rank's compute against the median (the torch engine's heartbeats): a
    # node beyond the cluster's factor is kept off the next segment
    if experiment["engine"] == "torch":
        slow = stragglers.assess(
            read_heartbeats(watchdog.heartbeat_dir(engine_log)), cluster.watchdog.straggler_factor
        )
        if slow:
            record["stragglers"] = slow
    elif straggler_log:  # Megatron's own reports in this attempt's log
        slow = megatron_stragglers.assess_attempt(
            engine_log,
            log_offset,
            cluster.watchdog.straggler_factor,
            layout.gpus,
            job_nodes(),
            experiment["layout"].get("procs_per_node", 1),
        )
        if slow:
            record["stragglers"] = slow
    # a node suspected twice (hangs, stragglers) is for the site's admins, not our retries
    found = suspects.events(Path(paths.record).parent, engine_log.parent, current=record)
    for line in suspects.admin_reports(found):
        record.setdefault("report_to_admins", []).append(line)
        log.warning("%s", line)
    records.write_trained(record, paths)
    loss = record["lm_loss"]
    log.info(
        "segment %d of %s done: iterations %d..%d in %.0f s, lm loss %s, checkpoint %s",
        segment,
        name,
        start_iteration + 1,
        stop,
        record["seconds"],
        "not logged" if loss is None else f"{loss:.4g}",
        record["checkpoint"],
    )
    return record


def straggler_log_on(experiment: dict[str, Any], cluster, container: str | None) -> bool:
    """Whether this segment runs Megatron's straggler detector: a megatron experiment
    with ``resiliency: auto`` whose image the site probe's record found able to run it
    (hpcllm.models.megatron_resiliency); said in the job's log either way."""
    if experiment["engine"] != "megatron":
        return False
    found, source = megatron_resiliency.from_record(probe_record_path(cluster, container))
    setting = megatron_resiliency.setting_of(experiment)
    on = megatron_resiliency.uses_straggler_log("megatron", setting, found)
    log.info(
        "Megatron's straggler detector: %s (resiliency: %s; %s)",
        "on" if on else "off",
        setting,
        found.straggler_text() if found is not None else source,
    )
    return on


def job_nodes() -> list[str]:
    """The nodes of this Slurm job (its node list expanded), or this host outside one."""
    import socket

    nodelist = os.environ.get("SLURM_JOB_NODELIST")
    if nodelist:
        try:
            done = subprocess.run(
                ["scontrol", "show", "hostnames", nodelist],
                capture_output=True, text=True, timeout=60, check=False,
            )  # fmt: skip
            if done.returncode == 0 and done.stdout.split():
                return done.stdout.split()
        except (OSError, subprocess.TimeoutExpired):
            pass
    return [socket.gethostname()]


def checkpoint_disk_full(save: str) -> str:
    """A save that found its file system full: its partial folders removed (they are never
    loaded, and hold space), the file system, its room and what a checkpoint takes (the
    newest committed one's size), and the fix."""
    from hpcllm.atomic import SUFFIX
    from hpcllm.diskspace import describe

    newest = checkpoints.latest_iteration(save)
    # the torch engine's folder under its temporary name; Megatron-LM's, not committed
    partial = [p for p in Path(save).glob(f"iter_*{SUFFIX}") if p.is_dir()] + [
        checkpoints.iteration_dir(save, i)
        for i in checkpoints.iteration_dirs(save)
        if newest is None or i > newest
    ]
    for folder in partial:
        shutil.rmtree(folder, ignore_errors=True)
    needed = None
    if newest is not None:
        folder = checkpoints.iteration_dir(save, newest)
        needed = sum(f.stat().st_size for f in folder.rglob("*") if f.is_file())
    removed = f" (removed its partial {', '.join(p.name for p in partial)})" if partial else ""
    return f"the checkpoint could not be written{removed}: " + describe(
        save, needed=needed
    ).replace("this step needs", "a checkpoint needs")


def _left(deadline: float | None) -> float | None:
    return deadline - time.time() if deadline is not None else None


def segment_failure(
    text: str,
    signum: int | None,
    returncode: int | None = None,
    oom_kills: int = 0,
    slurm_state: str | None = None,
) -> str:
    """The failure class of an attempt that ended before its target iteration.

    A signal this job received (Slurm's --signal before the time limit, scancel,
    preemption) explains the stop whatever the engine printed on its way down. An engine
    killed by SIGKILL prints nothing itself: the kernel's OOM record (``oom_kills``, the
    rise of the job cgroup's count during the launch) or Slurm's state of the step name
    the cause; without one it was killed from outside (a node's watchdog, Slurm's
    KillWait, a user), which another attempt can get past: ``signal``.
    """
    if oom_kills:
        return "out_of_memory"
    found = classify_text(text, slurm_state)
    if signum is not None and found not in ("time_limit", "node_failure"):
        return "signal"
    if killed_by_sigkill(returncode, text) and found in (None, "error"):
        return "signal"
    return found or "error"


# An exception line of the engine's output: the last line of a traceback.
_EXCEPTION_LINE = re.compile(r"^(?:\[\w+\]:)?\s*(\w+(?:\.\w+)*(?:Error|Exception)): (.+)$", re.M)


def checkpoint_problem(text: str, save: str) -> str | None:
    """The exception the engine raised about a file of the checkpoint folder (loading a
    corrupt or partial checkpoint), naming the file; None if it raised none."""
    for m in reversed(list(_EXCEPTION_LINE.finditer(text))):
        if save in m.group(2) or m.group(1).endswith("CheckpointError"):
            return f"{m.group(1)}: {m.group(2)}"
    return None
