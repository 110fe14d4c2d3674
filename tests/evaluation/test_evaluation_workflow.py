"""The evaluation rules through Snakemake on the laptop: a tiny torch campaign of 2
segments is exported and evaluated on the CPU, offline (the shipped task and the held-out
perplexity), into results/eval/<exp>/scores.csv; other shots rerun the tasks job alone, a
new last checkpoint or a changed experiment both evaluations after the export."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import pytest
import yaml
from support import make_workdir, planned, run_snakemake

pytestmark = pytest.mark.workflow

NAME = "eval_tiny"
SCORES = f"results/eval/{NAME}/scores.csv"


def configure(work: Path, lr: float | None = None, **evaluate) -> str:
    experiment = {
        "engine": "torch",
        "preset": "tiny",
        "data": {"tokenizer": "sample_bpe", "sources": {"sample_en": 1.0}, "split": "90,10,0"},
        "layout": {"nodes": 1, "procs_per_node": 1},
        "segments": 2,
        "iterations_per_segment": 2,
        "eval_iters": 0,
        "evaluate": {
            "tasks": ["module_purpose"],
            "shots": 0,
            "limit": 4,
            "perplexity_tokens": 2000,
            **evaluate,
        },  # fmt: skip
    }
    if lr is not None:
        experiment["optim"] = {"lr": lr}
    path = work / "evaluate.yaml"
    path.write_text(yaml.safe_dump({"training": {"experiments": {NAME: experiment}}}))
    return str(path)


@pytest.fixture(scope="module")
def evaluated(tmp_path_factory) -> Path:
    work = make_workdir(tmp_path_factory.mktemp("evaluate") / "work")
    run_snakemake(work, SCORES, "--profile", "profiles/local", "--configfile", configure(work))
    return work


def test_the_last_checkpoint_is_exported_and_scored(evaluated):
    with open(evaluated / SCORES) as f:
        rows = {(r["task"], r["metric"]): r for r in csv.DictReader(f)}
    acc = rows[("module_purpose", "acc")]
    assert acc["iteration"] == "4" and acc["items"] == "4" and acc["shots"] == "0"
    assert 0 <= float(acc["value"]) <= 1
    ppl = rows[("validation perplexity (sample_en)", "perplexity")]
    assert ppl["items"] == "1999"  # perplexity_tokens read, each but the first predicted
    assert float(ppl["value"]) > 1
    assert ("validation perplexity (all)", "perplexity") in rows


def test_reruns_follow_what_changed(evaluated):
    work = evaluated
    args = (SCORES, "--profile", "profiles/local", "-n")
    same = run_snakemake(work, *args, "--configfile", configure(work))
    assert "Nothing to be done" in same.stdout + same.stderr
    # other shots: the tasks job and the table, not the perplexity
    shots = run_snakemake(work, *args, "--configfile", configure(work, shots=1))
    assert planned(shots.stdout + shots.stderr) == {"evaluate_tasks": 1, "evaluation_table": 1}
    # a new last checkpoint: its export, then both evaluations
    seg = run_snakemake(
        work,
        *args,
        "--configfile",
        configure(work),
        "--forcerun",
        f"results/train/{NAME}/seg2.json",
    )
    assert planned(seg.stdout + seg.stderr) == {
        "train_segment": 1, "export_model": 1, "evaluate_tasks": 1,
        "evaluate_perplexity": 1, "evaluation_table": 1,
    }  # fmt: skip
    # a changed experiment: its segments, the export, both evaluations
    changed = run_snakemake(work, *args, "--configfile", configure(work, lr=0.002))
    jobs = planned(changed.stdout + changed.stderr)
    assert jobs.get("train_segment") == 2 and jobs.get("evaluate_tasks") == 1
    assert jobs.get("evaluate_perplexity") == 1 and jobs.get("evaluation_table") == 1


def test_the_default_target_ends_with_the_scores_on_the_results_page(evaluated):
    """The laptop examples' tiny_local has an `evaluate` key (config/examples/local.yaml):
    the default target plans its export, both evaluations and the table before the page."""
    out = run_snakemake(evaluated, "-n", "--profile", "profiles/local")
    jobs = planned(out.stdout + out.stderr)
    for rule in ("export_model", "evaluate_tasks", "evaluate_perplexity", "evaluation_table"):
        assert jobs.get(rule) == 1, jobs
    assert jobs.get("results_page") == 1, jobs


def page_only(work: Path) -> str:
    """A config whose results page shows NAME alone: no benchmarks, no other experiment."""
    path = work / "page.yaml"
    path.write_text(
        yaml.safe_dump({"benchmarks": {"experiments": None}, "training": {"run": [NAME]}})
    )
    return str(path)


def test_the_results_page_shows_the_model_the_command_and_reruns_on_a_short_reason(evaluated):
    """Issue 40 item 12 through the workflow: the evaluation table's job writes the
    lm-eval command and the page shows it with the model and the chance levels; the page
    rule's params are short (its rerun reason printed ~3,000 characters of Prepared(...))
    and a changed experiment still reruns it."""
    import html
    import re

    from hpcllm.evaluation.model import model_folder

    args = ("results/index.html", "--profile", "profiles/local", "--configfile")
    run_snakemake(evaluated, *args, configure(evaluated), page_only(evaluated))
    page = (evaluated / "results/index.html").read_text()
    folder = model_folder(evaluated / f"results/export/{NAME}/iter_0000004/export.json")
    model = str(folder.relative_to(evaluated))
    assert f'<a href="{model.removeprefix("results/")}/">{model}</a>' in page
    assert page.count("<td>25 %</td>") == 2 and "<td>4 items</td>" in page  # acc, acc_norm
    # which model the scores are of (issue 51): the weights' digest the export recorded
    info = json.loads((folder / "export.json").read_text())
    assert re.fullmatch(r"[0-9a-f]{16}", info["weights_digest"])
    assert (
        f"Scores of the model of iteration 4, exported at {info['exported_at']}: weights "
        f"digest <code>{info['weights_digest']}</code> (recorded at export" in page
    )
    assert "<td>1,999 tokens</td>" in page and "summary.csv" not in page
    command = html.unescape(re.search(r"<pre><code>(.*?)</code></pre>", page, re.S)[1])
    assert f"pretrained={folder}" in command and "--limit 4" in command
    assert f"--tasks {evaluated}/results/eval/{NAME}/lm_eval/module_purpose.yaml" in command
    # another log interval (the page's energy per token reads it; the training's
    # segments continue with it): the page alone again, for a reason that fits on a line
    more = evaluated / "log_interval.yaml"
    more.write_text(yaml.safe_dump({"training": {"experiments": {NAME: {"log_interval": 2}}}}))
    changed = run_snakemake(evaluated, "-n", *args, configure(evaluated), page_only(evaluated),
                            str(more))  # fmt: skip
    out = changed.stdout + changed.stderr
    assert planned(out) == {"results_page": 1}, out[-3000:]
    reason = re.search(r"^\s*reason: (.*)$", out, re.M)[1]
    assert "Params have changed since last execution" in reason and len(reason) < 300, reason
    assert "Prepared(" not in out


def test_the_results_page_sets_the_campaign_s_predictions_against_its_finish(evaluated):
    """Issue 48, from the records the campaign's jobs wrote: segment 2's job predicted the
    finish at its start; the page rule draws it against the actual finish into
    results/train/<exp>/forecast.png, embeds that, and says how the prediction held."""
    import base64

    args = ("results/index.html", "--profile", "profiles/local", "--configfile")
    run_snakemake(evaluated, *args, configure(evaluated), page_only(evaluated))
    png = evaluated / f"results/train/{NAME}/forecast.png"
    page = (evaluated / "results/index.html").read_text()
    assert png.read_bytes().startswith(b"\x89PNG")
    figure = (
        f'<figure><img src="data:image/png;base64,{base64.b64encode(png.read_bytes()).decode()}"'
    )
    assert figure in page
    assert "against the actual finish (black line).</figcaption>" in page
    seg1, seg2 = (
        json.loads((evaluated / f"results/train/{NAME}/seg{k}.json").read_text())["timing"]
        for k in (1, 2)
    )
    assert seg1["prediction"] is None  # nothing measured before segment 1
    p, end = seg2["prediction"], seg2["ended"]
    inside = int(p["campaign_low"] <= end <= p["campaign_high"])
    error = abs(p["campaign_end"] - end) / (end - p["made_at"])
    assert (
        f"<p>The actual end fell inside the stated 80 % interval in {inside} of 1 prediction; "
        f"median error {100 * error:.1f} % of the time that was left.</p>"
    ) in page


def test_a_cluster_profile_plans_export_and_evaluation_with_their_cost(tmp_path):
    """The 800M example with its evaluation on JUWELS (docs/evaluation.md): the export and
    both evaluations are in the cost lines, whole 4-GPU nodes for their time limits, and
    the tasks job asks for a GPU of the booster partition."""
    import re

    work = make_workdir(tmp_path / "work")
    proc = run_snakemake(
        work, "-n", "--profile", "profiles/juwels", "--configfile",
        "config/examples/fineweb_juwels.yaml", "config/experiments/opengptx_800m.yaml",
        "config/examples/evaluate_800m.yaml",
        env={"HPCLLM_ACCOUNT": "myproject"}, examples=False,
    )  # fmt: skip
    out = proc.stdout + proc.stderr
    cost = out[out.index("Cost on juwels") :]
    for rule, hours in (("evaluate_tasks", 2), ("evaluate_perplexity", 1)):
        line = f"  {rule}: 1 job(s), {hours:.1f} node-hours, {4 * hours:.1f} GPU-hours"
        assert line in cost, cost[:1500]
    # the export holds a GPU node for a limit sized from the model (hpcllm.cpu_limits)
    export = re.search(r"\n  export_model: 1 job\(s\), ([\d.]+) node-hours", cost)
    assert export and 0 < float(export.group(1)) < 1, cost[:1500]
    block = re.search(r"^rule evaluate_tasks:\n(.*?)\n\n", out, re.S | re.M).group(1)
    assert "gres=gpu:1" in block and "slurm_partition=booster" in block, block


def test_no_tasks_evaluates_the_perplexity_alone(evaluated):
    """evaluate.tasks: [] is documented as perplexity only; the tasks job failed in lm-eval
    ("No tasks specified"), leaving no scores and a stale results page (issue 40 item 9).
    Now no tasks job is planned, and the table is written again from the perplexity (the
    same export and settings: that job is not rerun). Last in this module: it changes the
    table the tests above read."""
    proc = run_snakemake(evaluated, SCORES, "--profile", "profiles/local", "--configfile",
                         configure(evaluated, tasks=[]))  # fmt: skip
    assert planned(proc.stdout + proc.stderr) == {"evaluation_table": 1}
    with open(evaluated / SCORES) as f:
        rows = list(csv.DictReader(f))
    assert [r["task"] for r in rows] == [
        "validation perplexity (sample_en)",
        "validation perplexity (all)",
    ]
