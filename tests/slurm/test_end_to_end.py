"""The built-in configuration through real sbatch, compared with the local profile's run."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import slurmruns
import torch

pytestmark = pytest.mark.slurm


def test_builtin_config_runs_as_slurm_jobs_and_matches_local_run(cluster, tmp_path):
    on_slurm = slurmruns.make_workdir(tmp_path / "slurm")
    proc = slurmruns.run(on_slurm, cluster)
    output = proc.stdout + proc.stderr
    remote, local = slurmruns.rule_headers(output)
    # The text stages and training run on the compute nodes; the built-in sources are on
    # disk (local files, the shipped hub mirror): no login-node step reads or copies them.
    assert {
        "train_tokenizer", "tokenize", "merge_tokenized", "prepare_data_cache", "train_segment"
    } <= set(remote), output[-3000:]  # fmt: skip
    assert not {"download_text", "fetch_text"} & (set(local) | set(remote)), output[-3000:]

    # Every submitted job left its Slurm log, named by its job id, and only those did.
    logs = slurmruns.slurm_logs(on_slurm)
    assert {rule: len(v) for rule, v in logs.items()} == remote
    job_ids = [job_id for entries in logs.values() for job_id, _ in entries]
    assert all(job_id.isdigit() for job_id in job_ids) and len(set(job_ids)) == len(job_ids)
    # ... and Slurm ran each of them for its rule, to completion.
    known = {job["id"]: job for job in cluster.jobs()}
    for rule, entries in logs.items():
        for job_id, _ in entries:
            assert job_id in output, f"job {job_id} not reported by Snakemake"
            assert known[job_id]["state"] == "COMPLETED", known[job_id]
            assert known[job_id]["comment"].startswith(f"rule_{rule}"), known[job_id]
    # A tokenize job gets its 4 threads' cores on a cluster (on one machine the shards
    # share its cores: tests/workflow/test_text_workflow.py).
    assert {known[j]["cpus"] for j, _ in logs["tokenize"]} == {"4"}, logs["tokenize"]
    # The campaign ends with the Hugging Face export of the last checkpoint and its scores,
    # each a Slurm job (the task data staged by the login-node rule, the table written
    # there), on the results page.
    assert {"export_model", "evaluate_tasks", "evaluate_perplexity"} <= set(remote), remote
    assert {"stage_eval_tasks", "evaluation_table"} <= set(local), local
    scores = (on_slurm / "results/eval/tiny_local/scores.csv").read_text()
    assert "tiny_local,30,module_purpose,acc," in scores, scores
    assert "validation perplexity (all)" in scores, scores
    assert "Evaluation of iteration 30" in (on_slurm / "results/index.html").read_text()

    locally = slurmruns.make_workdir(tmp_path / "local")
    # The reference: the deterministic stages that write data/, and training (bitwise
    # reproducible on the CPU with fixed threads).
    # Two runs: `--until` stops at the first job of a rule it names, and skips what lies
    # downstream of it (train_segment after merge_tokenized, segment 2 after segment 1).
    slurmruns.run(locally, None, "--until", "merge_tokenized", "pack_lmdb", profile="local")
    segments = sorted(
        str(p.relative_to(on_slurm))
        for p in (on_slurm / "results" / "train").glob("*/seg*.json")
        if re.fullmatch(r"seg\d+\.json", p.name)
    )
    assert segments, "no training segment ran on Slurm"
    slurmruns.run(locally, None, *segments, profile="local")
    slurm_data = {  # less the evaluation's task data, which the local runs do not reach
        path: digest
        for path, digest in slurmruns.fingerprints(on_slurm / "data").items()
        if not path.startswith(("eval_cache/", "eval_tasks/", "eval_mirror/"))
    }
    assert any(p.endswith("_text_document.bin") for p in slurm_data), sorted(slurm_data)
    assert any(p.startswith("index_cache/") for p in slurm_data), sorted(slurm_data)
    assert slurm_data == slurmruns.fingerprints(locally / "data")
    trained = sorted((on_slurm / "checkpoints").glob("*/latest_checkpointed_iteration.txt"))
    assert trained, "no experiment was trained"
    for tracker in trained:
        name = tracker.parent.name
        assert tracker.read_text() == (locally / "checkpoints" / name / tracker.name).read_text()
        slurm_model, local_model = (
            final_model(root / "checkpoints" / name) for root in (on_slurm, locally)
        )
        assert slurm_model.keys() == local_model.keys()
        assert all(torch.equal(slurm_model[k], local_model[k]) for k in slurm_model), name

    # Nothing left to do: a second run through Slurm submits no job.
    again = slurmruns.run(on_slurm, cluster)
    assert "Nothing to be done" in again.stdout + again.stderr


def final_model(save: Path) -> dict[str, torch.Tensor]:
    iteration = int((save / "latest_checkpointed_iteration.txt").read_text())
    path = save / f"iter_{iteration:07d}" / "mp_rank_00" / "model_optim_rng.pt"
    return torch.load(path, map_location="cpu", weights_only=False)["model"]
