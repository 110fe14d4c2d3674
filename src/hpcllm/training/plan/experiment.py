"""An experiment checked at plan time, and where its segments' files go.

:func:`prepare_experiment` resolves the preset and checks layout, memory and data
sources before any job runs (``snakemake -n`` included); :class:`Prepared` is what the
segments, the chain and the index cache get from it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from hpcllm.models.planner import Layout
from hpcllm.training.plan.data import Blend, parse_split


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
    # layout: auto (hpcllm.training.plan.autolayout): the candidates and the choice
    auto: Any = None


def prepare_experiment(
    name: str, raw: dict[str, Any], text: dict[str, Any], cluster, workdir: str = "."
) -> Prepared:
    """Resolve the preset and check layout, memory and data sources before any job runs.

    Data that the text stage has not made yet is checked when the segment starts. With
    ``layout.auto`` the layout is the measuring job's choice where its record is in
    ``workdir`` (results/layout/<name>.json), else the best predicted.
    """
    from hpcllm.models.planner import plan
    from hpcllm.models.presets import resolve_experiment

    exp = resolve_experiment(name, raw)
    data = exp["data"]
    from hpcllm.configuration import missing_data_config

    if data["tokenizer"] not in text["tokenizers"]:
        raise ValueError(
            f"training.experiments.{name}.data.tokenizer: '{data['tokenizer']}' is not in "
            f"text.tokenizers ({', '.join(text['tokenizers']) or 'none defined'}); "
            + missing_data_config(name, "text.tokenizers", data["tokenizer"])
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
                f"text.sources ({', '.join(text['sources']) or 'none defined'}); there is "
                "no data for it: " + missing_data_config(name, "text.sources", source)
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
    from hpcllm.training.plan.job_plan import check_nodes

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
    from hpcllm.training.plan.vocab import check_vocab_size

    check_vocab_size(name, exp, tok, text["tokenizers"][tok], workdir)
    vocab = exp["model"].get("vocab_size") or text["tokenizers"][tok].get("vocab_size") or 50257
    gpu_gb = cluster.gpu.memory_gb if cluster.gpu is not None else None
    # Memory for the layout the engine runs: Megatron-LM without Transformer Engine (the
    # ROCm image) runs without sequence parallelism (megatron_args.py), whose activations
    # are then not split over TP.
    from hpcllm.models.megatron_args import transformer_impl_for

    auto = None
    if lay.get("auto"):
        from hpcllm.training.plan import autolayout

        gpus_per_node = getattr(cluster, "gpus_per_node", 0)
        auto = autolayout.plan_auto(
            name, exp, gpus, lay["procs_per_node"], vocab, gpu_gb,
            cluster.gpu.rate_tflops(exp["precision"]) if cluster.gpu is not None else None,
            transformer_impl_for(cluster), autolayout.record_path(name, workdir),
            max_minutes=cluster.max_minutes if cluster.uses_slurm else None,
            # the site's billing unit (LUMI bills one GPU-hour per two GCDs)
            billing=cluster.billed_gpus_per_node / gpus_per_node if gpus_per_node else 1.0,
        )  # fmt: skip
        exp = autolayout.with_layout(exp, auto.chosen)
        lay = exp["layout"]
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
    return Prepared(exp, layout, blend, files, eod, memory.total, auto)


def as_measured(name: str, prepared, config: dict[str, Any], cluster, workdir: str = "."):
    """A segment's experiment with the measuring job's choice: planned again where the
    plan ran before the record existed (the same run that measured)."""
    if prepared.auto is None or prepared.auto.measured:
        return prepared
    from hpcllm.models.planner import PlanError

    again = prepare_experiment(
        name, config["training"]["experiments"][name], config["text"], cluster, workdir
    )
    if not again.auto.measured:
        raise PlanError(
            f"training.experiments.{name}: layout: auto, but {again.auto.record} is "
            "missing: the measuring job (rule measure_layout) makes it before the segments"
        )
    return again
