"""The scores table holds one export's scores, and the results page shows them only while
that export is the experiment's current one (a changed experiment never shows an old
score)."""

from __future__ import annotations

import json

import pytest

from hpcllm.evaluation.chance import chance_level, known_chance
from hpcllm.evaluation.model import EvaluationError, file_digest
from hpcllm.evaluation.table import current_scores, write_table
from hpcllm.results_page import ExperimentView, evaluated_model, experiment_section


def records(tmp_path, export, **task):
    digest = file_digest(export)
    tasks = {
        "export_digest": digest,
        "iteration": 30,
        "tasks": {
            "module_purpose": {
                "metrics": {"acc": {"value": 0.375, "stderr": 0.18}},
                "shots": 1,
                "items": 8,
                **task,
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
    # accuracies in percent, as chance is; perplexity as it is
    assert "Evaluation of iteration 30" in page and "37.5 % ± 18 %" in page and "148.4" in page
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


def test_the_page_says_what_the_scores_mean_and_how_to_get_them_again(tmp_path):
    """Issue 40 item 12: the scores lacked each task's chance level, what acc and acc_norm
    are, the unit of "items" (tokens for perplexity), the model evaluated and the lm-eval
    command of the scores."""
    export = tmp_path / "results/export/tiny/iter_0000030/export.json"
    export.parent.mkdir(parents=True)
    export.write_text('{"iteration": 30}')
    (export.parent / "config.json").write_text("{}")
    table = tmp_path / "results/eval/tiny/scores.csv"
    metrics = {"acc": {"value": 0.375, "stderr": 0.18}, "acc_norm": {"value": 0.5, "stderr": 0.2}}
    # a record from before the chance level was measured: the known task's level
    write_table("tiny", *records(tmp_path, export, metrics=metrics), str(export), table)
    shown, _ = current_scores(table, export, 30)
    assert [r["chance"] for r in shown] == ["0.25", "0.25", "", ""]
    command = tmp_path / "results/eval/tiny/lm_eval/command.sh"
    command.parent.mkdir(parents=True)
    command.write_text("#!/bin/sh\n# a comment\nHF_HUB_OFFLINE=1 lm-eval run --tasks /x/y.yaml\n")
    model, lm_eval = evaluated_model(tmp_path, "tiny", 30)
    assert model == "results/export/tiny/iter_0000030"
    assert lm_eval == "HF_HUB_OFFLINE=1 lm-eval run --tasks /x/y.yaml"
    page = experiment_section(
        ExperimentView("tiny", {}, scores=shown, model=model, lm_eval=lm_eval)
    )
    heads = page[page.index("<thead>") : page.index("</thead>")]
    assert (
        heads
        == "<thead><tr>"
        + "".join(f"<th>{c}</th>" for c in ("task", "metric", "value", "chance", "shots", "scored"))
        + "</tr>"
    )
    assert page.count("<td>25 %</td>") == 2 and "<td>8 items</td>" in page
    assert "<td>100 tokens</td>" in page  # the perplexity's items are tokens
    assert "acc: the share of items on which the right choice has the highest" in page
    assert (
        "acc_norm: the same, with each choice&#x27;s log-likelihood divided by its length, in bytes"
        in page
    )
    assert "chance: the accuracy of picking a choice at random" in page
    assert '<a href="export/tiny/iter_0000030/">results/export/tiny/iter_0000030</a>' in page
    assert "<pre><code>HF_HUB_OFFLINE=1 lm-eval run --tasks /x/y.yaml</code></pre>" in page
    # a record's own (measured) level; a task of unknown choices has none
    write_table("tiny", *records(tmp_path, export, chance=0.2), str(export), table)
    assert current_scores(table, export, 30)[0][0]["chance"] == "0.2"
    assert known_chance("mmlu_anatomy") == 0.25 and known_chance("lambada_openai") is None


class _Task:
    """What chance_level reads of an lm-eval Task."""

    OUTPUT_TYPE = "multiple_choice"
    eval_docs = [{"c": ["a", "b"]}, {"c": ["a", "b", "c", "d"]}, {"c": ["a", "b", "c", "d"]}]

    def doc_to_choice(self, doc):
        return doc["c"]


def test_the_chance_level_is_measured_on_the_items_scored():
    assert chance_level(_Task(), None) == pytest.approx((1 / 2 + 1 / 4 + 1 / 4) / 3)
    assert chance_level(_Task(), 1) == 0.5  # lm-eval scores the first `limit` items
    generation = _Task()
    generation.OUTPUT_TYPE = "generate_until"
    assert chance_level(generation, None) is None


def write_checkpoint(folder, weights: bytes) -> None:
    """A checkpoint folder with its checksums manifest, as training writes it."""
    from hpcllm.training.checkpoints.checksums import write_manifest

    folder.mkdir(parents=True, exist_ok=True)
    (folder / "weights.distcp").write_bytes(weights)
    (folder / "common.pt").write_bytes(b"args")
    write_manifest(folder)


def test_the_page_names_the_model_its_scores_are_of(tmp_path):
    """Issue 51 item 1: the scores' export digest named the export (export.json holds a
    timestamp), not the weights: the page shows the weights' digest (the checkpoint's
    checksums manifest), the iteration and when the export was made; retrained weights
    show another digest, the same weights the same."""
    from hpcllm.export.identity import export_identity, weights_digest

    first, again, other = (tmp_path / n / "iter_0000030" for n in ("a", "b", "c"))
    write_checkpoint(first, b"\x01" * 64)
    write_checkpoint(again, b"\x01" * 64)
    write_checkpoint(other, b"\x01" * 63 + b"\x02")  # one byte retrained differently
    assert weights_digest(first) == weights_digest(again) != weights_digest(other)
    assert weights_digest(tmp_path / "nowhere") is None

    export = tmp_path / "results/export/tiny/iter_0000030/export.json"
    export.parent.mkdir(parents=True)
    export.write_text(json.dumps({"iteration": 30, "exported_at": "2026-11-28T14:00:00+00:00",
                                  "source_checkpoint": str(first),
                                  "weights_digest": weights_digest(first)}))  # fmt: skip
    table = tmp_path / "results/eval/tiny/scores.csv"
    write_table("tiny", *records(tmp_path, export), str(export), table)
    shown, _ = current_scores(table, export, 30)
    identity = export_identity(export)
    page = experiment_section(ExperimentView("tiny", {}, scores=shown, identity=identity))
    assert (
        "Scores of the model of iteration 30, exported at 2026-11-28T14:00:00+00:00: weights "
        f"digest <code>{weights_digest(first)}</code> (recorded at export" in page
    )
    # An export from before export.json recorded the digest: its checkpoint's manifest.
    export.write_text(json.dumps({"iteration": 30, "source_checkpoint": str(other)}))
    page = experiment_section(
        ExperimentView("tiny", {}, scores=shown, identity=export_identity(export))
    )
    assert f"<code>{weights_digest(other)}</code> (of its checkpoint&#x27;s manifest now" in page
    assert "exported at an unrecorded time" in page
    # ... and its checkpoint deleted since: said so, not guessed.
    export.write_text(json.dumps({"iteration": 30, "source_checkpoint": str(tmp_path / "x")}))
    page = experiment_section(
        ExperimentView("tiny", {}, scores=shown, identity=export_identity(export))
    )
    assert "weights digest unknown" in page
