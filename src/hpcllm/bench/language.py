"""The language benchmark: a training engine run with a sweep point's settings.

``megatron`` (clusters) runs Megatron-LM's ``pretrain_gpt.py`` (in the container, at
/opt/Megatron-LM) with the arguments of ``hpcllm.models.megatron_args``; ``torch``
(laptops, CI) runs ``hpcllm.training.engines.torch_engine``. Both with ``--log-interval 1`` and
throughput logging, so every iteration is a Megatron-format line for the parser.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from hpcllm.bench.runner import launch_for, run_launch
from hpcllm.clusters import MEGATRON_IN_IMAGE
from hpcllm.launch import python_for
from hpcllm.models.planner import Layout
from hpcllm.models.presets import resolve_experiment
from hpcllm.text.tokenizer_train import hf_tokenizer_config

EOD_TOKEN = "<|endoftext|>"  # both engines' default end-of-document token


def experiment_of(point: dict) -> dict:
    """The training experiment (preset plus the point's batch, layout and precision)."""
    spec = {
        "preset": point["preset"],
        **point.get("model_overrides", {}),
    }
    exp = resolve_experiment(point["id"], spec)
    exp["model"]["seq_length"] = point["seq_length"]
    exp["batch"] = {"micro": point["micro_batch"], "global": point["global_batch"]}
    exp["layout"].update(
        tp=point["tp"],
        pp=point["pp"],
        sequence_parallel=point["sequence_parallel"],
        distributed_optimizer=point["distributed_optimizer"],
    )
    exp["precision"] = point["precision"]
    exp["save_interval"] = point["iterations"]  # unused: a benchmark gets no --save
    exp["log_interval"] = 1
    # Throughput does not depend on the learning rate; the presets' warm-ups (2000
    # iterations for 175B) exceed a benchmark's length, which Megatron refuses.
    exp["optim"]["warmup_iters"] = 0
    return exp


def eod_token_of(point: dict) -> str:
    """The end-of-document token of the point's tokenizer (the experiment's eod_token)."""
    return point.get("eod_token") or EOD_TOKEN


def tokenizer_folder(point: dict, run_dir: str | Path) -> str | None:
    """The point's ``tokenizer.json`` (any model Hugging Face ``tokenizers`` loads: BPE,
    Unigram, WordPiece) as both engines read it: a copy of that very file in the run
    folder (never other files that lie beside it) and a tokenizer_config.json naming the
    end-of-document token as ``eos_token``; Megatron's HuggingFaceTokenizer takes its EOD
    from it (its datasets fail without one), the torch engine the same folder."""
    if not point.get("tokenizer"):
        return None
    from hpcllm.text.tokenization import TokenizerError, load_tokenizer, special_tokens_of

    source = point["tokenizer"]
    eod = eod_token_of(point)
    try:
        tokenizer = load_tokenizer(source)
    except TokenizerError as exc:
        raise ValueError(str(exc)) from None
    if tokenizer.token_to_id(eod) is None:
        raise ValueError(
            f"{source}: has no end-of-document token {eod!r}, which the benchmark's engines "
            f"append to documents (its special tokens: "
            f"{', '.join(special_tokens_of(tokenizer)) or 'none'}); set "
            f"benchmarks.experiments.{point.get('experiment', '<name>')}.eod_token to the "
            "token its data was tokenized with"
        )
    out = Path(run_dir) / "tokenizer"
    out.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(source, out / "tokenizer.json")
    (out / "tokenizer_config.json").write_text(json.dumps(hf_tokenizer_config(eod)))
    return str(out.resolve())


def engine_command(
    point: dict,
    run_dir: str | Path,
    python: str,
    transformer_impl: str = "transformer_engine",
    megatron_dir: str = MEGATRON_IN_IMAGE,
) -> list[str]:
    exp = experiment_of(point)
    model = exp["model"]
    folder = tokenizer_folder(point, run_dir)
    mock = point["data"] == "mock"
    if point["engine"] == "torch":
        cmd = [
            python, "-m", "hpcllm.training.engines.torch_engine",
            "--num-layers", str(model["num_layers"]),
            "--hidden-size", str(model["hidden_size"]),
            "--num-attention-heads", str(model["num_attention_heads"]),
            "--seq-length", str(point["seq_length"]),
            "--micro-batch-size", str(point["micro_batch"]),
            "--global-batch-size", str(point["global_batch"]),
            "--train-iters", str(point["iterations"]),
            "--lr", str(exp["optim"]["lr"]),
            "--min-lr", str(exp["optim"]["min_lr"]),
            "--log-interval", "1",
            "--log-throughput",
            "--data-cache-path", str(Path(run_dir).resolve() / "index-cache"),
            "--split", "100,0,0",  # a benchmark trains only
            "--eval-iters", "0",
        ]  # fmt: skip
        if model.get("ffn_hidden_size"):
            cmd += ["--ffn-hidden-size", str(model["ffn_hidden_size"])]
        if point["precision"] in ("bf16", "fp16"):
            cmd.append(f"--{point['precision']}")
        if mock:
            cmd += ["--mock-data", "--vocab-size", str(model.get("vocab_size") or 50257)]
        else:
            cmd += ["--data-path", str(Path(point["data"]).resolve())]
        if folder:
            cmd += ["--tokenizer-model", folder, "--eod-token", eod_token_of(point)]
        return cmd
    from hpcllm.models.megatron_args import pretrain_gpt_args, pretrain_gpt_program

    layout = Layout(
        gpus=point["gpus"],
        tp=point["tp"],
        pp=point["pp"],
        dp=point["dp"],
        micro_batch=point["micro_batch"],
        global_batch=point["global_batch"],
    )
    args = pretrain_gpt_args(
        exp,
        layout,
        data_path=None if mock else [point["data"]],
        split="100,0,0",
        save=None,  # a benchmark writes no checkpoint and never resumes one
        tensorboard_dir=str(Path(run_dir) / "tensorboard"),
        data_cache_path=str(Path(run_dir).resolve() / "index-cache"),
        train_iters=point["iterations"],
        stop_iteration=point["iterations"],
        exit_minutes=None,
        transformer_impl=transformer_impl,
        tokenizer_model=folder,
    )
    return [*pretrain_gpt_program(python, megatron_dir), *args]


def language_launch(point: dict, run_dir: str | Path, cluster, container: str | None):
    """The launch of the point's engine on its nodes, as its job runs it."""
    from hpcllm.models.megatron_args import MEGATRON_ENV, transformer_impl_for

    command = engine_command(
        point,
        run_dir,
        python_for(container),
        transformer_impl=transformer_impl_for(cluster),
        megatron_dir=cluster.megatron_dir or MEGATRON_IN_IMAGE,
    )
    launch = launch_for(point, cluster, command, container)
    if point["engine"] == "megatron":
        launch.env.update(MEGATRON_ENV)
    return launch


def run_language_point(
    point: dict,
    log_path: str,
    record_path: str,
    cluster,
    container: str | None = None,
    time_limit_s: float | None = None,
) -> dict:
    launch = language_launch(point, Path(log_path).parent, cluster, container)
    return run_launch(launch, point, log_path, record_path, time_limit_s)
