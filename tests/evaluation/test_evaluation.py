"""Evaluation of an exported model: lm-eval offline on a shipped task and on a standard
task read from a hub-style mirror, the staging message where neither is there, held-out
perplexity on the validation split, and the table that refuses another export's scores."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from support import REPO

from hpcllm.evaluation.model import EvaluationError
from hpcllm.evaluation.run import stage_tasks
from hpcllm.evaluation.tasks import plan_problems, resolve_task, staging_problem, unknown_tasks

TASKS_DIR = REPO / "resources" / "eval_tasks"  # the shipped tasks

QUESTIONS = [  # made up for this test, in allenai/ai2_arc's columns
    ("What do plants take in to make food?", ["carbon dioxide", "salt", "sand", "iron"], "A"),
    ("Which of these is a liquid at room temperature?", ["ice", "water", "wood", "stone"], "B"),
    ("What pulls objects toward Earth?", ["light", "sound", "gravity", "heat"], "C"),
]


def arc_mirror(root: Path) -> Path:
    """A copy of allenai/ai2_arc's repository layout (README configs, parquet per split)
    with a few items of ARC-Easy."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    repo = root / "allenai" / "ai2_arc"
    (repo / "ARC-Easy").mkdir(parents=True)
    splits = ("train", "validation", "test")
    (repo / "README.md").write_text(
        "---\nconfigs:\n- config_name: ARC-Easy\n  data_files:\n"
        + "".join(f"  - split: {s}\n    path: ARC-Easy/{s}-*\n" for s in splits)
        + "---\n"
    )
    rows = [{"id": f"q{i}", "question": q, "answerKey": key,
             "choices": {"text": c, "label": ["A", "B", "C", "D"]}}
            for i, (q, c, key) in enumerate(QUESTIONS)]  # fmt: skip
    for split in splits:
        pq.write_table(
            pa.Table.from_pylist(rows), repo / "ARC-Easy" / f"{split}-00000-of-00001.parquet"
        )
    return repo


@pytest.fixture(scope="module")
def tasks_run(tmp_path_factory, export_record) -> Path:
    """The folder of a tasks job's run: lm-eval's simple_evaluate with the exported model
    on the CPU, offline, on the shipped task over its JSON-lines file and lm-eval's own
    arc_easy from a mirror (tasks.json: the manifest, scores.json: the record)."""
    tmp_path = tmp_path_factory.mktemp("tasks_run")
    mirror = tmp_path / "mirror"
    arc_mirror(mirror)
    code = f"""
import json
from hpcllm.evaluation.run import stage_tasks, evaluate_tasks
stage_tasks("tiny", ["module_purpose", "arc_easy"], {str(TASKS_DIR)!r}, {str(mirror)!r},
            online=False, site="site", facts="facts.yaml", manifest="tasks.json")
evaluate_tasks({str(export_record)!r}, "tasks.json", 30, shots=1, limit=3,
               output="scores.json", cache_dir="cache", requested_device="cpu")
"""
    env = {**os.environ, "HF_DATASETS_OFFLINE": "1", "HF_HUB_OFFLINE": "1",
           "PYTHONPATH": str(REPO / "src"), "HF_HOME": str(tmp_path / "hf_home")}  # fmt: skip
    proc = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=600)  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    return tmp_path


def test_tasks_run_offline_from_local_files(tasks_run):
    """Both tasks are scored on the items asked for, with the shots asked for."""
    record = json.loads((tasks_run / "scores.json").read_text())
    assert set(record["tasks"]) == {"module_purpose", "arc_easy"}
    for name, task in record["tasks"].items():
        assert task["shots"] == 1 and task["items"] == 3, (name, task)
        acc = task["metrics"]["acc"]
        assert 0 <= acc["value"] <= 1 and acc["stderr"] is not None
    assert record["iteration"] == 30 and record["device"] == "cpu"
    assert len(record["export_digest"]) == 16
    # The datasets' cache went where it was told, not to the home folder.
    assert (tasks_run / "cache").is_dir() and not (tasks_run / "hf_home" / "datasets").exists()
    # Issue 40 item 12: the chance level from the task data (4 choices per item here).
    assert {n: t["chance"] for n, t in record["tasks"].items()} == {
        "module_purpose": 0.25, "arc_easy": 0.25}  # fmt: skip


def test_the_lm_eval_command_reproduces_the_scores_from_any_folder(tasks_run, tmp_path):
    """Issue 40 item 12: the results page shows the lm-eval command of the tasks' scores.
    The shipped task's data_files are relative to its YAML, so `lm-eval --tasks
    module_purpose` run by hand from the checkout failed; the command the evaluation table
    writes runs task files with absolute paths, here from another folder, offline, and
    gives the job's scores."""
    from hpcllm.evaluation.harness import write_rerun

    record = json.loads((tasks_run / "scores.json").read_text())
    command = write_rerun(str(tasks_run / "scores.json"), str(tasks_run / "tasks.json"),
                          str(tasks_run / "cache"), str(tmp_path / "lm_eval"))  # fmt: skip
    assert command.startswith("HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1 lm-eval run ")
    assert "--num_fewshot 1 " in command and "--limit 3" in command and "--seed 1234" in command
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}",
           "PYTHONPATH": str(REPO / "src"), "HF_HOME": str(tmp_path / "hf_home")}  # fmt: skip
    proc = subprocess.run(["bash", "-c", f"{command} --output_path {elsewhere / 'out'}"],
                          cwd=elsewhere, env=env, capture_output=True, text=True, timeout=600)  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    (results,) = (elsewhere / "out").rglob("results_*.json")
    scores = json.loads(results.read_text())["results"]
    for name, task in record["tasks"].items():
        for metric, m in task["metrics"].items():
            assert scores[name][f"{metric},none"] == pytest.approx(m["value"]), (name, metric)


def test_unstaged_hub_task_names_where_to_stage(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    task = resolve_task("arc_easy", TASKS_DIR, None, "training.experiments.x.evaluate.tasks")
    assert task.dataset == "allenai/ai2_arc"
    assert staging_problem(task, online=True, site="S", facts="f.yaml") is None  # downloads
    with pytest.raises(EvaluationError) as e:
        stage_tasks("x", ["arc_easy"], str(TASKS_DIR), None, online=False, site="MareNostrum 5",
                    facts="config/clusters/mn5.yaml", manifest="m.json")  # fmt: skip
    message = str(e.value)
    assert "hf download --repo-type dataset allenai/ai2_arc" in message
    assert "data/eval_mirror/allenai/ai2_arc" in message and "MareNostrum 5" in message
    assert not Path("m.json").exists()
    # A staged copy under $HPCLLM_HF_MIRROR is used as it is.
    arc_mirror(tmp_path / "staged")
    found = stage_tasks("x", ["arc_easy"], str(TASKS_DIR), str(tmp_path / "staged"),
                        online=False, site="S", facts="f", manifest="m.json")  # fmt: skip
    assert found[0].folder == str(tmp_path / "staged/allenai/ai2_arc")


def test_unknown_task_is_named_with_the_key():
    # at plan time on a site without internet: every task that cannot run, by its key
    problems = plan_problems("x", ["module_purpose", "arc_easy", "no_such_task"], TASKS_DIR,
                             None, "MareNostrum 5", "config/clusters/mn5.yaml")  # fmt: skip
    assert len(problems) == 2
    assert "Stage it here" in problems[0] and "allenai/ai2_arc" in problems[0]
    assert problems[1].startswith("training.experiments.x.evaluate.tasks: no task 'no_such_task'")
    with pytest.raises(
        EvaluationError, match=r"training.experiments.x.evaluate.tasks: no task 'no_such_task'"
    ):
        resolve_task("no_such_task", TASKS_DIR, None, "training.experiments.x.evaluate.tasks")


def test_unknown_tasks_are_named_at_plan_time_with_the_known_ones():
    """On every site, before training (issue 40 item 9); lm-eval's task files are read,
    nothing is looked up online."""
    key = "training.experiments.x.evaluate.tasks"
    assert unknown_tasks("x", ["module_purpose", "arc_easy", "hellaswag"], TASKS_DIR) == []
    problems = unknown_tasks("x", ["module_purpose", "no_such_task", "arc_esy", "mmlu"], TASKS_DIR)
    assert len(problems) == 3
    assert problems[0].startswith(
        f"{key}: no task 'no_such_task': neither {TASKS_DIR / 'no_such_task.yaml'} (this "
        "project's tasks: module_purpose) nor one of lm-eval's "
    )
    assert problems[0].endswith(
        " tasks (`lm-eval ls tasks` lists them). Correct the name, or add a task file there "
        "(docs/evaluation.md)."
    )
    assert "tasks (closest: arc_easy, " in problems[1]
    assert problems[2].startswith(f"{key}: 'mmlu' is a group of lm-eval's tasks (")
    assert "name its tasks one by one" in problems[2]


def test_no_tasks_does_not_start_lm_eval(tmp_path, monkeypatch):
    """evaluate.tasks: [] is perplexity only; lm-eval stops on an empty list ("No tasks
    specified"). The workflow plans no tasks job; asked for by name, it records none."""
    from hpcllm.evaluation import harness
    from hpcllm.evaluation.run import evaluate_tasks

    def no_lm_eval(*args, **kwargs):
        raise AssertionError("lm-eval started without tasks")

    monkeypatch.setattr(harness, "run_tasks", no_lm_eval)
    folder = tmp_path / "results/export/tiny/iter_0000030"
    folder.mkdir(parents=True)
    (folder / "config.json").write_text("{}")
    (folder / "export.json").write_text('{"iteration": 30}')
    (tmp_path / "tasks.json").write_text('{"tasks": []}')
    record = evaluate_tasks(str(folder / "export.json"), str(tmp_path / "tasks.json"), 30,
                            shots=0, limit=None, output=str(tmp_path / "out.json"),
                            cache_dir=str(tmp_path / "cache"), requested_device="cpu")  # fmt: skip
    assert record["tasks"] == {} and json.loads((tmp_path / "out.json").read_text()) == record


def test_perplexity_on_the_validation_split(export_record, tokenized):
    import torch
    import transformers

    from hpcllm.evaluation.perplexity import perplexity, validation_tokens

    prefix, docs = tokenized
    # '80,20,0' of 37 documents: train 0..29 (round(29.6) = 30), valid 30..36.
    tokens = validation_tokens(prefix, "80,20,0", None)
    assert np.array_equal(tokens, np.concatenate(docs[30:37]))
    assert len(validation_tokens(prefix, "80,20,0", 50)) == 50
    result = perplexity(export_record.parent, {"sample": prefix}, "80,20,0", 16, 33, "cpu")
    assert result["all"]["tokens"] == 32 == result["sources"]["sample"]["tokens"]
    # The same as the model's own loss over the windows it read (two of 16 + 1 tokens).
    model = transformers.AutoModelForCausalLM.from_pretrained(export_record.parent)
    ids = torch.from_numpy(tokens[:33])
    with torch.no_grad():
        losses = [model(input_ids=w[None], labels=w[None]).loss for w in (ids[:17], ids[16:33])]
    assert result["all"]["perplexity"] == pytest.approx(math.exp(float(sum(losses)) / 2), rel=1e-4)
    with pytest.raises(EvaluationError, match="gives the validation split none"):
        validation_tokens(prefix, "100,0,0", None)


def test_a_cluster_job_evaluates_in_the_training_image(
    tmp_path, monkeypatch, export_record, tokenized
):
    """On a GPU cluster the job runs `apptainer exec --nv ... <image> python -m
    hpcllm.evaluation.run ...` with the checkout's src/ bound and on PYTHONPATH, offline.
    Apptainer cannot run here: a stand-in records its arguments and the environment and
    runs the command as the image would (this venv's Python)."""
    from hpcllm.clusters import load_cluster
    from hpcllm.evaluation.run import in_container

    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    fake = bin_dir / "apptainer"
    fake.write_text(
        f"#!{sys.executable}\n"
        "import json, os, subprocess, sys\n"
        "argv = sys.argv[1:]\n"
        "command = argv[[a.endswith('.sif') for a in argv].index(True) + 1:]\n"
        "json.dump({'argv': argv, 'env': dict(os.environ)}, open('apptainer.json', 'w'))\n"
        "sys.exit(subprocess.run([sys.executable if c == 'python' else c for c in command]).returncode)\n"
    )
    fake.chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.setenv("SCRATCH", str(tmp_path / "scratch"))  # as jutil env activate sets it
    monkeypatch.chdir(tmp_path)
    prefix, _ = tokenized
    kwargs = dict(export_record=str(export_record), prefixes={"sample": prefix}, split="80,20,0",
                  seq_length=16, max_tokens=33, iteration=30, output="perplexity.json")  # fmt: skip
    in_container(
        load_cluster("juwels", REPO / "config/clusters"),
        "containers/megatron-nvidia.sif",
        "evaluate_perplexity",
        kwargs,
    )
    seen = json.loads((tmp_path / "apptainer.json").read_text())
    src = str(REPO / "src")
    assert (
        seen["argv"][:2] == ["exec", "--nv"]
        and src in seen["argv"][seen["argv"].index("--bind") + 1]
    )
    assert seen["env"]["PYTHONPATH"] == src and seen["env"]["HF_HUB_OFFLINE"] == "1"
    # started as the jobs and the site probe start the image (config/clusters/juwels.yaml):
    # the site's binds and job environment expanded, PMIx's variable kept outside
    binds = seen["argv"][seen["argv"].index("--bind") + 1].split(",")
    assert binds == [str(tmp_path / "scratch"), src]
    assert seen["env"]["HF_HOME"] == f"{tmp_path}/scratch/hpcllm-cache/huggingface"
    assert seen["env"]["PMIX_SECURITY_MODE"] == "native"
    sif = seen["argv"].index("containers/megatron-nvidia.sif")
    assert seen["argv"][sif + 1 : sif + 4] == ["env", "-u", "PMIX_SECURITY_MODE"]
    record = json.loads((tmp_path / "perplexity.json").read_text())
    assert record["perplexity"]["all"]["tokens"] == 32 and record["iteration"] == 30
