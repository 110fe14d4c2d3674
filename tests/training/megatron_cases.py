"""Every Megatron-LM command line the workflow generates, for the tests that check them:
every preset on every GPU cluster, every point of the shipped language sweeps on every
cluster, each as {"name", "argv" (after pretrain_gpt.py), "world_size", "env"}."""

from __future__ import annotations

import json
import os
from pathlib import Path

import yaml
from support import REPO

from hpcllm.bench.language import language_launch
from hpcllm.bench.sweeps import expand_all, facts_of
from hpcllm.clusters import MEGATRON_IN_IMAGE, known_clusters, load_cluster
from hpcllm.models.megatron_args import MEGATRON_ENV, transformer_impl_for
from hpcllm.models.planner import PlanError, check_layout
from hpcllm.models.presets import PRESETS, resolve_experiment
from hpcllm.text.tokenizer_train import hf_tokenizer_config
from hpcllm.training.engines.command import engine_command as segment_command
from hpcllm.training.plan.data import Blend
from hpcllm.training.plan.experiment import Paths

CLUSTERS = REPO / "config" / "clusters"
# What an experiment adds to its preset (the schema's required keys and defaults).
EXPERIMENT = {"engine": "megatron", "segments": 3, "iterations_per_segment": 1000, "seed": 1234, "log_interval": 10, "data": {"split": "949,50,1"}}  # fmt: skip
ENV = {"HPCLLM_SCRATCH": "/scratch", "HPCLLM_ACCOUNT": "acct", "HPCLLM_PARTITION": "gpu"}


def gpu_clusters():
    for name in known_clusters(CLUSTERS):
        cluster = load_cluster(name, root=CLUSTERS, environ={**os.environ, **ENV})
        if cluster.gpus_per_node:
            yield cluster


def gpt2_tokenizer_files(folder: Path) -> str:
    """A small tokenizer folder as train_tokenizer writes it: tokenizer.json,
    tokenizer_config.json, vocab.json and merges.txt."""
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    trainer = trainers.BpeTrainer(vocab_size=400, special_tokens=["<|endoftext|>"])
    tok.train_from_iterator(["the quick brown fox jumps over the lazy dog"] * 20, trainer)
    folder.mkdir(parents=True, exist_ok=True)
    tok.model.save(str(folder))
    tok.save(str(folder / "tokenizer.json"))  # as train_tokenizer writes it
    (folder / "tokenizer_config.json").write_text(json.dumps(hf_tokenizer_config("<|endoftext|>")))
    return str(folder)


def training_cases(tmp: Path) -> list[dict]:
    cases = []
    tokenizer_dir = gpt2_tokenizer_files(tmp / "tokenizer")
    tokenizer_files = (f"{tokenizer_dir}/vocab.json", f"{tokenizer_dir}/merges.txt")
    blend = Blend(
        ("data/tokenized/gpt2/a_text_document", "data/tokenized/gpt2/b_text_document"), (0.7, 0.3)
    )
    paths = Paths("checkpoints/x", "results/x.json", "x.log", "cache/x", "tb/x")
    for cluster in gpu_clusters():
        for preset in PRESETS:
            exp = resolve_experiment(preset, {"preset": preset, **EXPERIMENT})
            exp.setdefault("save_interval", exp["iterations_per_segment"])
            replica = exp["layout"]["tp"] * exp["layout"]["pp"]
            whole_nodes = max(1, -(-replica // cluster.gpus_per_node)) * cluster.gpus_per_node
            layout = None
            for gpus in (whole_nodes, replica):  # whole nodes, else one replica
                try:
                    layout = check_layout(preset, exp, gpus, cluster.gpus_per_node)
                    break
                except PlanError:
                    continue  # planning refuses it: never generated
            if layout is None:
                continue
            for segment, left in ((1, 3600.0), (exp["segments"], None)):
                argv = segment_command(
                    exp, layout, blend, tokenizer_files, paths, segment, left and 50,
                    transformer_impl=transformer_impl_for(cluster),
                )  # fmt: skip
                name = f"train {preset} on {cluster.name} segment {segment}"
                # run_segment builds its launch with env=MEGATRON_ENV
                cases.append(
                    {"name": name, "argv": argv[2:], "world_size": gpus, "env": MEGATRON_ENV}
                )
    return cases


def bench_cases(tmp: Path) -> list[dict]:
    schema = yaml.safe_load((REPO / "workflow/schemas/benchmarks.schema.yaml").read_text())
    experiments = {"language": "config/experiments/language.yaml"}
    cases = []
    for cluster in gpu_clusters():
        for point in expand_all(experiments, facts_of(cluster), root=REPO, schema=schema):
            row = point.row()
            # the launch the point's job runs: its engine's arguments and environment
            launch = language_launch(row, tmp / row["id"], cluster, "megatron.sif")
            argv = launch.argv[launch.argv.index(f"{MEGATRON_IN_IMAGE}/pretrain_gpt.py") + 1 :]
            env = {k: v for k, v in launch.env.items() if k == "CUDA_DEVICE_MAX_CONNECTIONS"}
            cases.append({"name": f"bench {point.id} on {cluster.name}", "argv": argv, "world_size": row["gpus"], "env": env})  # fmt: skip
    return cases


def transformer_impl(case: dict) -> str:
    return case["argv"][case["argv"].index("--transformer-impl") + 1]
