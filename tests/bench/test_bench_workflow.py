"""The tiny local sweep end to end through Snakemake, the report, and the JUWELS plan."""

import json
import math
import os
import statistics
from pathlib import Path

import pandas as pd
import pytest
import yaml
from support import REPO, run_snakemake

from hpcllm.bench.metrics import batch_times_trimmed
from hpcllm.bench.plots import PLOTS, plot_all
from hpcllm.vision.models import choose_impl

# Mock data for the language runs: the sweep needs no text stage in this test.
TINY = {"benchmarks": {"experiments": {"language_tiny": {"data": "mock", "tokenizer": None}}}}


def vision_records(workdir: Path, point_id: str) -> list[dict]:
    """The JSON records of a vision run's log, read without the package's parser."""
    text = (workdir / "results/bench/vision" / point_id / "run.log").read_text()
    return [json.loads(line) for line in text.splitlines() if line.startswith("{")]


def measured_epoch(workdir: Path, point_id: str) -> dict:
    """The record of epoch 2, the measured one of vision_tiny."""
    return next(
        r for r in vision_records(workdir, point_id) if r["event"] == "epoch" and r["epoch"] == 2
    )


def check_vision_runs(workdir: Path, vision: pd.DataFrame) -> None:
    val_images = json.loads((workdir / "data/vision/imagenet_sample/val.report.json").read_text())
    for _, run in vision.iterrows():
        records = vision_records(workdir, run["id"])
        start = next(r for r in records if r["event"] == "start")
        assert start["world_size"] == run["gpus"]
        epoch = measured_epoch(workdir, run["id"])
        # EPICURE's three timings, straight from the run's epoch record
        assert run["epoch_time_s"] == epoch["epoch_time_s"] > run["train_time_s"] > 0
        assert run["train_time_s"] == epoch["train_time_s"]
        times = [r["time_s"] for r in records if r["event"] == "batch" and r["epoch"] == 2]
        assert len(times) == start["batches_per_epoch"] >= 3
        assert run["median_batch_time_s"] == pytest.approx(statistics.median(times[1:-1]))
        # validation of the whole val split, every image once over the ranks
        assert run["val_images"] == epoch["val_images"] == val_images["num_samples"]
        assert 0 <= run["val_top1"] <= run["val_top5"] <= 1
        # no energy counters on a CPU: the columns are there and empty
        assert math.isnan(run["energy_j_per_gpu"]) and math.isnan(run["energy_j_per_image"])
        assert run["model_impl"] == choose_impl("auto")
        # stage-in happened (one "node" here), was timed, and its copies are gone
        stage = next(r for r in records if r["event"] == "stage_in")
        assert run["stage_in_method"] == stage["method"] == "copy"
        assert run["stage_in_nodes"] == 1 and run["stage_in_s"] > 0
        (folder,) = stage["dirs"].values()
        assert run["id"] in folder and not Path(folder).exists()


def check_efficiencies(workdir: Path, df: pd.DataFrame) -> None:
    """2-node efficiencies against values derived from the runs' own records."""
    for (bench, scaling, precision), group in df.groupby(["benchmark", "scaling", "precision"]):
        one, two = (group[group["nodes"] == n].iloc[0] for n in (1, 2))
        assert one["efficiency"] == 1.0
        if bench == "language":
            ratio = two["tokens_per_s_per_gpu"] / one["tokens_per_s_per_gpu"]
            assert two["efficiency"] == pytest.approx(ratio)
            continue
        e1, e2 = (measured_epoch(workdir, run["id"]) for run in (one, two))
        per_gpu = [e["images"] / e["train_time_s"] / g for e, g in ((e1, 1), (e2, 2))]
        assert two["efficiency"] == pytest.approx(per_gpu[1] / per_gpu[0])
        # weak scaling (EPICURE): the same epoch's images on twice the GPUs
        assert scaling == "weak"
        t_ep = e1["epoch_time_s"] / e2["epoch_time_s"]
        assert two["efficiency_epoch_time"] == pytest.approx(t_ep / 2), precision


def check_plots(workdir: Path, df: pd.DataFrame, monkeypatch) -> None:
    """The workflow's PNGs are the summary's figures: drawn again here from summary.csv
    they are the same pixels, and what is drawn is the summary's values."""
    import matplotlib.image

    monkeypatch.chdir(workdir)  # the summary's log paths are relative to the working dir
    again = {name: workdir / f"again_{name}.png" for name in PLOTS}
    shown = plot_all(df, again)
    for name, path in again.items():
        made = matplotlib.image.imread(workdir / f"results/bench/plots/{name}.png")
        assert (made == matplotlib.image.imread(path)).all(), name
    vision = df[df["benchmark"] == "vision"]
    panel = shown["efficiency"]["vision: from t_tr (training part of the epoch)"]
    assert len(panel) == 2  # weak x fp32/amp
    for label, (nodes, values) in panel.items():
        _, model, scaling, precision = label.split()
        rows = vision[(vision["scaling"] == scaling) & (vision["precision"] == precision)]
        rows = rows.sort_values("nodes")
        assert nodes == [1.0, 2.0] and values == pytest.approx(list(rows["efficiency_train_time"]))
    cdf = shown["batch_time_cdf"]["vision: CDF, first and last batch removed"]
    assert len(cdf) == len(vision)
    for _, run in vision.iterrows():
        label = f"{run['experiment']} {run['model']} {run['scaling']} {run['precision']} n={run['nodes']}"
        times = [
            r["time_s"]
            for r in vision_records(workdir, run["id"])
            if r["event"] == "batch" and r["epoch"] == 2
        ]
        assert cdf[label][0] == pytest.approx(sorted(batch_times_trimmed(times)))


@pytest.mark.workflow
def test_tiny_sweep_runs_into_summary_plots_and_report(workdir, monkeypatch):
    overlay = workdir / "tiny.yaml"
    overlay.write_text(yaml.safe_dump(TINY))
    run_snakemake(
        workdir,
        "results/bench/summary.csv",
        "--profile",
        "profiles/local",
        "--configfile",
        str(overlay),
    )
    df = pd.read_csv(workdir / "results/bench/summary.csv")
    assert len(df) == 8 and set(df["status"]) == {"ok"}, df[["id", "status"]]
    vision = df[df["benchmark"] == "vision"]
    assert set(vision["gpus"]) == {1, 2} and set(vision["precision"]) == {"fp32", "amp"}
    assert set(vision["scaling"]) == {"weak"}
    assert set(df[df["benchmark"] == "language"]["scaling"]) == {"strong", "weak"}
    # the same images per epoch at both node counts: the dataset is not repeated
    assert len(set(vision["repeat"])) == 1
    assert (df[df["benchmark"] == "language"]["tokens_per_s_per_gpu"] > 0).all()
    check_vision_runs(workdir, vision)
    check_efficiencies(workdir, df)
    check_plots(workdir, df, monkeypatch)
    run_snakemake(
        workdir,
        "results/bench/summary.csv",
        "--report",
        "report.html",
        "--configfile",
        str(overlay),
    )
    html = (workdir / "report.html").read_text(errors="replace")
    assert "Benchmarks" in html and "efficiency.png" in html


@pytest.mark.workflow
def test_full_juwels_sweeps_plan(workdir):
    exp = yaml.safe_load((REPO / "config/experiments/vision.yaml").read_text())
    exp["dataset"] = "imagenet_sample"  # the built-in config has no ImageNet tree
    overlay = workdir / "juwels.yaml"
    # both sweeps are opt-in (config/experiments/*_sweep.yaml); the vision one inline here
    sweeps = {"language": "config/experiments/language.yaml", "vision": exp}
    overlay.write_text(yaml.safe_dump({"benchmarks": {"experiments": sweeps}}))
    proc = run_snakemake(
        workdir,
        "results/bench/summary.csv",
        "-n",
        "--profile",
        "profiles/juwels",
        "--configfile",
        str(overlay),
        env={"HPCLLM_ACCOUNT": os.environ.get("HPCLLM_ACCOUNT", "test")},
    )
    out = proc.stdout + proc.stderr
    assert "bench_language" in out and "bench_vision" in out
    assert "gpt3_175b.strong.bf16.n0256" in out and "resnet50.weak.amp.n0064" in out
