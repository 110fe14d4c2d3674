"""The scores table holds one export's scores, and the results page shows them only while
that export is the experiment's current one (a changed experiment never shows an old
score)."""

from __future__ import annotations

import json

import pytest

from hpcllm.evaluation.model import EvaluationError, file_digest
from hpcllm.evaluation.table import current_scores, write_table
from hpcllm.results_page import ExperimentView, experiment_section


def records(tmp_path, export):
    digest = file_digest(export)
    tasks = {
        "export_digest": digest,
        "iteration": 30,
        "tasks": {
            "module_purpose": {
                "metrics": {"acc": {"value": 0.375, "stderr": 0.18}},
                "shots": 1,
                "items": 8,
            }
        },
    }
    ppl = {"export_digest": digest, "iteration": 30, "perplexity": {
        "sources": {"sample_en": {"tokens": 100, "nll": 5.0, "perplexity": 148.4}},
        "all": {"tokens": 100, "nll": 5.0, "perplexity": 148.4}}}  # fmt: skip
    (tmp_path / "tasks.json").write_text(json.dumps(tasks))
    (tmp_path / "perplexity.json").write_text(json.dumps(ppl))
    return str(tmp_path / "tasks.json"), str(tmp_path / "perplexity.json")


def test_table_and_page_show_the_current_exports_scores_only(tmp_path):
    export = tmp_path / "results/export/tiny/iter_0000030/export.json"
    export.parent.mkdir(parents=True)
    export.write_text('{"iteration": 30}')
    table = tmp_path / "results/eval/tiny/scores.csv"
    rows = write_table("tiny", *records(tmp_path, export), str(export), table)
    assert [(r["task"], r["metric"]) for r in rows] == [
        ("module_purpose", "acc"),
        ("validation perplexity (sample_en)", "perplexity"),
        ("validation perplexity (all)", "perplexity"),
    ]
    shown, why = current_scores(table, export, 30)
    assert why is None and len(shown) == 3
    page = experiment_section(ExperimentView("tiny", {}, scores=shown))
    assert "Evaluation of iteration 30" in page and "0.375 ± 0.18" in page and "148.4" in page
    # Another checkpoint is the last one now: the old table is not shown.
    assert current_scores(table, export, 40)[0] is None
    # The experiment changed and was exported again: neither the table nor the page keep
    # the old scores.
    export.write_text('{"iteration": 30, "weights": "other"}')
    shown, why = current_scores(table, export, 30)
    assert shown is None and "another checkpoint or export" in why and str(table) in why
    with pytest.raises(EvaluationError, match="measured on another export"):
        write_table("tiny", str(tmp_path / "tasks.json"), str(tmp_path / "perplexity.json"),
                    str(export), table)  # fmt: skip


def test_no_tasks_makes_a_table_of_the_perplexity_alone(tmp_path):
    """evaluate.tasks: [] (perplexity only): no tasks record; lm-eval refuses an empty list."""
    export = tmp_path / "results/export/tiny/iter_0000030/export.json"
    export.parent.mkdir(parents=True)
    export.write_text('{"iteration": 30}')
    _, ppl = records(tmp_path, export)
    table = tmp_path / "results/eval/tiny/scores.csv"
    rows = write_table("tiny", None, ppl, str(export), table)
    assert [r["task"] for r in rows] == [
        "validation perplexity (sample_en)",
        "validation perplexity (all)",
    ]
    assert {r["iteration"] for r in rows} == {30} and rows[0]["export_digest"] == file_digest(
        export
    )
    shown, why = current_scores(table, export, 30)
    assert why is None and len(shown) == 2
