# The benchmarks stage's globals, plan-time checks and input/params functions (its rules:
# benchmarks.smk, which includes this file first).
from snakemake.exceptions import WorkflowError

from hpcllm.bench.hold import held_by, smaller_points
from hpcllm.bench.sweeps import SweepError, expand_all, facts_of, point_time_limit
from hpcllm.configuration import load_schema
from hpcllm.containers import image_for

BENCH = config["benchmarks"]
_dropped = []  # points the planner finds cannot run (memory, layout): said, not queued
try:
    BENCH_POINTS = {
        p.id: p.row()
        for p in expand_all(
            BENCH["experiments"],
            facts_of(CLUSTER),
            schema=load_schema(
                f"{HPCLLM_ROOT}/workflow/schemas/benchmarks.schema.yaml"
            ),
            dropped=_dropped,
        )
    }
except SweepError as e:
    raise WorkflowError(f"benchmarks: {e}")
for _message in _dropped:
    logger.warning(f"Warning: benchmarks: {_message}")
from hpcllm.configuration import vision_split_errors

_split_errors = vision_split_errors(BENCH["experiments"], config["vision"]["datasets"])
if _split_errors:
    raise WorkflowError("\n".join(_split_errors))
BENCH_PLOTS = ("efficiency", "throughput", "batch_time_cdf", "loss")
BENCH_SMALLER = smaller_points(BENCH_POINTS.values())


def bench_ids(benchmark):
    return [i for i, p in BENCH_POINTS.items() if p["benchmark"] == benchmark]


def bench_point(wildcards):
    return BENCH_POINTS[wildcards.point]


def bench_container(benchmark, check=False):
    """The point's image (None without); ``check``: as an input, stop the plan when it
    can be neither found nor built (container_image)."""
    purpose = "train" if benchmark == "language" else "vision"
    images = container_image(purpose, check)
    return images[0] if images else None


if "bench_preflight" not in globals():  # a Snakefile without preflight.smk's include

    def bench_preflight(point):
        return []


def bench_after(point):
    """The timings files of the smaller points of the point's series (hpcllm.bench.hold):
    it runs after them, so that their records are there when its job looks for a failure
    that holds it. Ancient (their times not compared): a smaller point's rerun does not
    rerun it, except the rerun of the point that held it, which releases it. Timings, not
    records: deleting a point's folder to rerun it reruns that point alone."""
    holder = held_by(f"results/bench/{point['benchmark']}/{point['id']}/run.json")
    files = []
    for other in BENCH_SMALLER[point["id"]]:
        path = f"results/timings/bench_{point['benchmark']}/{other}.tsv"
        files.append(path if other == holder else ancient(path))
    return files


def bench_vision_inputs(wildcards):
    point = BENCH_POINTS[wildcards.point]
    inputs = {"lmdb": f"data/vision/{point['dataset']}/{point['split']}.lmdb"}
    if point.get("val_split"):
        inputs["val"] = f"data/vision/{point['dataset']}/{point['val_split']}.lmdb"
    if bench_container("vision"):
        inputs["container"] = bench_container("vision", check=True)
    inputs["preflight"] = bench_preflight(point)  # the canary (preflight.smk)
    inputs["after"] = bench_after(point)
    return inputs


def bench_language_inputs(wildcards):
    point = BENCH_POINTS[wildcards.point]
    inputs = {}
    if point["data"] != "mock":
        inputs["data"] = [point["data"] + ".bin", point["data"] + ".idx"]
    if point.get("tokenizer"):
        inputs["tokenizer"] = point["tokenizer"]
    if bench_container("language"):
        inputs["container"] = bench_container("language", check=True)
    inputs["preflight"] = bench_preflight(point)  # the canary (preflight.smk)
    inputs["after"] = bench_after(point)
    return inputs


def bench_nodes(wildcards):
    return BENCH_POINTS[wildcards.point]["nodes"] if CLUSTER.uses_slurm else 1


def bench_threads(wildcards):
    """Slurm: the whole node for the launcher; here: one core per process of the run."""
    point = BENCH_POINTS[wildcards.point]
    return CLUSTER.cpus_per_node if CLUSTER.uses_slurm else point["gpus"]


def bench_gres(wildcards):
    return f"gpu:{CLUSTER.gpus_per_node}" if CLUSTER.gpus_per_node else ""


def bench_runtime_min(point):
    """A point's time limit sized from its work (language: its FLOPs; vision: its epochs
    of images); 120 min where the cluster has no GPU to size it for."""
    work = point_time_limit(point, facts_of(CLUSTER))
    return work.limit_minutes if work else 120


def bench_runtime(wildcards):
    return bench_runtime_min(BENCH_POINTS[wildcards.point])


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
