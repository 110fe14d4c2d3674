"""Every Megatron-LM command line the workflow generates, for the tests that check them:
every preset on every GPU cluster, the shipped experiment (config/experiments/
opengptx_800m.yaml) on every GPU cluster, every point of the shipped language sweeps on
every cluster, and the canaries made from the shipped experiment and sweep points (the
preflight's scaled-down jobs, hpcllm.preflight.canary), each as {"name", "argv" (after
pretrain_gpt.py), "world_size", "env"}."""

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


def writable_tree_copy(tree: str | Path, dest: Path, *skip: str) -> Path:
    """A copy of a Megatron-LM tree that a test may build in: the shared reference copy
    has no write bits, which copytree keeps (root ignores them, CI's user may not)."""
    import shutil
    import stat

    ignore = shutil.ignore_patterns(".git", "__pycache__", *skip)
    shutil.copytree(tree, dest, ignore=ignore, copy_function=shutil.copyfile)
    for path in [dest, *dest.rglob("*")]:
        path.chmod(path.stat().st_mode | stat.S_IWUSR)
    return dest


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
            # the last segment with Megatron's straggler detector, as where the site
            # probe found the image able to run it (hpcllm.models.megatron_resiliency)
            for segment, left in ((1, 3600.0), (exp["segments"], None)):
                stragglers = segment > 1
                argv = segment_command(
                    exp, layout, blend, tokenizer_files, paths, segment, left and 50,
                    transformer_impl=transformer_impl_for(cluster), straggler_log=stragglers,
                )  # fmt: skip
                name = f"train {preset} on {cluster.name} segment {segment}"
                name += " with --log-straggler" if stragglers else ""
                # run_segment builds its launch with env=MEGATRON_ENV
                cases.append(
                    {"name": name, "argv": argv[2:], "world_size": gpus, "env": MEGATRON_ENV}
                )
    return cases


def shipped_experiments(cluster) -> dict[str, dict]:
    """The shipped training experiments (config/experiments/*.yaml with the megatron
    engine) as the workflow reads them: the schema's defaults filled in."""
    from snakemake.utils import validate

    out = {}
    for path in sorted((REPO / "config/experiments").glob("*.yaml")):
        training = yaml.safe_load(path.read_text()).get("training") or {}
        for name, raw in (training.get("experiments") or {}).items():
            if raw.get("engine") == "megatron":
                section = {"experiments": {name: raw}}
                validate(section, str(REPO / "workflow/schemas/training.schema.yaml"))
                out[name] = section["experiments"][name]
    return out


def _text_for(raw: dict) -> dict:
    """A text section with the experiment's tokenizer and sources (nothing is read)."""
    tok = raw["data"]["tokenizer"]
    return {"sources": {s: {"type": "local"} for s in raw["data"]["sources"]},
            "tokenizers": {tok: {"type": "train", "vocab_size": 400}},
            "tokenize": {"tokenizers": [tok]}}  # fmt: skip


def _segment_cases(name, prepared, cluster, tokenizer_files, paths) -> list[dict]:
    exp = prepared.experiment
    cases = []
    for segment, left in ((1, 3600.0), (exp["segments"], None)):
        argv = segment_command(
            exp, prepared.layout, prepared.blend, tokenizer_files, paths, segment,
            left and 50, transformer_impl=transformer_impl_for(cluster),
            straggler_log=segment > 1,  # as where the probe found the image can run it
        )  # fmt: skip
        cases.append({"name": f"{name} on {cluster.name} segment {segment}", "argv": argv[2:],
                      "world_size": prepared.layout.gpus, "env": MEGATRON_ENV})  # fmt: skip
    return cases


def experiment_cases(tmp: Path) -> list[dict]:
    """The shipped experiments' segments on every GPU cluster, and their training canaries
    (two nodes for a multi-node experiment, a tiny model of the experiment's layout:
    train_canary_experiment)."""
    import copy

    from hpcllm.preflight.canary import canary_nodes, train_canary_experiment
    from hpcllm.training.plan.experiment import prepare_experiment

    tokenizer_dir = gpt2_tokenizer_files(tmp / "tokenizer")
    tokenizer_files = (f"{tokenizer_dir}/vocab.json", f"{tokenizer_dir}/merges.txt")
    paths = Paths("checkpoints/x", "results/x.json", "x.log", "cache/x", "tb/x")
    cases = []
    for cluster in gpu_clusters():
        for name, raw in shipped_experiments(cluster).items():
            text = _text_for(raw)
            prepared = prepare_experiment(name, copy.deepcopy(raw), text, cluster)
            cases += _segment_cases(f"train {name}", prepared, cluster, tokenizer_files, paths)
            nodes = canary_nodes(prepared.experiment["layout"].get("nodes", 1))
            canary = train_canary_experiment(copy.deepcopy(raw), cluster, nodes)
            prepared = prepare_experiment(f"canary_{name}", canary, text, cluster)
            cases += _segment_cases(
                f"canary train {name}", prepared, cluster, tokenizer_files, paths
            )
    return cases


def bench_cases(tmp: Path) -> list[dict]:
    """Every point of the shipped language sweep on every GPU cluster, and the language
    canary of each (two nodes where the sweep has multi-node points, a tiny model, 3
    iterations: language_canary_point)."""
    from hpcllm.preflight.canary import canary_nodes, language_canary_point

    schema = yaml.safe_load((REPO / "workflow/schemas/benchmarks.schema.yaml").read_text())
    experiments = {"language": "config/experiments/language.yaml"}
    cases = []
    for cluster in gpu_clusters():
        canaries = {}
        points = expand_all(experiments, facts_of(cluster), root=REPO, schema=schema)
        nodes = canary_nodes(max((p.row()["nodes"] for p in points), default=1))
        for point in points:
            row = point.row()
            cases.append(_bench_case(f"bench {point.id} on {cluster.name}", row, tmp, cluster))
            name = f"canary bench {point.id} on {cluster.name}"
            small = language_canary_point(row, cluster, nodes)
            canary = _bench_case(name, small, tmp, cluster)
            # distinct canaries only: many points scale down to the same command line
            key = json.dumps([canary["argv"], canary["world_size"], canary["env"]])
            canaries.setdefault(key, canary)
        cases += canaries.values()
    return cases


def _bench_case(name: str, row: dict, tmp: Path, cluster) -> dict:
    # the launch the point's job runs: its engine's arguments and environment
    launch = language_launch(row, tmp / f"{row['id']}-{cluster.name}", cluster, "megatron.sif")
    argv = launch.argv[launch.argv.index(f"{MEGATRON_IN_IMAGE}/pretrain_gpt.py") + 1 :]
    env = {k: v for k, v in launch.env.items() if k == "CUDA_DEVICE_MAX_CONNECTIONS"}
    return {"name": name, "argv": argv, "world_size": row["gpus"], "env": env}


def all_cases(tmp: Path) -> list[dict]:
    """Every command line above (what the conformance test parses)."""
    return training_cases(tmp) + experiment_cases(tmp) + bench_cases(tmp)


def transformer_impl(case: dict) -> str:
    return case["argv"][case["argv"].index("--transformer-impl") + 1]
