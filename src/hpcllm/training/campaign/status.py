"""``hpcllm status``: where a campaign stands, from its files and Slurm, without Snakemake.

Reads the same configuration the workflow reads (config/config.yaml, the --configfile
files, the profile's cluster), then per experiment: segments done, the newest checkpoint
and its tokens, the last train and validation loss, throughput of the last segment,
GPU-hours spent and the estimate to finish, and the experiment's Slurm jobs; per
benchmark sweep: points done, running and failed (with their class). Nothing is written,
nothing is submitted: safe on a login node while the campaign runs.
"""

from __future__ import annotations

import json
import os
import re
import socket
import subprocess
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from hpcllm.bench.energy import log_energy, wh_per_million_tokens
from hpcllm.training.campaign import attempts as attempts_mod
from hpcllm.training.campaign.curves import read_curves
from hpcllm.training.checkpoints import lease
from hpcllm.training.checkpoints import tracker as checkpoints
from hpcllm.training.engines.log_lines import parse_log_lines


@dataclass
class ExperimentStatus:
    name: str
    segments_done: int
    segments: int
    iteration: int | None
    total_iterations: int
    tokens: int
    train_loss: float | None
    valid_loss: float | None
    tokens_per_second: float | None
    tflops_per_gpu: float | None
    gpu_hours: float
    gpu_hours_to_finish: float | None
    jobs: list[str] = field(default_factory=list)
    last_failure: str | None = None
    seconds_to_finish: float | None = None  # measured time per iteration x iterations left
    log_age_s: float | None = None  # since the newest engine log line was written
    running_gpu_hours: float = 0.0  # of the attempt running now (in gpu_hours too)
    # Why the files show a model that is not the current one (checkpoints of other
    # settings, segment records of checkpoints no longer there); its figures are left out.
    stale: str | None = None
    # the last attempt refused the checkpoint (damaged or unverified): last_failure says why
    refused_checkpoint: bool = False
    # A layout Megatron cannot load the checkpoints with (hpcllm.training.plan.reshard): the
    # plan's message, naming the checkpoint format and the ways out. The same model: its
    # figures stay; the next run submits nothing.
    layout_refused: str | None = None
    earlier_failure: str | None = None  # an attempt's failure that a later attempt followed
    # The GPUs' energy over the iterations whose log lines carry it (hpcllm.bench.energy).
    wh_per_million_tokens: float | None = None
    # when it will finish (hpcllm.training.campaign.calendar), or why that is not known
    calendar: str | None = None
    # the newest segment's slowest node against the median (campaign.stragglers)
    straggler: str | None = None
    # the nodes excluded after a hang or a straggler, and those excluded twice, for the
    # site's admins (campaign.suspects)
    suspect_nodes: tuple[str, ...] = ()

    @property
    def finished(self) -> bool:
        return self.segments_done >= self.segments


class SlurmQueryError(RuntimeError):
    """squeue could not be asked: the job list is unknown (not empty)."""


REPO = Path(__file__).resolve().parents[4]


class RunFileMissing(FileNotFoundError):
    """A --configfile (or a profile's configfile) that is nowhere the run could have read it."""


def run_file(path: str | os.PathLike, workdir: str | os.PathLike) -> Path | None:
    """A --configfile or --profile of the run as given: relative to where this command runs
    (as Snakemake reads it), else to the working directory (``-d``: the run may have
    started there); None when neither has it."""
    for base in (Path.cwd(), Path(workdir)):
        if (base / path).exists():
            return base / path
    return None


def _profile_file(workdir: Path, profile: str) -> Path:
    profile_file = (run_file(profile, workdir) or Path(profile)) / "config.yaml"
    if not profile_file.is_file():
        profile_file = REPO / profile / "config.yaml"
    return profile_file


def _profile_settings(workdir: Path, profile: str | None) -> dict:
    if not profile:
        return {}
    return yaml.safe_load(_profile_file(workdir, profile).read_text()) or {}


def run_configfiles(workdir: Path, configfiles: Sequence[str], profile: str | None) -> list[Path]:
    """The run's config files after config/config.yaml: the --configfile files, or without
    them the profile's ``configfile:`` (a --configfile replaces it, as in Snakemake; a
    profile's may also be in the repo). Raises :class:`RunFileMissing` naming a missing one."""
    from_profile = not configfiles
    profile_dir = None
    if from_profile:
        configfiles = _profile_settings(workdir, profile).get("configfile") or []
        if isinstance(configfiles, str):
            # Snakemake reads a profile's single path in the profile's folder where it is
            # there (profiles/local's ../../config/examples/local.yaml)
            configfiles = [configfiles]
            profile_dir = _profile_file(workdir, profile).parent
    out = []
    for path in configfiles:
        beside = profile_dir / path if profile_dir is not None else None
        found = beside if beside is not None and beside.exists() else run_file(path, workdir)
        if found is None and from_profile and (REPO / path).is_file():
            found = REPO / path
        if found is None or not found.is_file():
            where = f"the configfile of --profile {profile}" if from_profile else "--configfile"
            raise RunFileMissing(
                f"{where} {path}: no such file, neither here nor in {workdir} (give the "
                "files of the run, relative to where you run this command or to the -d "
                "directory)"
            )
        out.append(found)
    return out


def load_config(workdir: Path, configfiles: Sequence[str], profile: str | None) -> dict:
    """The workflow's configuration: config/config.yaml, then the run's config files
    (:func:`run_configfiles`), deep-merged, with the profile's ``config:`` entries (the
    cluster) and the schema defaults."""
    from hpcllm.configuration import SECTIONS, check_section, unset_nulls

    repo = REPO
    config: dict = {}
    base = workdir / "config" / "config.yaml"
    files = run_configfiles(workdir, configfiles, profile)
    for path in [base if base.is_file() else repo / "config" / "config.yaml", *files]:
        _merge(config, yaml.safe_load(Path(path).read_text()) or {})
    if profile:
        entries = _profile_settings(workdir, profile).get("config") or {}
        if isinstance(entries, list):  # `config: [cluster=juwels]` form
            entries = dict(e.split("=", 1) for e in entries)
        _merge(config, entries)
    schemas = repo / "workflow" / "schemas"
    from snakemake.utils import validate

    # as the workflow does (common.smk): `key: null` in a config file unsets the key
    unset_nulls("", config, schemas / "config.schema.yaml")
    for section in SECTIONS:
        unset_nulls(section, config.get(section), schemas / f"{section}.schema.yaml")
    validate(config, str(schemas / "config.schema.yaml"))
    for section in SECTIONS:
        config.setdefault(section, {})
        check_section(section, config[section], schemas / f"{section}.schema.yaml")
        validate(config[section], str(schemas / f"{section}.schema.yaml"))
    return config


def _merge(into: dict, new: dict) -> None:
    for key, value in new.items():
        if isinstance(value, dict) and isinstance(into.get(key), dict):
            _merge(into[key], value)
        else:
            into[key] = value


def slurm_error(stderr: str) -> str:
    """One line of squeue's error output: its fatal line, else its last (a machine with
    Slurm's clients but no slurm.conf prints four lines of DNS lookups)."""
    lines = [x.strip() for x in stderr.splitlines() if x.strip()]
    fatal = [x for x in lines if ": fatal: " in x]
    return (fatal or lines or ["no output"])[-1]


def slurm_jobs() -> list[dict[str, str]]:
    """Queued and running jobs of this user: id, state, job name, dependency, submit time,
    reason, partition, comment (the plugin's rule tag)."""
    try:
        out = subprocess.run(
            ["squeue", "--me", "-h", "-o", "%i|%T|%j|%E|%V|%r|%P|%k"],
            capture_output=True,
            text=True,
            timeout=30,
        )
    except (OSError, subprocess.TimeoutExpired) as e:
        raise SlurmQueryError(f"unknown: Slurm could not be asked (squeue: {e})") from e
    if out.returncode != 0 or (": fatal: " in out.stderr and not out.stdout.strip()):
        raise SlurmQueryError(
            f"unknown: Slurm could not be asked ({slurm_error(out.stderr or out.stdout)}; "
            "run hpcllm status where Slurm's commands reach the cluster, e.g. a login node)"
        )
    jobs = []
    for line in out.stdout.splitlines():
        parts = line.split("|", 7)
        if len(parts) == 7:  # without the partition (an older format's output)
            parts.insert(6, "")
        if len(parts) == 8:
            jobs.append(
                {
                    "id": parts[0],
                    "state": parts[1],
                    "name": parts[2],
                    "dependency": parts[3],
                    "submitted": parts[4],
                    "reason": parts[5],
                    "partition": parts[6],
                    "comment": parts[7],
                }
            )
    return jobs


def _partition_queue(jobs: list[dict[str, str]], cluster):
    """The partition's queue (hpcllm.training.campaign.queue_state.read: one squeue, one
    sinfo) where this user's jobs run (the first that names one), else the cluster's GPU
    partition; and why it is None."""
    from hpcllm.training.campaign import queue_state

    partition = next((j["partition"] for j in jobs if j.get("partition")), None)
    partition = partition or cluster.partitions.gpu
    if not partition:
        return None, "no partition known"
    state = queue_state.read(partition, time.time())
    return state, None if state else f"squeue or sinfo -p {partition} could not be asked"


def stuck_note(job: dict[str, str]) -> str:
    """A pending job's note where it waits for a limit Slurm does not resolve by itself
    (hpcllm.slurm_pending): the reason, what it means and what to change; else ""."""
    from hpcllm import slurm_pending

    reason = job.get("reason") or ""
    if not slurm_pending.is_stuck(job.get("state", ""), reason):
        return ""
    if not slurm_pending.confirmed(job["id"], reason):
        return ""
    owner, meaning, change = slurm_pending.STUCK_REASONS[reason]
    return (
        f" [{reason}: {meaning.format(what=owner)}; Slurm will not start it by itself: "
        f"change {change.format(facts='the cluster file')}]"
    )


def controller_state(workdir: Path) -> str:
    """Whether a Snakemake run drives the campaign: ``alive`` (a snakemake process on this
    host working in ``workdir``), ``locked`` (none here, but a run's locks are in
    .snakemake/locks: one on another login node, or a killed one's leftovers), ``none``."""
    here = workdir.resolve()
    for proc in Path("/proc").glob("[0-9]*"):
        try:
            argv = (proc / "cmdline").read_bytes().split(b"\0")
            if not any(b"snakemake" in Path(a.decode(errors="replace")).name.encode()
                       for a in argv[:3]):  # fmt: skip
                continue
            if (proc / "cwd").resolve() == here:
                return "alive"
        except OSError:
            continue
    locks = workdir / ".snakemake" / "locks"
    return "locked" if locks.is_dir() and any(locks.iterdir()) else "none"


def _segment_of(path: Path) -> int:
    m = re.search(r"seg(\d+)", path.name)
    return int(m.group(1)) if m else 0


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def experiment_status(
    workdir: Path,
    name: str,
    prepared,
    jobs,
    now: float | None = None,
    cluster=None,
    expected_starts: dict[str, float] | None = None,
    job_times=None,
    jobs_known: bool = True,
    continue_with: str | None = None,
    model: tuple[float, str] | None = None,
    queue=None,
    queue_unread: str | None = None,
) -> ExperimentStatus:
    """``cluster``: the run's (Megatron's --transformer-impl is a weight-determining
    setting); without it that one key is not compared. ``expected_starts``: ``squeue
    --start``'s times of pending jobs, by id. ``job_times``: a job id's Slurm times
    (hpcllm.training.campaign.queue_times.job_times; None: not asked). ``jobs_known``:
    ``jobs`` is what Slurm said (else whether the campaign has stalled is not judged).
    ``continue_with``: the command that continues the campaign, for a stalled one.
    ``model``: the plan's rate (hpcllm.training.campaign.calendar.model_rate), the finish's
    before anything of the campaign measured one. ``queue``: the partition's jobs of all
    users (hpcllm.training.campaign.queue_state.read), for the next job's wait;
    ``queue_unread``: why it is None where Slurm was asked."""
    now = time.time() if now is None else now
    exp, layout = prepared.experiment, prepared.layout
    seq = exp["model"]["seq_length"]
    total = exp["segments"] * exp["iterations_per_segment"]
    save = workdir / "checkpoints" / name
    known = True  # whether the checkpoint folder can be read (the segment names its error)
    try:
        iteration = checkpoints.latest_iteration(save)
    except checkpoints.CheckpointError:
        iteration, known = None, False
    done, stale = _segments_done(
        workdir / "results" / "train" / name, exp, iteration if known else float("inf"), save
    )
    changed = _changed_settings(save, prepared, cluster) if iteration is not None else None
    if changed:
        done = 0
    layout_refused = None
    if iteration is not None and not changed and done < exp["segments"]:
        layout_refused = _layout_refusal(name, save, prepared, cluster)
    logs = sorted(
        (workdir / "logs" / "train_segment" / name).glob("seg*.engine.log"), key=_segment_of
    )
    curves = read_curves(logs, seq)
    tokens_per_second = tflops = seconds_per_iteration = log_age = logged = None
    if logs:
        log_age = max(0.0, now - max(p.stat().st_mtime for p in logs))
        rows = [r for r in parse_log_lines(logs[-1].read_text(errors="replace")) if "lm loss" in r]
        if rows:
            logged = rows[-1]["iteration"]
        # The speed: the newest line that measured one, in the newest log that has one (a
        # new attempt's log has none until its first interval: the segment before's holds).
        for log in reversed(logs):
            if log is not logs[-1]:
                rows = [
                    r for r in parse_log_lines(log.read_text(errors="replace")) if "lm loss" in r
                ]
            measured = [
                r
                for r in rows
                if isinstance(r.get("elapsed time per iteration (ms)"), float)
                and r["elapsed time per iteration (ms)"] > 0
            ]
            if measured:
                last = measured[-1]
                seconds_per_iteration = last["elapsed time per iteration (ms)"] / 1000
                batch = last.get("global batch size", layout.global_batch)
                tokens_per_second = batch * seq / seconds_per_iteration
                tflops = last.get("throughput per GPU (TFLOP/s/GPU)")
                break
    energy = log_energy(
        [r for p in logs for r in parse_log_lines(p.read_text(errors="replace")) if "lm loss" in r],
        layout.gpus,
        layout.global_batch,
        seq,
        exp.get("log_interval", 1),
    )
    # GPU-hours: every attempt of every segment, from its start to its end (or to its
    # last record for one still running or lost), times the GPUs of the layout.
    # The attempt that runs now (its Slurm job RUNNING, or its local process holding the
    # checkpoint folder's lease) counts up to now.
    running_ids = {j["id"] for j in jobs if j["state"] == "RUNNING"}
    holder = lease.read(save)
    local_pid = (
        holder.pid
        if holder and holder.host == socket.gethostname() and _alive(holder.pid)
        else None
    )
    seconds, trained, running_seconds = 0.0, 0, 0.0
    running_since = None  # when the attempt running now started
    running_logged = None  # the iteration it logged last
    running: tuple[int, attempts_mod.Attempt] | None = None  # its segment and attempt
    newest: tuple[float, attempts_mod.Attempt] | None = None  # the newest attempt of all
    failed: tuple[float, attempts_mod.Attempt] | None = None  # the newest that failed
    for path in (workdir / "logs" / "train_segment" / name).glob("seg*.attempts.json"):
        entries = attempts_mod.load(path)
        for i, a in enumerate(entries):
            end = a.ended or a.started
            if (
                a.ended is None
                and a.reached_iteration is None
                and (
                    (a.job_id and a.job_id in running_ids)
                    or (local_pid and i == len(entries) - 1 and not a.job_id)
                )
            ):
                end = now
                running_seconds += max(0.0, now - a.started)
                if running_since is None or a.started >= running_since:
                    running = (_segment_of(path), a)
                running_since = max(running_since or 0.0, a.started)
                # how far it got: its own part of the engine log
                running_logged = attempts_mod.trained_to(
                    a, path.with_name(path.name.replace(".attempts.json", ".engine.log"))
                )
            seconds += max(0.0, end - a.started)
            if a.reached_iteration is not None:
                trained += max(0, a.reached_iteration - a.start_iteration)
            if newest is None or a.started >= newest[0]:
                newest = (a.started, a)
            if a.failure and (failed is None or a.started >= failed[0]):
                failed = (a.started, a)
    # A failure is the current state only while no attempt started after it (a retry, a
    # resumed run, a restart): then it is reported as an earlier one.
    last_failure = earlier_failure = None
    refused_checkpoint = False
    if failed is not None:
        text = f"{failed[1].failure} (job {failed[1].job_id or '-'})"
        text += attempts_mod.hang_summary(failed[1])  # the watchdog's suspect, if any
        if newest is not None and newest[1] is failed[1]:
            last_failure = text
            # a checkpoint refused before training: the message names the file and the
            # way back to the newest checkpoint that verifies
            if failed[1].failure == "checkpoint_error" and failed[1].message:
                last_failure += f": {failed[1].message}"
                refused_checkpoint = True
        else:
            earlier_failure = text
    gpu_hours = seconds * layout.gpus / 3600
    train_loss = curves["train"][-1][1] if curves["train"] else None
    valid_loss = curves["valid"][-1][1] if curves["valid"] else None
    if changed:
        old = f"iteration {iteration}" + (
            f", loss {train_loss:.4f}" if train_loss is not None else ""
        )
        stale = (
            f"the checkpoints in {save} ({old}) were trained with other settings ({changed}): "
            "not this experiment's model, and the next run refuses them. Restart it from "
            f"scratch (`hpcllm restart-training {name}`), give the changed experiment a new "
            "name, or revert the settings"
        )
    if changed or (stale and iteration is None):
        # not the model the current settings train: no figure of it as the current one
        iteration = train_loss = valid_loss = log_age = energy = None
        tokens_per_second = tflops = seconds_per_iteration = None
    to_finish = _gpu_hours_to_finish(
        (seconds - running_seconds) * layout.gpus / 3600,
        trained,
        seconds_per_iteration and seconds_per_iteration * layout.gpus / 3600,
        total,
        iteration,
        running_logged,
    )
    seconds_to_finish = None
    if seconds_per_iteration is not None:
        seconds_to_finish = seconds_per_iteration * (total - (iteration or 0))
    mine = [
        f"{j['id']} {j['state']} seg{j['comment'].rsplit('_', 1)[-1]}{stuck_note(j)}"
        for j in jobs
        if j["comment"].startswith(f"rule_train_segment_wildcards_{name}_")
    ]
    # The experiment's chain (hpcllm.training.campaign.chain): the running job trains the next
    # segment, the pending one is its successor.
    from hpcllm.training.campaign.chain import job_name_of, needs_a_fix, stopped

    chain_name = job_name_of(workdir, name)
    next_k = next(
        (
            k
            for k in range(1, exp["segments"] + 1)
            if k * exp["iterations_per_segment"] > (iteration or 0)
        ),
        None,
    )
    for j in sorted(jobs, key=lambda j: int(re.sub(r"\D.*", "", j["id"]) or 0)):
        if j.get("name") != chain_name:
            continue
        # the running job trains the segment its attempt records (past that segment's last
        # checkpoint it is still that segment's job), else the next the checkpoint lacks
        k = running[0] if running and running[1].job_id == j["id"] else next_k
        what = f"seg{k}" if j["state"] == "RUNNING" and k else "next"
        after = j.get("dependency") or ""
        after = f" ({after})" if after and after != "(null)" else ""
        mine.append(f"{j['id']} {j['state']} chain {what}{after}{stuck_note(j)}")
    stop = stopped(save)
    finish = None
    if not changed and not layout_refused and done < exp["segments"]:
        ours = [
            j for j in jobs
            if j.get("name") == chain_name
            or j["comment"].startswith(f"rule_train_segment_wildcards_{name}_")
        ]  # fmt: skip
        if jobs_known and not ours and local_pid is None:
            finish = _stalled(workdir, continue_with, name, stop)
        if finish is None:
            rate_rows = None
            if running and logs and _segment_of(logs[-1]) == running[0]:
                rate_rows = parse_log_lines(logs[-1].read_text(errors="replace"))
            finish = _finish(workdir, name, exp, iteration or 0, now, jobs, chain_name,
                             running_since, logged, expected_starts, running, job_times,
                             rate_rows, model, queue, queue_unread)  # fmt: skip
    if stop:
        earlier_failure = None
        last_failure = (
            f"{stop['failure']} (job {stop['job_id'] or '-'}); the chain stopped at "
            f"segment {stop['segment']}"
        )
        if needs_a_fix(stop):  # the next run refuses to submit it again until then
            last_failure += f"; fix the cause, then `hpcllm retry-training {name}`"
    return ExperimentStatus(
        name=name,
        segments_done=done,
        segments=exp["segments"],
        iteration=iteration,
        total_iterations=total,
        tokens=(iteration or 0) * layout.global_batch * seq,
        train_loss=train_loss,
        valid_loss=valid_loss,
        tokens_per_second=tokens_per_second,
        tflops_per_gpu=tflops,
        gpu_hours=gpu_hours,
        gpu_hours_to_finish=to_finish,
        jobs=mine,
        last_failure=last_failure,
        seconds_to_finish=seconds_to_finish,
        log_age_s=log_age,
        running_gpu_hours=running_seconds * layout.gpus / 3600,
        stale=stale,
        refused_checkpoint=refused_checkpoint,
        layout_refused=layout_refused,
        earlier_failure=earlier_failure,
        wh_per_million_tokens=wh_per_million_tokens(*energy) if energy else None,
        calendar=finish,
        straggler=newest_straggler(workdir / "results" / "train" / name),
        suspect_nodes=suspect_node_lines(workdir, name),
    )


def suspect_node_lines(workdir: Path, name: str) -> tuple[str, ...]:
    """The suspect nodes' line, then one line per node excluded twice (campaign.suspects)."""
    from hpcllm.training.campaign import suspects

    found = suspects.events(
        workdir / "results" / "train" / name, workdir / "logs" / "train_segment" / name
    )
    line = suspects.suspects_line(found)
    return (line, *suspects.admin_reports(found)) if line else ()


def newest_straggler(records: Path) -> str | None:
    """The newest segment record's slowest node against the median, with its factor."""
    from hpcllm.training.campaign import stragglers

    for path in sorted(records.glob("seg*.json"), key=_segment_of, reverse=True):
        try:
            found = json.loads(path.read_text()).get("stragglers")
        except (OSError, ValueError, AttributeError):
            continue
        if found:
            return f"segment {_segment_of(path)}: {stragglers.describe(found)}"
    return None


def _gpu_hours_to_finish(
    ended_gpu_hours: float,
    trained: int,
    logged_gpu_hours_per_iteration: float | None,
    total: int,
    iteration: int | None,
    running_logged: int | None,
) -> float | None:
    """The GPU-hours left: the iterations left times the GPU-hours per iteration measured.

    The rate is that of the attempts that ended (their GPU-hours, failures included, per
    iteration they trained), constant while an attempt runs: counting the running
    attempt's hours but not yet its iterations made the figure grow through a segment and
    fall at its end. Before any attempt ended, the engine log's speed. The iterations left
    count from the running attempt's newest logged iteration (its progress), else from
    the checkpoint."""
    if iteration is None:
        return None
    if trained:
        rate = ended_gpu_hours / trained
    elif logged_gpu_hours_per_iteration:
        rate = logged_gpu_hours_per_iteration
    else:
        return None
    reached = iteration
    if running_logged is not None and iteration < running_logged <= total:
        reached = running_logged
    return rate * (total - reached)


def _stalled(workdir: Path, continue_with: str | None, name: str, stop) -> str | None:
    """The line of a campaign nothing carries on (no job of it in Slurm, none running
    here): no date. None while a Snakemake run drives it."""
    from hpcllm.training.campaign.chain import needs_a_fix

    state = controller_state(workdir)
    if state == "alive":
        return None  # between two jobs: the controller submits the next
    command = f"`{continue_with}`" if continue_with else "the workflow's command"
    if stop:
        then = f"`hpcllm retry-training {name}`, then " if needs_a_fix(stop) else ""
        return (
            f"stopped (no date): its chain stopped at segment {stop['segment']} (see last "
            f"failure) and no job of it is running or queued; continue it with {then}"
            f"{command} in {workdir}"
        )
    if state == "locked":
        return (
            "stalled (no date): no job of it is running or queued and no Snakemake run works "
            f"in {workdir} on this host, though a run's locks are in .snakemake/locks (a "
            "run on another login node, or a killed one's). If none runs, continue it with "
            f"{command} in {workdir} (after `snakemake --unlock` with the same arguments)"
        )
    return (
        "stalled (no date): no job of it is running or queued and no Snakemake run works "
        f"in {workdir}; continue it with {command} in {workdir}"
    )


def _finish(workdir, name, exp, iteration, now, jobs, chain_name, running_since, logged,
            expected_starts, running=None, job_times=None, rate_rows=None,
            model=None, queue=None, queue_unread=None) -> str:  # fmt: skip
    """The calendar's line: from the campaign's segment records, the running attempt (its
    segment, start iteration, Slurm times, its iterations so far), ``squeue --start``'s
    times for its pending jobs (in job id order) and the partition's ``queue`` (the next
    job's wait; where it is not read, ``queue_unread`` says why in the line)."""
    from hpcllm.training.campaign import calendar
    from hpcllm.training.campaign.queue_times import slurm_timestamp

    records = calendar.read_records(
        [workdir / "checkpoints" / name / "chain", workdir / "results" / "train" / name],
        exp["segments"],
    )
    ours = [
        j
        for j in sorted(jobs, key=lambda j: int(re.sub(r"\D.*", "", j["id"]) or 0))
        if j.get("name") == chain_name
        or j["comment"].startswith(f"rule_train_segment_wildcards_{name}_")
    ]
    pending = [j for j in ours if j["state"] == "PENDING"]
    if queue is not None and any(j.get("partition") not in (None, "", queue.partition)
                                 for j in ours):  # fmt: skip
        queue_unread = f"its jobs run outside partition {queue.partition}"
        queue = None
    segment, attempt = running or (None, None)
    running_rate = None
    if rate_rows is not None and attempt is not None:
        # the running attempt's own iterations (a resumed segment's log holds earlier ones)
        own = [r for r in rate_rows if r["iteration"] > attempt.start_iteration]
        running_rate = calendar.running_times(own)
    f = calendar.campaign_forecast(
        exp,
        records,
        iteration,
        now,
        model_seconds=model[0] if model else None,
        model_source=model[1] if model else "the plan's model estimate",
        layout=calendar.layout_measurement(name, workdir),
        running_since=running_since,
        running_logged=logged,
        expected_starts=[(expected_starts or {}).get(j["id"]) for j in pending],
        running_segment=segment,
        running_start_iteration=attempt.start_iteration if attempt else None,
        running_job=job_times(attempt.job_id) if job_times and attempt and attempt.job_id else None,
        running_rate=running_rate,
        pending_since=slurm_timestamp(pending[0].get("submitted")) if pending else None,
        queue=queue,
        mine=[j["id"] for j in ours],
        nodes=int(exp["layout"].get("nodes") or 1),
    )
    if f is None:
        return "expected to finish: not known yet (no segment of it has been measured)"
    return calendar.describe(f) + calendar.queue_unread_note(
        f, queue_unread if queue is None else None
    )


def _segments_done(
    results: Path, exp: dict, iteration: float | None, save: Path
) -> tuple[int, str | None]:
    """Segment records of this campaign (seg1 .. seg<segments>) that the checkpoint folder
    holds the iterations of; and why any other is not counted (records of checkpoints moved
    aside or deleted: Snakemake would not train those segments again)."""
    done, orphans = 0, []
    for k in range(1, exp["segments"] + 1):
        path = results / f"seg{k}.json"
        if not path.is_file():
            continue
        try:
            reached = json.loads(path.read_text()).get("last_iteration")
        except (OSError, ValueError, AttributeError):
            reached = None
        if isinstance(reached, int) and reached > (iteration or 0):
            orphans.append(path)
        else:
            done += 1
    if not orphans:
        return done, None
    names = ", ".join(p.name for p in orphans)
    holds = "holds no checkpoint" if iteration is None else f"holds iteration {iteration}"
    keep = ""
    if iteration is not None:
        # e.g. after a damaged checkpoint was removed and the tracker pointed back
        keep = (
            f"To train on from iteration {iteration}, keeping the campaign: run the "
            f"workflow with --forcerun {results}/{orphans[0].name} (that segment and the "
            "ones after it train again from there). To start over instead: "
        )
    return done, (
        f"{results}/{names} record iterations that {save} no longer has (it {holds}: "
        f"moved or deleted); Snakemake does not train a segment whose record exists. "
        f"{keep}`hpcllm restart-training {results.name}` moves the records aside too, so "
        "that the next run trains them all again"
    )


def _changed_settings(save: Path, prepared, cluster) -> str | None:
    """The weight-determining settings that differ from what the checkpoints in ``save``
    were trained with (``key: old -> new; ...``, or why their record is unreadable), or
    None."""
    from hpcllm.training.plan.settings import (
        SettingsChanged,
        differences,
        load_recorded,
        weight_settings,
    )

    try:
        recorded = load_recorded(save)
    except SettingsChanged as e:
        return str(e)
    if recorded is None:
        return None
    impl = None
    if cluster is not None:
        from hpcllm.models.megatron_args import transformer_impl_for

        impl = transformer_impl_for(cluster)
    current = weight_settings(prepared, impl)
    old = dict(recorded["weights"])
    if cluster is None and "layout.transformer_impl" in current:
        old["layout.transformer_impl"] = None  # the cluster's, not known here: not compared
    return "; ".join(differences(old, current)) or None


def _layout_refusal(name: str, save: Path, prepared, cluster) -> str | None:
    """Why Megatron cannot load the checkpoints in ``save`` with the experiment's layout
    (as the plan refuses it: hpcllm.training.plan.settings.layout_message), or None."""
    from hpcllm.training.plan import reshard
    from hpcllm.training.plan.settings import layout_message, load_recorded

    recorded = load_recorded(save)  # readable: _changed_settings read it
    impl = None
    if cluster is not None:
        from hpcllm.models.megatron_args import transformer_impl_for

        impl = transformer_impl_for(cluster)
    reason = reshard.layout_refusal(
        (recorded or {}).get("layout") or {}, reshard.layout_settings(prepared, impl)
    )
    return layout_message(name, save, reason, planning=True) if reason else None


def sweep_status(workdir: Path, points: dict[str, dict], jobs) -> dict[str, dict[str, Any]]:
    """Per benchmark experiment: points, done, running, failed {point: class}, held
    {point: the point holding it} (hpcllm.bench.hold: not run, not a failure of its own)."""
    out: dict[str, dict[str, Any]] = {}
    running = {
        j["comment"].split("_wildcards_", 1)[-1]
        for j in jobs
        if j["comment"].startswith("rule_bench_")
    }
    for point_id, point in points.items():
        sweep = out.setdefault(
            point.get("experiment", point["benchmark"]),
            {"points": 0, "done": 0, "running": 0, "failed": {}, "held": {}},
        )
        sweep["points"] += 1
        record = workdir / "results" / "bench" / point["benchmark"] / point_id / "run.json"
        if record.is_file():
            data = json.loads(record.read_text())
            status = data.get("status", "ok")
            if status == "ok":
                sweep["done"] += 1
            elif status == "held":
                sweep["held"][point_id] = data.get("held_by")
            else:
                sweep["failed"][point_id] = status
        elif point_id in running:
            sweep["running"] += 1
    return out


def _num(value, fmt: str) -> str:
    return "-" if value is None else format(value, fmt)


def _duration(seconds: float) -> str:
    seconds = int(round(seconds))
    if seconds < 120:
        return f"{seconds} s"
    if seconds < 2 * 3600:
        return f"{seconds // 60} min"
    if seconds < 2 * 86400:
        return f"{seconds / 3600:.1f} h"
    return f"{seconds / 86400:.1f} days"


def text_status(workdir: Path, text: dict) -> list[str]:
    """Per tokenizer and source: tokenized shards of the configured number, merged or not."""
    lines = []
    for tok in text.get("tokenize", {}).get("tokenizers", []):
        for source, cfg in text.get("sources", {}).items():
            base = workdir / "data" / "tokenized" / tok
            shards = cfg.get("shards", 1)
            done = sum(
                (base / source / f"{i:04d}_text_document.idx").is_file() for i in range(shards)
            )
            merged = (base / f"{source}_text_document.idx").is_file()
            lines.append(
                f"  {tok}/{source}: "
                + ("merged" if merged else f"{done}/{shards} shards tokenized")
            )
    return lines


def format_status(
    experiments: list[ExperimentStatus],
    sweeps: dict,
    text_lines: Sequence[str] = (),
    queue_error: str | None = None,
) -> str:
    lines = []
    if text_lines:
        lines += ["text", *text_lines]
    if experiments:
        lines.append("training")
    for e in experiments:
        lines.append(
            f"  {e.name}: {'done, ' if e.finished else ''}"
            f"{e.segments_done}/{e.segments} segments, checkpoint iteration "
            f"{_num(e.iteration, 'd')}/{e.total_iterations} ({e.tokens / 1e6:.3f} M tokens)"
            + (", refused by the last attempt (see last failure)" if e.refused_checkpoint else "")
        )
        if e.stale:
            lines.append(f"    stale files: {e.stale}")
        if e.layout_refused:
            lines.append(f"    layout refused: {e.layout_refused}")
        lines.append(
            f"    loss {_num(e.train_loss, '.4f')} (validation {_num(e.valid_loss, '.4f')}), "
            f"last segment {_num(e.tokens_per_second, ',.0f')} tokens/s, "
            f"{_num(e.tflops_per_gpu, '.1f')} TFLOP/s/GPU"
            + (
                f", {e.wh_per_million_tokens:,.1f} Wh per million tokens"
                if e.wh_per_million_tokens is not None
                else ""
            )
        )
        running = (
            f" ({e.running_gpu_hours:.2f} in the running attempt)" if e.running_gpu_hours else ""
        )
        finish = (
            ""
            if e.finished
            else f", about {_num(e.gpu_hours_to_finish, '.2f')} to finish"
            + (
                f" (about {_duration(e.seconds_to_finish)} of training at the last "
                "segment's speed, queue time not included)"
                if e.seconds_to_finish is not None
                else ""
            )
        )
        lines.append(
            f"    {e.gpu_hours:.2f} GPU-hours spent{running}{finish}; jobs: "
            f"{queue_error or ', '.join(e.jobs) or 'none'}"
            + (f"; last failure: {e.last_failure}" if e.last_failure else "")
            + (
                f"; an earlier attempt failed ({e.earlier_failure}), later ones ran"
                if e.earlier_failure
                else ""
            )
        )
        if e.calendar and not e.finished:
            lines.append(f"    {e.calendar}")
        if e.straggler:
            lines.append(f"    {e.straggler}")
        lines += [f"    {x}" for x in e.suspect_nodes]
        if e.log_age_s is not None and not e.finished:
            lines.append(f"    newest engine log line: {_duration(e.log_age_s)} ago")
    if sweeps:
        lines.append("benchmarks")
    for name, s in sweeps.items():
        failed = ", ".join(f"{p} ({c})" for p, c in s["failed"].items()) or "none"
        held = ", ".join(f"{p} (by {b})" for p, b in s.get("held", {}).items())
        lines.append(
            f"  {name}: {s['done']}/{s['points']} points done, {s['running']} running, "
            f"failed: {failed}" + (f", held: {held}" if held else "")
        )
    return "\n".join(lines) if lines else "nothing configured"


def vocab_size(prepared, text: dict) -> int:
    """The vocabulary the plan counts an iteration's FLOPs with (training_functions.smk)."""
    tokenizer = text.get("tokenizers", {}).get(prepared.experiment["data"]["tokenizer"], {})
    return prepared.experiment["model"].get("vocab_size") or tokenizer.get("vocab_size") or 50257


def campaign_status(
    workdir: str | Path = ".",
    configfiles: Sequence[str] = (),
    profile: str | None = None,
    jobs: list[dict[str, str]] | None = None,
    starts: dict[str, float] | None = None,
) -> str:
    """``jobs``, ``starts``: squeue's jobs and their ``--start`` times (asked when None)."""
    from hpcllm.bench.sweeps import expand_all, facts_of
    from hpcllm.clusters import load_cluster
    from hpcllm.training.plan.experiment import prepare_experiment

    workdir = Path(workdir)
    config = load_config(workdir, configfiles, profile)
    repo = Path(__file__).resolve().parents[4]
    clusters = workdir / "config" / "clusters"
    cluster = load_cluster(
        config["cluster"], root=clusters if clusters.is_dir() else repo / "config" / "clusters"
    )
    from hpcllm.training.campaign import calendar, queue_times

    queue_error, starts, job_times = None, starts or {}, None
    queue, queue_unread = None, None
    if jobs is None:
        jobs = []
        if cluster.uses_slurm:
            try:
                jobs = slurm_jobs()
                job_times = queue_times.job_times
            except SlurmQueryError as e:
                queue_error = str(e)
            if any(j["state"] == "PENDING" for j in jobs):
                starts = queue_times.expected_starts()
            if queue_error is None:
                queue, queue_unread = _partition_queue(jobs, cluster)
    training = config["training"]
    names = training.get("run") or list(training["experiments"])
    command = " ".join(
        ["snakemake"]
        + ([f"--profile {profile}"] if profile else [])
        + ([f"--configfile {' '.join(configfiles)}"] if configfiles else [])
    )
    experiments = []
    for name in names:
        prepared = prepare_experiment(
            name, training["experiments"][name], config["text"], cluster, workdir
        )
        experiments.append(
            experiment_status(
                workdir,
                name,
                prepared,
                jobs,
                cluster=cluster,
                expected_starts=starts,
                job_times=job_times,
                jobs_known=queue_error is None,
                continue_with=command,
                queue=queue,
                queue_unread=queue_unread,
                model=calendar.model_rate(
                    prepared, cluster, vocab_size(prepared, config["text"]), workdir
                ),
            )
        )
    bench = config["benchmarks"]
    points = {}
    if bench.get("experiments"):
        from hpcllm.configuration import load_schema

        schema = load_schema(repo / "workflow/schemas/benchmarks.schema.yaml")
        points = {
            p.id: p.row()
            for p in expand_all(bench["experiments"], facts_of(cluster), workdir, schema)
        }
    return format_status(
        experiments,
        sweep_status(workdir, points, jobs),
        text_status(workdir, config["text"]),
        queue_error,
    )
