"""Training segments on two Slurm nodes: the launch path, and faults that lose nothing.

One experiment, ``tiny_2n`` (tests/slurm/training.yaml): 2 segments on 2 nodes, one
process each (srun -> torchrun per node -> the torch engine, DDP over gloo). The
uninterrupted run is the reference the fault tests must reproduce bit for bit.
"""

from __future__ import annotations

import shutil
import time
from pathlib import Path

import pytest
import slurmruns
import torch

pytestmark = pytest.mark.slurm

CONFIG = Path(__file__).with_name("training.yaml")
EXPERIMENT = "tiny_2n"
SAVE = f"checkpoints/{EXPERIMENT}"
FINAL = f"results/train/{EXPERIMENT}/seg2.json"
SEG1 = f"results/train/{EXPERIMENT}/seg1.json"


@pytest.fixture(scope="session")
def text_data(tmp_path_factory) -> Path:
    """The built-in config's tokenized data, made once with the local profile."""
    work = slurmruns.make_workdir(tmp_path_factory.mktemp("slurm-text") / "work")
    slurmruns.run(work, None, "--until", "merge_tokenized", profile="local")
    return work


def training_workdir(text_data: Path, path: Path) -> Path:
    """A copy of the text stage's working directory (data and Snakemake's records)."""
    shutil.copytree(
        text_data, path, symlinks=True, ignore=shutil.ignore_patterns("locks", "incomplete")
    )
    return path


def run_training(work: Path, cluster, *args: str, **kw):
    return slurmruns.run(work, cluster, "--configfile", str(CONFIG), *args, FINAL, **kw)


def final_weights(work: Path) -> dict[str, torch.Tensor]:
    iteration = int((work / SAVE / "latest_checkpointed_iteration.txt").read_text())
    path = work / SAVE / f"iter_{iteration:07d}" / "mp_rank_00" / "model_optim_rng.pt"
    return torch.load(path, map_location="cpu", weights_only=False)["model"]


def engine_processes(cluster) -> dict[str, str]:
    """node -> RANK of every torch engine process of this cluster running now."""
    found = {}
    for pid in cluster.processes():
        env = cluster.environ(pid)
        try:
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
        except OSError:  # gone meanwhile
            continue
        if b"hpcllm.training.torch_engine" in cmdline and "SLURMD_NODENAME" in env:
            found[env["SLURMD_NODENAME"]] = env.get("RANK", "?")
    return found


@pytest.fixture(scope="session")
def uninterrupted(slurm_cluster, text_data, tmp_path_factory):
    """tiny_2n trained without interruption; while it runs, where its ranks run."""
    slurm_cluster.restore()
    work = training_workdir(text_data, tmp_path_factory.mktemp("slurm-train") / "work")
    proc = slurmruns.start(
        work, slurm_cluster, "--configfile", str(CONFIG), FINAL, log=work / "snakemake.out"
    )
    ranks: dict[str, str] = {}
    while proc.poll() is None:
        ranks.update(engine_processes(slurm_cluster))
        time.sleep(0.2)
    output = (work / "snakemake.out").read_text()
    assert proc.returncode == 0, output[-5000:] + slurm_cluster.log_tail()
    return work, ranks, output


def test_two_node_segment_runs_a_rank_on_each_node_and_saves_once(uninterrupted, slurm_cluster):
    work, ranks, output = uninterrupted
    assert ranks == {"n1": "0", "n2": "1"}
    segment_jobs = [
        j for j in slurm_cluster.jobs() if j["comment"].startswith("rule_train_segment")
    ]
    assert {j["nodes"] for j in segment_jobs} == {"n[1-2]"}
    engine_log = (work / f"logs/train_segment/{EXPERIMENT}/seg1.engine.log").read_text()
    assert "world size 2" in engine_log
    # Rank 0 alone writes each checkpoint, once per save, with both ranks' RNG states.
    assert engine_log.count("successfully saved checkpoint from iteration") == 1
    assert sorted(p.name for p in (work / SAVE).glob("iter_*")) == [
        "iter_0000004",
        "iter_0000008",
    ]
    state = torch.load(
        work / SAVE / "iter_0000008/mp_rank_00/model_optim_rng.pt",
        map_location="cpu",
        weights_only=False,
    )
    assert len(state["rng_state"]) == 2
    assert [p.name for p in (work / SAVE / "iter_0000008").iterdir()] == ["mp_rank_00"]


def test_two_nodes_train_like_one_process_with_the_same_global_batch(
    uninterrupted, text_data, tmp_path
):
    """Gradients are averaged over both ranks: the weights match a 1-process run."""
    work, _, _ = uninterrupted
    single = training_workdir(text_data, tmp_path / "single")
    one_node = (
        "training={'experiments': {'tiny_2n': {'layout': {'nodes': 1, 'procs_per_node': 1}}}}"
    )
    slurmruns.run(
        single, None, "--configfile", str(CONFIG), "--config", one_node, FINAL, profile="local"
    )
    two, one = final_weights(work), final_weights(single)
    assert two.keys() == one.keys()
    for name in two:
        torch.testing.assert_close(two[name], one[name], rtol=1e-4, atol=1e-5, msg=name)
