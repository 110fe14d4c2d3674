"""The per-experiment scores table: task metrics and held-out perplexity of one export.

Each evaluation's JSON names the export it read (a digest of its export.json); the table
refuses records of another export than the current one, so that a changed experiment
never shows an old score.
"""

from __future__ import annotations

import csv
import json
import os
from pathlib import Path

from hpcllm.atomic import atomic_path
from hpcllm.evaluation.chance import METRICS as CHANCE_METRICS
from hpcllm.evaluation.chance import known_chance
from hpcllm.evaluation.model import EvaluationError, file_digest

COLUMNS = ["experiment", "iteration", "task", "metric", "value", "stderr", "chance", "shots",
           "items", "export_digest"]  # fmt: skip


def check_current(record_path: str | os.PathLike, record: dict, export_record: str) -> None:
    current = file_digest(export_record)
    if record.get("export_digest") != current:
        raise EvaluationError(
            f"{record_path} was measured on another export than {export_record} (now "
            f"{current}, there {record.get('export_digest')}): run it again, "
            f"snakemake --forcerun {record_path}"
        )


def rows(experiment: str, tasks: dict | None, ppl: dict) -> list[dict]:
    """The table's rows; ``tasks`` None: no tasks (evaluate.tasks: [], perplexity only)."""
    digest = ppl["export_digest"]
    out = []
    for task, scores in (tasks or {}).get("tasks", {}).items():
        # measured from the task's data; a record of before: the known tasks' level
        chance = scores["chance"] if "chance" in scores else known_chance(task)
        for metric, m in scores["metrics"].items():
            out.append({"experiment": experiment, "iteration": tasks["iteration"], "task": task,
                        "metric": metric, "value": m["value"], "stderr": m["stderr"],
                        "chance": chance if metric.split(" ")[0] in CHANCE_METRICS else None,
                        "shots": scores["shots"], "items": scores["items"],
                        "export_digest": digest})  # fmt: skip
    for source, s in {**ppl["perplexity"]["sources"], "all": ppl["perplexity"]["all"]}.items():
        out.append({"experiment": experiment, "iteration": ppl["iteration"],
                    "task": f"validation perplexity ({source})", "metric": "perplexity",
                    "value": s["perplexity"], "stderr": None, "chance": None, "shots": None,
                    "items": s["tokens"], "export_digest": digest})  # fmt: skip
    return out


def write_table(
    experiment: str,
    tasks_json: str | os.PathLike | None,
    perplexity_json: str | os.PathLike,
    export_record: str,
    output: str | os.PathLike,
) -> list[dict]:
    """``tasks_json`` None: the experiment evaluates no tasks (perplexity only)."""
    records = {}
    for path in (tasks_json, perplexity_json):
        if path is None:
            continue
        records[path] = json.loads(Path(path).read_text())
        check_current(path, records[path], export_record)
    table = rows(experiment, records.get(tasks_json), records[perplexity_json])
    with atomic_path(output) as tmp, open(tmp, "w", newline="") as f:
        writer = csv.DictWriter(f, COLUMNS)
        writer.writeheader()
        writer.writerows(table)
    return table


def read_table(path: str | os.PathLike) -> list[dict]:
    with open(path, newline="") as f:
        return list(csv.DictReader(f))


def format_value(value: str | float | None, stderr: str | float | None = None) -> str:
    if value in (None, ""):
        return "–"
    text = f"{float(value):.4g}"
    if stderr not in (None, ""):
        text += f" ± {float(stderr):.2g}"
    return text


def current_scores(
    table_path: str | os.PathLike, export_record: str | os.PathLike, iteration: int
) -> tuple[list[dict] | None, str | None]:
    """The table's rows when they are of ``export_record`` at ``iteration`` (the
    experiment's current last checkpoint), else None and why (None, None: no table)."""
    if not Path(table_path).is_file():
        return None, None
    table = read_table(table_path)
    current = file_digest(export_record) if Path(export_record).is_file() else None
    if any(int(r["iteration"]) != iteration or r["export_digest"] != current for r in table):
        return None, (
            f"The scores in {table_path} are of another checkpoint or export than the "
            f"current one (iteration {iteration:,}); they are not shown. Evaluate again: "
            f"snakemake {table_path}"
        )
    return table, None
