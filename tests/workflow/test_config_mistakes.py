"""Config mistakes a plan used to accept (or name only by file), refused at plan time
naming the key and what to do (issue 33, items 7 and 8). The checks of cluster facts,
profiles and benchmark sweeps are tested in tests/clusters and tests/bench; here the
training engine, given tokenizer files, and the dry runs through Snakemake."""

from __future__ import annotations

import os
from dataclasses import replace

import pytest
from support import REPO, megatron_checkout, run_snakemake

from hpcllm.clusters import load_cluster
from hpcllm.text.tokenizers_config import missing_file_problem
from hpcllm.training.engines.command import engine_problem

CLUSTERS = REPO / "config" / "clusters"


def test_the_megatron_engine_on_a_cluster_without_containers_is_refused_by_its_key(tmp_path):
    """Megatron-LM is in the training image (/opt/Megatron-LM): the local machine has none
    unless its facts name a checkout (megatron_lm) at the pin; a segment failed on start
    on /opt/Megatron-LM/pretrain_gpt.py."""
    local = load_cluster("local", CLUSTERS)
    assert engine_problem("big", "megatron", local) == (
        "training.experiments.big.engine: megatron runs Megatron-LM's pretrain_gpt.py from "
        "the training container (/opt/Megatron-LM), but cluster local has no container "
        f"runtime ({CLUSTERS / 'local.yaml'}: container_runtime: none) and names no "
        "Megatron-LM checkout (megatron_lm: PATH, at the pinned commit). Name one there, set "
        "engine: torch to train it here, or leave it out of training.run here and run it "
        "with a GPU cluster's profile (snakemake --profile profiles/<cluster>)."
    )
    assert engine_problem("big", "torch", local) is None
    assert engine_problem("big", "megatron", load_cluster("juwels", CLUSTERS)) is None
    # A checkout at the pin, its helpers built for this Python: the engine runs bare metal.
    tree = megatron_checkout(tmp_path / "Megatron-LM")
    assert engine_problem("big", "megatron", replace(local, megatron_lm=str(tree))) is None
    # Another release (an archive says it in package_info.py) is refused, naming both.
    other = megatron_checkout(tmp_path / "old", version="0.16.0")
    assert engine_problem("big", "megatron", replace(local, megatron_lm=str(other))) == (
        f"training.experiments.big.engine: megatron on cluster local ({local.path}): "
        f"megatron_lm {other}: megatron/core/package_info.py says 0.16.0, the pin's says "
        "0.19.1 (core_v0.19.0, 5be9626709af); check out that commit"
    )


def test_a_given_tokenizer_file_that_is_not_there_is_named_by_its_key(tmp_path):
    (tmp_path / "vocab.json").write_text("{}")
    given = {"type": "files", "tokenizer_json": "nowhere/tokenizer.json"}
    assert missing_file_problem("euro", given) == (
        "text.tokenizers.euro.tokenizer_json: nowhere/tokenizer.json does not exist (a "
        f"relative path is read from the working directory, {os.getcwd()}); set it to the "
        "path of a Hugging Face tokenizer.json"
    )
    gpt2 = {"type": "files", "vocab_file": str(tmp_path / "vocab.json"), "merges_file": "m.txt"}
    assert missing_file_problem("gpt2", gpt2).startswith(
        "text.tokenizers.gpt2.merges_file: m.txt does not exist"
    )
    assert missing_file_problem("gpt2", gpt2).endswith("path of a GPT-2 style merges.txt")
    # One a rule of the workflow may make (a trained tokenizer's file), or one that is there
    made = {"type": "files", "tokenizer_json": "data/tokenizers/bpe/tokenizer.json"}
    assert missing_file_problem("reuse", made) is None
    there = {**given, "tokenizer_json": str(tmp_path / "vocab.json")}
    assert missing_file_problem("euro", there) is None
    assert missing_file_problem("bpe", {"type": "train", "vocab_size": 300}) is None


@pytest.mark.workflow
def test_a_dry_run_refuses_the_megatron_engine_on_the_local_machine(workdir):
    (workdir / "meg.yaml").write_text(
        "training:\n  experiments:\n    tiny_local:\n      engine: megatron\n"
    )
    proc = run_snakemake(workdir, "-n", "--configfile", "meg.yaml", check=False)
    out = proc.stdout + proc.stderr
    assert proc.returncode != 0
    assert "training.experiments.tiny_local.engine: megatron runs Megatron-LM's" in out, out[-3000:]
    assert "set engine: torch to train it here" in out


@pytest.mark.workflow
def test_a_configfile_naming_another_cluster_than_the_profile_is_refused(workdir):
    """The profile's `config: cluster: juwels` wins over the file's `cluster: lumi`: the
    plan was made for JUWELS without a word."""
    (workdir / "lumi.yaml").write_text("cluster: lumi\n")
    proc = run_snakemake(
        workdir,
        "-n",
        "--profile",
        "profiles/juwels",
        "--configfile",
        "lumi.yaml",
        check=False,
        examples=False,
        env={"HPCLLM_ACCOUNT": "myproject"},
    )
    out = proc.stdout + proc.stderr
    assert proc.returncode != 0
    assert "lumi.yaml sets cluster: lumi, but the profile " in out, out[-3000:]
    assert "is for cluster 'juwels'" in out and "Use --profile profiles/lumi" in out


@pytest.mark.workflow
def test_a_dry_run_refuses_an_account_the_slurm_plugin_would_cut(workdir):
    """The plugin splits slurm_account at whitespace and submits the first part."""
    proc = run_snakemake(
        workdir,
        "-n",
        "--profile",
        "profiles/juwels",
        check=False,
        examples=False,
        env={"HPCLLM_ACCOUNT": "proj1\nproj2"},
    )
    out = proc.stdout + proc.stderr
    assert proc.returncode != 0
    assert (
        "the profile's default-resources takes slurm_account from $HPCLLM_ACCOUNT, which is "
        "'proj1\\nproj2': an account is one name" in out
    ), out[-3000:]


@pytest.mark.workflow
def test_a_dry_run_refuses_a_source_that_inherits_an_example_sources_keys(workdir):
    """README's way to add one's sources to the examples: --configfile
    config/examples/local.yaml my.yaml. A local `fineweb` there got the example hub
    source's dataset, mirror, name and max_documents (issue 40 item 8)."""
    (workdir / "mine").mkdir()
    (workdir / "mine/docs.jsonl").write_text('{"text": "mine"}\n')
    (workdir / "my.yaml").write_text(
        "text:\n  sources:\n    fineweb:\n      type: local\n      files: mine/docs.jsonl\n"
    )
    proc = run_snakemake(workdir, "-n", "--configfile", "my.yaml", check=False)
    out = proc.stdout + proc.stderr
    assert proc.returncode != 0
    assert (
        "text.sources.fineweb is type: local (in my.yaml), but it has dataset, mirror, name, "
        "keys of a hub source that a local source does not read. They come from "
        f"{REPO / 'config/examples/local.yaml'}, where a hub source is also named fineweb"
        in " ".join(out.split())
    ), out[-3000:]
    assert "Give your source a name of its own" in out


@pytest.mark.workflow
def test_a_dry_run_refuses_a_key_given_twice_in_a_config_file(workdir):
    (workdir / "twice.yaml").write_text(
        "training:\n  experiments:\n    tiny_local:\n      segments: 2\n      segments: 4\n"
    )
    proc = run_snakemake(workdir, "-n", "--configfile", "twice.yaml", check=False)
    out = proc.stdout + proc.stderr
    assert proc.returncode != 0
    assert (
        "twice.yaml:5: key training.experiments.tiny_local.segments is given twice in this "
        "file (first at line 4)" in out
    ), out[-3000:]


@pytest.mark.workflow
def test_a_dry_run_refuses_an_unknown_evaluation_task(workdir):
    """It was accepted on sites whose login nodes reach the hub; the staging job refused it
    after training (issue 40 item 9)."""
    (workdir / "eval.yaml").write_text(
        "training:\n  experiments:\n    tiny_local:\n      evaluate:\n"
        "        tasks: [module_purpose, no_such_task]\n"
    )
    proc = run_snakemake(workdir, "-n", "--configfile", "eval.yaml", check=False)
    out = " ".join((proc.stdout + proc.stderr).split())
    assert proc.returncode != 0
    assert (
        "training.experiments.tiny_local.evaluate.tasks: no task 'no_such_task': neither "
        "resources/eval_tasks/no_such_task.yaml (this project's tasks: module_purpose) nor "
        "one of lm-eval's" in out
    ), out[-3000:]
