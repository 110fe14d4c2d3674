# The results page: the benchmark tables and figures and each experiment's loss and
# status in one self-contained HTML file, the first thing to open (docs/benchmarks.md).


include: "results_functions.smk"


rule results_page:
    input:
        unpack(results_page_inputs),
    output:
        report(
            "results/index.html",
            caption="../report/results_page.rst",
            category="1. Results",
        ),
        # per experiment its predictions of the finish against what happened (on the page)
        forecasts=results_page_forecasts(),
    log:
        "logs/results_page.log",
    localrule: True
    conda:
        "../../envs/workflow.yaml"
    params:
        experiments=results_page_experiments,
        # Recorded by Snakemake: a changed experiment reruns the page.
        experiment_keys=results_page_keys,
        cluster=CLUSTER.name,
        # set against each experiment's GPU-hours
        max_gpu_hours=config["max_gpu_hours"],
    script:
        "../scripts/results_page.py"
