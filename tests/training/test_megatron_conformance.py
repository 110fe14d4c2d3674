"""Every Megatron-LM command line we generate, parsed by Megatron-LM's own parser.

Megatron-LM's training code is not on any package index, so CI cannot have it: this test
runs only when ``MEGATRON_LM_DIR`` points at a Megatron-LM tree at the pinned commit
(``git -C Megatron-LM archive <commit> | tar -x -C DIR``). It builds every command line
the workflow generates (every preset on every GPU cluster, every point of the shipped
language sweeps on every cluster) and runs ``parse_args`` and ``validate_args`` of
``megatron.training.arguments`` on each, then builds its tokenizer and learning-rate
schedule as ``pretrain_gpt.py`` does at start-up, in one subprocess
(scripts/megatron_lm_parser.py, which says what it stubs on a CPU-only machine).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from support import REPO

from hpcllm.bench.language import PRETRAIN_GPT, language_launch
from hpcllm.bench.sweeps import expand_all, facts_of
from hpcllm.clusters import known_clusters, load_cluster
from hpcllm.text.tokenizer_train import hf_tokenizer_config
from hpcllm.training.data import Blend
from hpcllm.training.megatron_args import MEGATRON_ENV, MEGATRON_LM_COMMIT, transformer_impl_for
from hpcllm.training.planner import PlanError, check_layout
from hpcllm.training.presets import PRESETS, resolve_experiment
from hpcllm.training.segment import Paths
from hpcllm.training.segment import engine_command as segment_command

MEGATRON_LM_DIR = os.environ.get("MEGATRON_LM_DIR")
pytestmark = pytest.mark.skipif(
    not MEGATRON_LM_DIR,
    reason=f"MEGATRON_LM_DIR is unset: point it at Megatron-LM {MEGATRON_LM_COMMIT[:12]}",
)
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
            argv = launch.argv[launch.argv.index(PRETRAIN_GPT) + 1 :]
            env = {k: v for k, v in launch.env.items() if k == "CUDA_DEVICE_MAX_CONNECTIONS"}
            cases.append({"name": f"bench {point.id} on {cluster.name}", "argv": argv, "world_size": row["gpus"], "env": env})  # fmt: skip
    return cases


def run_parser(mode: str, cases):
    """scripts/megatron_lm_parser.py MODE on the Megatron-LM tree; its JSON answer."""
    done = subprocess.run(
        [sys.executable, str(REPO / "scripts" / "megatron_lm_parser.py"), mode],
        input=json.dumps(cases),
        capture_output=True,
        text=True,
        # offline, as on compute nodes: a tokenizer that needs the hub fails, not hangs
        env={**os.environ, "PYTHONPATH": MEGATRON_LM_DIR, "HF_HUB_OFFLINE": "1"},
        check=False,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_megatron_parses_every_generated_command_line(tmp_path):
    cases = training_cases(tmp_path) + bench_cases(tmp_path)
    assert len({c["name"].split()[1] for c in cases if c["name"].startswith("train")}) == len(
        PRESETS
    )
    assert any(c["name"].startswith("bench") for c in cases)
    results = run_parser("parse", cases)
    failed = [f"{r['name']}: {r['error']}" for r in results if not r["ok"]]
    assert not failed, f"{len(failed)} of {len(results)} refused:\n" + "\n".join(failed[:20])
    print(
        f"Megatron-LM {MEGATRON_LM_COMMIT[:12]} parsed and validated {len(results)} command lines"
    )


def test_megatron_loads_the_index_cache_that_the_cpu_rule_built(text_workdir, monkeypatch):
    """prepare_data_cache's index files, found by Megatron-LM's own dataset construction
    for the segment's command line: it builds nothing (its cache key, tokenizer included,
    equals ours), so the GPU job only loads them."""
    from snakemake.utils import validate

    from hpcllm.training.cache import build_index_cache
    from hpcllm.training.segment import prepare_experiment

    config = yaml.safe_load((REPO / "config/config.yaml").read_text())
    for section in ("text", "training"):  # the schema's defaults, as the workflow fills them
        validate(config[section], str(REPO / f"workflow/schemas/{section}.schema.yaml"))
    name = "tiny_local"
    raw = {**config["training"]["experiments"][name], "engine": "megatron"}
    raw["data"] = {**raw["data"], "split": "90,8,2"}  # a test split too: all three built
    monkeypatch.chdir(text_workdir)  # relative paths, as the workflow runs
    prepared = prepare_experiment(name, raw, config["text"], load_cluster("juwels", CLUSTERS))
    cache = "data/index_cache/conformance"
    paths = Paths(f"checkpoints/{name}", "seg1.json", "seg1.engine.log", cache, "tb")
    record = build_index_cache(prepared, cache, "data/index_cache/conformance.json")
    assert all(record["built"]) and record["files"]
    argv = segment_command(
        prepared.experiment, prepared.layout, prepared.blend, prepared.tokenizer_files,
        paths, 1, None, transformer_impl="local",
    )  # fmt: skip
    assert "--tokenizer-model" in argv  # the trained tokenizer's folder holds tokenizer.json
    case = {"argv": argv[2:], "world_size": prepared.layout.gpus, "env": MEGATRON_ENV}
    result = run_parser("datasets", case)
    assert result["samples"] == [record["samples"][k] for k in ("train", "valid", "test")]
    assert result["after"] == result["before"] == record["files"], result["log"]
    assert result["sizes"] == record["built"]
    # Megatron's end-of-document id (from the tokenizer_config.json's eos_token) is ours
    assert (
        result["eod"] == json.loads(Path(prepared.tokenizer_files[0]).read_text())["<|endoftext|>"]
    )
