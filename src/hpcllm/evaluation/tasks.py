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
from functools import cache
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


def _lm_eval_tasks_root() -> Path:
    spec = importlib.util.find_spec("lm_eval")  # finds the package without importing it
    if spec is None or spec.origin is None:
        raise EvaluationError(
            "lm-eval is not installed in this environment: pip install -e '.[train]'"
        )
    return Path(spec.origin).parent / "tasks"


@cache
def _task_files(root: Path) -> tuple[Path, ...]:
    return tuple(sorted(root.rglob("*.yaml")))


def _names_line(key: str, name: str | None = None) -> re.Pattern:
    value = re.escape(name) if name else r"([^\s'\"#]+)"
    return re.compile(rf"^{key}:[ \t]*['\"]?{value}['\"]?[ \t]*(?:#.*)?$", re.M)


@cache
def lm_eval_index() -> tuple[dict[str, Path], dict[str, Path]]:
    """lm-eval's task names and group names, each with its YAML file: a scan of its task
    files for ``task: <name>`` and ``group: <name>`` lines (about a second, where lm-eval's
    own TaskManager index takes a minute); once per process."""
    tasks: dict[str, Path] = {}
    groups: dict[str, Path] = {}
    task_line, group_line = _names_line("task"), _names_line("group")
    for path in _task_files(_lm_eval_tasks_root()):
        text = path.read_text(errors="replace")
        for found, pattern in ((tasks, task_line), (groups, group_line)):
            for match in pattern.finditer(text):
                found.setdefault(match.group(1), path)
    return tasks, groups


def lm_eval_task_yaml(name: str) -> Path | None:
    """The YAML file of lm-eval's own task ``name``. Most are ``<name>.yaml``: those files
    are read first, the whole index only where none of them says ``task: <name>``."""
    line = _names_line("task", name)
    for path in _task_files(_lm_eval_tasks_root()):
        if path.stem == name and line.search(path.read_text(errors="replace")):
            return path
    return lm_eval_index()[0].get(name)


def shipped_tasks(tasks_dir: str | os.PathLike) -> list[str]:
    """The names of the project's own tasks (``<tasks_dir>/<name>.yaml``)."""
    return sorted(p.stem for p in Path(tasks_dir).glob("*.yaml"))


def unknown_task(name: str, tasks_dir: str | os.PathLike, key: str) -> str:
    """The message for a task name found neither among the project's tasks nor among
    lm-eval's: the key, the name, the known ones (lm-eval's closest) and what to do."""
    import difflib

    shipped = shipped_tasks(tasks_dir)
    try:
        tasks, groups = lm_eval_index()
    except EvaluationError:
        tasks, groups = {}, {}
    if name in groups:
        return (
            f"{key}: '{name}' is a group of lm-eval's tasks ({groups[name]}), and only single "
            "tasks are supported: name its tasks one by one (docs/evaluation.md)."
        )
    close = difflib.get_close_matches(name, [*shipped, *tasks], n=5, cutoff=0.6)
    return (
        f"{key}: no task '{name}': neither {Path(tasks_dir) / (name + '.yaml')} (this "
        f"project's tasks: {', '.join(shipped) or 'none'}) nor one of lm-eval's "
        f"{len(tasks):,} tasks"
        + (f" (closest: {', '.join(close)}; " if close else " (")
        + "`lm-eval ls tasks` lists them). Correct the name, or add a task file there "
        "(docs/evaluation.md)."
    )


def unknown_tasks(experiment: str, tasks: list[str], tasks_dir: str | os.PathLike) -> list[str]:
    """At plan time, on every site: each task of ``experiment`` that is neither the
    project's nor lm-eval's, by its key (the staging job on the login node found it only
    after training). Without network: lm-eval's task files are scanned. Where lm-eval is
    not installed beside Snakemake its names cannot be checked here; the staging job
    (in the jobs' environment) checks them."""
    key = f"training.experiments.{experiment}.evaluate.tasks"
    shipped = set(shipped_tasks(tasks_dir))
    problems = []
    for name in tasks:
        if name in shipped:
            continue
        try:
            found = lm_eval_task_yaml(name)
        except EvaluationError:
            continue  # lm-eval not installed here
        if found is None:
            problems.append(unknown_task(name, tasks_dir, key))
    return problems


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
        raise EvaluationError(unknown_task(name, tasks_dir, key))
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


def local_data(task: TaskSource, cache_dir: str | os.PathLike, cfg: dict) -> dict[str, Any]:
    """The keys of the task's config ``cfg`` that make lm-eval read its data from local
    files only: a shipped task's data_files made absolute (they are relative to its
    YAML), a hub task's dataset_path the local copy; ``datasets``' cache in ``cache_dir``
    (not the home folder, small on clusters)."""
    kwargs = dict(cfg.get("dataset_kwargs") or {})
    kwargs["cache_dir"] = str(cache_dir)
    if task.dataset is None:
        files = kwargs.get("data_files")
        here = Path(task.yaml).parent
        if isinstance(files, dict):
            kwargs["data_files"] = {split: _absolute(here, f) for split, f in files.items()}
        elif files is not None:
            kwargs["data_files"] = _absolute(here, files)
        return {"dataset_kwargs": kwargs}
    if not os.path.isdir(task.folder):
        raise EvaluationError(
            f"evaluation task {task.name}: its data {task.folder} (a copy of the hub "
            f"dataset {task.dataset}) is not there. Stage it: `hf download --repo-type "
            f"dataset {task.dataset} --local-dir {task.folder}` where there is internet."
        )
    return {"dataset_kwargs": kwargs, "dataset_path": os.path.abspath(task.folder)}


def task_spec(task: TaskSource, cache_dir: str | os.PathLike) -> dict[str, Any]:
    """The task as a config dict for lm-eval that reads its data from local files only."""
    cfg = load_task_config(task.yaml)
    return {**cfg, **local_data(task, cache_dir, cfg), "task": task.name}


def task_file(task: TaskSource, cache_dir: str | os.PathLike, path: str | os.PathLike) -> None:
    """Write the task as :func:`task_spec` gives it to lm-eval, as a task YAML for
    ``lm-eval run --tasks <path>``: its own file included, the local data's keys with
    absolute paths (it runs from any folder)."""
    import yaml

    cfg = load_task_config(task.yaml, resolve_functions=False)
    data = local_data(task, os.path.abspath(cache_dir), cfg)
    keys = {"include": os.path.abspath(task.yaml), "task": task.name, **data}
    Path(path).write_text(
        f"# {task.name} as the workflow's tasks job ran it (hpcllm.evaluation.tasks.task_file)\n"
        + yaml.safe_dump(keys, sort_keys=False)
    )


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
