import hpcllm_checkout  # noqa: F401  (hpcllm from the checkout that planned the run)

from hpcllm.offline import go_offline

go_offline()  # a compute job: no Hugging Face hub lookups (docs/clusters.md)

from hpcllm import logs
from hpcllm.training.campaign.measure_layout import measure_layouts

logs.setup(snakemake.log[0])
measure_layouts(
    snakemake.wildcards.experiment,
    snakemake.params.prepared,
    snakemake.output.record,
    snakemake.params.work,
    snakemake.params.cluster,
    container=snakemake.input.container[0] if snakemake.input.container else None,
    limit_minutes=snakemake.resources.runtime,
    canary_records=list(snakemake.input.preflight),
)
