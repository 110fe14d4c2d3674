"""One segment of a chained training run, as the ``train_segment`` rule runs it.

Segment k of K trains from the newest checkpoint to iteration ``k x iterations_per_segment``
(or until its job's time is nearly used up), launched through ``hpcllm.launch`` (srun ->
torchrun per node -> the engine on a cluster; the bare process or torchrun --standalone
here). It is complete only when the checkpoint reached its target: then, and only then,
its result record is written. A segment that stopped early fails, and rerunning the
workflow continues it from its newest checkpoint.
"""

from __future__ import annotations

import json
import logging
import os
import re
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from hpcllm.atomic import atomic_path
from hpcllm.training import checkpoints
from hpcllm.training.data import Blend
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
        if not m:
            continue
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
) -> list[str]:
    """The argv of one engine process (the launcher runs it, with ``--no-python``)."""
    stop = target_iteration(experiment, segment)
    train_iters = total_iterations(experiment)
    split = experiment["data"]["split"]
    vocab, merges = tokenizer_files
    tokenizer_dir = str(Path(vocab).parent)  # a trained tokenizer's folder holds tokenizer.json
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
                # read offline; GPT2BPETokenizer would ask the hub for gpt2's config
                tokenizer_model=tokenizer_dir
                if (Path(tokenizer_dir) / "tokenizer.json").exists()
                else None,
            ),
        ]
    model, optim = experiment["model"], experiment["optim"]
    argv = [
        sys.executable,
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
        "--vocab-file", vocab,
        "--merge-file", merges,
        "--eod-token", eod_token,
        "--save", paths.save,
        "--load", paths.save,
        "--save-interval", str(experiment.get("save_interval") or experiment["iterations_per_segment"]),
        "--log-interval", str(experiment["log_interval"]),
        "--log-throughput",
        "--threads", str(experiment["threads"]),
    ]  # fmt: skip
    if model.get("ffn_hidden_size"):
        argv += ["--ffn-hidden-size", str(model["ffn_hidden_size"])]
    if experiment["precision"] == "bf16":
        argv.append("--bf16")
    if exit_minutes is not None:
        argv += ["--exit-duration-in-mins", f"{exit_minutes:.2f}"]
    return argv


def _exit_minutes(experiment: dict[str, Any]) -> float | None:
    left = remaining_job_seconds()
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


def run_launch(script_text: str, script_path: Path, engine_log: Path, env: dict[str, str]) -> int:
    """Run the launch script, its output appended to ``engine_log``.

    SIGTERM or SIGUSR1 sent to this process (Slurm's --signal, scancel) is passed on as
    SIGTERM: srun forwards it to the tasks, torchrun to the workers (it does not forward
    SIGUSR1), and the engines save and exit on SIGTERM.
    """
    script_path.parent.mkdir(parents=True, exist_ok=True)
    script_path.write_text(script_text)
    engine_log.parent.mkdir(parents=True, exist_ok=True)
    with open(engine_log, "a") as out:
        out.write(f"==> {time.strftime('%Y-%m-%d %H:%M:%S')} launch {script_path}\n")
        out.flush()
        child = subprocess.Popen(
            ["bash", str(script_path)], stdout=out, stderr=subprocess.STDOUT, env=env
        )

        def forward(signum, frame):
            log.warning("got signal %d: asking the engine to save and stop", signum)
            child.send_signal(signal.SIGTERM)

        previous = {s: signal.signal(s, forward) for s in (signal.SIGTERM, signal.SIGUSR1)}
        try:
            return child.wait()
        finally:
            for s, handler in previous.items():
                signal.signal(s, handler)


def run_segment(
    name: str,
    prepared: Prepared,
    segment: int,
    paths: Paths,
    cluster,
    container: str | None = None,
) -> dict[str, Any]:
    """Train segment ``segment`` of ``name``; write and return its result record."""
    from hpcllm.launch import build_launch

    experiment, layout = prepared.experiment, prepared.layout
    check_segment_data(prepared)
    stop = target_iteration(experiment, segment)
    start_iteration = checkpoints.latest_iteration(paths.save) or 0
    started = time.time()
    if start_iteration < stop:
        lay = experiment["layout"]
        exit_minutes = _exit_minutes(experiment)
        command = engine_command(
            experiment,
            layout,
            prepared.blend,
            prepared.tokenizer_files,
            paths,
            segment,
            exit_minutes,
            eod_token=prepared.eod_token,
            transformer_impl=transformer_impl_for(cluster),
        )
        launch = build_launch(
            cluster,
            nodes=lay.get("nodes", 1),
            procs_per_node=lay.get("procs_per_node", 1),
            command=command,
            container=container,
            # Megatron-LM refuses sequence parallelism without it (one CUDA work queue).
            env=MEGATRON_ENV if experiment["engine"] == "megatron" else None,
        )
        log.info("segment %d of %s: iterations %d..%d", segment, name, start_iteration + 1, stop)
        script = Path(paths.engine_log).with_suffix(".sh")
        env = {**os.environ, "PYTHONUNBUFFERED": "1"}
        rc = run_launch(launch.shell(), script, Path(paths.engine_log), env)
        log.info("engine exited with %d", rc)
    else:
        log.warning(
            "%s already holds iteration %d >= this segment's target %d: nothing to train",
            paths.save,
            start_iteration,
            stop,
        )
    reached = checkpoints.latest_iteration(paths.save) or 0
    if reached < stop:
        raise SegmentIncomplete(
            f"segment {segment} of {name} stopped at iteration {reached} of {stop} (see "
            f"{paths.engine_log}); rerun the workflow to continue from the checkpoint in "
            f"{paths.save}"
        )
    lines = [
        r for r in parse_log_lines(Path(paths.engine_log).read_text()) if r["iteration"] <= stop
    ]
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
        "checkpoint": str(checkpoints.iteration_dir(paths.save, reached)),
    }
    with atomic_path(paths.record) as tmp:
        tmp.write_text(json.dumps(record, indent=2) + "\n")
    return record


@dataclass(frozen=True)
class Prepared:
    """An experiment checked at plan time: resolved config, layout, data, tokenizer."""

    experiment: dict[str, Any]
    layout: Layout
    blend: Blend
    tokenizer_files: tuple[str, str]  # vocab.json, merges.txt: those the config names
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
    if exp["engine"] == "torch" and (lay["tp"] > 1 or lay["pp"] > 1):
        raise ValueError(
            f"training.experiments.{name}.layout: the torch engine is data parallel only; "
            "set tp: 1 and pp: 1, or use engine: megatron"
        )
    if exp["engine"] == "torch" and exp["precision"] == "fp16":
        raise ValueError(
            f"training.experiments.{name}.precision: fp16 needs loss scaling, which the "
            "torch engine does not do; use bf16 or fp32"
        )
    vocab = exp["model"].get("vocab_size") or text["tokenizers"][tok].get("vocab_size") or 50257
    gpu_gb = cluster.gpu.memory_gb if cluster.gpu is not None else None
    layout, memory = plan(name, exp, gpus, vocab, gpu_gb, lay["procs_per_node"])
    exp.setdefault("save_interval", exp["iterations_per_segment"])
    eod = text["tokenizers"][tok].get("eod_token", "<|endoftext|>")
    from hpcllm.text.tokenizers_config import gpt2_files

    files = gpt2_files(tok, text["tokenizers"][tok])
    return Prepared(exp, layout, blend, files, eod, memory.total)


def check_segment_data(prepared: Prepared) -> None:
    """At run time: the data exist, match the tokenizer, and every split gets documents."""
    from hpcllm.training.data import check_blend, check_splits
    from hpcllm.training.torch_engine import vocabulary

    class _Args:  # what vocabulary() reads
        vocab_file = prepared.tokenizer_files[0]
        eod_token = prepared.eod_token
        vocab_size = None

    vocab_size, _ = vocabulary(_Args)
    check_blend(prepared.blend, vocab_size)
    exp = prepared.experiment
    check_splits(prepared.blend, exp["data"]["split"], [total_iterations(exp), 0, 0])
