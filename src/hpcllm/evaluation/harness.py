"""lm-evaluation-harness on the exported model, offline (docs/evaluation.md)."""

from __future__ import annotations

import json
import os
import shlex
from pathlib import Path
from typing import Any

from hpcllm.evaluation.chance import chance_level
from hpcllm.evaluation.model import model_folder
from hpcllm.evaluation.tasks import TaskSource, task_file, task_spec

SEED = 1234  # lm-eval's own default seeds, fixed so that a rerun draws the same shots
BATCH_SIZE = 8


def run_tasks(
    model: str | os.PathLike,
    tasks: list[TaskSource],
    shots: int,
    limit: int | None,
    device: str,
    cache_dir: str | os.PathLike,
    batch_size: int = BATCH_SIZE,
) -> dict[str, Any]:
    """Each task's metrics (value and standard error) for the model folder ``model``, and
    its chance level (hpcllm.evaluation.chance)."""
    from lm_eval import simple_evaluate
    from lm_eval.tasks import TaskManager

    Path(cache_dir).mkdir(parents=True, exist_ok=True)
    # Only the tasks given here: lm-eval's own index of every task takes a minute.
    manager = TaskManager(include_defaults=False)
    loaded = manager.load([task_spec(t, cache_dir) for t in tasks])["tasks"]
    chance = {name: chance_level(task, limit) for name, task in loaded.items()}
    out = simple_evaluate(
        model="hf",
        model_args={"pretrained": str(model), "dtype": "auto"},
        tasks=list(loaded.values()),
        num_fewshot=shots,
        limit=limit,
        task_manager=manager,
        device=device,
        batch_size=batch_size,
        random_seed=SEED,
        numpy_random_seed=SEED,
        torch_random_seed=SEED,
        fewshot_random_seed=SEED,
        log_samples=False,
    )
    return {
        "lm_eval_version": out.get("lm_eval_version"),
        "tasks": {
            name: {
                "metrics": metrics_of(out["results"][name]),
                "shots": out["n-shot"].get(name),
                "items": out["n-samples"].get(name, {}).get("effective"),
                "version": out["versions"].get(name),
                "chance": chance.get(name),
            }
            for name in (t.name for t in tasks)
        },
    }


def metrics_of(result: dict[str, Any]) -> dict[str, dict[str, float | None]]:
    """lm-eval's ``"acc,none"``/``"acc_stderr,none"`` keys as ``{"acc": {value, stderr}}``
    (a filter other than ``none`` stays in the name: ``exact_match (strict-match)``)."""
    metrics: dict[str, dict[str, float | None]] = {}
    for key, value in result.items():
        if "," not in key or "_stderr," in key or not isinstance(value, (int, float)):
            continue
        metric, filt = key.split(",", 1)
        name = metric if filt == "none" else f"{metric} ({filt})"
        stderr = result.get(f"{metric}_stderr,{filt}")
        metrics[name] = {
            "value": float(value),
            "stderr": float(stderr) if isinstance(stderr, (int, float)) else None,
        }
    return metrics


def lm_eval_command(
    model: str | os.PathLike,
    task_files: list[str | os.PathLike],
    shots: int,
    limit: int | None,
    device: str,
) -> str:
    """The lm-eval command line that runs what :func:`run_tasks` runs, offline (the task
    files of :func:`hpcllm.evaluation.tasks.task_file`). Its paths are absolute: it runs
    from any folder where lm-eval[hf] is installed."""
    argv = ["lm-eval", "run", "--model", "hf", "--model_args",
            f"pretrained={os.path.abspath(model)}", "dtype=auto",
            "--tasks", *(os.path.abspath(f) for f in task_files), "--num_fewshot", str(shots),
            "--batch_size", str(BATCH_SIZE), "--device", device, "--seed", str(SEED)]  # fmt: skip
    if limit is not None:
        argv += ["--limit", str(limit)]
    return "HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1 " + shlex.join(argv)


def write_rerun(tasks_record: str, manifest: str, cache_dir: str, folder: str) -> str:
    """Write into ``folder`` each task of ``manifest`` as the tasks job ran it
    (``<task>.yaml``) and ``command.sh``, the lm-eval command that reproduces the scores
    of ``tasks_record``; return that command."""
    record = json.loads(Path(tasks_record).read_text())
    tasks = [TaskSource(**t) for t in json.loads(Path(manifest).read_text())["tasks"]]
    Path(folder).mkdir(parents=True, exist_ok=True)
    files = [Path(folder) / f"{t.name}.yaml" for t in tasks]
    for task, path in zip(tasks, files):
        task_file(task, cache_dir, path)
    model = model_folder(record["export"])
    command = lm_eval_command(model, files, record["shots"], record["limit"], record["device"])
    Path(folder, "command.sh").write_text(
        f"#!/bin/sh\n# Reproduces {tasks_record}; runs from any folder.\n{command}\n"
    )
    return command
