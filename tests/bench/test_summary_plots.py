import json
import math
import shutil
from pathlib import Path

import pandas as pd
import pytest

from hpcllm.bench.plots import PLOTS, plot_all
from hpcllm.bench.summary import summarize, write_summary

DATA = Path(__file__).parent / "data"


def point(nodes, scaling="strong", **over):
    p = {
        "id": f"exp.m.{scaling}.bf16.n{nodes:04d}",
        "benchmark": "language",
        "experiment": "exp",
        "model": "m",
        "scaling": scaling,
        "precision": "bf16",
        "nodes": nodes,
        "gpus": 4 * nodes,
        "seq_length": 2048,
        "global_batch": 16,
        "warmup_iterations": 1,
        "peak_tflops": 989.0,
    }
    p.update(over)
    return p


def put_run(results, p, log_text, record=None):
    """A run's folder as the runner leaves it: its log (unless None) and its record."""
    d = results / p["benchmark"] / p["id"]
    d.mkdir(parents=True)
    if log_text is not None:
        (d / "run.log").write_text(log_text)
    if record is not None:
        (d / "run.json").write_text(json.dumps({"id": p["id"], **record}))


def put_slurm_log(root, p, job_id, text):
    """The Slurm plugin's job log: <root>/rule_<rule>/<wildcards>/<job id>.log."""
    d = root / f"rule_bench_{p['benchmark']}" / p["id"]
    d.mkdir(parents=True, exist_ok=True)
    (d / f"{job_id}.log").write_text(text)


def scaled_log(factor):
    """The current-format fixture with every iteration time multiplied by ``factor``."""
    import re

    text = (DATA / "megatron_current.log").read_text()
    return re.sub(
        r"elapsed time per iteration \(ms\): ([\d.]+)",
        lambda m: f"elapsed time per iteration (ms): {float(m[1]) * factor:.1f}",
        text,
    )


def test_summary_marks_every_bad_case_and_plots_still_render(tmp_path):
    results = tmp_path / "results"
    points = [point(1), point(2), point(4), point(8), point(16), point(1, "weak")]
    put_run(results, points[0], scaled_log(1.0))
    # twice the GPUs, the same iteration time at the same global batch: tokens/s per GPU
    # halved, efficiency 0.5 (no speed-up from the second node)
    put_run(results, points[1], scaled_log(1.0))
    put_run(results, points[2], (DATA / "megatron_truncated.log").read_text())
    # a failed run whose record holds only its exit code: the status comes from the log
    put_run(results, points[3], (DATA / "megatron_oom.log").read_text(), {"returncode": 1})
    # points[4] is missing; points[5] (weak) is a sweep with a single point, no iterations
    put_run(results, points[5], (DATA / "no_iterations.log").read_text())
    df = summarize(points, results).set_index("id")
    status = df["status"].to_dict()
    assert status[points[0]["id"]] == "ok" and status[points[1]["id"]] == "ok"
    assert status[points[2]["id"]] == "truncated"
    assert status[points[3]["id"]] == "out_of_memory"
    assert status[points[4]["id"]] == "missing"
    assert status[points[5]["id"]] == "no_iterations"
    assert df.loc[points[0]["id"], "efficiency"] == 1.0
    assert abs(df.loc[points[1]["id"], "efficiency"] - 0.5) < 1e-3
    assert math.isnan(df.loc[points[3]["id"], "efficiency"])
    assert (
        abs(df.loc[points[0]["id"], "mfu"] - df.loc[points[0]["id"], "tflops_per_gpu"] / 989) < 1e-9
    )

    write_summary(df.reset_index(), tmp_path / "summary.csv")
    back = pd.read_csv(tmp_path / "summary.csv")
    assert len(back) == 6 and set(back["status"]) >= {"ok", "missing", "truncated"}
    paths = {name: tmp_path / f"{name}.png" for name in PLOTS}
    shown = plot_all(df.reset_index(), paths)
    for path in paths.values():
        assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    # only the two good runs are drawn: efficiency 1 and 0.5 at 1 and 2 nodes
    (line,) = shown["efficiency"]["language: throughput per GPU / at fewest nodes"].values()
    assert line[0] == [1.0, 2.0] and line[1] == pytest.approx([1.0, 0.5], abs=1e-3)
    # the CDF of the two good runs: their iteration times without warm-up, first and
    # last; the two logs are the same, so one line whose legend entry names both runs
    cdf = shown["batch_time_cdf"]["language: CDF, first and last batch removed"]
    ((label, (xs, ys)),) = cdf.items()
    assert xs == sorted(xs) and ys[-1] == 1.0
    assert label == "exp m strong bf16 n=1\n= exp m strong bf16 n=2 (the same to 0.01 %)"
    loss_lines = shown["loss"]["language: loss vs tokens"]
    assert len(loss_lines) == 2  # ok and ok (the same values, one line), the truncated run


def test_a_failed_baseline_gives_its_series_no_efficiencies(tmp_path):
    """The baseline is the fewest nodes of the sweep, never another point: the 1-node run
    logged its iterations and then died (a time limit), so the 2-node run has none."""
    results = tmp_path / "results"
    one, two = point(1), point(2)
    put_run(results, one, scaled_log(1.0), {"status": "time_limit", "returncode": 1})
    put_run(results, two, scaled_log(1.0), {"status": "ok", "returncode": 0})
    df = summarize([one, two], results).set_index("id")
    assert df.loc[one["id"], "status"] == "time_limit" and df.loc[two["id"], "status"] == "ok"
    assert df.loc[one["id"], "tokens_per_s_per_gpu"] > 0  # it has figures, yet is no baseline
    assert (df["baseline_nodes"] == 1).all()
    assert df["efficiency"].isna().all()


def test_summarize_reads_the_slurm_job_logs(tmp_path):
    results, slurm = tmp_path / "results", tmp_path / "slurm_logs"
    died, killed, lost, absent, refined = (point(n) for n in (1, 2, 4, 8, 16))
    # the node died before the run wrote its log: only Slurm's job log says why
    put_run(results, died, None)
    put_slurm_log(slurm, died, 101, (DATA / "slurm_node_failure.log").read_text())
    # Slurm stopped the job at its time limit; the runner's record never got written
    put_slurm_log(slurm, killed, 102, (DATA / "slurm_time_limit.log").read_text())
    # a record but no log: the runner's own status stands
    put_run(results, lost, None, {"status": "cancelled", "returncode": -15})
    # nothing at all
    # the runner saw only a failed srun ("error"); Slurm's log names the node failure
    put_run(results, refined, scaled_log(1.0)[:300], {"status": "error", "returncode": 1})
    put_slurm_log(slurm, refined, 105, "srun: error: Node failure on jwb0217\n")
    df = summarize([died, killed, lost, absent, refined], results, slurm).set_index("id")
    assert df["status"].to_dict() == {
        died["id"]: "node_failure",
        killed["id"]: "time_limit",
        lost["id"]: "cancelled",
        absent["id"]: "missing",
        refined["id"]: "node_failure",
    }
    # without the Slurm logs the same runs are only missing or an error
    alone = summarize([died, killed, refined], results).set_index("id")["status"]
    assert list(alone) == ["missing", "missing", "error"]


def test_plots_render_with_no_runs_at_all(tmp_path):
    df = summarize([point(1)], tmp_path / "nothing")
    assert list(df["status"]) == ["missing"]
    paths = {name: tmp_path / f"{name}.png" for name in PLOTS}
    plot_all(df, paths)
    assert all(p.stat().st_size > 1000 for p in paths.values())


def test_vision_run_from_records(tmp_path):
    results = tmp_path / "r"
    base = {
        "benchmark": "vision",
        "experiment": "v",
        "model": "resnet_tiny",
        "scaling": "weak",
        "precision": "amp",
        "measured_epoch": 2,
        "peak_tflops": 100.0,
    }

    def log(train_time, stage_in=None):
        lines = [{"event": "start", "train_flops_per_image": 1e9}]
        if stage_in:  # seconds per node of the copy to node-local storage
            lines.append({"event": "stage_in", "method": "copy", "seconds_per_node": stage_in})
        for epoch in (1, 2):
            lines += [
                {"event": "batch", "epoch": epoch, "batch": b, "time_s": train_time / 4}
                for b in range(4)
            ]
            lines.append(
                {
                    "event": "epoch",
                    "epoch": epoch,
                    "epoch_time_s": train_time + 1,
                    "train_time_s": train_time,
                    "images": 64,
                }
            )
        lines.append({"event": "end"})
        return "\n".join(json.dumps(x) for x in lines) + "\n"

    p1 = {**base, "id": "v.1", "nodes": 1, "gpus": 1}
    p2 = {**base, "id": "v.2", "nodes": 2, "gpus": 2}
    put_run(results, p1, log(8.0))
    # the same epoch (EPICURE's weak scaling: fixed per-GPU batch, fixed dataset) in half
    # the time on twice the GPUs: perfect scaling
    put_run(results, p2, log(4.0, stage_in={"n1": 1.5, "n2": 3.25}))
    df = summarize([p1, p2], results).set_index("id")
    assert df.loc["v.2", "efficiency_train_time"] == 1.0
    assert df.loc["v.2", "efficiency_epoch_time"] == (9.0 * 1) / (5.0 * 2)
    assert df.loc["v.2", "efficiency_batch_time"] == 2.0  # batches got faster
    assert df.loc["v.1", "images_per_s_per_gpu"] == 8.0
    assert df.loc["v.1", "mfu"] == 8.0 * 1e9 / 1e12 / 100.0
    # docs/benchmarks.md: stage_in_s is the slowest node's (the job waits for it)
    assert (df.loc["v.2", "stage_in_s"], df.loc["v.2", "stage_in_nodes"]) == (3.25, 2)
    assert df.loc["v.2", "stage_in_method"] == "copy"
    shutil.rmtree(results)


def test_coinciding_series_stay_visible_and_integers_stay_integers(tmp_path):
    """Strong and weak scaling with identical numbers: both lines are drawn apart on the
    canvas (own marker, a sideways shift) while the data stay exact; the summary writes
    counts as integers even in columns with a missing value; the compact table is short
    and rounded."""
    import matplotlib.pyplot as plt

    from hpcllm.bench.plots import _plot_vs_nodes
    from hpcllm.bench.summary import compact_table, format_table

    results = tmp_path / "results"
    points = [point(1), point(2), point(1, "weak"), point(2, "weak"), point(4)]
    for p in points[:4]:
        put_run(results, p, scaled_log(1.0), {"returncode": 0, "slurm_job_id": 4242})
    df = summarize(points, results)
    fig, ax = plt.subplots()
    assert _plot_vs_nodes(ax, df, "language", "tokens_per_s_per_gpu")
    fig.canvas.draw()
    strong, weak = ax.get_lines()
    assert strong.get_marker() != weak.get_marker()
    assert list(strong.get_xdata()) == list(weak.get_xdata()) == [1, 2]  # data unchanged
    on_canvas = [line.get_transform().transform(line.get_xydata()) for line in (strong, weak)]
    assert (abs(on_canvas[0][:, 0] - on_canvas[1][:, 0]) > 3).all()  # apart on the canvas
    plt.close(fig)

    write_summary(df, tmp_path / "summary.csv")
    text = (tmp_path / "summary.csv").read_text()
    rows = {line.split(",")[0]: line.split(",") for line in text.splitlines()}
    header = rows["id"]
    missing_run = dict(zip(header, rows[points[4]["id"]]))
    ok_run = dict(zip(header, rows[points[0]["id"]]))
    assert (ok_run["nodes"], ok_run["slurm_job_id"], ok_run["returncode"]) == ("1", "4242", "0")
    assert (missing_run["nodes"], missing_run["returncode"]) == ("4", "")

    table = compact_table(df)
    assert list(table["nodes"]) == [1, 2, 4, 1, 2]
    assert len(table.columns) <= 15 < len(df.columns)
    shown = format_table(table)
    assert "2658.3" in shown and "2658.27" not in shown and "missing" in shown


def test_figures_read_at_page_size_with_integer_nodes_and_every_listed_line_visible(
    tmp_path, monkeypatch
):
    """Issue 31: legends at the axis labels' size in figures the page shows at their own
    width (a 7-point legend in a 20-inch figure read as 6 px); node counts 1, 2, 4 on the
    log2 axes (not 2^0, 2^1); every legend entry a line of its own: strong and weak at 1
    node train on the same data, and their equal loss curves were listed twice and drawn
    as one."""
    import re

    import matplotlib.image
    import matplotlib.pyplot as plt
    import numpy as np

    from hpcllm.bench import plots as plots_module

    def log(time_factor, loss_shift):
        return re.sub(
            r"lm loss: ([\d.E+-]+)",
            lambda m: f"lm loss: {float(m[1]) + loss_shift:.6E}",
            scaled_log(time_factor),
        )

    results = tmp_path / "results"
    points = [point(1), point(2), point(4), point(1, "weak"), point(2, "weak")]
    # strong n=2's losses differ in the 6th digit, as data parallelism makes them
    for p, factor, shift in zip(points, (1.0, 1.0, 1.1, 1.0, 1.3), (0, 1e-5, 0.1, 0, 0.2)):
        put_run(results, p, log(factor, shift))
    df = summarize(points, results)
    kept = []  # the figures, as they were saved
    monkeypatch.setattr(plots_module.plt, "close", kept.append)
    paths = {name: tmp_path / f"{name}.png" for name in PLOTS}
    plot_all(df, paths)
    monkeypatch.undo()
    figures = dict(zip(PLOTS, kept))

    page_width = 1200 - 32  # the results page's content width in CSS pixels
    for name, fig in figures.items():
        fig.canvas.draw()
        width = matplotlib.image.imread(paths[name]).shape[1]
        shown = min(1.0, page_width / width)  # the page scales a wider image down
        for ax in fig.axes:
            legend = ax.get_legend()
            if legend is None:
                continue
            label_size = ax.xaxis.label.get_fontsize()
            for text in legend.get_texts():
                assert text.get_fontsize() >= label_size, (name, text.get_text())
                pixels = text.get_fontsize() * plots_module.DPI / 72 * shown
                assert pixels >= 12, f"{name}: legend text {pixels:.1f} px on the page"
            # a legend entry per line drawn, and no two lines on top of each other
            lines = [line for line in ax.get_lines() if not line.get_label().startswith("_")]
            assert len(legend.get_texts()) == len(lines)
            for i, one in enumerate(lines):
                for other in lines[i + 1 :]:
                    assert not (
                        len(one.get_xdata()) == len(other.get_xdata())
                        and np.allclose(one.get_xydata(), other.get_xydata(), rtol=1e-4)
                    ), f"{name}: {one.get_label()!r} hides {other.get_label()!r}"
            if ax.get_xscale() == "log":
                low, high = ax.get_xlim()
                ticks = [
                    t.get_text()
                    for t, v in zip(ax.get_xticklabels(), ax.get_xticks())
                    if low <= v <= high
                ]
                assert ticks == ["1", "2", "4"], (name, ticks)
    loss = figures["loss"].axes[0]
    entries = [t.get_text() for t in loss.get_legend().get_texts()]
    # strong n=1, weak n=1 and strong n=2 read the same log: one line, named in one entry
    assert entries[0] == (
        "exp m strong bf16 n=1\n= exp m weak bf16 n=1\n= exp m strong bf16 n=2 (the same to 0.01 %)"
    )
    assert len(entries) == 3 and all(" n=" in e for e in entries)
    styles = {(line.get_marker(), line.get_linestyle()) for line in loss.get_lines()}
    assert len(styles) == 3  # each line its own marker and dash pattern
    for fig in figures.values():
        plt.close(fig)
