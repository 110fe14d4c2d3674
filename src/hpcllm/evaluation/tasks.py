"""The evaluation tasks of an experiment and where their data are read from, offline.

A task is either shipped with the project (``resources/eval_tasks/<name>.yaml``: an
lm-eval task over local files, ``dataset_path: json``) or one of lm-evaluation-harness's
own tasks by name (``arc_easy``, ``hellaswag``, ...). lm-eval's tasks name a dataset
repository on the Hugging Face hub (``dataset_path``); compute nodes have no internet, so
each is read from a local copy of that repository in the hub-mirror layout the text stage
uses: ``$HPCLLM_HF_MIRROR/<repo id>`` (staged by hand), else
``data/eval_mirror/<repo id>`` (downloaded by the login-node rule where the login nodes
reach the hub). The evaluation job then loads each task as a config dict whose
``dataset_path`` is that folder, so that nothing is looked up online.
"""

from __future__ import annotations

import importlib.util
import os
import re
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from hpcllm.evaluation.model import EvaluationError

DOWNLOAD_ROOT = "data/eval_mirror"
# Read from the files themselves, never from the hub.
LOCAL_DATASET_TYPES = {"json", "csv", "parquet", "text", "arrow"}


@dataclass(frozen=True)
class TaskSource:
    name: str
    yaml: str  # the task's lm-eval YAML file
    dataset: str | None  # hub repo id; None for a task over local files
    folder: str | None  # the local copy of ``dataset`` (None until staged)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def shipped_task(name: str, tasks_dir: str | os.PathLike) -> Path | None:
    path = Path(tasks_dir) / f"{name}.yaml"
    return path if path.is_file() else None


def lm_eval_task_yaml(name: str) -> Path | None:
    """The YAML file of lm-eval's own task ``name`` (a scan of its task files for
    ``task: <name>``: seconds, where lm-eval's full task index takes a minute)."""
    spec = importlib.util.find_spec("lm_eval")
    if spec is None or spec.origin is None:
        raise EvaluationError(
            "lm-eval is not installed in this environment: pip install -e '.[train]'"
        )
    root = Path(spec.origin).parent / "tasks"
    line = re.compile(rf"^task:\s*['\"]?{re.escape(name)}['\"]?\s*$", re.M)
    for path in sorted(root.rglob("*.yaml")):
        if line.search(path.read_text(errors="replace")):
            return path
    return None


def load_task_config(path: str | os.PathLike, resolve_functions: bool = True) -> dict[str, Any]:
    """A task's YAML with its includes merged, as lm-eval's TaskManager reads it."""
    from lm_eval.tasks._yaml_loader import load_yaml  # the loader TaskManager uses

    return load_yaml(path, resolve_func=resolve_functions)


def mirror_folder(dataset: str, mirror_root: str | None) -> str:
    """Where the local copy of hub dataset ``dataset`` is (or is to be downloaded)."""
    if mirror_root and os.path.isdir(os.path.join(mirror_root, dataset)):
        return os.path.join(mirror_root, dataset)
    return os.path.join(DOWNLOAD_ROOT, dataset)


def resolve_task(
    name: str, tasks_dir: str | os.PathLike, mirror_root: str | None, key: str
) -> TaskSource:
    """Find task ``name`` (``key`` names it in the config for messages)."""
    path = shipped_task(name, tasks_dir) or lm_eval_task_yaml(name)
    if path is None:
        raise EvaluationError(
            f"{key}: no task '{name}': neither {Path(tasks_dir) / (name + '.yaml')} nor a task "
            "of lm-eval by that name (`lm-eval ls tasks` lists them). Correct the name, or "
            "add a task file there (docs/evaluation.md)."
        )
    cfg = load_task_config(path, resolve_functions=False)
    dataset = cfg.get("dataset_path")
    if not dataset:
        raise EvaluationError(
            f"{key}: '{name}' ({path}) is a group or has no dataset_path; name its tasks one by one"
        )
    if dataset in LOCAL_DATASET_TYPES:
        return TaskSource(name, str(path), None, None)
    return TaskSource(name, str(path), dataset, mirror_folder(dataset, mirror_root))


def staging_problem(task: TaskSource, online: bool, site: str, facts: str) -> str | None:
    """Why ``task``'s data cannot be had on this site (None: staged, or downloadable on
    the login node), with where to stage them."""
    if task.dataset is None or os.path.isdir(task.folder) or online:
        return None
    return (
        f"evaluation task {task.name} reads the hub dataset {task.dataset}, which is not "
        f"staged, and the login nodes of {site} have no internet ({facts}: internet.login). "
        f"Stage it here: where there is internet run `hf download --repo-type dataset "
        f"{task.dataset} --local-dir <dir>`, copy <dir> to {task.folder} on the cluster "
        f"(or to <folder>/{task.dataset} and export HPCLLM_HF_MIRROR=<folder>)."
    )


def download(task: TaskSource) -> None:
    """Copy the task's hub dataset repository to ``task.folder`` (login node)."""
    from huggingface_hub import snapshot_download

    snapshot_download(repo_id=task.dataset, repo_type="dataset", local_dir=task.folder)


def task_spec(task: TaskSource, cache_dir: str | os.PathLike) -> dict[str, Any]:
    """The task as a config dict for lm-eval that reads its data from local files only:
    a shipped task's data_files made absolute (they are relative to its YAML), a hub
    task's dataset_path the local copy; ``datasets``' cache in ``cache_dir`` (not the
    home folder, small on clusters)."""
    cfg = load_task_config(task.yaml)
    kwargs = dict(cfg.get("dataset_kwargs") or {})
    kwargs["cache_dir"] = str(cache_dir)
    cfg["dataset_kwargs"] = kwargs
    if task.dataset is None:
        files = kwargs.get("data_files")
        here = Path(task.yaml).parent
        if isinstance(files, dict):
            kwargs["data_files"] = {split: _absolute(here, f) for split, f in files.items()}
        elif files is not None:
            kwargs["data_files"] = _absolute(here, files)
    else:
        if not os.path.isdir(task.folder):
            raise EvaluationError(
                f"evaluation task {task.name}: its data {task.folder} (a copy of the hub "
                f"dataset {task.dataset}) is not there. Stage it: `hf download --repo-type "
                f"dataset {task.dataset} --local-dir {task.folder}` where there is internet."
            )
        cfg["dataset_path"] = os.path.abspath(task.folder)
    cfg["task"] = task.name
    return cfg


def _absolute(here: Path, files):
    if isinstance(files, list):
        return [_absolute(here, f) for f in files]
    return str(files) if os.path.isabs(files) else str((here / files).resolve())


def plan_problems(
    experiment: str,
    tasks: list[str],
    tasks_dir: str | os.PathLike,
    mirror_root: str | None,
    site: str,
    facts: str,
) -> list[str]:
    """At plan time on a site whose login nodes have no internet: every task of
    ``experiment`` that is unknown or whose hub data are not staged, with where to stage
    them (before any job runs, not when the staging job fails)."""
    key = f"training.experiments.{experiment}.evaluate.tasks"
    problems = []
    for name in tasks:
        try:
            task = resolve_task(name, tasks_dir, mirror_root, key)
        except EvaluationError as e:
            problems.append(str(e))
            continue
        problem = staging_problem(task, online=False, site=site, facts=facts)
        if problem:
            problems.append(problem)
    return problems
