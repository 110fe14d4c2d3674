# The results stage's globals, plan-time checks and input/params functions (its rules:
# results.smk, which includes this file first).
def page_experiment_names():
    """The experiments the default target trains (see all_targets): on a GPU cluster
    the laptop's torch-engine examples only when named in `training.run`."""
    names = TRAINING.get("run") or list(EXPERIMENTS)
    if CLUSTER.uses_slurm and CLUSTER.gpus_per_node and not TRAINING.get("run"):
        names = [n for n in names if EXPERIMENTS[n].experiment["engine"] != "torch"]
    return names


def results_page_target():
    if not BENCH_POINTS and not page_experiment_names():
        return []
    return ["results/index.html"]


def results_page_forecasts():
    """The page's plot per experiment of its predicted against its actual finish."""
    return [f"results/train/{name}/forecast.png" for name in page_experiment_names()]


def results_page_inputs(wildcards):
    """The results page reads the benchmark summary and plots, and per experiment its
    loss curve, every segment's record and, where it is evaluated, its scores (named keys
    for the script)."""
    inputs = {}
    if BENCH_POINTS:
        inputs["summary"] = "results/bench/summary.csv"
        for name in BENCH_PLOTS:
            inputs[f"plot_{name}"] = f"results/bench/plots/{name}.png"
    for name in page_experiment_names():
        inputs[f"loss_{name}"] = f"results/train/{name}/loss.png"
        segments = EXPERIMENTS[name].experiment["segments"]
        inputs[f"records_{name}"] = [
            f"results/train/{name}/seg{k}.json" for k in range(1, segments + 1)
        ]
        if name in EVALUATED:  # the page shows the scores of the last checkpoint
            inputs[f"scores_{name}"] = f"results/eval/{name}/scores.csv"
            inputs[f"lm_eval_{name}"] = f"results/eval/{name}/lm_eval"
    return inputs


def results_page_experiments(wildcards):
    """The experiments' Prepared for the script, by name."""
    # A SimpleNamespace: Snakemake records no such param (a dict of Prepared made a
    # ~3,000-character rerun reason); results_page_keys is recorded instead.
    from types import SimpleNamespace

    return SimpleNamespace(**{n: EXPERIMENTS[n] for n in page_experiment_names()})


def results_page_keys(wildcards):
    """Recorded by Snakemake, and short: per experiment a digest of its settings."""
    from hpcllm.results_page import page_keys

    return page_keys({name: EXPERIMENTS[name] for name in page_experiment_names()})
