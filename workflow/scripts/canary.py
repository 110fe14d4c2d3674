import hpcllm_checkout  # noqa: F401  (hpcllm from the checkout that planned the run)

from hpcllm.offline import go_offline

go_offline()  # a compute job: no Hugging Face hub lookups (docs/clusters.md)

from hpcllm import logs
from hpcllm.preflight.canary import run_canary

logs.setup(snakemake.log[0])
run_canary(
    snakemake.wildcards.kind,
    snakemake.params.source,
    snakemake.config,
    snakemake.params.cluster,
    snakemake.params.key,
    snakemake.params.work,
    snakemake.output.record,
    container=snakemake.input.get("container", [None])[0],
    inputs=dict(snakemake.input.items()),
    schema=snakemake.params.schema,
    time_limit_s=snakemake.params.time_limit_s,
    nodes=snakemake.params.nodes,
)
