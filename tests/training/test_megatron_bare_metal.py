"""Megatron-LM from a cluster's ``megatron_lm`` checkout, without a container: the jobs
run the pin's tree on the workflow's own Python (3.11 here), which the release's
``from typing import override`` needs hpcllm's shim for, and without Transformer Engine
where this Python has none. With the pin's tree (MEGATRON_LM_DIR, or the shared
reference copy: tests/conftest.py), its dataset helpers built as the checkout check
says, the plan accepts it and the segment's job, launched as the job script launches it
(torchrun, one rank), gets past imports, argument parsing and the model's configuration
to Megatron's own CUDA check: this machine has no GPU."""

from __future__ import annotations

import os
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest
from megatron_cases import _text_for, gpt2_tokenizer_files, writable_tree_copy
from support import REPO, hang_guard, run_snakemake

from hpcllm.clusters import load_cluster
from hpcllm.launch import python_for
from hpcllm.models.megatron_args import (
    MEGATRON_LM_RELEASE,
    has_transformer_engine,
    transformer_impl_for,
)
from hpcllm.training.campaign.engine_process import segment_launch
from hpcllm.training.engines.command import engine_command, engine_problem
from hpcllm.training.plan.experiment import Paths, prepare_experiment
from hpcllm.training.plan.job_plan import segment_job

MEGATRON_LM_DIR = os.environ.get("MEGATRON_LM_DIR")
pytestmark = pytest.mark.skipif(
    not MEGATRON_LM_DIR,
    reason="needs a Megatron-LM tree at the pin (MEGATRON_LM_DIR, or the reference copy "
    f"../shared/reference/megatron-lm-{MEGATRON_LM_RELEASE} from the project's root)",
)


@pytest.fixture(scope="module")
def checkout(tmp_path_factory) -> Path:
    """A copy of the pin's tree with its dataset helpers built for this Python, as the
    checkout check tells a user: ``make -C <checkout>/megatron/core/datasets`` with this
    environment's python3 first on the PATH (python3-config is the base's: a venv has
    none)."""
    tree = writable_tree_copy(
        MEGATRON_LM_DIR, tmp_path_factory.mktemp("checkout") / "Megatron-LM", "helpers_cpp*"
    )
    bins = [str(Path(sys.executable).parent), sysconfig.get_config_var("BINDIR")]
    done = subprocess.run(
        ["make", "-C", str(tree / "megatron/core/datasets")],
        env={**os.environ, "PATH": os.pathsep.join([*bins, os.environ["PATH"]])},
        capture_output=True,
        text=True,
        timeout=hang_guard(30),  # about 10 s of compiling on a quiet machine
        check=False,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return tree


def bare_metal_cluster(tmp_path: Path, tree: Path):
    """profiles/local's cluster file (no scheduler, no container) naming the checkout."""
    root = tmp_path / "clusters"
    root.mkdir()
    local = (REPO / "config/clusters/local.yaml").read_text()
    (root / "bare.yaml").write_text(f"{local}\nmegatron_lm: {tree}\n")
    return load_cluster("bare", root=root)


def workdir_with_cluster(work: Path, tree: Path) -> Path:
    """A working directory whose config/clusters holds the shipped files and bare.yaml
    (the local facts naming the checkout), as a user adds a cluster file."""
    config = work / "config"
    config.mkdir(parents=True)
    for entry in (REPO / "config").iterdir():
        if entry.name != "clusters":
            (config / entry.name).symlink_to(entry)
    clusters = config / "clusters"
    clusters.mkdir()
    for entry in (REPO / "config/clusters").iterdir():
        (clusters / entry.name).symlink_to(entry)
    bare_metal_cluster(work, tree)  # writes work/clusters/bare.yaml
    (work / "clusters/bare.yaml").rename(clusters / "bare.yaml")
    for name in ("resources", "profiles"):
        (work / name).symlink_to(REPO / name)
    return work


def experiment() -> dict:
    """The tiny preset with what the 800M model asks for (RoPE, flash attention, bf16),
    which Megatron's default layers build only with Transformer Engine, filled in by the
    training schema as the workflow reads it."""
    from snakemake.utils import validate

    raw = {
        "engine": "megatron",
        "preset": "tiny",
        "model": {"position_embedding": "rope", "flash_attention": True},
        "precision": "bf16",
        "layout": {"nodes": 1, "procs_per_node": 1},
        "segments": 2,
        "iterations_per_segment": 4,
        "data": {"tokenizer": "gpt2", "sources": {"a": 1.0}, "split": "98,2,0"},
    }
    section = {"experiments": {"bare": raw}}
    validate(section, str(REPO / "workflow/schemas/training.schema.yaml"))
    return section["experiments"]["bare"]


@pytest.mark.skipif(has_transformer_engine(), reason="this Python has Transformer Engine")
def test_a_checkout_plan_and_its_segment_job_run_to_megatrons_cuda_check(
    checkout, tmp_path, monkeypatch
):
    monkeypatch.chdir(tmp_path)  # relative paths, as the workflow runs
    cluster = bare_metal_cluster(tmp_path, checkout)
    assert cluster.megatron_lm == str(checkout)
    raw = experiment()
    prepared = prepare_experiment("bare", raw, _text_for(raw), cluster)
    # the plan: the checkout is accepted, and the layers are Megatron's own, saying why
    assert engine_problem("bare", "megatron", cluster) is None
    assert transformer_impl_for(cluster) == "local"
    (said,) = segment_job("bare", prepared, cluster, 400).warnings
    assert "asks for flash attention, but Megatron-LM runs on bare without Transformer " in said
    assert f"(--transformer-impl local: the jobs' Python ({sys.executable}, which" in said

    # the job: the segment's command line and launch, as run_segment builds and runs them
    tokenizer = gpt2_tokenizer_files(tmp_path / "tokenizer")
    argv = engine_command(
        prepared.experiment, prepared.layout, prepared.blend,
        (f"{tokenizer}/vocab.json", f"{tokenizer}/merges.txt"),
        Paths("checkpoints/bare", "seg1.json", "seg1.engine.log", "cache", "tb"), 1, None,
        megatron_dir=cluster.megatron_dir, transformer_impl=transformer_impl_for(cluster),
        python=python_for(None),
    )  # fmt: skip
    assert argv[:4] == [
        sys.executable, "-m", "hpcllm.models.megatron_compat", f"{checkout}/pretrain_gpt.py"
    ]  # fmt: skip
    launch = segment_launch(prepared.experiment, argv, cluster, None)
    assert any(word.endswith("torchrun") for word in launch.argv), launch.argv
    script = tmp_path / "seg1.engine.sh"
    script.write_text(launch.shell())
    done = subprocess.run(
        ["bash", str(script)],
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
        capture_output=True,
        text=True,
        timeout=hang_guard(20),  # Megatron's imports and start-up, about 15 s
        check=False,
    )
    log = done.stdout + done.stderr
    assert done.returncode != 0
    assert "AssertionError: Megatron requires CUDA." in log, log[-4000:]
    # past the imports (the shim), the parser (Megatron prints its arguments) and the
    # model's configuration (gpt_config_from_args: TE's RoPE fusion is not asked for)
    assert "ImportError" not in log, log[-4000:]
    assert "apply_rope_fusion is not available" not in log, log[-4000:]
    assert "transformer_impl ................................ local" in log, log[-4000:]
    assert f"{checkout}/megatron/training/initialize.py" in log  # the checkout's Megatron


# (not marked workflow: tests/conftest.py would run it apart from this module's other
# test, and the checkout fixture would be built twice)
@pytest.mark.skipif(has_transformer_engine(), reason="this Python has Transformer Engine")
def test_a_dry_run_on_a_checkout_cluster_plans_the_megatron_engine_and_says_why_local(
    checkout, tmp_path
):
    """The workflow's own plan (snakemake -n) of the laptop example's experiment on the
    megatron engine, on a cluster file naming the checkout: accepted, with the reason for
    Megatron's own layers among its warnings."""
    work = workdir_with_cluster(tmp_path / "work", checkout)
    model = "{position_embedding: rope, flash_attention: true}"
    (work / "meg.yaml").write_text(
        "cluster: bare\ntraining:\n  run: [tiny_local]\n  experiments:\n    tiny_local:\n"
        f"      engine: megatron\n      model: {model}\n"
    )
    proc = run_snakemake(work, "-n", "--configfile", "meg.yaml")
    out = proc.stdout + proc.stderr
    assert (
        "training.experiments.tiny_local: asks for flash attention, but Megatron-LM runs on bare"
        in out
    ), out[-4000:]
    assert f"(--transformer-impl local: the jobs' Python ({sys.executable}, which runs" in out
    assert "train_segment" in out
