import os

import hpcllm_checkout  # noqa: F401  (hpcllm from the checkout that planned the run)

from hpcllm import logs
from hpcllm.evaluation.harness import write_rerun
from hpcllm.evaluation.table import write_table

logs.setup(snakemake.log[0])
tasks = snakemake.input.get("tasks")  # none where evaluate.tasks is [] (perplexity only)
write_table(
    snakemake.wildcards.experiment,
    tasks,
    snakemake.input.perplexity,
    snakemake.input.export,
    snakemake.output.table,
)
os.makedirs(snakemake.output.lm_eval, exist_ok=True)
if tasks:
    write_rerun(
        tasks, snakemake.input.manifest, snakemake.params.cache_dir, snakemake.output.lm_eval
    )
