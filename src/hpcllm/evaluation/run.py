"""What the evaluation rules' jobs do (workflow/scripts/stage_eval_tasks.py, evaluate_model.py and evaluation_table.py call these)."""

from __future__ import annotations

import json
import os
from pathlib import Path

from hpcllm.atomic import atomic_path
from hpcllm.evaluation.model import EvaluationError, device, file_digest, model_folder
from hpcllm.evaluation.tasks import TaskSource, download, resolve_task, staging_problem


def _write(path: str | os.PathLike, record: dict) -> None:
    with atomic_path(path) as tmp:
        tmp.write_text(json.dumps(record, indent=2) + "\n")


def stage_tasks(
    experiment: str,
    tasks: list[str],
    tasks_dir: str,
    mirror_root: str | None,
    online: bool,
    site: str,
    facts: str,
    manifest: str | os.PathLike,
) -> list[TaskSource]:
    """Login node: find every task, download the hub data not staged yet where the login
    nodes reach the hub, else stop naming where to stage them; write ``manifest``."""
    found = [
        resolve_task(t, tasks_dir, mirror_root, f"training.experiments.{experiment}.evaluate.tasks")
        for t in tasks
    ]
    problems = [p for t in found if (p := staging_problem(t, online, site, facts))]
    if problems:
        raise EvaluationError("\n".join(problems))
    for task in found:
        if task.dataset is not None and not os.path.isdir(task.folder):
            print(f"{task.name}: downloading {task.dataset} to {task.folder}", flush=True)
            download(task)
    _write(manifest, {"tasks": [t.to_dict() for t in found]})
    return found


def evaluate_tasks(
    export_record: str,
    manifest: str,
    iteration: int,
    shots: int,
    limit: int | None,
    output: str,
    cache_dir: str,
    requested_device: str = "auto",
) -> dict:
    from hpcllm.evaluation.harness import run_tasks

    tasks = [TaskSource(**t) for t in json.loads(Path(manifest).read_text())["tasks"]]
    model = model_folder(export_record)
    dev = device(requested_device)
    # No tasks (evaluate.tasks: [], perplexity only): lm-eval stops on an empty list
    # ("No tasks specified"), so it is not started; the workflow plans no such job, this
    # is for the file asked for by name.
    result = run_tasks(model, tasks, shots, limit, dev, cache_dir) if tasks else {"tasks": {}}
    record = {"export": export_record, "export_digest": file_digest(export_record),
              "iteration": iteration, "device": dev, "shots": shots, "limit": limit,
              **result}  # fmt: skip
    _write(output, record)
    return record


def evaluate_perplexity(
    export_record: str,
    prefixes: dict[str, str],
    split: str,
    seq_length: int,
    max_tokens: int | None,
    iteration: int,
    output: str,
    requested_device: str = "auto",
) -> dict:
    from hpcllm.evaluation.perplexity import perplexity

    dev = device(requested_device)
    result = perplexity(model_folder(export_record), prefixes, split, seq_length, max_tokens, dev)
    record = {"export": export_record, "export_digest": file_digest(export_record),
              "iteration": iteration, "device": dev, "max_tokens": max_tokens,
              "perplexity": result}  # fmt: skip
    _write(output, record)
    return record


def in_container(cluster, container: str, job: str, kwargs: dict) -> None:
    """Run ``job`` (evaluate_tasks or evaluate_perplexity) with ``kwargs`` in ``cluster``'s
    training image (the GPU build of PyTorch is there), this checkout's package bound."""
    import subprocess

    from hpcllm.launch import Launch, container_exec, package_in_container
    from hpcllm.offline import OFFLINE_ENV

    # Started as the site probe starts the image (hpcllm.preflight.probe.inside_launch):
    # the site's modules, the job environment, the variables kept outside the container.
    binds, env = package_in_container(container)
    unset = tuple(cluster.env_outside_container)
    command = container_exec(cluster, container, binds, unset)
    command += ["python", "-m", "hpcllm.evaluation.run", job, json.dumps(kwargs)]
    launch = Launch(
        argv=command,
        env={**cluster.env, **cluster.env_outside_container, **OFFLINE_ENV, **env},
        modules=cluster.modules,
        source=cluster.path or cluster.name,
        unset_in_container=unset,
        globs=cluster.env_globs,
    )
    subprocess.run(["bash", "-c", launch.shell()], check=True, env=dict(os.environ))


def main(argv: list[str] | None = None) -> None:
    import sys

    job, kwargs = (argv or sys.argv[1:])[:2]
    {"evaluate_tasks": evaluate_tasks, "evaluate_perplexity": evaluate_perplexity}[job](
        **json.loads(kwargs)
    )


if __name__ == "__main__":
    main()
