"""The results page's plot of a campaign's predictions against what happened.

x: when each segment's job made its prediction; y: the campaign's finish it predicted,
with its 80 % interval as error bars, and the segment's own end predicted and actual. A
horizontal line: the campaign's actual finish once it has ended; before that the latest
recorded prediction, drawn as not yet known, unless the campaign has stalled (then no
date is drawn at all). Times in the local time of the machine that draws it, as the
page's table. matplotlib is imported here only: the page is built on the login node.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import datetime
from pathlib import Path
from typing import Any

from hpcllm.atomic import atomic_path
from hpcllm.training.campaign.calendar import INTERVAL

DPI = 100


def forecast_series(
    rows: Sequence[Mapping[str, Any]], stalled: bool = False
) -> dict[str, list[tuple[float, ...]]]:
    """What the plot draws, in epoch seconds, by legend label: ``(made_at, predicted,
    low, high)`` per campaign prediction (low and high None where none was stated);
    ``(made_at, predicted)`` and ``(made_at, actual)`` per segment end; ``(finish,)`` for
    the actual finish, or for the latest prediction while the campaign runs."""
    made = [r for r in rows if r.get("campaign_predicted") is not None]
    out: dict[str, list[tuple[float, ...]]] = {
        f"campaign finish predicted ({INTERVAL * 100:.0f} % interval)": [
            (r["made_at"], r["campaign_predicted"], r.get("campaign_low"), r.get("campaign_high"))
            for r in made
        ],
        "segment end predicted": [
            (r["made_at"], r["segment_predicted"])
            for r in rows
            if r.get("segment_predicted") is not None
        ],
        "segment end actual": [
            (r["made_at"], r["segment_actual"]) for r in rows if r.get("segment_actual")
        ],
    }
    actual = next((r["campaign_actual"] for r in rows if r.get("campaign_actual")), None)
    if actual is not None:
        out["actual finish"] = [(actual,)]
    elif made and not stalled:
        latest = max(made, key=lambda r: r["made_at"])
        out["latest prediction (not yet known)"] = [(latest["campaign_predicted"],)]
    return out


def plot_forecast(
    name: str, rows: Sequence[Mapping[str, Any]], out: str | Path, stalled: bool = False
) -> dict[str, list[tuple[float, ...]]]:
    """Draw :func:`forecast_series` of ``rows`` (:func:`hpcllm.training.campaign
    .forecast_coverage.forecast_rows`) to the PNG ``out``; returns what it drew."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.dates as mdates
    import matplotlib.pyplot as plt

    def day(t: float) -> float:  # matplotlib's date axis: days, local time as the table
        return float(mdates.date2num(datetime.fromtimestamp(t)))

    series = forecast_series(rows, stalled)
    fig, ax = plt.subplots(figsize=(10, 4))
    for label, points in series.items():
        if not points:
            continue
        if label.startswith("campaign finish"):
            stated = [p for p in points if p[2] is not None and p[3] is not None]
            bare = [p for p in points if p[2] is None or p[3] is None]
            if stated:
                x, y, low, high = zip(*stated)
                ax.errorbar(
                    [day(t) for t in x],
                    [day(t) for t in y],
                    yerr=[
                        [(c - lo) / 86400 for c, lo in zip(y, low)],
                        [(hi - c) / 86400 for c, hi in zip(y, high)],
                    ],
                    fmt="o",
                    capsize=4,
                    color="tab:blue",
                    label=label,
                )
            if bare:
                ax.plot(
                    [day(p[0]) for p in bare],
                    [day(p[1]) for p in bare],
                    "o",
                    mfc="none",
                    color="tab:blue",
                    label="campaign finish predicted (no interval stated)",
                )
        elif label.startswith("segment end"):
            x, y = zip(*points)
            style = {"marker": "s", "mfc": "none"} if "predicted" in label else {"marker": "x"}
            ax.plot([day(t) for t in x], [day(t) for t in y], ls="none", color="tab:orange",
                    label=label, **style)  # fmt: skip
        elif label == "actual finish":
            ax.axhline(day(points[0][0]), color="black", label=label)
        else:  # the latest prediction: not yet known whether it holds
            ax.axhline(day(points[0][0]), color="grey", ls="--", label=label)
    if not any(series.values()):
        ax.text(0.5, 0.5, "no prediction recorded", ha="center", transform=ax.transAxes)
    made = [p[0] for label, points in series.items()
            if label.startswith(("campaign", "segment")) for p in points]  # fmt: skip
    if made:  # a margin in the plot's own scale (one prediction: matplotlib spans years)
        shown = [t for points in series.values() for p in points for t in p if t is not None]
        pad = max(0.1 * (max(made) - min(made)), 0.1 * (max(shown) - min(shown)), 1.0)
        ax.set_xlim(day(min(made) - pad), day(max(made) + pad))
    for axis in (ax.xaxis, ax.yaxis):
        locator = mdates.AutoDateLocator()
        axis.set_major_locator(locator)
        axis.set_major_formatter(mdates.ConciseDateFormatter(locator))
    ax.set_xlabel("prediction made at")
    ax.set_ylabel("end (predicted or actual)")
    ax.set_title(f"{name}: predictions of the finish")
    ax.grid(alpha=0.3)
    if ax.get_legend_handles_labels()[0]:  # beside the axes: never over a point
        ax.legend(fontsize="small", loc="upper left", bbox_to_anchor=(1.01, 1.0))
    fig.tight_layout()
    with atomic_path(out) as tmp:
        fig.savefig(tmp, format="png", dpi=DPI, bbox_inches="tight")
    plt.close(fig)
    return series
