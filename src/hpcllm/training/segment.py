"""One segment of a chained training run, as the ``train_segment`` rule runs it.

Segment k of K trains from the newest checkpoint to iteration ``k x iterations_per_segment``
(or until its job's time is nearly used up), launched through ``hpcllm.launch`` (srun ->
torchrun per node -> the engine on a cluster; the bare process or torchrun --standalone
here). It is complete only when the checkpoint reached its target: then, and only then,
its result record is written. A segment that stopped early fails with its failure class
(:mod:`hpcllm.bench.failures`); Snakemake's next attempt (the rule's ``retries``)
continues it from the newest checkpoint while attempts fail for a transient reason and
make progress (:mod:`hpcllm.training.attempts`). While it runs, the segment holds its
checkpoint folder's lease (:mod:`hpcllm.training.lease`): one writer per folder.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from hpcllm.atomic import atomic_path
from hpcllm.bench.failures import (
    classify_text,
    killed_by_sigkill,
    oom_kill_count,
    slurm_step_state,
)
from hpcllm.progress import Progress
from hpcllm.training import attempts, checkpoints, checksums, lease
from hpcllm.training import settings as tracked
from hpcllm.training.data import Blend, parse_split, sample_counts
from hpcllm.training.megatron_args import (
    MEGATRON_ENV,
    exit_duration_minutes,
    pretrain_gpt_args,
    transformer_impl_for,
)
from hpcllm.training.planner import Layout

log = logging.getLogger(__name__)

_LOG_LINE = re.compile(r"iteration\s+(\d+)/\s*(\d+)\s*\|(.*)$")


class SegmentIncomplete(RuntimeError):
    """The engine stopped before the segment's target iteration (time, signal, failure)."""

    def __init__(self, message: str, failure: str):
        super().__init__(message)
        self.failure = failure


class SegmentRefused(RuntimeError):
    """This attempt does not run: the previous one failed for good, or made no progress."""


@dataclass(frozen=True)
class Paths:
    save: str  # checkpoints/<experiment>
    record: str  # results/train/<experiment>/seg<k>.json
    engine_log: str  # the engine's output (Megatron-style log lines)
    data_cache: str  # Megatron's --data-cache-path
    tensorboard: str


def target_iteration(experiment: dict[str, Any], segment: int) -> int:
    return segment * experiment["iterations_per_segment"]


def total_iterations(experiment: dict[str, Any]) -> int:
    return experiment["segments"] * experiment["iterations_per_segment"]


def parse_log_lines(text: str) -> list[dict[str, Any]]:
    """The fields of every Megatron-style iteration line (either engine)."""
    rows = []
    for line in text.splitlines():
        m = _LOG_LINE.search(line)
        if not m or not line.rstrip().endswith("|"):
            continue  # not one, or cut off (a killed job): Megatron ends them with "|"
        row: dict[str, Any] = {"iteration": int(m.group(1)), "train_iters": int(m.group(2))}
        for part in m.group(3).split("|"):
            key, sep, value = part.partition(":")
            if sep:
                try:
                    row[key.strip()] = float(value)
                except ValueError:
                    row[key.strip()] = value.strip()
        rows.append(row)
    return rows


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


def megatron_tokenizer_model(tokenizer_files: tuple[str, str]) -> str | None:
    """The ``--tokenizer-model`` folder of Megatron's HuggingFaceTokenizer: the folder of a
    given tokenizer.json (``tokenizers_config.engine_files``, written by the workflow's
    tokenizer_folder rule), or the tokenizer's folder where it holds a tokenizer.json and a
    tokenizer_config.json naming the ``eos_token`` (Megatron's EOD; a trained tokenizer
    has both), read offline; else None (GPT2BPETokenizer, which asks the hub for gpt2's
    configuration)."""
    from hpcllm.text.tokenizers_config import is_hf_folder

    folder = Path(tokenizer_files[0]).parent
    if is_hf_folder(tokenizer_files):
        return str(folder)
    try:
        config = json.loads((folder / "tokenizer_config.json").read_text())
    except (OSError, ValueError):
        return None
    has_eos = isinstance(config, dict) and config.get("eos_token")
    return str(folder) if has_eos and (folder / "tokenizer.json").exists() else None


def hub_tokenizer_warning(
    name: str, engine: str, tokenizer_cfg: dict, tokenizer_files: tuple[str, str], eod: str
) -> str | None:
    """At plan time: why a megatron experiment's given (``type: files``) GPT-2 tokenizer
    would make the job reach for the hub at start-up, or None. A trained one gets its
    tokenizer.json and tokenizer_config.json from train_tokenizer, a given tokenizer.json
    its folder from tokenizer_folder."""
    if engine != "megatron" or tokenizer_cfg.get("type", "train") == "train":
        return None
    if megatron_tokenizer_model(tokenizer_files) is not None:
        return None
    from hpcllm.text.tokenizer_train import hf_tokenizer_config  # only on this path

    return (
        f"training.experiments.{name}: {Path(tokenizer_files[0]).parent} has no "
        "tokenizer.json with a tokenizer_config.json naming an eos_token, so Megatron-LM "
        "gets GPT2BPETokenizer, which loads gpt2's configuration from the Hugging Face hub "
        "when the job starts; on compute nodes without internet the job fails there. Put "
        f"both files beside {tokenizer_files[0]} (tokenizer_config.json: "
        f"{json.dumps(hf_tokenizer_config(eod))}), or name the tokenizer.json as the "
        "tokenizer's tokenizer_json, or fill "
        "HF_HOME with gpt2's configuration and set HF_HUB_OFFLINE=1 for the jobs."
    )


def engine_command(
    experiment: dict[str, Any],
    layout: Layout,
    blend: Blend,
    tokenizer_files: tuple[str, str],
    paths: Paths,
    segment: int,
    exit_minutes: float | None,
    megatron_dir: str = "/opt/Megatron-LM",
    eod_token: str = "<|endoftext|>",
    transformer_impl: str = "transformer_engine",
    python: str = sys.executable,
) -> list[str]:
    """The argv of one engine process (the launcher runs it, with ``--no-python``);
    ``python`` runs the torch engine (the image's inside a container)."""
    stop = target_iteration(experiment, segment)
    train_iters = total_iterations(experiment)
    split = experiment["data"]["split"]
    vocab, merges = tokenizer_files
    if experiment["engine"] == "megatron":
        return [
            "python",
            f"{megatron_dir}/pretrain_gpt.py",
            *pretrain_gpt_args(
                experiment,
                layout,
                data_path=blend.megatron_data_path(),
                split=split,
                vocab_file=vocab,
                merge_file=merges,
                save=paths.save,
                tensorboard_dir=paths.tensorboard,
                data_cache_path=paths.data_cache,
                train_iters=train_iters,
                stop_iteration=stop,
                exit_minutes=None if exit_minutes is None else int(exit_minutes),
                transformer_impl=transformer_impl,
                tokenizer_model=megatron_tokenizer_model(tokenizer_files),
            ),
        ]
    model, optim = experiment["model"], experiment["optim"]
    argv = [
        python,
        "-m",
        "hpcllm.training.torch_engine",
        "--num-layers", str(model["num_layers"]),
        "--hidden-size", str(model["hidden_size"]),
        "--num-attention-heads", str(model["num_attention_heads"]),
        "--seq-length", str(model["seq_length"]),
        "--position-embedding-type", model["position_embedding"],
        "--micro-batch-size", str(layout.micro_batch),
        "--global-batch-size", str(layout.global_batch),
        "--train-iters", str(train_iters),
        "--exit-interval", str(stop),
        "--exit-signal-handler",
        "--lr", repr(float(optim["lr"])),
        "--min-lr", repr(float(optim["min_lr"])),
        "--lr-decay-style", "cosine",
        "--lr-warmup-iters", str(optim["warmup_iters"]),
        "--adam-beta1", repr(float(optim["beta1"])),
        "--adam-beta2", repr(float(optim["beta2"])),
        "--weight-decay", repr(float(optim["weight_decay"])),
        "--clip-grad", repr(float(optim["clip_grad"])),
        "--seed", str(experiment["seed"]),
        "--data-path", *blend.megatron_data_path(),
        "--split", split,
        "--data-cache-path", paths.data_cache,
        *torch_tokenizer_args(tokenizer_files),
        "--eod-token", eod_token,
        "--save", paths.save,
        "--load", paths.save,
        "--save-interval", str(experiment.get("save_interval") or experiment["iterations_per_segment"]),
        "--log-interval", str(experiment["log_interval"]),
        "--log-throughput",
        "--eval-interval", str(experiment["eval_interval"]),
        "--eval-iters", str(experiment["eval_iters"]),
        "--tensorboard-dir", paths.tensorboard,
        "--threads", str(experiment["threads"]),
    ]  # fmt: skip
    if model.get("ffn_hidden_size"):
        argv += ["--ffn-hidden-size", str(model["ffn_hidden_size"])]
    if experiment["precision"] == "bf16":
        argv.append("--bf16")
    if exit_minutes is not None:
        argv += ["--exit-duration-in-mins", f"{exit_minutes:.2f}"]
    return argv


def torch_tokenizer_args(tokenizer_files: tuple[str, str]) -> list[str]:
    """The torch engine's tokenizer flags: the Hugging Face folder of a given
    tokenizer.json, or GPT-2 style vocab and merges files."""
    from hpcllm.text.tokenizers_config import is_hf_folder

    if is_hf_folder(tokenizer_files):
        return ["--tokenizer-model", str(Path(tokenizer_files[0]).parent)]
    return ["--vocab-file", tokenizer_files[0], "--merge-file", tokenizer_files[1]]


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


class Signals:
    """SIGTERM/SIGUSR1/SIGINT caught from the segment's start (Slurm's --signal, scancel,
    Ctrl-C).

    Caught from the start, a signal during the start-up (data checks, before the engine
    runs) ends the segment cleanly instead of killing it half-way; once the engine runs
    it is passed on as SIGTERM to the launch's process group (its own: a Ctrl-C reaches
    the engine only this way, also one that came while it was being started): srun
    forwards it to the tasks, torchrun to the workers (it does not forward SIGUSR1), and
    the engines save and exit on SIGTERM. The segment waits for that; a second Ctrl-C
    kills the group at once.
    """

    CAUGHT = (signal.SIGTERM, signal.SIGUSR1, signal.SIGINT)

    def __init__(self) -> None:
        self.received: int | None = None
        self.interrupted = False  # a Ctrl-C: the job ends with KeyboardInterrupt
        self.child: subprocess.Popen | None = None
        self._previous: dict = {}

    def __enter__(self) -> Signals:
        for s in self.CAUGHT:
            # A process started with SIGINT ignored (in the background) keeps ignoring it.
            if s != signal.SIGINT or signal.getsignal(s) != signal.SIG_IGN:
                self._previous[s] = signal.signal(s, self._handle)
        return self

    def __exit__(self, *exc) -> None:
        for s, handler in self._previous.items():
            signal.signal(s, handler)

    def _handle(self, signum, frame) -> None:
        again = self.interrupted and signum == signal.SIGINT
        self.received = signum
        self.interrupted |= signum == signal.SIGINT
        if self.child is not None and self.child.poll() is None:
            if again:
                log.warning("second Ctrl-C: killing the engine")
                self.signal_child(signal.SIGKILL)
            else:
                log.warning("got signal %d: asking the engine to save and stop", signum)
                self.signal_child(signal.SIGTERM)
        else:
            log.warning("got signal %d before the engine started: it will not start", signum)

    def signal_child(self, signum: int) -> None:
        """``signum`` to the launch's process group (the launch script, its launcher and
        the engine); to the child alone if the group is gone."""
        try:
            os.killpg(self.child.pid, signum)
        except ProcessLookupError:
            with contextlib.suppress(ProcessLookupError):
                self.child.send_signal(signum)


def _die_with_parent(parent: int):
    """The launch process's pre-exec step: SIGTERM to it when the segment's process dies
    (even by SIGKILL), so that no engine trains on for a job that is gone. Linux's
    PR_SET_PDEATHSIG, kept across the exec of the launch script and of the engine."""
    import ctypes

    prctl = ctypes.CDLL(None, use_errno=True).prctl  # resolved before the fork

    def pre_exec() -> None:
        prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
        if os.getppid() != parent:  # the parent died before: no signal will come
            os._exit(1)

    return pre_exec


def run_launch(
    script_text: str,
    script_path: Path,
    engine_log: Path,
    env: dict[str, str],
    signals: Signals | None = None,
    while_running: Callable[[], None] | None = None,
    poll_s: float = 5.0,
) -> int:
    """Run the launch script, its output appended to ``engine_log``; signals passed on;
    ``while_running`` is called every ``poll_s`` seconds until it ends (progress)."""
    script_path.parent.mkdir(parents=True, exist_ok=True)
    script_path.write_text(script_text)
    engine_log.parent.mkdir(parents=True, exist_ok=True)
    with contextlib.ExitStack() as stack:
        if signals is None:
            signals = stack.enter_context(Signals())
        cut = engine_log.exists() and engine_log.stat().st_size > 0
        if cut:  # a previous attempt killed mid-line: keep its cut line on its own
            with open(engine_log, "rb") as previous:
                previous.seek(-1, os.SEEK_END)
                cut = previous.read(1) != b"\n"
        with open(engine_log, "a") as out:
            if cut:
                out.write("\n")
            out.write(f"==> {time.strftime('%Y-%m-%d %H:%M:%S')} launch {script_path}\n")
            out.flush()
            # Its own process group, so that a Ctrl-C reaches it only through Signals
            # (nothing half-started escapes it); and it dies with this process.
            signals.child = subprocess.Popen(
                ["bash", str(script_path)],
                stdout=out,
                stderr=subprocess.STDOUT,
                env=env,
                start_new_session=True,
                preexec_fn=_die_with_parent(os.getpid()),
            )
            if signals.received is not None:  # between the check and the start
                signals.signal_child(signal.SIGTERM)
            try:
                while True:
                    try:
                        return signals.child.wait(timeout=poll_s if while_running else None)
                    except subprocess.TimeoutExpired:
                        while_running()
            finally:
                signals.child = None


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


def retention(experiment: dict[str, Any], save: str) -> Callable[[], None]:
    """Deletes the checkpoints ``keep_checkpoints`` does not keep (nothing when unset);
    called while the engine runs and after it (checkpoints.prune says what is safe)."""
    keep = experiment.get("keep_checkpoints")

    def prune() -> None:
        if keep:
            deleted = checkpoints.prune(save, keep["last"], keep.get("every"))
            if deleted:
                log.info("keep_checkpoints: deleted iterations %s of %s", deleted, save)

    return prune


def check_checksums(save: str) -> None:
    """Before an engine starts: the committed checkpoint is what was committed
    (:mod:`hpcllm.training.checksums`); CheckpointError naming the damaged file if not."""
    dropped = checksums.drop_uncommitted(save)
    if dropped:
        log.info("%s: dropped the checksums of uncommitted iterations %s", save, dropped)
    recorded = checksums.record_committed(save)
    if recorded is not None:
        log.warning(
            "%s: iteration %d has no recorded checksums (written without them, or its job "
            "ended before it recorded them): recorded now, so not verified this once",
            save,
            recorded,
        )
    iteration = checksums.verify_committed(save)
    if iteration:
        log.info("%s: iteration %d verified against its checksums", save, iteration)


def record_checksums(save: str) -> None:
    """The committed checkpoint's checksums, if the engine wrote none (Megatron-LM)."""
    iteration = checksums.record_committed(save)
    if iteration is not None:
        log.info("%s: recorded the checksums of iteration %d", save, iteration)


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
) -> dict[str, Any]:
    """Train segment ``segment`` of ``name``; write and return its result record.

    Attempt ``attempt`` (Snakemake's) first checks that it may run at all, then takes the
    checkpoint folder's lease, records itself, trains, and records how it ended.
    """
    record_file = attempts.attempts_path(paths.engine_log)
    start_iteration = checkpoints.latest_iteration(paths.save) or 0
    why = attempts.refusal(
        attempts.load(record_file), attempt, start_iteration, engine_log=paths.engine_log
    )
    if why:
        raise SegmentRefused(f"segment {segment} of {name}, attempt {attempt} not run: {why}")
    with Signals() as signals, lease.held(paths.save, on_takeover=_log_takeover) as holder:
        log.info("lease on %s: %s", paths.save, holder.describe())
        start_iteration = checkpoints.latest_iteration(paths.save) or 0
        log_offset = _size(paths.engine_log)
        entry = attempts.record_start(record_file, attempt, start_iteration, log_offset=log_offset)

        def end(failure: str | None, message: str = "", reached: int | None = None) -> None:
            if reached is None:
                reached = checkpoints.latest_iteration(paths.save) or 0
            logged = attempts.logged_iteration(paths.engine_log, log_offset)
            attempts.record_end(record_file, entry, reached, failure, message, logged)

        try:
            record = _train_segment(name, prepared, segment, paths, cluster, container, signals)
        except SegmentIncomplete as e:
            end(e.failure, str(e))
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


def shutdown_timeout(experiment: dict[str, Any]) -> int:
    """Seconds torchrun lets the workers save and exit after forwarding SIGTERM: the
    signal's lead (time.signal_seconds), at least torchrun's own 30."""
    return max(30, int((experiment.get("time") or {}).get("signal_seconds") or 0))


def segment_launch(experiment: dict[str, Any], command: list[str], cluster, container: str | None):
    """The launch of a segment's engine ``command`` on the experiment's nodes."""
    from hpcllm.launch import build_launch, package_in_container

    if experiment["engine"] == "megatron":
        # Megatron-LM refuses sequence parallelism without it (one CUDA work queue).
        binds, env = [], dict(MEGATRON_ENV)
    else:  # the torch engine is hpcllm: in an image it needs the checkout's src/
        binds, env = package_in_container(container)
    # On Slurm's SIGTERM (time.signal_seconds before the limit) torchrun forwards it and
    # SIGKILLs the workers after TORCH_ELASTIC_SHUTDOWN_TIMEOUT, 30 s by default: less
    # than a large model's save. The whole lead is theirs (torchrun's --shutdown-timeout,
    # pytorch/pytorch PR 172596; an older torch ignores the variable and keeps 30 s).
    env["TORCH_ELASTIC_SHUTDOWN_TIMEOUT"] = str(shutdown_timeout(experiment))
    lay = experiment["layout"]
    return build_launch(
        cluster,
        nodes=lay.get("nodes", 1),
        procs_per_node=lay.get("procs_per_node", 1),
        command=command,
        container=container,
        binds=binds,
        env=env,
    )


def _train_segment(
    name: str,
    prepared: Prepared,
    segment: int,
    paths: Paths,
    cluster,
    container: str | None,
    signals: Signals,
) -> dict[str, Any]:
    from hpcllm.launch import python_for

    experiment, layout = prepared.experiment, prepared.layout
    stop = target_iteration(experiment, segment)
    start_iteration = checkpoints.latest_iteration(paths.save) or 0
    # Before anything else: never resume (or report as done) a checkpoint trained with
    # other weight-determining settings.
    tracked.check_checkpoint_settings(
        name,
        paths.save,
        tracked.weight_settings(prepared, transformer_impl_for(cluster)),
        tracked.continuation_settings(prepared),
        has_checkpoint=start_iteration > 0,
    )
    check_checksums(paths.save)
    check_segment_data(prepared)
    started = time.time()
    engine_log = Path(paths.engine_log)
    log_offset = engine_log.stat().st_size if engine_log.exists() else 0
    if start_iteration < stop and signals.received is None:
        command = engine_command(
            experiment,
            layout,
            prepared.blend,
            prepared.tokenizer_files,
            paths,
            segment,
            exit_duration(experiment, warn_early_signal(experiment, remaining_job_seconds())),
            eod_token=prepared.eod_token,
            transformer_impl=transformer_impl_for(cluster),
            python=python_for(container),
        )
        launch = segment_launch(experiment, command, cluster, container)
        log.info("segment %d of %s: iterations %d..%d", segment, name, start_iteration + 1, stop)
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
        )
        log.info("engine exited with %d", rc)
        record_checksums(paths.save)
        retention(experiment, paths.save)()
        oom_after = oom_kill_count()
        oom_kills = (oom_after or 0) - (oom_before or 0) if oom_before is not None else 0
    else:
        rc, oom_kills = None, 0
    if start_iteration >= stop:
        log.warning(
            "%s already holds iteration %d >= this segment's target %d: nothing to train",
            paths.save,
            start_iteration,
            stop,
        )
    reached = checkpoints.latest_iteration(paths.save) or 0
    if reached < stop:
        text = engine_log.read_text(errors="replace")[log_offset:] if engine_log.exists() else ""
        state = None
        if killed_by_sigkill(rc, text) and not oom_kills:
            state = slurm_step_state(os.environ.get("SLURM_JOB_ID"))
        failure = segment_failure(text, signals.received, rc, oom_kills, state)
        when = "early"
        if not text:
            when = "before the engine started"
        elif not parse_log_lines(text):
            when = "during the engine's start-up"
        broken = checkpoint_problem(text, paths.save)
        if broken:
            after = (
                f"the checkpoint could not be loaded: {broken} Another attempt would fail "
                "the same way; fix or remove that checkpoint (docs/training.md)"
            )
        else:
            after = (
                f"the next attempt or a rerun continues from the newest checkpoint in "
                f"{paths.save} (iteration {reached})"
            )
        raise SegmentIncomplete(
            f"segment {segment} of {name} stopped at iteration {reached} of {stop} {when} "
            f"({failure}; see {paths.engine_log}); {after}",
            failure,
        )
    lines = [r for r in parse_log_lines(engine_log.read_text()) if r["iteration"] <= stop]
    last = lines[-1] if lines else {}
    record = {
        "experiment": name,
        "engine": experiment["engine"],
        "segment": segment,
        "segments": experiment["segments"],
        "first_iteration": target_iteration(experiment, segment - 1) + 1,
        "last_iteration": stop,
        "resumed_from_iteration": start_iteration,
        "consumed_samples": stop * layout.global_batch,
        "lm_loss": last.get("lm loss"),
        "seconds": round(time.time() - started, 3),
        "gpus": layout.gpus,
        "checkpoint": str(checkpoints.iteration_dir(paths.save, reached)),
    }
    # The GPUs' energy where the engine logged it (hpcllm.bench.energy), and its tokens.
    from hpcllm.bench.energy import log_energy

    energy = log_energy(lines, layout.gpus, layout.global_batch,
                        experiment["model"]["seq_length"], experiment.get("log_interval", 1))  # fmt: skip
    if energy:
        record["energy_j"], record["energy_tokens"] = round(energy[0], 3), energy[1]
    with atomic_path(paths.record) as tmp:
        tmp.write_text(json.dumps(record, indent=2) + "\n")
    return record


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


@dataclass(frozen=True)
class Prepared:
    """An experiment checked at plan time: resolved config, layout, data, tokenizer."""

    experiment: dict[str, Any]
    layout: Layout
    blend: Blend
    # What the engines read (tokenizers_config.engine_files): vocab.json and merges.txt,
    # or a given tokenizer.json's folder (tokenizer.json, tokenizer_config.json)
    tokenizer_files: tuple[str, str]
    eod_token: str
    memory_gb: float


def prepare_experiment(name: str, raw: dict[str, Any], text: dict[str, Any], cluster) -> Prepared:
    """Resolve the preset and check layout, memory and data sources before any job runs.

    Data that the text stage has not made yet is checked when the segment starts.
    """
    from hpcllm.training.planner import plan
    from hpcllm.training.presets import resolve_experiment

    exp = resolve_experiment(name, raw)
    data = exp["data"]
    if data["tokenizer"] not in text["tokenizers"]:
        raise ValueError(
            f"training.experiments.{name}.data.tokenizer: '{data['tokenizer']}' is not in "
            f"text.tokenizers ({', '.join(text['tokenizers'])})"
        )
    if data["tokenizer"] not in text["tokenize"]["tokenizers"]:
        raise ValueError(
            f"training.experiments.{name}.data.tokenizer: the sources are not tokenized with "
            f"'{data['tokenizer']}'; add it to text.tokenize.tokenizers"
        )
    for source in data["sources"]:
        if source not in text["sources"]:
            raise ValueError(
                f"training.experiments.{name}.data.sources: '{source}' is not in "
                f"text.sources ({', '.join(text['sources'])}); there is no data for it"
            )
    tok = data["tokenizer"]
    blend = Blend(
        tuple(f"data/tokenized/{tok}/{s}_text_document" for s in data["sources"]),
        tuple(float(w) for w in data["sources"].values()),
    )
    lay = exp["layout"]
    lay.setdefault("nodes", 1)
    lay.setdefault("procs_per_node", max(1, cluster.gpus_per_node))
    gpus = lay["nodes"] * lay["procs_per_node"]
    from hpcllm.training.job_plan import check_nodes

    check_nodes(name, lay, cluster)
    if exp["engine"] == "torch" and (lay["tp"] > 1 or lay["pp"] > 1):
        raise ValueError(
            f"training.experiments.{name}.layout: the torch engine is data parallel only; "
            "set tp: 1 and pp: 1, or use engine: megatron"
        )
    if exp["engine"] == "torch" and exp["precision"] == "fp16":
        raise ValueError(
            f"training.experiments.{name}.precision: the torch engine's fp16 (for benchmark "
            "runs) keeps no loss scale in its checkpoints, so segments cannot resume it; "
            "use bf16 or fp32, or engine: megatron"
        )
    vocab = exp["model"].get("vocab_size") or text["tokenizers"][tok].get("vocab_size") or 50257
    gpu_gb = cluster.gpu.memory_gb if cluster.gpu is not None else None
    # Memory for the layout the engine runs: Megatron-LM without Transformer Engine (the
    # ROCm image) runs without sequence parallelism (megatron_args.py), whose activations
    # are then not split over TP.
    from hpcllm.training.megatron_args import transformer_impl_for

    runs = exp
    if lay.get("sequence_parallel") and transformer_impl_for(cluster) == "local":
        runs = {**exp, "layout": {**lay, "sequence_parallel": False}}
    layout, memory = plan(name, runs, gpus, vocab, gpu_gb, lay["procs_per_node"])
    warmup, total = exp["optim"]["warmup_iters"], total_iterations(exp)
    if warmup >= total:
        # Megatron-LM refuses it at start-up (OptimizerParamScheduler asserts
        # lr_warmup_steps < lr_decay_steps; the decay lasts --train-iters): refused for
        # both engines, so that what runs here runs on a cluster.
        raise ValueError(
            f"training.experiments.{name}: the learning-rate warm-up (optim.warmup_iters = "
            f"{warmup}) is not shorter than the whole run (segments x "
            f"iterations_per_segment = {exp['segments']} x {exp['iterations_per_segment']} "
            f"= {total} iterations); Megatron-LM refuses that at start-up (lr_warmup_steps "
            "< lr_decay_steps). Lower optim.warmup_iters or train longer."
        )
    exp.setdefault("save_interval", exp["iterations_per_segment"])
    exp.setdefault("eval_interval", exp["iterations_per_segment"])
    exp.setdefault("eval_iters", 1)
    try:  # at plan time, whatever eval_iters is: a job would fail on it later
        split = parse_split(data["split"])
    except ValueError as e:
        raise ValueError(f"training.experiments.{name}.data.split: {e}") from None
    if exp["eval_iters"] and split[1] == 0:
        raise ValueError(
            f"training.experiments.{name}: eval_iters is {exp['eval_iters']} but data.split "
            f"'{data['split']}' gives the validation split no share; give it one (e.g. "
            "'98,2,0') or set eval_iters: 0"
        )
    eod = text["tokenizers"][tok].get("eod_token", "<|endoftext|>")
    from hpcllm.text.tokenizers_config import engine_files

    files = engine_files(tok, text["tokenizers"][tok])
    return Prepared(exp, layout, blend, files, eod, memory.total)


def engine_problem(name: str, engine: str, cluster) -> str | None:
    """The megatron engine where there is no Megatron-LM: the workflow has it only in the
    training image (at /opt/Megatron-LM, engine_command's megatron_dir), so a cluster
    without a container runtime (the local machine) has none, and a segment would fail
    on start. None where the engine runs."""
    if engine != "megatron" or cluster.uses_containers:
        return None
    return (
        f"training.experiments.{name}.engine: megatron runs Megatron-LM's pretrain_gpt.py "
        f"from the training container (/opt/Megatron-LM), but cluster {cluster.name} has no "
        f"container runtime ({cluster.path}: container_runtime: none), so no Megatron-LM. "
        "Set engine: torch to train it here, or leave it out of training.run here and run "
        "it with a GPU cluster's profile (snakemake --profile profiles/<cluster>)."
    )


def check_segment_data(prepared: Prepared) -> None:
    """At run time: the data exist, match the tokenizer, and every split gets documents."""
    from hpcllm.text.tokenizers_config import engine_vocabulary
    from hpcllm.training.data import check_blend, check_splits

    vocab_size, _ = engine_vocabulary(prepared.tokenizer_files, prepared.eod_token)
    check_blend(prepared.blend, vocab_size)
    check_splits(prepared.blend, prepared.experiment["data"]["split"], dataset_samples(prepared))


def dataset_samples(prepared: Prepared) -> list[int]:
    """Samples per split the engines ask for (a key of the index cache)."""
    exp = prepared.experiment
    samples = sample_counts(
        total_iterations(exp), prepared.layout.global_batch, exp["eval_interval"], exp["eval_iters"]
    )
    shares = parse_split(exp["data"]["split"])
    return [n if share > 0 else 0 for n, share in zip(samples, shares)]
