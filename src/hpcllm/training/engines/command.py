"""The engines' command lines: Megatron-LM's ``pretrain_gpt.py`` or the torch engine, for
one segment of an experiment, with the tokenizer each reads; and where an engine cannot
run (no Megatron-LM: no container and no checkout named).
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

from hpcllm.clusters import MEGATRON_IN_IMAGE
from hpcllm.models.megatron_args import pretrain_gpt_args, pretrain_gpt_program
from hpcllm.models.planner import Layout
from hpcllm.training.plan.data import Blend
from hpcllm.training.plan.experiment import Paths, target_iteration, total_iterations


def megatron_tokenizer_model(tokenizer_files: tuple[str, str]) -> str:
    """The ``--tokenizer-model`` folder of Megatron's HuggingFaceTokenizer, read offline:
    the folder of the engines' files (``tokenizers_config.engine_files``), which always
    holds a tokenizer.json and a tokenizer_config.json naming the ``eos_token``
    (Megatron's EOD): train_tokenizer writes both beside a trained tokenizer's vocab.json
    and merges.txt, the tokenizer_folder rule both for a given tokenizer. Decided from the
    names, not from files on disk, so the plan's command line is the job's."""
    return str(Path(tokenizer_files[0]).parent)


def engine_command(
    experiment: dict[str, Any],
    layout: Layout,
    blend: Blend,
    tokenizer_files: tuple[str, str],
    paths: Paths,
    segment: int,
    exit_minutes: float | None,
    megatron_dir: str = MEGATRON_IN_IMAGE,
    eod_token: str = "<|endoftext|>",
    transformer_impl: str = "transformer_engine",
    python: str = sys.executable,
    straggler_log: bool = False,
) -> list[str]:
    """The argv of one engine process (the launcher runs it, with ``--no-python``);
    ``python`` runs either engine (the image's inside a container, this environment's
    outside one: a bare ``python`` there could be any Python on the PATH; a checkout's
    ``pretrain_gpt.py`` runs through hpcllm's Python 3.11 shim there:
    ``megatron_args.pretrain_gpt_program``). ``straggler_log``: Megatron's straggler
    detector on (hpcllm.models.megatron_resiliency.uses_straggler_log)."""
    stop = target_iteration(experiment, segment)
    train_iters = total_iterations(experiment)
    split = experiment["data"]["split"]
    if experiment["engine"] == "megatron":
        return [
            *pretrain_gpt_program(python, megatron_dir),
            *pretrain_gpt_args(
                experiment,
                layout,
                data_path=blend.megatron_data_path(),
                split=split,
                save=paths.save,
                tensorboard_dir=paths.tensorboard,
                data_cache_path=paths.data_cache,
                train_iters=train_iters,
                stop_iteration=stop,
                exit_minutes=None if exit_minutes is None else int(exit_minutes),
                transformer_impl=transformer_impl,
                tokenizer_model=megatron_tokenizer_model(tokenizer_files),
                straggler_log=straggler_log,
            ),
        ]
    model, optim = experiment["model"], experiment["optim"]
    argv = [
        python,
        "-m",
        "hpcllm.training.engines.torch_engine",
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


def engine_problem(name: str, engine: str, cluster) -> str | None:
    """Why the megatron engine cannot run on ``cluster``, or None where it can: it runs
    from the training image (/opt/Megatron-LM) or, without a container runtime, from the
    Megatron-LM checkout the cluster file names (``megatron_lm``, at the pin, its helpers
    built)."""
    from hpcllm.models.megatron_args import checkout_problem

    if engine != "megatron" or cluster.uses_containers:
        return None
    where = f"training.experiments.{name}.engine: megatron"
    if cluster.megatron_lm is not None:
        problem = checkout_problem(cluster.megatron_lm)
        return f"{where} on cluster {cluster.name} ({cluster.path}): {problem}" if problem else None
    return (
        f"{where} runs Megatron-LM's pretrain_gpt.py from the training container "
        f"(/opt/Megatron-LM), but cluster {cluster.name} has no container runtime "
        f"({cluster.path}: container_runtime: none) and names no Megatron-LM checkout "
        "(megatron_lm: PATH, at the pinned commit). Name one there, set engine: torch to "
        "train it here, or leave it out of training.run here and run it with a GPU "
        "cluster's profile (snakemake --profile profiles/<cluster>)."
    )
