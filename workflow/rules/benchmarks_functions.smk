# The benchmarks stage's globals, plan-time checks and input/params functions (its rules:
# benchmarks.smk, which includes this file first).
from snakemake.exceptions import WorkflowError

from hpcllm.bench.hold import (
    HELD_JOB_MINUTES,
    HELD_JOB_NODES,
    held_by,
    held_job_note,
    smaller_points,
    submission_hold,
)
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


BENCH_RULES = ("bench_language", "bench_vision")
_HOLD_NOTED = set()  # points whose hold the plan stated (once per point and process)
_SIZED = set()  # the DAGs whose bench jobs were sized again once they knew what reruns


class RerunsNotKnown(Exception):
    """Snakemake sizes jobs (params use resources) before it knows which jobs run."""


def bench_rerunning():
    """The points this run still runs: none without a DAG (or in a job, whose DAG is its
    own job); RerunsNotKnown while the DAG does not know yet."""
    dag = workflow.dag
    if dag is None:
        return set()
    if workflow.is_main_process and id(dag) not in _SIZED:
        raise RerunsNotKnown
    return {
        job.wildcards["point"]
        for job in dag.needrun_jobs()
        if job.rule.name in BENCH_RULES
    }


def bench_hold(point):
    """The hold the point's job will find (hpcllm.bench.hold.submission_hold), decided
    from the smaller points' records: at plan time and again when the job is submitted
    (Snakemake sizes a job's resources again once its inputs are done). Slurm only: here
    a point takes no nodes to save."""
    if not CLUSTER.uses_slurm:
        return None
    try:
        hold = submission_hold(
            point, f"results/bench/{point['benchmark']}", bench_rerunning
        )
    except RerunsNotKnown:
        return None  # sized again once the DAG knows (_size_bench_jobs_again)
    if hold and workflow.is_main_process and point["id"] not in _HOLD_NOTED:
        _HOLD_NOTED.add(point["id"])
        own, held = bench_profile_runtime(point), HELD_JOB_MINUTES
        logger.info(
            held_job_note(point, hold, own or bench_runtime_min(point), own or held)
        )
    return hold


def bench_profile_runtime(point):
    """The minutes the profile's set-resources gives the point's rule (they win over the
    rule's own, a held point's too), or None."""
    from hpcllm.plan_cost import runtime_minutes

    value = _profile_resources.get(f"bench_{point['benchmark']}", {}).get("runtime")
    return None if value is None else runtime_minutes(value)


# Snakemake sizes a job's resources while it builds the DAG (its params use them), before
# it knows which jobs run, and keeps them for the plan's cost and the dry run's listing.
# A point's hold depends on whether the point that holds it reruns first: once the DAG
# knows that, the bench jobs are sized again. (At submission Snakemake sizes every job
# again itself, once its inputs are done.) Only in this process: a job's DAG is its own.
if workflow.is_main_process:
    from snakemake.dag import DAG as _BenchDAG

    _update_needrun = _BenchDAG.update_needrun

    async def _size_bench_jobs_again(dag, *args, **kwargs):
        result = await _update_needrun(dag, *args, **kwargs)
        if id(dag) not in _SIZED:
            _SIZED.add(id(dag))
            for job in dag.needrun_jobs():
                if job.rule.name in BENCH_RULES:
                    job._resources = job._params = None
        return result

    _BenchDAG.update_needrun = _size_bench_jobs_again


def bench_nodes(wildcards):
    """The point's nodes; one for a point that will be held (it only writes its record)."""
    point = BENCH_POINTS[wildcards.point]
    if not CLUSTER.uses_slurm:
        return 1
    return HELD_JOB_NODES if bench_hold(point) else point["nodes"]


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
    point = BENCH_POINTS[wildcards.point]
    return HELD_JOB_MINUTES if bench_hold(point) else bench_runtime_min(point)


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
