# Benchmark sweeps: one job per sweep point, then the summary, the plots and the report.
# The points come from the experiments in config `benchmarks.experiments` expanded for the
# cluster (hpcllm.bench.sweeps); docs/benchmarks.md describes them. A point runs after
# the smaller points of its series and is held, not run, when one of them failed in the
# network or at start-up (hpcllm.bench.hold; bench_after in benchmarks_functions.smk).


include: "benchmarks_functions.smk"


wildcard_constraints:
    point=r"[A-Za-z0-9_.-]+",


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
        "results/timings/bench_vision/{point}.tsv"
    conda:
        "../../envs/workflow.yaml"
    threads: bench_threads
    resources:
        nodes=bench_nodes,
        gres=bench_gres,
        # One task per node, run in the batch shell so that the run's own srun gets the
        # whole allocation (as train_segment; see the comments there).
        tasks=bench_nodes,
        tasks_per_gpu=0,
        mpi="",
        runtime=bench_runtime,
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
        "results/timings/bench_language/{point}.tsv"
    conda:
        "../../envs/workflow.yaml"
    threads: bench_threads
    resources:
        nodes=bench_nodes,
        gres=bench_gres,
        # One task per node, run in the batch shell so that the run's own srun gets the
        # whole allocation (as train_segment; see the comments there).
        tasks=bench_nodes,
        tasks_per_gpu=0,
        mpi="",
        # Minutes: sized from the point's work (hpcllm.bench.sweeps.point_time_limit).
        runtime=bench_runtime,
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
        table=report(
            "results/bench/summary.txt",
            caption="../report/summary_table.rst",
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
            subcategory="Language loss",
        ),
    log:
        "logs/aggregate_benchmarks.log",
    localrule: True
    conda:
        "../../envs/workflow.yaml"
    params:
        points=list(BENCH_POINTS.values()),
        results=subpath(output.summary, parent=True),
        slurm_logs=".snakemake/slurm_logs",
    script:
        "../scripts/aggregate_benchmarks.py"
