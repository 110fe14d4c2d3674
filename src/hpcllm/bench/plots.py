"""Benchmark plots with matplotlib (Agg: no display on compute and login nodes).

Every plot renders, also with no successful run (it then says so in the axes), so the
report of a sweep with failures or a single point still builds. Each plot function
returns what it drew (:func:`drawn`), so tests check the plots' content.
"""

from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import matplotlib.ticker as mticker  # noqa: E402
import matplotlib.transforms as mtransforms  # noqa: E402
import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402

from hpcllm.atomic import atomic_path  # noqa: E402
from hpcllm.bench.logparse import parse_megatron_log, parse_vision_log  # noqa: E402
from hpcllm.bench.metrics import batch_times_trimmed  # noqa: E402
from hpcllm.bench.summary import GROUP  # noqa: E402

BENCHMARKS = ("language", "vision")
# Legends and panel titles at the size of the axis labels. Every figure is at most
# FIGURE_WIDTH inches (1100 px at DPI), so the results page (1200 px wide) shows it at its
# own size: a 7-point legend in a 20-inch figure read as 6 px there.
TEXT_SIZE = "medium"
DPI = 110
FIGURE_WIDTH = 10.0


def _label(run) -> str:
    return f"{run['experiment']} {run['model']} {run['scaling']} {run['precision']}"


def _groups(df: pd.DataFrame, benchmark: str):
    ok = df[(df["benchmark"] == benchmark) & (df["status"] == "ok")]
    return ok.groupby(GROUP, dropna=False) if not ok.empty else []


def _empty(ax, text: str) -> None:
    ax.text(0.5, 0.5, text, ha="center", va="center", transform=ax.transAxes, color="grey")


Series = dict[str, dict[str, tuple[list[float], list[float]]]]


def drawn(fig) -> Series:
    """Per panel (its title), per line (its label): the x and y values drawn."""
    return {
        ax.get_title(): {
            line.get_label(): (
                [float(v) for v in line.get_xdata()],
                [float(v) for v in line.get_ydata()],
            )
            for line in ax.get_lines()
            if not line.get_label().startswith("_")  # reference lines have no label
        }
        for ax in fig.axes
    }


def _save(fig, path: str | Path) -> Series:
    with atomic_path(path) as tmp:
        fig.savefig(tmp, format="png", dpi=DPI, bbox_inches="tight")
    series = drawn(fig)
    plt.close(fig)
    return series


def _node_count(value: float, _pos=None) -> str:
    return f"{value:g}"  # 1, 2, 4, ... 256 (a log2 axis would label them 2^0, 2^1)


def _nodes_axis(ax) -> None:
    ax.set_xscale("log", base=2)
    ax.xaxis.set_major_formatter(mticker.FuncFormatter(_node_count))
    ax.xaxis.set_minor_formatter(mticker.NullFormatter())
    ax.set_xlabel("nodes")
    ax.grid(True, which="both", alpha=0.3)


def plot_efficiency(df: pd.DataFrame, path: str | Path) -> Series:
    panels = [
        ("language", "efficiency", "language: throughput per GPU / at fewest nodes"),
        ("vision", "efficiency_epoch_time", "vision: from t_ep (full epoch, validation included)"),
        ("vision", "efficiency_train_time", "vision: from t_tr (training part of the epoch)"),
        ("vision", "efficiency_batch_time", "vision: from median batch time (start to next start)"),
    ]
    fig, axes = plt.subplots(2, 2, figsize=(FIGURE_WIDTH, 8), squeeze=False)
    for ax, (bench, col, title) in zip(axes.flat, panels):
        if _plot_vs_nodes(ax, df, bench, col):
            ax.axhline(1.0, color="black", lw=0.8, ls="--")
            ax.legend(fontsize=TEXT_SIZE)
        else:
            _empty(ax, f"no successful {bench} runs")
        _nodes_axis(ax)
        ax.set_ylabel("scaling efficiency (1 = perfect)")
        ax.set_title(title, fontsize=TEXT_SIZE)
    fig.tight_layout()
    return _save(fig, path)


# Series that coincide (strong and weak scaling at the same nodes, say) must stay
# visible: each gets its own marker and dash pattern, and is drawn shifted sideways by a
# few points (a display offset: the data, and what :func:`drawn` reports, are unchanged).
MARKERS = ("o", "s", "^", "D", "v", "P", "X", "*")
DASHES = ("-", "--", "-.", ":")
OFFSET_POINTS = 3.0


def _series_style(index: int, count: int) -> dict:
    return {
        "marker": MARKERS[index % len(MARKERS)],
        "linestyle": DASHES[(index // len(MARKERS)) % len(DASHES)],
        "markerfacecolor": "none" if index % 2 else None,
    }


def _shift(ax, line, index: int, count: int) -> None:
    """Draw ``line`` a few points sideways (after its data went into the axis limits)."""
    shift = (index - (count - 1) / 2) * OFFSET_POINTS
    line.set_transform(
        mtransforms.offset_copy(ax.transData, fig=ax.figure, x=shift, y=0, units="points")
    )


def _plot_vs_nodes(ax, df: pd.DataFrame, bench: str, col: str) -> bool:
    """One line of ``col`` against nodes per sweep series; whether any was drawn."""
    groups = list(_groups(df, bench))
    for index, (_, g) in enumerate(groups):
        g = g.sort_values("nodes")
        (line,) = ax.plot(
            g["nodes"], g[col], label=_label(g.iloc[0]), **_series_style(index, len(groups))
        )
        _shift(ax, line, index, len(groups))
    return bool(groups)


def plot_throughput(df: pd.DataFrame, path: str | Path) -> Series:
    panels = [
        ("language", "tokens_per_s_per_gpu", "tokens/s per GPU"),
        ("vision", "images_per_s_per_gpu", "images/s per GPU"),
    ]
    fig, axes = plt.subplots(1, 2, figsize=(FIGURE_WIDTH, 4.5), squeeze=False)
    for ax, (bench, col, ylabel) in zip(axes[0], panels):
        if _plot_vs_nodes(ax, df, bench, col):
            ax.legend(fontsize=TEXT_SIZE)
        else:
            _empty(ax, f"no successful {bench} runs")
        _nodes_axis(ax)
        ax.set_ylabel(ylabel)
        ax.set_title(f"{bench}: per-GPU throughput", fontsize=TEXT_SIZE)
    fig.tight_layout()
    return _save(fig, path)


def _batch_times(run) -> list[float]:
    if run["benchmark"] == "vision":
        parsed = parse_vision_log(run["log"])
        epoch = run.get("measured_epoch")
        return batch_times_trimmed([b["time_s"] for b in parsed.batches if b.get("epoch") == epoch])
    its = parse_megatron_log(run["log"]).iterations[int(run.get("warmup_iterations") or 0) :]
    return batch_times_trimmed([i.elapsed_s for i in its])


# Curves this close are one line on any figure (data parallelism sums in another order:
# the 1- and 2-node strong-scaling losses differ in the 6th digit).
SAME_RTOL = 1e-4


def _draw_curves(ax, curves: list[tuple[str, list[float], list[float]]], **kw) -> int:
    """Draw ``(label, xs, ys)`` curves, each with its own marker and dash pattern; returns
    the lines drawn. Curves with the same values (to SAME_RTOL) are one line whose legend
    entry names each run: otherwise the legend lists a line hidden under another."""
    groups: list[tuple[np.ndarray, np.ndarray, list[str]]] = []
    for label, xs, ys in curves:
        xs, ys = np.asarray(xs, dtype=float), np.asarray(ys, dtype=float)
        for gx, gy, labels in groups:
            if (
                gx.shape == xs.shape
                and np.allclose(gx, xs, rtol=SAME_RTOL, atol=0)
                and (np.allclose(gy, ys, rtol=SAME_RTOL, atol=0))
            ):
                labels.append(label)
                break
        else:
            groups.append((xs, ys, [label]))
    for index, (xs, ys, labels) in enumerate(groups):
        ax.plot(
            xs,
            ys,
            label="\n= ".join(labels) + (" (the same to 0.01 %)" if len(labels) > 1 else ""),
            marker=MARKERS[index % len(MARKERS)],
            markevery=max(1, len(xs) // 8),
            markerfacecolor="none" if index % 2 else None,
            linestyle=DASHES[index % len(DASHES)],
            **kw,
        )
    if groups:  # below the axes: long labels would hide the start of the curves
        ax.legend(fontsize=TEXT_SIZE, loc="upper center", bbox_to_anchor=(0.5, -0.15))
    return len(groups)


def plot_batch_time_cdf(df: pd.DataFrame, path: str | Path) -> Series:
    fig, axes = plt.subplots(1, 2, figsize=(FIGURE_WIDTH, 4.5), squeeze=False)
    for ax, bench in zip(axes[0], BENCHMARKS):
        curves = []
        runs = df[(df["benchmark"] == bench) & (df["status"] == "ok")]
        for _, run in runs.sort_values(["experiment", "model", "nodes"]).iterrows():
            times = np.sort(_batch_times(run))
            if len(times):
                fractions = np.arange(1, len(times) + 1) / len(times)
                curves.append((f"{_label(run)} n={run['nodes']}", times, fractions))
        if not _draw_curves(ax, curves, drawstyle="steps-post"):
            _empty(ax, f"no {bench} batch times")
        ax.set_xlabel(
            "batch time (s), start to next start, loading included"
            if bench == "vision"
            else "iteration time (s)"
        )
        ax.set_ylabel("fraction of batches")
        ax.set_title(f"{bench}: CDF, first and last batch removed", fontsize=TEXT_SIZE)
        ax.grid(True, alpha=0.3)
    fig.tight_layout()
    return _save(fig, path)


def plot_loss(df: pd.DataFrame, path: str | Path) -> Series:
    fig, ax = plt.subplots(figsize=(FIGURE_WIDTH * 0.7, 4.5))
    curves = []
    runs = df[(df["benchmark"] == "language") & df["status"].isin(["ok", "truncated"])]
    for _, run in runs.sort_values(["experiment", "model", "nodes"]).iterrows():
        its = [i for i in parse_megatron_log(run["log"]).iterations if i.lm_loss is not None]
        if not its:
            continue
        tokens = [
            (
                i.consumed_samples
                if i.consumed_samples is not None
                else i.iteration * run["global_batch"]
            )
            * run["seq_length"]
            for i in its
        ]
        curves.append((f"{_label(run)} n={run['nodes']}", tokens, [i.lm_loss for i in its]))
    if not _draw_curves(ax, curves):
        _empty(ax, "no language runs with a loss")
    ax.set_xlabel("tokens")
    ax.set_ylabel("lm loss")
    ax.set_title("language: loss vs tokens", fontsize=TEXT_SIZE)
    ax.grid(True, alpha=0.3)
    fig.tight_layout()
    return _save(fig, path)


PLOTS = {
    "efficiency": plot_efficiency,
    "throughput": plot_throughput,
    "batch_time_cdf": plot_batch_time_cdf,
    "loss": plot_loss,
}


def plot_all(df: pd.DataFrame, paths: dict[str, str | Path]) -> dict[str, Series]:
    """Write every plot; ``paths`` maps the keys of :data:`PLOTS` to PNG paths."""
    return {name: fn(df, paths[name]) for name, fn in PLOTS.items()}
