import hpcllm_checkout  # noqa: F401  (hpcllm from the checkout that planned the run)

from hpcllm import logs
from hpcllm.evaluation.table import write_table

logs.setup(snakemake.log[0])
write_table(
    snakemake.wildcards.experiment,
    snakemake.input.get("tasks"),  # none where evaluate.tasks is [] (perplexity only)
    snakemake.input.perplexity,
    snakemake.input.export,
    snakemake.output[0],
)
