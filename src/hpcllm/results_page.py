"""The results page: one self-contained HTML file a person opens first.

Per benchmark the compact table (nodes, scaling mode, precision, throughput per GPU,
efficiency per timing, status) and EPICURE's figures (efficiency against nodes per
timing, throughput per GPU, per-batch CDFs); then per training experiment its status
(segments, iterations, tokens, GPU-hours, last losses) and the loss against tokens.
Figures are embedded (base64 PNG), so the file can be mailed or copied off the cluster
alone; Snakemake's ``--report`` links it from its landing page.
"""

from __future__ import annotations

import base64
import html
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path

import pandas as pd

from hpcllm.atomic import atomic_path
from hpcllm.bench.summary import compact_table

# The figures of a benchmark section, in reading order: (file stem, caption).
BENCH_FIGURES = (
    ("efficiency", "Scaling efficiency against nodes, per timing (1 = perfect)."),
    ("throughput", "Throughput per GPU against nodes."),
    ("batch_time_cdf", "Per-batch times: CDF per run (first and last batch removed)."),
    ("loss", "Language points: loss against tokens."),
)
BENCHMARK_TITLES = {
    "language": "Language model benchmark",
    "vision": "Vision benchmark (ResNet-50)",
}

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
nav a { margin-right: 1rem; }
"""


@dataclass
class ExperimentView:
    """What the page shows of one training experiment."""

    name: str
    status: dict[str, str]  # label -> value, in display order
    loss_png: Path | None = None
    notes: list[str] = field(default_factory=list)


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
            css = "status" if col == "status" else ("text" if isinstance(value, str) else "")
            cells.append(f'<td class="{css}">{html.escape(shown)}</td>')
        css = "ok" if row.get("status") == "ok" else "bad"
        rows.append(f'<tr class="{css}">{"".join(cells)}</tr>')
    return f"<table><thead><tr>{head}</tr></thead><tbody>{''.join(rows)}</tbody></table>"


def benchmark_sections(summary: pd.DataFrame, plots: dict[str, Path]) -> list[str]:
    """Per benchmark present in the summary: its table; then the sweep's figures."""
    parts = []
    for bench in sorted(summary["benchmark"].dropna().unique()) if not summary.empty else []:
        rows = summary[summary["benchmark"] == bench]
        table = compact_table(rows).drop(columns=["benchmark"], errors="ignore")
        ok = int((rows["status"] == "ok").sum())
        parts.append(
            f'<h3 id="bench-{bench}">{html.escape(BENCHMARK_TITLES.get(bench, bench))}</h3>'
            f'<p class="meta">{ok} of {len(rows)} runs ok.</p>{table_html(table)}'
        )
    figures = [_figure(plots[k], cap) for k, cap in BENCH_FIGURES if k in plots]
    if figures:
        parts.append("<h3>Figures</h3>" + "".join(figures))
    return parts


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
        f"<table><tbody>{rows}</tbody></table>{notes}{figure}"
    )


def render_page(
    title: str,
    summary: pd.DataFrame | None,
    plots: dict[str, Path],
    experiments: list[ExperimentView],
    generated: datetime | None = None,
) -> str:
    when = (generated or datetime.now(timezone.utc)).strftime("%Y-%m-%d %H:%M UTC")
    nav, body = [], []
    if summary is not None:
        nav.append('<a href="#benchmarks">Benchmarks</a>')
        body.append('<h2 id="benchmarks">Benchmarks</h2>')
        body += benchmark_sections(summary, plots)
    if experiments:
        nav.append('<a href="#training">Training</a>')
        body.append('<h2 id="training">Training</h2>')
        body += [experiment_section(v) for v in experiments]
    if not body:
        body.append("<p>Nothing has been benchmarked or trained yet.</p>")
    return (
        '<!doctype html><html lang="en"><head><meta charset="utf-8">'
        '<meta name="viewport" content="width=device-width, initial-scale=1">'
        f"<title>{html.escape(title)}</title><style>{STYLE}</style></head><body>"
        f'<h1>{html.escape(title)}</h1><p class="meta">Written {when}. Full tables: '
        "results/bench/summary.csv; the workflow's provenance: snakemake --report.</p>"
        f"<nav>{''.join(nav)}</nav>{''.join(body)}</body></html>\n"
    )


def write_page(path: str | Path, text: str) -> None:
    with atomic_path(path) as tmp:
        Path(tmp).write_text(text)


def experiment_view(workdir: Path, name: str, prepared, loss_png: Path | None) -> ExperimentView:
    """The status of an experiment as ``hpcllm status`` computes it (no Slurm query)."""
    from hpcllm.training.status import experiment_status

    s = experiment_status(workdir, name, prepared, jobs=[])
    status = {
        "segments done": f"{s.segments_done} of {s.segments}",
        "iteration": f"{s.iteration or 0:,} of {s.total_iterations:,}",
        "tokens trained": f"{s.tokens:,}",
        "GPU-hours": f"{s.gpu_hours:,.2f}",
        "train loss (last)": "" if s.train_loss is None else f"{s.train_loss:.3f}",
        "validation loss (last)": "" if s.valid_loss is None else f"{s.valid_loss:.3f}",
        "engine": str(prepared.experiment["engine"]),
    }
    notes = [f"Last failure: {s.last_failure}."] if s.last_failure else []
    return ExperimentView(name, status, loss_png, notes)
