import hpcllm_checkout  # noqa: F401  (hpcllm from the checkout that planned the run)

from hpcllm import logs
from hpcllm.training.campaign.curves import plot_loss_curve

logs.setup(snakemake.log[0])
plot_loss_curve(
    snakemake.wildcards.experiment,
    snakemake.params.engine_logs,
    snakemake.params.seq_length,
    snakemake.output[0],
)
