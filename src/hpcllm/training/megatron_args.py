"""The command line of Megatron-LM's ``pretrain_gpt.py`` for an experiment.

Megatron-LM's flags drift between versions (the OpenGPT-X report's appendix passes
``--data-impl mmap``, which later versions reject as an unrecognized argument), so the
flag names live in one table per supported Megatron-LM commit, read from that commit's
``megatron/training/arguments.py``. ``MEGATRON_LM_COMMIT`` is the one pin: the container
recipe builds the same commit (envs/*.def read it from here, see docs/training.md).
"""

from __future__ import annotations

import math
import re
from typing import Any

from hpcllm.training.planner import Layout

# The Megatron-LM commit the workflow generates arguments for and the container installs.
MEGATRON_LM_REPO = "https://github.com/NVIDIA/Megatron-LM.git"
MEGATRON_LM_COMMIT = "307dcf37f03d44da131ba21999278abe4112d2ad"

# Logical option -> flag, per commit. A logical option missing from a version's table is
# not supported by that version and refused, instead of passed to fail at start-up.
# Read from megatron/training/arguments.py at 307dcf37 (argparse groups network size,
# training, learning rate, checkpointing, mixed precision, distributed, data, logging).
FLAGS: dict[str, dict[str, str]] = {
    "307dcf37f03d44da131ba21999278abe4112d2ad": {
        "use_mcore_models": "--use-mcore-models",
        "num_layers": "--num-layers",
        "hidden_size": "--hidden-size",
        "ffn_hidden_size": "--ffn-hidden-size",
        "num_attention_heads": "--num-attention-heads",
        "seq_length": "--seq-length",
        "max_position_embeddings": "--max-position-embeddings",
        "position_embedding_type": "--position-embedding-type",
        "make_vocab_size_divisible_by": "--make-vocab-size-divisible-by",
        "tensor_model_parallel_size": "--tensor-model-parallel-size",
        "pipeline_model_parallel_size": "--pipeline-model-parallel-size",
        "sequence_parallel": "--sequence-parallel",
        "use_distributed_optimizer": "--use-distributed-optimizer",
        "use_flash_attn": "--use-flash-attn",
        "recompute_granularity": "--recompute-granularity",
        "recompute_method": "--recompute-method",
        "recompute_num_layers": "--recompute-num-layers",
        "micro_batch_size": "--micro-batch-size",
        "global_batch_size": "--global-batch-size",
        "train_iters": "--train-iters",
        "exit_interval": "--exit-interval",
        "exit_duration_in_mins": "--exit-duration-in-mins",
        "exit_signal_handler": "--exit-signal-handler",
        "bf16": "--bf16",
        "fp16": "--fp16",
        "optimizer": "--optimizer",
        "adam_beta1": "--adam-beta1",
        "adam_beta2": "--adam-beta2",
        "weight_decay": "--weight-decay",
        "clip_grad": "--clip-grad",
        "lr": "--lr",
        "min_lr": "--min-lr",
        "lr_decay_style": "--lr-decay-style",
        "lr_warmup_iters": "--lr-warmup-iters",
        "attention_dropout": "--attention-dropout",
        "hidden_dropout": "--hidden-dropout",
        "seed": "--seed",
        "data_path": "--data-path",
        "split": "--split",
        "data_cache_path": "--data-cache-path",
        "tokenizer_type": "--tokenizer-type",
        "vocab_file": "--vocab-file",
        "merge_file": "--merge-file",
        "save": "--save",
        "load": "--load",
        "save_interval": "--save-interval",
        "log_interval": "--log-interval",
        "log_throughput": "--log-throughput",
        "tensorboard_dir": "--tensorboard-dir",
        "eval_interval": "--eval-interval",
        "eval_iters": "--eval-iters",
        "distributed_backend": "--distributed-backend",
    },
}


class MegatronArgsError(ValueError):
    """An experiment that the pinned Megatron-LM version cannot express."""


def container_commit_mismatch(definition_text: str, where: str) -> str | None:
    """A message when a container recipe builds another Megatron-LM commit than the pin."""
    found = re.search(r"MEGATRON_COMMIT=([0-9a-f]{7,40})", definition_text)
    if found is None:
        return f"{where}: names no MEGATRON_COMMIT; the megatron engine cannot check its flags"
    if found.group(1) != MEGATRON_LM_COMMIT and found.group(1) not in FLAGS:
        return (
            f"{where}: builds Megatron-LM {found.group(1)[:12]}, but the arguments are "
            f"generated for {MEGATRON_LM_COMMIT[:12]} (hpcllm.training.megatron_args); build "
            "that commit, or add a flag table for this one read from its arguments.py"
        )
    return None


def exit_duration_minutes(remaining_seconds: float | None, margin_seconds: float) -> int | None:
    """``--exit-duration-in-mins`` (an integer in Megatron) from the job's time left."""
    if remaining_seconds is None:
        return None
    minutes = math.floor((remaining_seconds - margin_seconds) / 60)
    if minutes < 1:
        raise MegatronArgsError(
            f"the job has {remaining_seconds:.0f} s left, less than the safety margin of "
            f"{margin_seconds:.0f} s plus one minute of training; give the segment more time "
            "(runtime resource) or lower training.experiments.*.time.margin_seconds"
        )
    return minutes


def pretrain_gpt_args(
    experiment: dict[str, Any],
    layout: Layout,
    *,
    data_path: list[str],
    split: str,
    vocab_file: str,
    merge_file: str,
    save: str,
    tensorboard_dir: str,
    data_cache_path: str | None,
    train_iters: int,
    stop_iteration: int,
    exit_minutes: int | None,
    commit: str = MEGATRON_LM_COMMIT,
) -> list[str]:
    """The arguments after ``pretrain_gpt.py`` (the launch builder adds the rest)."""
    if commit not in FLAGS:
        raise MegatronArgsError(
            f"Megatron-LM commit {commit} has no flag table; supported: {', '.join(FLAGS)}"
        )
    table = FLAGS[commit]
    model, lay, optim = experiment["model"], experiment["layout"], experiment["optim"]
    args: list[str] = []

    def add(option: str, value: Any = True) -> None:
        if option not in table:
            raise MegatronArgsError(f"Megatron-LM {commit[:8]} has no option for {option}")
        if value is True:
            args.append(table[option])
        elif isinstance(value, list):
            args.extend([table[option], *map(str, value)])
        elif value is not None and value is not False:
            args.extend([table[option], f"{value:g}" if isinstance(value, float) else str(value)])

    add("use_mcore_models")
    add("num_layers", model["num_layers"])
    add("hidden_size", model["hidden_size"])
    add("ffn_hidden_size", model.get("ffn_hidden_size"))
    add("num_attention_heads", model["num_attention_heads"])
    add("seq_length", model["seq_length"])
    add("max_position_embeddings", model["seq_length"])
    add("position_embedding_type", model.get("position_embedding", "rope"))
    add("make_vocab_size_divisible_by", 128)
    add("tensor_model_parallel_size", layout.tp)
    add("pipeline_model_parallel_size", layout.pp)
    add("sequence_parallel", bool(lay.get("sequence_parallel")))
    add("use_distributed_optimizer", bool(lay.get("distributed_optimizer")))
    add("use_flash_attn", bool(model.get("flash_attention")))
    recompute = lay.get("recompute", "none")
    if recompute == "selective":
        add("recompute_granularity", "selective")
    elif recompute == "full":
        add("recompute_granularity", "full")
        add("recompute_method", "uniform")
        add("recompute_num_layers", 1)
    add("micro_batch_size", layout.micro_batch)
    add("global_batch_size", layout.global_batch)
    add("train_iters", train_iters)
    add("exit_interval", stop_iteration if stop_iteration < train_iters else None)
    add("exit_duration_in_mins", exit_minutes)
    add("exit_signal_handler")
    precision = experiment.get("precision", "bf16")
    add("bf16", precision == "bf16")
    add("fp16", precision == "fp16")
    add("optimizer", "adam")
    add("adam_beta1", float(optim["beta1"]))
    add("adam_beta2", float(optim["beta2"]))
    add("weight_decay", float(optim["weight_decay"]))
    add("clip_grad", float(optim["clip_grad"]))
    add("lr", float(optim["lr"]))
    add("min_lr", float(optim["min_lr"]))
    add("lr_decay_style", "cosine")
    add("lr_warmup_iters", optim["warmup_iters"])
    add("attention_dropout", 0.0)
    add("hidden_dropout", 0.0)
    add("seed", experiment.get("seed", 1234))
    add("data_path", data_path)
    add("split", split)
    add("data_cache_path", data_cache_path)
    add("tokenizer_type", "GPT2BPETokenizer")
    add("vocab_file", vocab_file)
    add("merge_file", merge_file)
    add("save", save)
    add("load", save)
    add("save_interval", experiment["save_interval"])
    add("log_interval", experiment.get("log_interval", 1))
    add("log_throughput")
    add("tensorboard_dir", tensorboard_dir)
    add("eval_interval", experiment.get("eval_interval") or train_iters)
    add("eval_iters", experiment.get("eval_iters", 0))
    add("distributed_backend", "nccl")
    return args
