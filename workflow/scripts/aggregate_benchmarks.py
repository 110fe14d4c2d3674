import hpcllm_checkout  # noqa: F401  (hpcllm from the checkout that planned the run)

from hpcllm import logs
from hpcllm.bench.plots import PLOTS, plot_all
from hpcllm.bench.summary import summarize, write_compact, write_summary

logs.setup(snakemake.log[0])
summary = summarize(snakemake.params.points, snakemake.params.results, snakemake.params.slurm_logs)
write_summary(summary, snakemake.output.summary)
# the compact table, also in the terminal at the end of a sweep (a local rule's output)
print(write_compact(summary, snakemake.output.table), flush=True)
plot_all(summary, {name: getattr(snakemake.output, name) for name in PLOTS})
