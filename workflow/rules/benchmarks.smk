# Benchmark sweeps: one job per sweep point, then the summary, the plots and the report.
# The points come from the experiments in config `benchmarks.experiments` expanded for the
# cluster (hpcllm.bench.sweeps); docs/benchmarks.md describes them.
import yaml as _yaml
from snakemake.exceptions import WorkflowError

from hpcllm.bench.sweeps import SweepError, expand_all, facts_of
from hpcllm.containers import image_for

BENCH = config["benchmarks"]
try:
    BENCH_POINTS = {
        p.id: p.row()
        for p in expand_all(
            BENCH["experiments"],
            facts_of(CLUSTER),
            schema=_yaml.safe_load(
                open(f"{workflow.basedir}/workflow/schemas/benchmarks.schema.yaml")
            ),
        )
    }
except SweepError as e:
    raise WorkflowError(f"benchmarks: {e}")
BENCH_PLOTS = ("efficiency", "throughput", "batch_time_cdf", "loss")


wildcard_constraints:
    point=r"[A-Za-z0-9_.-]+",


def bench_ids(benchmark):
    return [i for i, p in BENCH_POINTS.items() if p["benchmark"] == benchmark]


def bench_point(wildcards):
    return BENCH_POINTS[wildcards.point]


def bench_container(benchmark):
    image = image_for(
        CLUSTER,
        "train" if benchmark == "language" else "vision",
        config["containers"].get("use", {}),
    )
    return f"containers/{image}.sif" if image else None


def bench_vision_inputs(wildcards):
    point = BENCH_POINTS[wildcards.point]
    inputs = {"lmdb": f"data/vision/{point['dataset']}/{point['split']}.lmdb"}
    if bench_container("vision"):
        inputs["container"] = bench_container("vision")
    return inputs


def bench_language_inputs(wildcards):
    point = BENCH_POINTS[wildcards.point]
    inputs = {}
    if point["data"] != "mock":
        inputs["data"] = [point["data"] + ".bin", point["data"] + ".idx"]
    if point.get("tokenizer"):
        inputs["tokenizer"] = point["tokenizer"]
    if bench_container("language"):
        inputs["container"] = bench_container("language")
    return inputs


def bench_nodes(wildcards):
    return BENCH_POINTS[wildcards.point]["nodes"] if CLUSTER.uses_slurm else 1


def bench_threads(wildcards):
    """Slurm: the whole node for the launcher; here: one core per process of the run."""
    point = BENCH_POINTS[wildcards.point]
    return CLUSTER.cpus_per_node if CLUSTER.uses_slurm else point["gpus"]


def bench_gres(wildcards):
    return f"gpu:{CLUSTER.gpus_per_node}" if CLUSTER.gpus_per_node else ""


def bench_time_limit_s(wildcards, resources):
    return resources.runtime * 60 * BENCH["run_time_limit_fraction"]


def bench_records():
    return [
        f"results/bench/{p['benchmark']}/{i}/run.json" for i, p in BENCH_POINTS.items()
    ]


def benchmark_targets():
    if not BENCH_POINTS:
        return []
    return ["results/bench/summary.csv"] + [
        f"results/bench/plots/{name}.png" for name in BENCH_PLOTS
    ]


rule bench_vision:
    input:
        unpack(bench_vision_inputs),
    output:
        log="results/bench/vision/{point}/run.log",
        record="results/bench/vision/{point}/run.json",
        settings="results/bench/vision/{point}/settings.json",
    log:
        "logs/bench_vision/{point}.log",
    benchmark:
        "benchmarks/bench_vision/{point}.tsv"
    threads: bench_threads
    resources:
        nodes=bench_nodes,
        gres=bench_gres,
        runtime=120,
    params:
        point=bench_point,
        container=bench_container("vision"),
        time_limit_s=bench_time_limit_s,
    script:
        "../scripts/bench_vision.py"


rule bench_language:
    input:
        unpack(bench_language_inputs),
    output:
        log="results/bench/language/{point}/run.log",
        record="results/bench/language/{point}/run.json",
    log:
        "logs/bench_language/{point}.log",
    benchmark:
        "benchmarks/bench_language/{point}.tsv"
    threads: bench_threads
    resources:
        nodes=bench_nodes,
        gres=bench_gres,
        runtime=120,
    params:
        point=bench_point,
        container=bench_container("language"),
        time_limit_s=bench_time_limit_s,
    script:
        "../scripts/bench_language.py"


rule aggregate_benchmarks:
    input:
        bench_records(),
    output:
        summary=report(
            "results/bench/summary.csv",
            caption="../report/summary.rst",
            category="Benchmarks",
            subcategory="Summary",
        ),
        efficiency=report(
            "results/bench/plots/efficiency.png",
            caption="../report/efficiency.rst",
            category="Benchmarks",
            subcategory="Scaling",
        ),
        throughput=report(
            "results/bench/plots/throughput.png",
            caption="../report/throughput.rst",
            category="Benchmarks",
            subcategory="Scaling",
        ),
        batch_time_cdf=report(
            "results/bench/plots/batch_time_cdf.png",
            caption="../report/batch_time_cdf.rst",
            category="Benchmarks",
            subcategory="Batch times",
        ),
        loss=report(
            "results/bench/plots/loss.png",
            caption="../report/loss.rst",
            category="Benchmarks",
            subcategory="Training",
        ),
    log:
        "logs/aggregate_benchmarks.log",
    localrule: True
    params:
        points=list(BENCH_POINTS.values()),
        results="results/bench",
        slurm_logs=".snakemake/slurm_logs",
    script:
        "../scripts/aggregate_benchmarks.py"
