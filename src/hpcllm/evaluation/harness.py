"""lm-evaluation-harness on the exported model, offline (docs/evaluation.md)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from hpcllm.evaluation.tasks import TaskSource, task_spec

SEED = 1234  # lm-eval's own default seeds, fixed so that a rerun draws the same shots


def run_tasks(
    model: str | os.PathLike,
    tasks: list[TaskSource],
    shots: int,
    limit: int | None,
    device: str,
    cache_dir: str | os.PathLike,
    batch_size: int = 8,
) -> dict[str, Any]:
    """Each task's metrics (value and standard error) for the model folder ``model``."""
    from lm_eval import simple_evaluate
    from lm_eval.tasks import TaskManager

    Path(cache_dir).mkdir(parents=True, exist_ok=True)
    specs = [task_spec(t, cache_dir) for t in tasks]
    out = simple_evaluate(
        model="hf",
        model_args={"pretrained": str(model), "dtype": "auto"},
        tasks=specs,
        num_fewshot=shots,
        limit=limit,
        # Only the tasks given here: lm-eval's own index of every task takes a minute.
        task_manager=TaskManager(include_defaults=False),
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
