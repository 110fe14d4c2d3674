"""The tiny local sweep end to end through Snakemake, the report, and the JUWELS plan."""

import os
import resource

import pandas as pd
import pytest
import yaml
from support import REPO, run_snakemake

# Mock data for the language runs: the sweep needs no text stage in this test.
TINY = {"benchmarks": {"experiments": {"language_tiny": {"data": "mock", "tokenizer": None}}}}


@pytest.mark.workflow
def test_tiny_sweep_runs_into_summary_plots_and_report(workdir):
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
    assert len(df) == 12 and set(df["status"]) == {"ok"}, df[["id", "status"]]
    vision = df[df["benchmark"] == "vision"]
    assert set(vision["gpus"]) == {1, 2} and set(vision["precision"]) == {"fp32", "amp"}
    assert set(df["scaling"]) == {"strong", "weak"}
    assert (df[df["nodes"] == 1]["efficiency"] == 1.0).all()
    assert (df[df["nodes"] == 2]["efficiency"] > 0).all()
    assert (df[df["benchmark"] == "language"]["tokens_per_s_per_gpu"] > 0).all()
    # a 2-process run really ran 2 ranks
    log = (
        workdir / "results/bench/vision" / vision[vision["gpus"] == 2]["id"].iloc[0] / "run.log"
    ).read_text()
    assert '"world_size": 2' in log
    for name in ("efficiency", "throughput", "batch_time_cdf", "loss"):
        assert (workdir / f"results/bench/plots/{name}.png").stat().st_size > 5000
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
def test_full_juwels_sweeps_plan_in_seconds(workdir):
    exp = yaml.safe_load((REPO / "config/experiments/vision.yaml").read_text())
    exp["dataset"] = "imagenet_sample"  # the built-in config has no ImageNet tree
    overlay = workdir / "juwels.yaml"
    # both sweeps are opt-in (config/experiments/*_sweep.yaml); the vision one inline here
    sweeps = {"language": "config/experiments/language.yaml", "vision": exp}
    overlay.write_text(yaml.safe_dump({"benchmarks": {"experiments": sweeps}}))
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
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
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    out = proc.stdout + proc.stderr
    assert "bench_language" in out and "bench_vision" in out
    assert "gpt3_175b.strong.bf16.n0256" in out and "resnet50.weak.amp.n0064" in out
    assert cpu < 5, f"planning took {cpu:.1f} s of CPU"
