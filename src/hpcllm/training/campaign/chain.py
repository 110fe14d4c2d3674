"""A training campaign that Slurm carries through its segments without a Snakemake controller.

The official Slurm plugin sees one job at a time and cannot set dependencies (plugin
issues 133 and 109, snakemake issue 4084), so a campaign that must outlive its controller
(kill -9, logout, a login-node reboot) is a chain of our own jobs:

- ``start`` writes the campaign file ``checkpoints/<experiment>/chain/campaign.pickle``
  (the prepared experiment, the cluster, paths, container, the sbatch arguments of a
  segment job) and submits the chain's first job.
- Every chain job (``python -m hpcllm.training.campaign.chain step <campaign file>``) first submits
  its own successor with ``--dependency=afterany:<its own job id>``: a job killed by
  SIGKILL, a failed node or a time limit still has a successor, which classifies the dead
  attempt from Slurm's state (:func:`hpcllm.training.campaign.attempts.classify_unfinished`). It
  then trains the next segment whose target the checkpoint has not reached
  (:func:`hpcllm.training.campaign.segment.run_segment`: the lease, the settings check, the
  attempts file; never Snakemake's records). At its end it cancels its successor when the
  campaign is complete, or when the next attempt would be refused (a deterministic class,
  an attempt that ran until its time limit and added no iteration, ``max_attempts`` of the
  segment used): so after a deterministic failure in segment 2, segment 3 never starts on
  GPUs. At most two jobs of an experiment are in Slurm at once, and the successor waits for
  its predecessor to end: one writer per checkpoint folder, which the lease guarantees
  anyway. The job that trains a segment keeps its record's copy in ``chain/seg<k>.json``
  (:mod:`hpcllm.training.campaign.records`), which the controller copies back.
- A stopped chain leaves ``chain/stopped.json`` (segment, class, job id, message); the
  jobs submitted are logged in ``chain/jobs.jsonl``.
- The controller run again (:func:`wait_for_segment`) submits nothing while the chain is
  in Slurm: it says what it found and waits. After a stop another chain would repeat
  (:func:`needs_a_fix`) it refuses to submit, naming class and job id, until the user
  clears the stop (:func:`retry_training`, ``hpcllm retry-training``); after any other
  stop it submits a new chain and says why.

Compute nodes must be allowed to call ``sbatch`` for that. No site document of the
clusters here says so either way (JSC's and LUMI's user docs describe job chains submitted
from the login node only); the site probe asks (hpcllm.training.campaign.chain_site). Where they
may not, ``ensure`` submits the whole chain up front (``Campaign.up_front``: a job per
segment left and ``max_attempts - 1`` spares, each ``afterok`` the one before,
``singleton`` and ``--kill-on-invalid-dep``); its jobs call no sbatch or scancel. A job
ends with status 0 where the chain goes on (its segment trained, or stopped for a
transient reason the next job retries) and fails where it ends the chain (a stop, a spare
that finds the campaign complete): Slurm then cancels every later job, and a user's plain
``scancel`` of the running job does the same; nothing is left to start on GPU nodes.
(A job Slurm itself ends, at its time limit or a node failure, also ends the chain: the
controller, while alive, submits it anew, as after any other stop.) Where
a node refuses unexpectedly, the successor's submission fails loudly: the job logs the
error, finishes its segment and then fails (the chain stops there), and ``ensure`` (the
controller's rule, run again) submits the chain anew.
"""

from __future__ import annotations

import argparse
import contextlib
import fcntl
import json
import logging
import os
import pickle
import re
import shlex
import subprocess
import sys
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from types import SimpleNamespace
from typing import Any

from hpcllm import slurm_pending
from hpcllm.atomic import atomic_path
from hpcllm.failures.classify import classify_text, is_transient
from hpcllm.launch import clean_environment as _clean_environment
from hpcllm.training.campaign import attempts, records, signal_lead
from hpcllm.training.campaign.chain_listing import (
    LISTED,
    ChainError,
    live_jobs,
    squeue_listing,
)

# re-exported: status and the tests ask the chain for its jobs' name and live states
from hpcllm.training.campaign.chain_listing import LIVE_STATES as LIVE_STATES
from hpcllm.training.campaign.chain_listing import job_name_of as job_name_of
from hpcllm.training.checkpoints import lease
from hpcllm.training.checkpoints import tracker as checkpoints

log = logging.getLogger(__name__)

CHAIN = "chain"
CAMPAIGN = "campaign.pickle"
STOPPED = "stopped.json"
JOBS = "jobs.jsonl"
# A chain's stop when a job outside it (e.g. a plugin job) writes the checkpoint folder.
LEASE_HELD = "lease_held"


class ChainStopped(RuntimeError):
    """The chain stopped before the segment was committed; the message names class and job."""


@dataclass
class Campaign:
    """What a chain job needs to train the next segment (pickled into the campaign file)."""

    name: str
    prepared: Any  # hpcllm.training.plan.experiment.Prepared
    cluster: Any  # hpcllm.clusters.Cluster
    workdir: str  # absolute; paths below are relative to it
    container: str | None
    sbatch: list[str]  # the segment job's geometry (the plugin's own sbatch line)
    max_attempts: int
    python: str = sys.executable
    chain_id: str = ""  # set when a chain is submitted; attempts before it are not counted
    started: float = 0.0
    environment: dict[str, str] = field(default_factory=dict)
    # The names of the variables the chain was submitted with (set by ensure on the login
    # node): a chain job passes on only these, not what its own job added (None: older
    # campaign files, which pass on all but Slurm's).
    exported: tuple[str, ...] | None = None
    # Where compute nodes may not call sbatch (hpcllm.training.campaign.chain_site): every job of
    # the chain is submitted at once from the login node, each after the one before.
    up_front: bool = False

    @property
    def save(self) -> str:
        return f"checkpoints/{self.name}"

    def folder(self) -> Path:
        return Path(self.workdir) / self.save / CHAIN

    def file(self) -> Path:
        return self.folder() / CAMPAIGN

    def paths(self, segment: int):
        from hpcllm.training.plan.experiment import Paths

        return Paths(
            save=self.save,
            record=f"results/train/{self.name}/seg{segment}.json",
            engine_log=f"logs/train_segment/{self.name}/seg{segment}.engine.log",
            data_cache=f"data/index_cache/{self.name}",
            tensorboard=f"{self.save}/tensorboard",
        )

    @property
    def segments(self) -> int:
        return self.prepared.experiment["segments"]

    def target(self, segment: int) -> int:
        return segment * self.prepared.experiment["iterations_per_segment"]

    def job_name(self) -> str:
        """One name per checkpoint folder (two checkouts may train the same experiment)."""
        return job_name_of(self.workdir, self.name)


# Campaign files written before training's rooms name these classes at their old paths;
# a chain already queued in Slurm reads its file with the code of now.
_MOVED = {
    "hpcllm.training.chain": "hpcllm.training.campaign.chain",
    "hpcllm.training.segment": "hpcllm.training.plan.experiment",
    "hpcllm.training.planner": "hpcllm.models.planner",
    "hpcllm.training.data": "hpcllm.training.plan.data",
}


class _Unpickler(pickle.Unpickler):
    def find_class(self, module: str, name: str) -> Any:
        return super().find_class(_MOVED.get(module, module), name)


def load(path: str | os.PathLike) -> Campaign:
    """The campaign file; ChainError naming it and the way out when it cannot be read
    (truncated, edited, not a campaign), instead of a raw UnpicklingError."""
    try:
        with open(path, "rb") as f:
            campaign = _Unpickler(f).load()
    except FileNotFoundError:
        raise
    except (OSError, pickle.UnpicklingError, EOFError, AttributeError, ImportError,
            IndexError, KeyError, TypeError, ValueError) as e:  # fmt: skip
        raise ChainError(_unreadable_campaign(path, f"{type(e).__name__}: {e}")) from None
    # by name: a chain job runs this module as __main__, whose Campaign is another class
    if type(campaign).__name__ != Campaign.__name__:
        raise ChainError(_unreadable_campaign(path, f"holds a {type(campaign).__name__}"))
    return campaign


def _unreadable_campaign(path: str | os.PathLike, why: str) -> str:
    name = Path(path).parent.parent.name
    return (
        f"{path}: not a readable campaign file ({why}). The workflow writes it when it "
        f"submits a chain: `hpcllm cancel-training {name}`, then run the workflow again; it "
        "submits the chain anew from the newest checkpoint and writes the file afresh"
    )


def save(campaign: Campaign) -> None:
    campaign.folder().mkdir(parents=True, exist_ok=True)
    with atomic_path(campaign.file()) as tmp:
        tmp.write_bytes(pickle.dumps(campaign))


def committed_iteration(save: str | os.PathLike) -> int:
    """The iteration the tracker names (0 without one), as an observer sees it while a
    job writes: a save in progress (an ``iter_*`` before its tracker) is not committed.
    The segment itself checks the folder strictly before it loads anything."""
    try:
        return int((Path(save) / checkpoints.TRACKER).read_text().strip())
    except (FileNotFoundError, ValueError):
        return 0


def next_segment(campaign: Campaign) -> int | None:
    """The first segment whose target the committed checkpoint has not reached."""
    reached = committed_iteration(Path(campaign.workdir) / campaign.save)
    for k in range(1, campaign.segments + 1):
        if campaign.target(k) > reached:
            return k
    return None


# ---- submitting


def sbatch_geometry(
    resources: Mapping[str, Any],
    threads: int = 1,
    settings: Any = None,
) -> list[str]:
    """The sbatch options the official plugin would give a job with these resources
    (its own ``get_submit_command`` and ``set_gres_string``), without its job name, log,
    comment, working directory and command, which the chain sets itself. The plugin's
    ``exclude_failed_nodes`` setting becomes its ``--exclude``, as for its own jobs."""
    from snakemake_executor_plugin_slurm.submit_string import get_submit_command
    from snakemake_executor_plugin_slurm.utils import set_gres_string

    class _Resources(dict):
        __getattr__ = dict.get

    res = _Resources({k: v for k, v in resources.items() if v is not None})
    job = SimpleNamespace(resources=res, threads=threads)
    account = f" -A {shlex.quote(str(res['slurm_account']))}" if res.get("slurm_account") else ""
    partition = (
        f" -p {shlex.quote(str(res['slurm_partition']))}" if res.get("slurm_partition") else ""
    )
    params = {
        "run_uuid": "X",
        "slurm_logfile": "X",
        "comment_str": "X",
        "account": account,
        "partition": partition,
        "workdir": None,
    }
    excluded = getattr(settings, "exclude_failed_nodes", None) or ""
    failed_nodes = sorted({n.strip() for n in excluded.split(",") if n.strip()})
    call = get_submit_command(job, params, settings=settings, failed_nodes=failed_nodes)
    call += set_gres_string(job)
    words = shlex.split(call)
    assert words[:8] == ["sbatch", "--parsable", "--job-name", "X", "--output", "X"] + [
        "--export=ALL",
        "--comment",
    ], words
    return words[9:]


def submit_environment(
    campaign: Campaign, environ: Mapping[str, str] = os.environ
) -> dict[str, str]:
    """The environment a chain job is submitted with (``--export=ALL``): the submitter's,
    without Slurm's variables and, in a chain job, without those its job added (the
    GPUs Slurm gave it, thread counts, offline switches); plus the campaign's own."""
    env = _clean_environment(environ)
    if campaign.exported is not None:
        keep = set(campaign.exported) | {"SLURM_CONF"}
        env = {k: v for k, v in env.items() if k in keep}
    return {**env, **campaign.environment}


def submit(campaign: Campaign, after: str | None = None) -> str:
    """Submit one chain job (after job ``after`` ended, whatever its state); its id.

    ``singleton``: no two jobs of the chain (one name per checkpoint folder) run at once,
    even if a requeued job had submitted a second successor."""
    logs = Path(campaign.workdir) / f"logs/train_segment/{campaign.name}/chain"
    logs.mkdir(parents=True, exist_ok=True)
    command = (
        f"{shlex.quote(campaign.python)} -m hpcllm.training.campaign.chain step "
        f"{shlex.quote(str(campaign.file()))}"
    )
    argv = [
        "sbatch",
        "--parsable",
        "--job-name",
        campaign.job_name(),
        "--output",
        str(logs / "%j.log"),
        "--export=ALL",
        "--comment",
        f"hpcllm_chain_{campaign.name}",
        # the --signal lead for the saves measured so far (the campaign's is its start's)
        *signal_lead.with_lead(
            campaign.sbatch, campaign.prepared.experiment, Path(campaign.workdir) / campaign.save
        ),
        "-D",
        campaign.workdir,
    ]
    if not after:
        argv.append("--dependency=singleton")
    elif campaign.up_front:
        # Up front, a job that ends the chain (a stop, a scancel, the campaign found
        # complete) exits non-zero or is cancelled: Slurm cancels every job after it, as
        # no job here may call scancel. A job that stopped for a transient reason exits 0
        # and the next retries.
        argv += [f"--dependency=afterok:{after},singleton", "--kill-on-invalid-dep=yes"]
    else:
        argv.append(f"--dependency=afterany:{after},singleton")
    argv += ["--wrap", command]
    env = submit_environment(campaign)
    try:
        proc = subprocess.run(argv, capture_output=True, text=True, env=env, timeout=120)
    except (OSError, subprocess.TimeoutExpired) as e:
        raise ChainError(f"sbatch could not be run ({e}): {shlex.join(argv)}") from e
    if proc.returncode != 0:
        raise ChainError(
            f"sbatch failed ({proc.returncode}): {proc.stderr.strip() or proc.stdout.strip()}; "
            f"the command was: {shlex.join(argv)}"
        )
    job_id = proc.stdout.strip().split(";")[0]
    _log_job(campaign, job_id, after)
    return job_id


def _log_job(campaign: Campaign, job_id: str, after: str | None) -> None:
    entry = {"job": job_id, "after": after, "chain": campaign.chain_id, "time": time.time()}
    with open(campaign.folder() / JOBS, "a") as f:
        f.write(json.dumps(entry) + "\n")


def submitted_jobs(save: str | os.PathLike) -> list[dict[str, Any]]:
    path = Path(save) / CHAIN / JOBS
    if not path.is_file():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def chain_jobs(
    job_name: str, shared: Path | None = None, max_age: float = 0.0, timeout: float = 60
) -> list[dict[str, str]]:
    """This user's live jobs of a chain: id, state, dependency, reason, name. From one
    squeue of all this user's jobs (given ``timeout`` seconds); with ``shared`` (a file of
    the run), a listing younger than ``max_age`` seconds that another experiment's waiting
    controller job wrote is read instead, so the login node sees one squeue per interval
    for all experiments."""
    listing = _shared_listing(shared, max_age) if shared else squeue_listing(timeout)
    return live_jobs(listing, job_name)


def _shared_listing(path: Path, max_age: float) -> list[dict[str, str]]:
    """The listing in ``path`` if younger than ``max_age`` seconds, else a new one written
    there (``max_age`` 0: always new); under a lock, so waiters that wake together run one
    squeue."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path.with_suffix(".lock"), "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        cached = _cached_listing(path)
        if cached is not None and 0 <= time.time() - cached[0] < max_age:
            return cached[1]
        jobs = squeue_listing()
        with atomic_path(path) as tmp:
            tmp.write_text(json.dumps({"time": time.time(), "jobs": jobs}))
        return jobs


def _cached_listing(path: Path) -> tuple[float, list[dict[str, str]]] | None:
    """The time and jobs of the shared listing; None without one. A malformed one (a cache:
    the next squeue rewrites it) is ignored with a one-line warning naming it."""
    try:
        cached = json.loads(path.read_text())
        jobs = cached["jobs"]
        if not isinstance(cached["time"], (int, float)) or not isinstance(jobs, list):
            raise TypeError("'time' is not a number or 'jobs' not a list")
        for job in jobs:
            if not all(isinstance(job.get(k), str) for k in LISTED):
                raise TypeError(f"a job without its {', '.join(LISTED)} as text: {job!r:.80}")
    except FileNotFoundError:
        return None
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as e:
        log.warning("%s: ignored, not a squeue listing (%s); asking squeue anew", path, e)
        return None
    return float(cached["time"]), jobs


def cancel(job_ids: list[str]) -> None:
    if job_ids:
        subprocess.run(["scancel", *job_ids], capture_output=True, text=True, timeout=60)


@contextlib.contextmanager
def _locked(folder: Path) -> Iterator[None]:
    folder.mkdir(parents=True, exist_ok=True)
    with open(folder / "chain.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        yield


def ensure(campaign: Campaign) -> tuple[str, list[dict[str, str]]]:
    """Make sure the experiment's chain is in Slurm: ``("running", jobs)`` when it already
    is (a controller reattaching), ``("complete", [])`` when every segment is committed,
    else a new chain is submitted: ``("submitted", jobs)``. A new chain has a fresh
    attempt budget (as a new Snakemake run had). A chain that stopped for a failure
    another chain would repeat is not submitted again (:class:`ChainStopped`) until
    :func:`retry_training` clears its stop."""
    with _locked(campaign.folder()):
        live = chain_jobs(campaign.job_name())
        if live:
            return "running", live
        if next_segment(campaign) is None:
            return "complete", []
        stop = stopped(Path(campaign.workdir) / campaign.save)
        # (a stop at a segment committed since, e.g. by a run without the chain, is past)
        if stop and needs_a_fix(stop) and next_segment(campaign) <= stop["segment"]:
            raise ChainStopped(refusal_message(campaign, stop))
        campaign.started = time.time()
        campaign.chain_id = f"{campaign.started:.6f}"
        campaign.exported = tuple(sorted(_clean_environment(os.environ)))
        with contextlib.suppress(FileNotFoundError):
            (campaign.folder() / STOPPED).unlink()
        save(campaign)
        if not campaign.up_front:
            job = submit(campaign)
            return "submitted", [{"id": job, "state": "PENDING", "dependency": "", "reason": ""}]
        jobs, after = [], None
        for _ in range(up_front_jobs(campaign)):
            after = submit(campaign, after=after)
            jobs.append({"id": after, "state": "PENDING", "dependency": "", "reason": ""})
        return "submitted", jobs


def up_front_jobs(campaign: Campaign) -> int:
    """Jobs of a chain submitted up front: one per segment still to train, and the
    segment's retries (``max_attempts - 1``) as spares for the whole campaign. Each job
    that finds the campaign complete or stopped ends within seconds; the controller, where
    it is alive, cancels them first."""
    first = next_segment(campaign)
    remaining = 0 if first is None else campaign.segments - first + 1
    return remaining + campaign.max_attempts - 1


def stopped(save: str | os.PathLike) -> dict[str, Any] | None:
    path = Path(save) / CHAIN / STOPPED
    try:
        return json.loads(path.read_text())
    except (FileNotFoundError, ValueError):
        return None


def needs_a_fix(stop: Mapping[str, Any]) -> bool:
    """Whether a chain's stop is one another chain would repeat: a deterministic class
    (out_of_memory, missing_file, config_error, error). A user's ``scancel``
    (``cancelled``), a used-up attempt budget, a lease held by a job outside the chain
    (``lease_held``) and an attempt that added no iteration after a transient class are
    not: the next run submits the chain anew, as a new
    Snakemake run starts a new chain of attempts without ``training.chain``."""
    failure = stop.get("failure")
    return not is_transient(failure) and failure not in ("cancelled", "max_attempts", LEASE_HELD)


def describe_stop(name: str, stop: Mapping[str, Any]) -> str:
    return (
        f"the chain of {name} stopped at segment {stop['segment']}: {stop['failure']} in "
        f"Slurm job {stop.get('job_id') or '-'}: "
        + (stop.get("message") or "see its log").rstrip(". ")
    )


def refusal_message(campaign: Campaign, stop: Mapping[str, Any]) -> str:
    reached = committed_iteration(Path(campaign.workdir) / campaign.save)
    return (
        f"{describe_stop(campaign.name, stop)}. Not submitted again: another chain would "
        f"repeat the {stop['failure']} on GPUs (logs/train_segment/{campaign.name}/chain/"
        f"{stop.get('job_id') or '<job id>'}.log). Fix the cause, then run `hpcllm "
        f"retry-training {campaign.name}` in the workflow's directory and the workflow "
        f"again: it submits the chain anew, from checkpoint iteration {reached}."
    )


def retry_training(workdir: str | os.PathLike, name: str) -> dict[str, Any] | None:
    """Clear the experiment's chain stop (kept as ``stopped.<time>.json``) so that the next
    run submits the chain anew; the stop cleared, or None when there was none."""
    folder = Path(workdir) / "checkpoints" / name / CHAIN
    stop = stopped(folder.parent)
    if stop is None:
        return None
    (folder / STOPPED).rename(folder / f"stopped.{int(stop.get('time') or time.time())}.json")
    return stop


# A chain job's exit status that ends a chain submitted up front: its later jobs depend
# on it with afterok and --kill-on-invalid-dep, so Slurm cancels them all.
ENDS_CHAIN = 3
ENDS_UP_FRONT = (
    "this job ends the chain with exit status %d: Slurm cancels the jobs submitted after "
    "it (afterok, --kill-on-invalid-dep)"
)


def _stop(campaign: Campaign, segment: int, failure: str, job: str | None, message: str) -> None:
    entry = {
        "chain": campaign.chain_id,
        "segment": segment,
        "failure": failure,
        "job_id": job,
        "message": message,
        "time": time.time(),
    }
    with atomic_path(campaign.folder() / STOPPED) as tmp:
        tmp.write_text(json.dumps(entry, indent=2) + "\n")
    log.error("the chain of %s stopped at segment %d: %s", campaign.name, segment, message)
    if campaign.up_front:
        log.info(
            "up front: Slurm cancels the chain's later jobs as this one fails; `hpcllm "
            "cancel-training %s` on the login node cancels any left",
            campaign.name,
        )


def attempt_number(campaign: Campaign, segment: int) -> int:
    """This chain's attempt at ``segment`` (1 for its first): attempts recorded since the
    chain was submitted, plus one."""
    path = attempts.attempts_path(Path(campaign.workdir) / campaign.paths(segment).engine_log)
    return 1 + sum(1 for a in attempts.load(path) if a.started >= campaign.started)


# ---- a chain job


def step(campaign_file: str | os.PathLike, environ: Mapping[str, str] = os.environ) -> int:
    """Train the campaign's next segment as one job of its chain (see the module's doc)."""
    from hpcllm.training.campaign.segment import SegmentIncomplete, SegmentRefused, run_segment

    campaign = load(campaign_file)
    os.chdir(campaign.workdir)
    me = environ.get("SLURM_JOB_ID")
    segment = next_segment(campaign)
    if segment is None:
        log.info("%s: every segment is committed; nothing to train", campaign.name)
        if campaign.up_front:  # a spare: ending with this status cancels the ones after it
            log.info(ENDS_UP_FRONT, ENDS_CHAIN)
            return ENDS_CHAIN
        return 0
    done = stopped(campaign.save)
    if done and done.get("chain") == campaign.chain_id:
        if campaign.up_front:  # a job after a stop that Slurm has not cancelled yet
            log.info("%s; this job trains nothing", describe_stop(campaign.name, done))
            log.info(ENDS_UP_FRONT, ENDS_CHAIN)
            return ENDS_CHAIN
        log.error("the chain of %s stopped before (%s); not training", campaign.name, done)
        return 1
    successor, successor_error = None, None
    try:
        # (up front: the next job is in Slurm already; this node may not call sbatch)
        successor = _successor(campaign, me, environ) if me and not campaign.up_front else None
    except ChainError as e:
        # Loud: the chain ends with this job; the controller run again submits it anew.
        successor_error = str(e)
        log.error("the successor of job %s could not be submitted: %s", me, e)
    attempt = attempt_number(campaign, segment)
    record_file = attempts.attempts_path(campaign.paths(segment).engine_log)
    status = 0
    try:
        if attempt > campaign.max_attempts:
            raise SegmentRefused(
                f"segment {segment} of {campaign.name}: {attempt - 1} attempts used "
                f"(training.max_attempts = {campaign.max_attempts}); look at "
                f"{record_file} and the engine log, then rerun"
            )
        run_segment(
            campaign.name,
            campaign.prepared,
            segment,
            campaign.paths(segment),
            campaign.cluster,
            container=campaign.container,
            attempt=attempt,
            excluded=own_exclusion(me),
        )
    except SegmentRefused as e:
        last = attempts.current_chain(attempts.load(record_file))
        failure, job = "max_attempts", me
        if last and attempt <= campaign.max_attempts:
            failure = last[-1].failure or attempts.classify_unfinished(
                last[-1], attempts.slurm_state(last[-1].job_id)
            )
            job = last[-1].job_id
        _stop(campaign, segment, failure, job, str(e))
        cancel([successor] if successor else [])
        return 1
    except SegmentIncomplete as e:
        status = 1
        log.error("%s", e)
        reached = committed_iteration(campaign.save)
        why = attempts.refusal(attempts.load(record_file), attempt + 1, reached)
        if why is None and attempt + 1 > campaign.max_attempts:
            why = f"{attempt} attempts used (training.max_attempts = {campaign.max_attempts})"
        if why or not is_transient(e.failure):
            _stop(campaign, segment, e.failure, me, f"{e}; {why or ''}".rstrip("; "))
            cancel([successor] if successor else [])
            return status
        if campaign.up_front:  # the next job in Slurm retries: it must not be cancelled
            log.info("the next job of the chain retries segment %d", segment)
            status = 0
    except lease.LeaseHeld as e:
        return _lease_held(campaign, segment, me, successor, e)
    except Exception as e:
        # run_segment recorded this attempt's class (e.g. missing_file for a data file
        # gone) unless it failed before it could
        entries = attempts.load(record_file)
        failure = entries[-1].failure if entries and entries[-1].job_id == me else None
        failure = failure or classify_text(f"{type(e).__name__}: {e}") or "error"
        _stop(campaign, segment, failure, me, f"{type(e).__name__}: {e}")
        cancel([successor] if successor else [])
        raise
    if next_segment(campaign) is None:
        log.info("%s: the campaign is complete", campaign.name)
        cancel([successor] if successor else [])
    else:  # the next job avoids what this one found (a hung rank's node, a straggler)
        exclude_in_successor(campaign, successor or _up_front_successor(campaign, me))
    if successor_error:
        raise ChainError(
            f"the chain of {campaign.name} ends with job {me}: its successor could not be "
            f"submitted ({successor_error}). Run the workflow again (or `python -m "
            f"hpcllm.training.campaign.chain resume {campaign.file()}`) to continue it."
        )
    return status


def _successor(campaign: Campaign, me: str, environ: Mapping[str, str]) -> str:
    """This job's successor: the one it submitted already if Slurm requeued it (after a
    node failure Slurm runs a job again under the same id, by default), else a new one."""
    earlier = [
        e["job"]
        for e in submitted_jobs(campaign.save)
        if e.get("after") == me and e.get("chain") == campaign.chain_id
    ]
    if earlier:
        with contextlib.suppress(ChainError):  # squeue failing: submit (singleton holds)
            live = [e for e in earlier if e in {j["id"] for j in chain_jobs(campaign.job_name())}]
            if live:
                log.info(
                    "job %s runs again (Slurm restart %s): its successor, job %s, is in "
                    "Slurm already; none submitted",
                    me,
                    environ.get("SLURM_RESTART_COUNT", "?"),
                    live[-1],
                )
                return live[-1]
    successor = submit(campaign, after=me)
    log.info("successor submitted: job %s (after job %s ends)", successor, me)
    return successor


# ---- suspect nodes: kept off the next job (as the train_segment rule's slurm_extra does)


def nodes_to_avoid(campaign: Campaign, segment: int) -> list[str]:
    """The nodes the job that trains ``segment`` next should avoid: the campaign's own
    ``--exclude`` (the plugin's ``exclude_failed_nodes``), the straggler the record of
    the segment before names beyond the cluster's factor, and the node of each hang of
    this chain's attempts at ``segment`` (:func:`attempts.suspect_nodes`)."""
    from hpcllm.training.campaign import stragglers

    nodes = attempts.excluded_nodes(" ".join(campaign.sbatch))
    workdir = Path(campaign.workdir)
    if segment > 1:
        nodes += stragglers.nodes_to_exclude(workdir / campaign.paths(segment - 1).record)
    path = attempts.attempts_path(workdir / campaign.paths(segment).engine_log)
    mine = [a for a in attempts.load(path) if a.started >= campaign.started]
    nodes += attempts.suspect_nodes(mine, len(mine) + 1)
    return list(dict.fromkeys(nodes))


def exclude_in_successor(campaign: Campaign, successor: str | None) -> list[str]:
    """Once this job's segment ended, its successor (pending: submitted before the segment
    ran, or up front) is told to avoid the suspect nodes for the segment it will train
    (``scontrol update ExcNodeList``, which replaces the list: the campaign's own
    exclusions are in it). The nodes it was told; none where nothing new is suspect. A
    refusal (a site that lets no compute node change a job) is logged, not fatal: the
    successor then runs where Slurm puts it, as before."""
    segment = next_segment(campaign)
    if not successor or segment is None:
        return []
    nodes = nodes_to_avoid(campaign, segment)
    if nodes == attempts.excluded_nodes(" ".join(campaign.sbatch)):
        return []
    argv = ["scontrol", "update", f"JobId={successor}", f"ExcNodeList={','.join(nodes)}"]
    try:
        proc = subprocess.run(argv, capture_output=True, text=True, timeout=60)
        refused = (proc.stderr.strip() or proc.stdout.strip()) if proc.returncode else None
    except (OSError, subprocess.TimeoutExpired) as e:
        refused = str(e)
    if refused is not None:
        log.warning(
            "job %s (segment %d) could not be kept off %s: `%s` failed (%s); it runs where "
            "Slurm puts it", successor, segment, ", ".join(nodes), shlex.join(argv), refused,
        )  # fmt: skip
        return []
    log.info("job %s (segment %d) excludes %s", successor, segment, ", ".join(nodes))
    return nodes


def own_exclusion(job_id: str | None) -> list[str] | None:
    """The nodes Slurm was told to keep this job off (its ExcNodeList, as ``scontrol
    show job`` has it), for the attempt's record; None outside Slurm or unknown."""
    if not job_id:
        return None
    try:
        # `scontrol show`, no option before it: where compute nodes may not call Slurm
        # (an up-front chain) a site may still let them read it, as the tests' stand-in does
        proc = subprocess.run(["scontrol", "show", "job", job_id],
                              capture_output=True, text=True, timeout=60)  # fmt: skip
    except (OSError, subprocess.TimeoutExpired):
        return None
    found = re.search(r"(?:^|\s)ExcNodeList=(\S+)", proc.stdout) if proc.returncode == 0 else None
    if not found or found.group(1) == "(null)":
        return None
    listed = subprocess.run(["scontrol", "show", "hostnames", found.group(1)],
                            capture_output=True, text=True, timeout=60)  # fmt: skip
    return (listed.stdout.split() or None) if listed.returncode == 0 else None


def _up_front_successor(campaign: Campaign, me: str | None) -> str | None:
    """In a chain submitted up front, the job submitted after this one."""
    if not me or not campaign.up_front:
        return None
    after = [e["job"] for e in submitted_jobs(Path(campaign.workdir) / campaign.save)
             if e.get("after") == me and e.get("chain") == campaign.chain_id]  # fmt: skip
    return after[-1] if after else None


def _lease_held(
    campaign: Campaign, segment: int, me: str | None, successor: str | None, e: Exception
) -> int:
    """Another live job holds the checkpoint folder's lease: nothing was trained, and no
    failure of the campaign (a held lease is not classed ``error``, which would stop the
    chain for good). A holder of this chain (a second head, e.g. from a requeue) goes on
    and this job's successor waits for it (singleton); a holder outside the chain stops
    it with ``lease_held``, which the next run submits anew."""
    holder = lease.read(campaign.save)
    holder_id = holder.job_id if holder else None
    try:
        ours = holder_id in {j["id"] for j in chain_jobs(campaign.job_name())}
    except ChainError:
        ours = False
    if ours:
        log.warning(
            "job %s of this chain writes %s: job %s trains nothing; its successor %s "
            "continues the chain after it",
            holder_id,
            campaign.save,
            me,
            successor,
        )
        return 0
    _stop(campaign, segment, LEASE_HELD, me, str(e))
    cancel([successor] if successor else [])
    return 1


# ---- on the login node


def commit_record(campaign: Campaign, segment: int, settled: bool = False) -> bool:
    """Write segment ``segment``'s result record from its kept copy when the checkpoint
    reached its target and was trained with the current settings; whether it did.
    ``settled``: no chain job runs, so a missing copy will not come (made from the log)."""
    from hpcllm.models.megatron_args import transformer_impl_for
    from hpcllm.training.plan import settings as tracked

    save = Path(campaign.workdir) / campaign.save
    if committed_iteration(save) < campaign.target(segment):
        return False
    recorded = tracked.load_recorded(save)
    current = tracked.weight_settings(campaign.prepared, transformer_impl_for(campaign.cluster))
    changed = tracked.differences(recorded["weights"], current) if recorded else []
    if changed:
        raise tracked.SettingsChanged(
            tracked.refusal_message(campaign.name, campaign.save, changed)
        )
    kept = records.kept(Path(campaign.workdir) / campaign.save, segment, campaign.target(segment))
    record = Path(campaign.workdir) / campaign.paths(segment).record
    record.parent.mkdir(parents=True, exist_ok=True)
    if kept is not None:
        text = kept
    elif settled:  # committed before the chain kept records (or by a run without one)
        text = json.dumps(_record_from_log(campaign, segment), indent=2) + "\n"
    else:
        return False  # committed, but its job has not written the record yet
    with atomic_path(record) as tmp:
        tmp.write_text(text)
    return True


def _record_from_log(campaign: Campaign, segment: int) -> dict[str, Any]:
    """A committed segment's record from its engine log (the fields the job would write)."""
    return records.untrained(
        campaign.name,
        campaign.prepared,
        segment,
        campaign.save,
        Path(campaign.workdir) / campaign.paths(segment).engine_log,
        "the controller, from the engine log (the chain kept no record)",
    )


def describe_jobs(jobs: list[dict[str, str]], running_segment: int | None = None) -> str:
    """``57 RUNNING (segment 2), 58 PENDING after afterany:57(unfulfilled)``: the running
    job trains the next uncommitted segment, a pending one waits for its predecessor (or
    for what squeue names, e.g. ``[JobHeldUser]``)."""
    words = []
    for j in jobs:
        text = f"{j['id']} {j['state']}"
        if j["state"] == "RUNNING" and running_segment:
            text += f" (segment {running_segment})"
        if j.get("dependency") not in ("", "(null)", None):
            text += f" after {j['dependency']}"
        if j["state"] == "PENDING" and j.get("reason") not in ("", "None", "Dependency", None):
            text += f" [{j['reason']}]"
        words.append(text)
    return ", ".join(words)


def progress(campaign: Campaign) -> str:
    """``segments 1-2 of 3 committed (checkpoint iteration 8 of 12)``."""
    reached = committed_iteration(Path(campaign.workdir) / campaign.save)
    done = sum(1 for k in range(1, campaign.segments + 1) if campaign.target(k) <= reached)
    which = "no segment" if not done else "segment 1" if done == 1 else f"segments 1-{done}"
    return (
        f"{which} of {campaign.segments} committed (checkpoint iteration {reached} of "
        f"{campaign.target(campaign.segments)})"
    )


# How far the controller's wait backs off while nothing changes: the poll interval grows
# by half each quiet poll up to this many times the cluster's squeue_poll_seconds.
BACKOFF_LIMIT = 4


def wait_for_segment(
    campaign: Campaign, segment: int, poll_seconds: float = 30.0, say=log.info
) -> None:
    """The controller's rule on a Slurm cluster: make sure the chain is in Slurm (submit
    it, or reattach to the one running), then wait until segment ``segment`` is committed
    and write its record; raise :class:`ChainStopped` naming the class and job id when the
    chain stopped before (and, for a stop another chain would repeat, refusing to submit
    a new one: :func:`ensure`). It asks squeue at most every ``poll_seconds``, backing off
    to ``BACKOFF_LIMIT`` times that while the chain's jobs do not change, from a listing
    the waits of all experiments share (:func:`chain_jobs`)."""
    if commit_record(campaign, segment):
        say(f"{campaign.name}: segment {segment} is done, {progress(campaign)} by the chain")
        _cancel_spares(campaign, say)
        return
    previous = stopped(Path(campaign.workdir) / campaign.save)
    state, jobs = ensure(campaign)
    if state == "complete" and commit_record(campaign, segment, settled=True):
        say(f"{campaign.name}: segment {segment} is done, {progress(campaign)} by the chain")
        return
    if state == "submitted":
        why = (
            f" ({describe_stop(campaign.name, previous)}; a new attempt budget)" if previous else ""
        )
        what = f"job {jobs[0]['id']}"
        if campaign.up_front:
            what = (
                f"jobs {jobs[0]['id']}-{jobs[-1]['id']} up front, each after the one before "
                f"({campaign.segments} segments, {len(jobs)} jobs with the retries; compute "
                "nodes here may not call sbatch)"
            )
        say(f"submitted the chain of {campaign.name}{why}: {what}; {progress(campaign)}")
    elif state == "running":
        # A controller reattaching: nothing is submitted, it waits for the chain.
        say(
            f"the chain of {campaign.name} is in Slurm, {progress(campaign)}; jobs: "
            f"{describe_jobs(jobs, next_segment(campaign))}; waiting for segment {segment}"
        )
    campaign = load(campaign.file())
    seen = ""
    interval = poll_seconds
    shared = Path(campaign.workdir) / ".snakemake" / "hpcllm" / "squeue.json"
    while True:
        if commit_record(campaign, segment):
            say(f"{campaign.name}: segment {segment} is done, {progress(campaign)}")
            _cancel_spares(campaign, say)
            return
        jobs = chain_jobs(campaign.job_name(), shared, max_age=poll_seconds)
        stop = stopped(Path(campaign.workdir) / campaign.save)
        if jobs and stop and stop.get("chain") == campaign.chain_id:
            # Up front, the jobs after a stop would only start to end at once.
            cancel([j["id"] for j in jobs if j["state"] == "PENDING"])
            jobs = [j for j in jobs if j["state"] != "PENDING"]
        if not jobs:
            time.sleep(min(poll_seconds, 5.0))  # the last job may be writing the record
            if commit_record(campaign, segment, settled=True):
                say(f"{campaign.name}: segment {segment} is done, {progress(campaign)}")
                return
            stop = stopped(Path(campaign.workdir) / campaign.save)
            if stop and stop.get("chain") == campaign.chain_id:
                if needs_a_fix(stop):
                    raise ChainStopped(refusal_message(campaign, stop))
                raise ChainStopped(
                    f"{describe_stop(campaign.name, stop)}. Run the workflow again to "
                    "submit the chain anew (a new attempt budget)."
                )
            if chain_jobs(campaign.job_name(), shared):  # the listing predated the chain
                continue
            last = submitted_jobs(Path(campaign.workdir) / campaign.save)[-1:]
            where = f" (its last job: {last[0]['job']})" if last else ""
            raise ChainStopped(
                f"the chain of {campaign.name} is no longer in Slurm{where} and segment "
                f"{segment} is not committed: see logs/train_segment/{campaign.name}/chain/. "
                "Run the workflow again to submit the chain anew."
            )
        _end_a_stuck_wait(campaign, jobs)
        now = describe_jobs(jobs, next_segment(campaign))
        if now != seen:
            say(
                f"waiting for segment {segment} of {campaign.name}, {progress(campaign)}; "
                f"chain jobs: {now}"
            )
            seen, interval = now, poll_seconds
        else:
            interval = min(interval * 1.5, poll_seconds * BACKOFF_LIMIT)
        time.sleep(interval)


def _end_a_stuck_wait(campaign: Campaign, jobs: list[dict[str, str]]) -> None:
    """A chain job pending for a limit Slurm does not resolve by itself (its partition's
    or QOS's node or time limit, an invalid account or QOS: hpcllm.slurm_pending) would be
    waited for forever: cancel the chain's pending jobs and stop, naming the reason and
    what to change. The next run submits the chain anew."""
    stuck = next(
        (
            j
            for j in jobs
            if slurm_pending.is_stuck(j["state"], j.get("reason"))
            and slurm_pending.confirmed(j["id"], j["reason"])
        ),
        None,
    )
    if stuck is None:
        return
    pending = [j["id"] for j in jobs if j["state"] == "PENDING"]
    cancel(pending)
    facts = getattr(campaign.cluster, "path", "") or "the cluster file"
    raise ChainStopped(
        slurm_pending.stuck_message(
            stuck["id"], stuck["reason"], f"the chain of {campaign.name}:", facts
        )
        + f" (cancelled the chain's pending jobs {' '.join(pending)})"
    )


def _cancel_spares(campaign: Campaign, say=log.info) -> None:
    """Once every segment is committed, cancel the chain's jobs still pending (the spares
    of a chain submitted up front; they would start only to end at once)."""
    if next_segment(campaign) is not None:
        return
    with contextlib.suppress(ChainError):
        pending = [j["id"] for j in chain_jobs(campaign.job_name()) if j["state"] == "PENDING"]
        if pending:
            cancel(pending)
            spares = " ".join(pending)
            say(f"{campaign.name}: the campaign is complete; cancelled its spare jobs {spares}")


def chain_status(workdir: str | os.PathLike, name: str) -> dict[str, Any]:
    """The chain's live jobs and how it stopped (if it did), for ``hpcllm status``."""
    save = Path(workdir) / "checkpoints" / name
    return {"jobs": chain_jobs(job_name_of(workdir, name)), "stopped": stopped(save)}


def cancel_training(workdir: str | os.PathLike, name: str) -> list[str]:
    """Cancel every live job of the experiment's chain (this user's); their ids."""
    jobs = chain_jobs(job_name_of(workdir, name))
    cancel([j["id"] for j in jobs])
    return [j["id"] for j in jobs]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m hpcllm.training.campaign.chain", description=__doc__
    )
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("step", help="a chain job: train the next segment (Slurm runs this)")
    p.add_argument("campaign", help="checkpoints/<experiment>/chain/campaign.pickle")
    p = sub.add_parser("resume", help="submit the chain again unless it is in Slurm")
    p.add_argument("campaign", help="checkpoints/<experiment>/chain/campaign.pickle")
    args = parser.parse_args(argv)
    logging.basicConfig(
        level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    if args.command == "step":
        from hpcllm.offline import go_offline

        go_offline()  # a compute job: no Hugging Face hub lookups (docs/clusters.md)
        try:
            return step(args.campaign)
        except ChainError as e:  # the campaign file: its message, no traceback
            log.error("%s", e)
            return 1
    try:
        state, jobs = ensure(load(args.campaign))
    except (ChainStopped, ChainError) as e:
        print(e, file=sys.stderr)
        return 1
    print(state, " ".join(j["id"] for j in jobs))
    return 0


if __name__ == "__main__":
    sys.exit(main())
