"""A Megatron layout change that the checkpoints cannot be loaded with is refused before
anything is submitted (docs/training.md, "Changing an experiment";
hpcllm.training.plan.reshard): the workflow's own rules on profiles/rehearsal (a GPU
cluster's profile with the Slurm executor, 2 GPUs a node), on a machine without Slurm.

The checkpoint folder holds a committed checkpoint as Megatron leaves it (its tracker and
the iteration folder of a ``torch_dist`` save: what
hpcllm.training.checkpoints.tracker.latest_iteration reads; the plan reads no tensor) and
the record a segment writes (settings.check_checkpoint_settings) for TP=2 on one node.
The config then asks TP=1 on the same GPUs (so DP=2). Where the record says
``dp_reshardable`` a dry run warns and a real run stops with "Nothing was submitted"
before the executor sees a job (cost.smk, check_training_reruns): no job is submitted
and no image built (the Slurm commands and apptainer fail here as not installed; only the
executor's start-up query `scontrol show config` is made), nothing in the folder changes. In
``fully_reshardable`` format, or a DP change within Megatron's bucket rule, the same
plan has no refusal. ``hpcllm status`` shows the refusal (hpcllm.training.campaign.status).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import stat
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from support import EXAMPLES, REPO, hang_guard, make_workdir, run_snakemake

from hpcllm.clusters import load_cluster
from hpcllm.models.megatron_args import transformer_impl_for
from hpcllm.training.campaign import status
from hpcllm.training.checkpoints.tracker import latest_iteration
from hpcllm.training.plan.experiment import prepare_experiment
from hpcllm.training.plan.reshard import DP_ONLY, FULLY, layout_settings
from hpcllm.training.plan.settings import (
    check_checkpoint_settings,
    continuation_settings,
    settings_path,
    weight_settings,
)

NAME = "m"
PROFILE = "profiles/rehearsal"
TARGET = f"results/train/{NAME}/seg2.json"
SLURM_TOOLS = ("sbatch", "srun", "squeue", "sinfo", "sacct", "sacctmgr", "scontrol", "scancel")
# The site's container runtime (its image build is planned): a stand-in, as Apptainer
# cannot run here; like the Slurm commands it only records that it was called.
TOOLS = (*SLURM_TOOLS, "apptainer")
# Segment 1 (of 2 x 4 iterations) saved iteration 2, then its job ended (its time limit):
# both segments are planned, none of them past its target (hpcllm.training.plan.reruns).
ITERATION = 2


def configure(work: Path, **layout) -> str:
    """The experiment on the laptop examples' sample data, on one 2-GPU node."""
    exp = {
        "engine": "megatron",
        "preset": "tiny",
        "data": {"tokenizer": "sample_bpe", "sources": {"sample_en": 1.0}, "split": "98,2,0"},
        "layout": {"nodes": 1, **layout},
        "batch": {"global": 16},  # a multiple of micro batch 4 x DP, for DP 1 to 4
        "segments": 2,
        "iterations_per_segment": 4,
        "save_interval": 2,
    }
    path = work / f"{NAME}.yaml"
    path.write_text(yaml.safe_dump({"training": {"experiments": {NAME: exp}, "run": [NAME]}}))
    return str(path)


def trained(work: Path, fmt: str, **layout) -> dict:
    """Segment 1 trained with ``layout`` and saved in ``fmt``: the record as the segment
    writes it (its own check, with the cluster's settings), and Megatron's committed
    checkpoint of ITERATION. Returns the recorded layout."""
    cfg = configure(work, **layout)
    config = status.load_config(work, [str(EXAMPLES), cfg], PROFILE)
    cluster = load_cluster(config["cluster"], work / "config" / "clusters")
    prepared = prepare_experiment(
        NAME, config["training"]["experiments"][NAME], config["text"], cluster, str(work)
    )
    impl = transformer_impl_for(cluster)
    save = work / "checkpoints" / NAME
    saved = {**layout_settings(prepared, impl), "layout.checkpoint_format": fmt}
    check_checkpoint_settings(
        NAME, save, weight_settings(prepared, impl), continuation_settings(prepared), False, saved
    )
    # A torch_dist save (Megatron-LM checkpointing.py): the iteration folder, then the tracker.
    folder = save / f"iter_{ITERATION:07d}"
    folder.mkdir(parents=True)
    (folder / "metadata.json").write_text(json.dumps({"sharded_backend": "torch_dist"}))
    for shard in ("common.pt", "__0_0.distcp", "__1_0.distcp"):
        (folder / shard).write_bytes(b"\0" * 64)
    (save / "latest_checkpointed_iteration.txt").write_text(str(ITERATION))
    assert latest_iteration(save) == ITERATION
    return json.loads(settings_path(save).read_text())["layout"]


@pytest.fixture
def no_slurm(tmp_path) -> dict[str, str]:
    """An environment in which every Slurm command (and apptainer) fails as if not
    installed, and records that it was called."""
    bin_dir = tmp_path / "noslurm"
    bin_dir.mkdir()
    for tool in TOOLS:
        (bin_dir / tool).write_text(
            f"#!/bin/sh\necho {tool} \"$@\" >> '{bin_dir}/called'\n"
            f"echo '{tool}: not installed' >&2\nexit 127\n"
        )
        (bin_dir / tool).chmod(stat.S_IRWXU)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("HPCLLM_", "SLURM_"))}
    return {**env, "PATH": f"{bin_dir}{os.pathsep}{env['PATH']}"}


@pytest.fixture
def work(tmp_path) -> Path:
    return make_workdir(tmp_path / "work")


def snakemake(work: Path, env: dict[str, str], *args: str, check: bool = True):
    cfg = str(work / f"{NAME}.yaml")
    return run_snakemake(
        work, TARGET, "--profile", PROFILE, "--configfile", cfg, *args,
        env=env, check=check, timeout=hang_guard(6),  # ~5 s
    )  # fmt: skip


def snapshot(work: Path) -> dict[str, tuple[int, int]]:
    """Every file of the experiment's checkpoint folder: (size, modification time)."""
    save = work / "checkpoints" / NAME
    return {
        str(p.relative_to(save)): (p.stat().st_size, p.stat().st_mtime_ns)
        for p in save.rglob("*")
        if p.is_file()
    }


def refusal_words(saved: str, new: str) -> list[str]:
    return [
        f"training.experiments.{NAME}: the checkpoints in checkpoints/{NAME} were saved "
        f"with {saved} in the distributed optimizer's '{DP_ONLY}' checkpoint format",
        f"the experiment now asks for {new}",
        "go back to tp: 2, pp: 1",
        f"`hpcllm restart-training {NAME}`",
        "layout.reshardable_checkpoints: true",
    ]


def documented_warning() -> str:
    """The dry run's warning as docs/training.md shows it (one fenced block)."""
    doc = (REPO / "docs" / "training.md").read_text()
    head = f"Warning: training.experiments.{NAME}: the checkpoints in checkpoints/{NAME}"
    assert doc.count(head) == 1, "docs/training.md shows the layout refusal once"
    return head + doc.split(head, 1)[1].split("```", 1)[0]


@pytest.mark.workflow
def test_a_tp_change_of_dp_reshardable_checkpoints_submits_nothing(work, no_slurm):
    saved = trained(work, DP_ONLY, tp=2)
    assert (saved["layout.tp"], saved["layout.dp"]) == (2, 1)
    configure(work, tp=1)  # the same 2 GPUs: DP=2
    before = snapshot(work)
    words = refusal_words("TP=2 PP=1 DP=1", "TP=1 PP=1 DP=2")

    dry = snakemake(work, no_slurm, "-n")
    out = dry.stdout + dry.stderr
    assert out.count(f"Warning: {words[0]}") == 1, out[-4000:]  # once
    assert all(w in out for w in words), out[-4000:]
    assert "a run submits nothing (a dry run warns)" in out
    # docs/training.md ("Changing an experiment") shows this dry run's warning
    shown = " ".join(documented_warning().split())
    assert shown in " ".join(out.split()), shown

    real = snakemake(work, no_slurm, check=False)
    out = real.stdout + real.stderr
    assert real.returncode != 0, out[-4000:]
    assert f"Nothing was submitted: {words[0]}" in out, out[-4000:]
    said = " ".join(shown.removeprefix("Warning: ").split())
    assert f"Nothing was submitted: {said}" in " ".join(out.split())
    assert all(w in out for w in words), out[-4000:]
    # refused before the executor submitted anything or a container was built: the Slurm
    # executor only asked `scontrol show config` at its start (its job_status_query.py)
    called = Path(no_slurm["PATH"].split(os.pathsep)[0]) / "called"
    calls = called.read_text().splitlines() if called.exists() else []
    assert all(call.startswith("scontrol show ") for call in calls), calls
    assert not (work / "results").exists() and not (work / "logs").exists()
    assert snapshot(work) == before


@pytest.mark.workflow
@pytest.mark.parametrize(
    ("fmt", "layout", "new"),
    [
        (FULLY, {"tp": 2}, {"tp": 1}),  # any layout loads a fully reshardable save
        (DP_ONLY, {"tp": 1, "nodes": 1}, {"tp": 1, "nodes": 2}),  # DP 2 -> 4: same buckets
    ],
    ids=["fully_reshardable_tp", "dp_reshardable_dp_2_to_4"],
)
def test_a_layout_change_megatron_loads_plans_without_a_refusal(work, no_slurm, fmt, layout, new):
    trained(work, fmt, **layout)
    configure(work, **new)
    dry = snakemake(work, no_slurm, "-n")
    out = dry.stdout + dry.stderr
    assert "Warning: training.experiments" not in out, out[-4000:]
    assert "Nothing was submitted" not in out
    jobs = dict(re.findall(r"^(\w+)\s+(\d+)$", out.split("Job stats:", 1)[1], re.M))
    assert jobs.get("train_segment") == "2", out[-4000:]


def hpcllm_status(work: Path, env: dict[str, str]) -> str:
    """`hpcllm status` of the run (squeue fails here: the queue is reported unknown)."""
    proc = subprocess.run(
        [str(Path(sys.executable).parent / "hpcllm"), "status", "-d", str(work),
         "--configfile", str(EXAMPLES), f"{NAME}.yaml", "--profile", PROFILE],
        capture_output=True, text=True, env=env, cwd=work, timeout=hang_guard(5),
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc.stdout


def test_status_shows_a_layout_the_checkpoints_cannot_be_loaded_with(work, no_slurm):
    """As it shows changed settings: the refusal the plan gives, naming the format and the
    ways out; the checkpoint is this experiment's model, so its figures stay."""
    trained(work, DP_ONLY, tp=2)
    configure(work, tp=1)
    out = hpcllm_status(work, no_slurm)
    assert f"  {NAME}: 0/2 segments, checkpoint iteration {ITERATION}/8" in out, out
    (line,) = [line for line in out.splitlines() if line.startswith("    layout refused: ")]
    words = refusal_words("TP=2 PP=1 DP=1", "TP=1 PP=1 DP=2")
    words[0] = words[0].replace(f"checkpoints/{NAME}", str(work / "checkpoints" / NAME))
    assert all(w in line for w in words), line
    assert "a run submits nothing" in line and "stale" not in out

    configure(work, tp=2)  # back to the saved layout: resumes
    assert "layout refused" not in hpcllm_status(work, no_slurm)
    shutil.rmtree(work / "checkpoints" / NAME)
    trained(work, FULLY, tp=2)  # a fully reshardable save: any layout loads it
    configure(work, tp=1)
    assert "layout refused" not in hpcllm_status(work, no_slurm)
