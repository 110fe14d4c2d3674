"""The results page: one self-contained HTML file a person opens first.

A table of contents first; then, when an experiment has trained, the training section
(a person who trained looks for the loss first), else the benchmarks first. On a machine
without GPUs a note says what a sweep's "node" is there and why its TFLOP/s and
efficiencies do not describe a cluster. Per benchmark the compact table (nodes, scaling mode, precision, throughput per GPU,
efficiency per timing, status) and EPICURE's figures (efficiency against nodes per
timing, throughput per GPU, per-batch CDFs); then per training experiment its status
(segments, iterations, tokens, GPU-hours, last losses), the loss against tokens and its
evaluation (scores with chance levels, what they mean, the model, the lm-eval command),
and each segment's prediction of the finish against what happened: a table, a plot and
how often the stated 80 % interval held (hpcllm.training.campaign.forecast_coverage).
Figures are embedded (base64 PNG), so the file can be mailed or copied off the cluster
alone; Snakemake's ``--report`` links it from its landing page.
"""

from __future__ import annotations

import base64
import hashlib
import html
import json
import os
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path

import pandas as pd

from hpcllm.atomic import atomic_path
from hpcllm.bench.summary import compact_table, hold_notes
from hpcllm.evaluation.chance import METRICS as CHANCE_METRICS
from hpcllm.export.identity import ExportIdentity, export_identity

# The figures of a benchmark section, in reading order: (file stem, caption).
BENCH_FIGURES = (
    ("efficiency", "Scaling efficiency against nodes, per timing (1 = perfect)."),
    ("throughput", "Throughput per GPU against nodes."),
    ("batch_time_cdf", "Per-batch times: CDF per run (first and last batch removed)."),
    ("loss", "Language points: loss against tokens."),
)
BENCHMARK_TITLES = {"language": "Language model benchmark", "vision": "Vision benchmark"}
# The models the heading names (the benchmark settings' `model`; others by that name).
MODEL_NAMES = {"resnet50": "ResNet-50", "resnet18": "ResNet-18"}
# What the evaluation table's columns and metrics are, under the table.
SCORE_NOTES = {
    "acc": "acc: the share of items on which the right choice has the highest "
    "log-likelihood under the model.",
    "acc_norm": "acc_norm: the same, with each choice's log-likelihood divided by its "
    "length, in bytes as lm-eval documents it (lm-eval 0.4.13 counts characters: the same "
    "for ASCII text).",
    "perplexity": "perplexity: exp of the mean negative log-likelihood per predicted token "
    "of the experiment's validation split (lower is better).",
}
CHANCE_NOTE = (
    "chance: the accuracy of picking a choice at random, 1 / the item's number of choices "
    "averaged over the items scored (4 choices: 25 %); accuracies and their standard "
    "errors are in percent, as chance is."
)
SCORED_NOTE = "scored: the items a task scored; for perplexity, the validation tokens."

STYLE = """
body { font-family: system-ui, sans-serif; margin: 1.5rem auto; max-width: 1200px;
       padding: 0 1rem; color: #222; }
h1 { font-size: 1.5rem; margin-bottom: 0.2rem; } h2 { margin-top: 2rem; border-bottom:
     1px solid #ccc; } .meta { color: #666; font-size: 0.9rem; }
table { border-collapse: collapse; font-size: 0.85rem; margin: 0.5rem 0 1rem; }
th, td { border: 1px solid #ddd; padding: 0.2rem 0.5rem; text-align: right; }
th { background: #f3f3f3; } td.text { text-align: left; }
tr.bad td { background: #fde8e8; } tr.ok td.status { color: #176b1c; }
figure { margin: 0.5rem 0 1.5rem; } figure img { max-width: 100%; height: auto;
         border: 1px solid #eee; } figcaption { color: #555; font-size: 0.85rem; }
nav { font-size: 0.9rem; } nav ol { margin: 0.3rem 0; } nav li li { display: inline;
      margin-right: 1rem; } nav ol ol { padding-left: 0.5rem; }
.note { background: #fff6dc; border-left: 4px solid #e0a800; padding: 0.5rem 0.8rem; }
pre { background: #f6f6f6; padding: 0.5rem; white-space: pre-wrap; font-size: 0.8rem; }
"""

# Where the benchmark points ran without GPUs (the local machine): what their figures mean.
CPU_NOTE = (
    "<strong>No GPUs here.</strong> These runs are on a machine without GPUs: a benchmark "
    "&ldquo;node&rdquo; is one process, the processes share the same few CPU cores, and "
    "&ldquo;GPUs&rdquo; counts those processes (and GPU-hours their hours). Their TFLOP/s, "
    "MFU and scaling efficiencies say nothing about a cluster (more &ldquo;nodes&rdquo; split the same cores, so the "
    "efficiency falls by design); they show that the workflow runs end to end. Measure "
    "on a GPU cluster for figures that mean something."
)


@dataclass
class ExperimentView:
    """What the page shows of one training experiment."""

    name: str
    status: dict[str, str]  # label -> value, in display order
    loss_png: Path | None = None
    notes: list[str] = field(default_factory=list)
    trained: bool = False  # at least one iteration done: the page shows training first
    scores: list[dict] | None = None  # the evaluation table's rows (hpcllm.evaluation.table)
    model: str | None = None  # the evaluated model's folder, relative to the working directory
    lm_eval: str | None = None  # the lm-eval command that reproduces the tasks' scores
    # which model the scores are of: iteration, when exported, its weights' digest
    identity: ExportIdentity | None = None
    # per segment: the finish predicted at its start against what happened
    # (hpcllm.training.campaign.forecast_coverage.forecast_rows)
    predictions: list[dict] = field(default_factory=list)
    # the plot of those predictions (hpcllm.training.campaign.forecast_plot) and how well
    # they held, in words (forecast_coverage.coverage_sentence)
    forecast_png: Path | None = None
    coverage: str = ""
    stalled: bool = False  # stalled or stopped: the page shows no date


def page_keys(experiments: dict) -> dict[str, str]:
    """Per experiment a short digest of its prepared settings (what the page shows of it
    derives from them and from the run's files): the results rule's recorded param, so
    that a change reruns the page, where the Prepared themselves made a rerun reason of
    ~3,000 characters."""
    return {
        name: hashlib.sha256(repr(prepared).encode()).hexdigest()[:12]
        for name, prepared in experiments.items()
    }


def _img(path: Path) -> str:
    data = base64.b64encode(Path(path).read_bytes()).decode()
    return f'<img src="data:image/png;base64,{data}" alt="{html.escape(Path(path).stem)}">'


def _figure(path: Path, caption: str) -> str:
    return f"<figure>{_img(path)}<figcaption>{html.escape(caption)}</figcaption></figure>"


def table_html(table: pd.DataFrame) -> str:
    """The compact table as HTML; rows that did not end ``ok`` are shaded."""
    if table.empty:
        return "<p>No runs.</p>"
    head = "".join(f"<th>{html.escape(str(c))}</th>" for c in table.columns)
    rows = []
    for _, row in table.iterrows():
        cells = []
        for col, value in row.items():
            shown = "" if pd.isna(value) else str(value)
            text = isinstance(value, str) and not value.startswith("<")  # "< 0.05" is a number
            css = "status" if col == "status" else ("text" if text else "")
            cells.append(f'<td class="{css}">{html.escape(shown)}</td>')
        css = "ok" if row.get("status") == "ok" else "bad"
        rows.append(f'<tr class="{css}">{"".join(cells)}</tr>')
    return f"<table><thead><tr>{head}</tr></thead><tbody>{''.join(rows)}</tbody></table>"


def _tflops_shown(table: pd.DataFrame) -> pd.DataFrame:
    """A logged TFLOP/s of 0 from a run that made progress is below the log's resolution
    (both engines print Megatron's one decimal): it reads "< 0.05", not 0."""
    col, rate = "TFLOP/s/GPU", "per GPU /s"
    if col in table and rate in table:
        below = (table[col] == 0) & (table[rate] > 0)
        table[col] = table[col].astype(object).where(~below, "< 0.05")
    return table


def ran_without_gpus(summary: pd.DataFrame | None) -> bool:
    """Whether the summary's rows say their points ran on a cluster without GPUs (the
    sweep names the GPU model ``cpu`` there, see hpcllm.bench.sweeps)."""
    if summary is None or "gpu_model" not in summary:
        return False
    return bool((summary["gpu_model"] == "cpu").any())


def cluster_without_gpus(name: str, workdir: str | Path = ".") -> bool:
    """Whether the cluster's facts file (the working directory's ``config/clusters``, as
    the workflow reads it, else this checkout's) says it has no GPUs."""
    from hpcllm.clusters import DEFAULT_ROOT, load_cluster

    root = Path(workdir) / DEFAULT_ROOT
    if not root.is_dir():
        root = Path(__file__).resolve().parents[2] / DEFAULT_ROOT
    return not load_cluster(name, root=root).gpus_per_node


def benchmark_sections(
    summary: pd.DataFrame, plots: dict[str, Path]
) -> tuple[list[str], list[tuple[str, str]]]:
    """Per benchmark present in the summary: its table; then the sweep's figures. Also
    the contents entries (anchor, title) of these sections."""
    parts, contents = [], []
    for bench in sorted(summary["benchmark"].dropna().unique()) if not summary.empty else []:
        rows = summary[summary["benchmark"] == bench]
        table = _tflops_shown(compact_table(rows).drop(columns=["benchmark"], errors="ignore"))
        ok = int((rows["status"] == "ok").sum())
        ran = rows.get("model", pd.Series(dtype=object)).dropna().unique()
        models = ", ".join(MODEL_NAMES.get(m, m) for m in sorted(ran))
        title = BENCHMARK_TITLES.get(bench, bench) + (f" ({models})" if models else "")
        contents.append((f"bench-{bench}", title))
        holds = "".join(f'<p class="meta">{html.escape(n)}</p>' for n in hold_notes(rows))
        parts.append(
            f'<h3 id="bench-{html.escape(bench)}">{html.escape(title)}</h3>'
            f'<p class="meta">{ok} of {len(rows)} runs ok.</p>{table_html(table)}{holds}'
        )
    figures = [_figure(plots[k], cap) for k, cap in BENCH_FIGURES if k in plots]
    if figures:
        contents.append(("bench-figures", "Figures"))
        parts.append('<h3 id="bench-figures">Figures</h3>' + "".join(figures))
    return parts, contents


def experiment_section(view: ExperimentView) -> str:
    rows = "".join(
        f'<tr><th class="text">{html.escape(k)}</th><td>{html.escape(v)}</td></tr>'
        for k, v in view.status.items()
    )
    notes = "".join(f"<p>{html.escape(n)}</p>" for n in view.notes)
    figure = (
        _figure(view.loss_png, f"{view.name}: train and validation loss against tokens.")
        if view.loss_png and Path(view.loss_png).is_file()
        else "<p>No loss curve yet.</p>"
    )
    return (
        f'<h3 id="exp-{html.escape(view.name)}">{html.escape(view.name)}</h3>'
        f"<table><tbody>{rows}</tbody></table>{notes}{predictions_html(view)}{figure}"
        f"{scores_html(view)}"
    )


def _at(t: float | None) -> str:
    return "" if t is None else datetime.fromtimestamp(t).strftime("%Y-%m-%d %H:%M:%S")


def _error(seconds: float | None) -> str:
    return "" if seconds is None else f"{seconds:+,.0f} s"


def predictions_html(view: ExperimentView) -> str:
    """The calendar's history: each segment's prediction at its start against the end."""
    if not view.predictions:
        return ""
    head = (
        "<tr><th>segment</th><th>predicted at</th><th>segment end: predicted</th>"
        "<th>actual</th><th>error</th><th>campaign end: predicted</th><th>range</th>"
        "<th>actual</th><th>error</th></tr>"
    )
    body = "".join(
        "<tr>"
        + "".join(
            f"<td>{html.escape(str(v))}</td>"
            for v in (
                r["segment"],
                _at(r["made_at"]),
                _at(r["segment_predicted"]),
                _at(r["segment_actual"]),
                _error(r["segment_error_s"]),
                _at(r["campaign_predicted"]),
                f"{_at(r['campaign_low'])} to {_at(r['campaign_high'])}"
                if r.get("campaign_low") is not None
                else "",
                _at(r["campaign_actual"]),
                _error(r["campaign_error_s"]),
            )
        )
        + "</tr>"
        for r in view.predictions
    )
    return (
        f"<p>When it will finish, as each segment's job predicted at its start (error: "
        f"predicted - actual; local time of this page's machine):</p>"
        f"<table><thead>{head}</thead><tbody>{body}</tbody></table>{forecast_html(view)}"
    )


def forecast_caption(view: ExperimentView) -> str:
    """What the forecast plot shows; never a date where the campaign has stalled."""
    caption = (
        f"{view.name}: when each segment's job predicted the campaign's finish (dots, with "
        "the stated 80 % interval) and its own segment's end (squares; crosses: when it "
        "ended)"
    )
    if any(r.get("campaign_actual") for r in view.predictions):
        return caption + ", against the actual finish (black line)."
    if view.stalled:
        return (
            caption + ". No finish is forecast now: the campaign is not running (see its "
            "state above); these are past predictions only."
        )
    return caption + ". Not finished: the dashed line is the latest prediction, not yet known."


def forecast_html(view: ExperimentView) -> str:
    """The plot of the predictions against what happened, and their coverage in words."""
    coverage = f"<p>{html.escape(view.coverage)}</p>" if view.coverage else ""
    if not view.forecast_png or not Path(view.forecast_png).is_file():
        return coverage
    return coverage + _figure(view.forecast_png, forecast_caption(view))


def _chance(value) -> str:
    return "" if value in (None, "") else f"{100 * float(value):.3g} %"


def _value(row: dict) -> str:
    """A score as the table shows it: accuracies in percent, as their chance level is
    (± the standard error, also in percent), other metrics as they are."""
    from hpcllm.evaluation.table import format_value

    if row["metric"].split(" ")[0] not in CHANCE_METRICS or row["value"] in (None, ""):
        return format_value(row["value"], row["stderr"])
    text = f"{100 * float(row['value']):.3g} %"
    if row["stderr"] not in (None, ""):
        text += f" ± {100 * float(row['stderr']):.2g} %"
    return text


def model_line(identity: ExportIdentity | None) -> str:
    """Which model the scores are of, in words: the weights' digest (the same weights
    give the same digest; a retrained model another), the iteration and the export's
    time."""
    if identity is None:
        return ""
    digest = (
        f"weights digest <code>{html.escape(identity.weights_digest)}</code> "
        f"({html.escape(identity.digest_source)}: SHA-256 of the checkpoint's checksums "
        "manifest, so the same weights always show the same digest)"
        if identity.weights_digest
        else "weights digest unknown (the export recorded none and its checkpoint's "
        "checksums manifest is gone)"
    )
    iteration = f"{identity.iteration:,}" if isinstance(identity.iteration, int) else "?"
    when = html.escape(identity.exported_at or "an unrecorded time")
    return f"<p>Scores of the model of iteration {iteration}, exported at {when}: {digest}.</p>"


def _scored(row: dict) -> str:
    if row["items"] in (None, ""):
        return ""
    unit = "tokens" if row["metric"] == "perplexity" else "items"
    return f"{int(float(row['items'])):,} {unit}"


def scores_html(view: ExperimentView) -> str:
    """The experiment's evaluation: per task and metric its value (± standard error),
    chance level, shots and what was scored; what the metrics mean; the model evaluated
    and the lm-eval command that reproduces the tasks' scores."""
    if not view.scores:
        return ""
    columns = ("task", "metric", "value", "chance", "shots", "scored")
    head = "".join(f"<th>{c}</th>" for c in columns)
    body = "".join(
        f'<tr><td class="text">{html.escape(r["task"])}</td>'
        f'<td class="text">{html.escape(r["metric"])}</td>'
        f"<td>{html.escape(_value(r))}</td>"
        f"<td>{_chance(r.get('chance'))}</td>"
        f"<td>{html.escape(r['shots'] or '')}</td><td>{_scored(r)}</td></tr>"
        for r in view.scores
    )
    metrics = {r["metric"].split(" ")[0] for r in view.scores}
    notes = [SCORE_NOTES[m] for m in SCORE_NOTES if m in metrics]
    if any(r.get("chance") not in (None, "") for r in view.scores):
        notes.append(CHANCE_NOTE)
    notes.append(SCORED_NOTE)
    extra = "".join(f'<p class="meta">{html.escape(n)}</p>' for n in notes)
    if view.model:
        href = os.path.relpath(view.model, "results")  # the page is results/index.html
        extra += (
            f'<p>Model evaluated (Hugging Face folder): <a href="{html.escape(href)}/">'
            f"{html.escape(view.model)}</a></p>"
        )
    if view.lm_eval:
        extra += (
            "<p>The tasks' scores again, from any folder, where lm-eval[hf] is installed "
            "(on a cluster in the training image, where the job ran):</p>"
            f"<pre><code>{html.escape(view.lm_eval)}</code></pre>"
        )
    iteration = int(view.scores[0]["iteration"])
    return (
        f'<h4 id="eval-{html.escape(view.name)}">Evaluation of iteration {iteration:,}</h4>'
        f"{model_line(view.identity)}"
        f"<table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>{extra}"
    )


def _contents(sections: list[tuple[str, str, list[tuple[str, str]]]]) -> str:
    """The table of contents: each section, and on its line the subsections."""

    def link(anchor: str, text: str) -> str:
        return f'<a href="#{html.escape(anchor)}">{html.escape(text)}</a>'

    items = "".join(
        f"<li>{link(anchor, text)}"
        + (f"<ol>{''.join(f'<li>{link(a, t)}</li>' for a, t in subs)}</ol>" if subs else "")
        + "</li>"
        for anchor, text, subs in sections
    )
    return f"<nav><ol>{items}</ol></nav>" if items else ""


def render_page(
    title: str,
    summary: pd.DataFrame | None,
    plots: dict[str, Path],
    experiments: list[ExperimentView],
    generated: datetime | None = None,
    without_gpus: bool = False,
) -> str:
    """The page. ``without_gpus``: the cluster has no GPUs (also told by the summary's
    rows); the page then says what its benchmark figures mean."""
    when = (generated or datetime.now(timezone.utc)).strftime("%Y-%m-%d %H:%M UTC")
    sections = []  # (anchor, heading, contents entries, body parts)
    if summary is not None:
        parts, contents = benchmark_sections(summary, plots)
        sections.append(("benchmarks", "Benchmarks", contents, parts))
    if experiments:
        contents = [(f"exp-{v.name}", v.name) for v in experiments]
        parts = [experiment_section(v) for v in experiments]
        training = ("training", "Training", contents, parts)
        # a person who trained looks for the loss first, not three screens down
        sections.insert(0 if any(v.trained for v in experiments) else len(sections), training)
    body = []
    if without_gpus or ran_without_gpus(summary):
        body.append(f'<p class="note" id="no-gpus">{CPU_NOTE}</p>')
    for anchor, heading, _, parts in sections:
        body += [f'<h2 id="{anchor}">{heading}</h2>', *parts]
    if not sections:
        body.append("<p>Nothing has been benchmarked or trained yet.</p>")
    nav = _contents([(anchor, heading, contents) for anchor, heading, contents, _ in sections])
    full = " Full tables: results/bench/summary.csv." if summary is not None else ""
    return (
        '<!doctype html><html lang="en"><head><meta charset="utf-8">'
        '<meta name="viewport" content="width=device-width, initial-scale=1">'
        f"<title>{html.escape(title)}</title><style>{STYLE}</style></head><body>"
        f'<h1>{html.escape(title)}</h1><p class="meta">Written {when}.{full} The '
        "workflow's provenance: snakemake --report.</p>"
        f"{nav}{''.join(body)}</body></html>\n"
    )


def write_page(path: str | Path, text: str) -> None:
    with atomic_path(path) as tmp:
        Path(tmp).write_text(text)


def experiment_view(
    workdir: Path,
    name: str,
    prepared,
    loss_png: Path | None,
    max_gpu_hours: float | None = None,
    forecast_png: Path | None = None,
) -> ExperimentView:
    """The status of an experiment as ``hpcllm status`` computes it (no Slurm query);
    ``max_gpu_hours``: the config's limit, set against its GPU-hours; ``forecast_png``:
    where to draw its predictions against what happened (always drawn there)."""
    from hpcllm.training.campaign import calendar, forecast_coverage
    from hpcllm.training.campaign.status import experiment_status

    s = experiment_status(workdir, name, prepared, jobs=[])
    status = {
        "segments done": f"{s.segments_done} of {s.segments}",
        "iteration": f"{s.iteration or 0:,} of {s.total_iterations:,}",
        "tokens trained": f"{s.tokens:,}",
        "GPU-hours": f"{s.gpu_hours:,.2f}"
        + (f" of max_gpu_hours {max_gpu_hours:,g}" if max_gpu_hours is not None else ""),
        "train loss (last)": "" if s.train_loss is None else f"{s.train_loss:.3f}",
        "validation loss (last)": "" if s.valid_loss is None else f"{s.valid_loss:.3f}",
        "engine": str(prepared.experiment["engine"]),
    }
    if s.wh_per_million_tokens is not None:  # where the GPUs have energy counters
        status["energy (Wh per million tokens)"] = f"{s.wh_per_million_tokens:,.1f}"
    if s.straggler:  # the newest segment's slowest node against the median
        status["slowest node"] = s.straggler
    if s.suspect_nodes:  # excluded after a hang or a straggler; twice: for the admins
        status["suspect nodes"] = s.suspect_nodes[0].removeprefix("suspect nodes, ")
        status.update(
            {f"for the site's admins ({i})": line for i, line in enumerate(s.suspect_nodes[1:], 1)}
        )
    notes = [f"Last failure: {s.last_failure}."] if s.last_failure else []
    scores, stale = experiment_scores(workdir, name, s.total_iterations)
    notes += [stale] if stale else []
    older = older_than_data(workdir, name, prepared.blend.prefixes, s.total_iterations)
    notes += [older] if older else []
    if s.calendar and not s.finished:
        if s.calendar.startswith("expected to finish: "):
            status["expected to finish"] = s.calendar.removeprefix("expected to finish: ")
        else:  # stalled or stopped: no date, and the command that continues it
            status["state"] = s.calendar
    view = ExperimentView(name, status, loss_png, notes, trained=bool(s.iteration), scores=scores)
    view.predictions = forecast_coverage.forecast_rows(
        calendar.read_records(
            [workdir / "checkpoints" / name / "chain", workdir / "results" / "train" / name],
            prepared.experiment["segments"],
        )
    )
    view.stalled = "state" in status
    if view.predictions:
        view.coverage = forecast_coverage.coverage_sentence(
            forecast_coverage.coverage(view.predictions)
        )
    if forecast_png is not None:
        from hpcllm.training.campaign.forecast_plot import plot_forecast

        plot_forecast(name, view.predictions, forecast_png, stalled=view.stalled)
        view.forecast_png = forecast_png
    if scores:
        view.model, view.lm_eval = evaluated_model(workdir, name, s.total_iterations)
        export = workdir / f"results/export/{name}/iter_{s.total_iterations:07d}/export.json"
        view.identity = export_identity(export)
    return view


def older_than_data(workdir: Path, name: str, prefixes, iteration: int) -> str | None:
    """Why the exported model (and its scores) is older than the data the experiment
    reads now (its segments' records name the data they trained on); None when it is
    not, or where either is not known."""
    from hpcllm.training.plan.data import data_digest

    export = workdir / f"results/export/{name}/iter_{iteration:07d}/export.json"
    try:
        trained_on = json.loads(export.read_text()).get("data_digest")
        now = data_digest([str(workdir / p) for p in prefixes])
    except (OSError, ValueError, AttributeError):
        return None
    if trained_on is None or trained_on == now:
        return None
    return (
        f"The exported model of iteration {iteration:,} (and its scores) was trained on data "
        f"made before the data there now (data digest {trained_on}, now {now}): it is not "
        f"a model of the current data. `hpcllm restart-training {name}`, then the same "
        "command, trains one."
    )


def experiment_scores(workdir: Path, name: str, iteration: int):
    """The evaluation table of the experiment's last checkpoint, only when it is of the
    current export (a changed experiment never shows an old score), and why not."""
    from hpcllm.evaluation.table import current_scores

    export = workdir / f"results/export/{name}/iter_{iteration:07d}/export.json"
    return current_scores(workdir / f"results/eval/{name}/scores.csv", export, iteration)


def evaluated_model(workdir: Path, name: str, iteration: int) -> tuple[str | None, str | None]:
    """The model folder the shown scores are of (relative to ``workdir``) and the lm-eval
    command the evaluation table's job wrote for them (None where there is none)."""
    from hpcllm.evaluation.model import EvaluationError, model_folder

    try:
        folder = model_folder(workdir / f"results/export/{name}/iter_{iteration:07d}/export.json")
        model = str(folder.relative_to(workdir))
    except (EvaluationError, ValueError):
        model = None
    script = workdir / f"results/eval/{name}/lm_eval/command.sh"
    lines = script.read_text().splitlines() if script.is_file() else []
    commands = [line for line in lines if line and not line.startswith("#")]
    return model, commands[-1] if commands else None
