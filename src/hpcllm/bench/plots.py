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
import matplotlib.transforms as mtransforms  # noqa: E402
import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402

from hpcllm.atomic import atomic_path  # noqa: E402
from hpcllm.bench.logparse import parse_megatron_log, parse_vision_log  # noqa: E402
from hpcllm.bench.metrics import batch_times_trimmed  # noqa: E402
from hpcllm.bench.summary import GROUP  # noqa: E402

BENCHMARKS = ("language", "vision")


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
        fig.savefig(tmp, format="png", dpi=110, bbox_inches="tight")
    series = drawn(fig)
    plt.close(fig)
    return series


def _nodes_axis(ax) -> None:
    ax.set_xscale("log", base=2)
    ax.set_xlabel("nodes")
    ax.grid(True, which="both", alpha=0.3)


def plot_efficiency(df: pd.DataFrame, path: str | Path) -> Series:
    panels = [
        ("language", "efficiency", "language: throughput per GPU / at fewest nodes"),
        ("vision", "efficiency_epoch_time", "vision: from t_ep (full epoch, validation included)"),
        ("vision", "efficiency_train_time", "vision: from t_tr (training part of the epoch)"),
        ("vision", "efficiency_batch_time", "vision: from median batch time (start to next start)"),
    ]
    fig, axes = plt.subplots(1, len(panels), figsize=(5 * len(panels), 4), squeeze=False)
    for ax, (bench, col, title) in zip(axes[0], panels):
        if _plot_vs_nodes(ax, df, bench, col):
            ax.axhline(1.0, color="black", lw=0.8, ls="--")
            ax.legend(fontsize=7)
        else:
            _empty(ax, f"no successful {bench} runs")
        _nodes_axis(ax)
        ax.set_ylabel("scaling efficiency (1 = perfect)")
        ax.set_title(title, fontsize=9)
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
    fig, axes = plt.subplots(1, 2, figsize=(10, 4), squeeze=False)
    for ax, (bench, col, ylabel) in zip(axes[0], panels):
        if _plot_vs_nodes(ax, df, bench, col):
            ax.legend(fontsize=7)
        else:
            _empty(ax, f"no successful {bench} runs")
        _nodes_axis(ax)
        ax.set_ylabel(ylabel)
        ax.set_title(f"{bench}: per-GPU throughput", fontsize=9)
    return _save(fig, path)


def _batch_times(run) -> list[float]:
    if run["benchmark"] == "vision":
        parsed = parse_vision_log(run["log"])
        epoch = run.get("measured_epoch")
        return batch_times_trimmed([b["time_s"] for b in parsed.batches if b.get("epoch") == epoch])
    its = parse_megatron_log(run["log"]).iterations[int(run.get("warmup_iterations") or 0) :]
    return batch_times_trimmed([i.elapsed_s for i in its])


def plot_batch_time_cdf(df: pd.DataFrame, path: str | Path) -> Series:
    fig, axes = plt.subplots(1, 2, figsize=(10, 4), squeeze=False)
    for ax, bench in zip(axes[0], BENCHMARKS):
        drawn = 0
        runs = df[(df["benchmark"] == bench) & (df["status"] == "ok")]
        for _, run in runs.sort_values(["experiment", "model", "nodes"]).iterrows():
            times = np.sort(_batch_times(run))
            if len(times) == 0:
                continue
            ax.step(
                times,
                np.arange(1, len(times) + 1) / len(times),
                where="post",
                label=f"{_label(run)} n={run['nodes']}",
                linestyle=DASHES[drawn % len(DASHES)],  # equal CDFs stay apart
            )
            drawn += 1
        if drawn:
            ax.legend(fontsize=6)
        else:
            _empty(ax, f"no {bench} batch times")
        ax.set_xlabel(
            "batch time (s), start to next start, loading included"
            if bench == "vision"
            else "iteration time (s)"
        )
        ax.set_ylabel("fraction of batches")
        ax.set_title(f"{bench}: CDF, first and last batch removed", fontsize=9)
        ax.grid(True, alpha=0.3)
    return _save(fig, path)


def plot_loss(df: pd.DataFrame, path: str | Path) -> Series:
    fig, ax = plt.subplots(figsize=(6, 4))
    drawn = 0
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
        ax.plot(
            tokens,
            [i.lm_loss for i in its],
            label=f"{_label(run)} n={run['nodes']}",
            linestyle=DASHES[drawn % len(DASHES)],
        )
        drawn += 1
    if drawn:
        ax.legend(fontsize=6)
    else:
        _empty(ax, "no language runs with a loss")
    ax.set_xlabel("tokens")
    ax.set_ylabel("lm loss")
    ax.set_title("language: loss vs tokens", fontsize=9)
    ax.grid(True, alpha=0.3)
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
